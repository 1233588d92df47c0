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

import streamlit as st

_LOG = logging.getLogger("dashboard.failures")


def what_failed(exc: BaseException) -> str:
    """The failure in a user's words, without its message (which may hold paths, SQL or a
    database URL)."""
    module = type(exc).__module__
    if module.startswith("sqlalchemy") or module.startswith(("psycopg", "sqlite3")):
        return "the store (the database) did not answer"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return "the server's disk is full"
    if isinstance(exc, MemoryError):
        return "the server ran out of memory"
    if isinstance(exc, OSError):
        return "the server could not read or write a file"
    return f"an internal error ({type(exc).__name__})"


def failure_line(exc: BaseException, what: str) -> str:
    """``what`` (e.g. "The run could not be started") failed because of ``exc``, in one
    line for the page; the trace goes to the server's log under the line's reference."""
    reference = secrets.token_hex(4)
    _LOG.error("%s: failure %s", what, reference, exc_info=exc)
    return (
        f"{what}: {what_failed(exc)}. Nothing you stored was lost; try again in a moment. "
        f"(The server's log has the details under reference {reference}.)"
    )


def show_failure(exc: Exception) -> bool:
    """Say ``exc`` on the page in one line (logged with its trace); True tells Streamlit
    not to draw its own exception box."""
    st.error(failure_line(exc, "This page could not be shown"))
    return True
