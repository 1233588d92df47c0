"""Downloads of private files (a run's result.json, its reconstruction grid, PDF reports).

``st.download_button`` given bytes puts them in Streamlit's media store at once, served at
``/media/<id>`` to anyone who asks for that URL, signed in or not, for as long as the page
shows the button. Given a function, it stores nothing until the button is pressed: the
press travels over the signed-in session's own connection, and only then are the bytes
handed out, to that browser. Sign-out drops what is left (``dashboard/auth``).
"""

from __future__ import annotations

from typing import Any


def private_download(
    target: Any, label: str, data: bytes, *, file_name: str, mime: str, key: str
) -> None:
    """A download button (in ``target``: ``st`` or a column) whose bytes reach the media
    store only when their owner presses it."""
    target.download_button(
        label,
        lambda: data,  # deferred: nothing stored or served before the press
        file_name=file_name,
        mime=mime,
        key=key,
        on_click="ignore",  # the page need not rerun for a download
    )
