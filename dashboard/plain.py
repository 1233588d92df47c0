"""User-given text inside Streamlit's Markdown, shown as typed.

A file name, a class name or a value from the URL is the user's (or a link's author's)
text: inside an alert, a caption or a Markdown line it must not become a link, emphasis,
a colour or an icon. :func:`literal` puts it in a code span, where Markdown reads nothing.
"""

from __future__ import annotations

import re

_TICKS = re.compile(r"`+")


def literal(text: object, limit: int | None = None) -> str:
    """``text`` (cut to ``limit`` characters) as a Markdown code span, shown as typed."""
    shown = str(text)
    if limit is not None and len(shown) > limit:
        shown = shown[:limit] + "…"
    shown = " ".join(shown.split())  # one line: a newline would end the span's paragraph
    longest = max((len(m) for m in _TICKS.findall(shown)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") else ""
    return f"{fence}{pad}{shown}{pad}{fence}"
