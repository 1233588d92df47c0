"""What a page shows when something fails under it: one line that says what failed and
that nothing stored was lost, never a traceback or a path of the server's.

``app.py`` hands :func:`show_failure` to ``st.App`` as its ``on_script_error``: Streamlit
calls it for an exception a page script, a widget's callback or a refreshing fragment did
not catch. Expected refusals (``AuditInputError``) are caught where they happen and said
there; this is for the rest (the store down, a full disk, a bug). The full trace goes to the
server's log under a short reference the line names, so an operator can find it.
"""

from __future__ import annotations

import errno
import logging
import secrets

_LOG = logging.getLogger("dashboard.failures")


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during, innermost last."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _from_the_store(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("sqlalchemy", "psycopg", "sqlite3"))


def what_failed(exc: BaseException) -> str:
    """The failure in a user's words, without its message (which may hold paths, SQL or a
    database URL); a store error wrapped in another (the store's own refusal to open a
    database) is still the store's."""
    chain = _chain(exc)
    # A full disk, whoever met it: the OS, or SQLite ("database or disk is full").
    if any(isinstance(link, OSError) and link.errno == errno.ENOSPC for link in chain) or any(
        "disk is full" in str(link) for link in chain if _from_the_store(link)
    ):
        return "the server's disk is full"
    if any(_from_the_store(link) for link in chain):
        return "the store (the database) did not answer"
    if isinstance(exc, MemoryError):
        return "the server ran out of memory"
    if isinstance(exc, OSError):
        return "the server could not read or write a file"
    return f"an internal error ({type(exc).__name__})"


def failure_line(exc: BaseException, what: str, *, log_trace: bool = True) -> str:
    """``what`` (e.g. "The run could not be started") failed because of ``exc``, in one
    line for the page; the server's log gets the line's reference (and the trace, unless
    Streamlit logged it already)."""
    reference = secrets.token_hex(4)
    _LOG.error("%s: failure %s", what, reference, exc_info=exc if log_trace else None)
    return (
        f"{what}: {what_failed(exc)}. Nothing you stored was lost; try again in a moment. "
        f"(The server's log has the details under reference {reference}.)"
    )


def show_failure(exc: Exception) -> bool:
    """Say ``exc`` in one line at the top level of the page (the script may have failed
    inside a column or the sidebar); True tells Streamlit not to draw its own exception
    box. Streamlit has logged the trace just before."""
    from streamlit.delta_generator_singletons import get_dg_singleton_instance

    line = failure_line(exc, "This page could not be shown", log_trace=False)
    get_dg_singleton_instance().main_dg.error(line)
    return True
