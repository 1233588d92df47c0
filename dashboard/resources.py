"""The process-wide resources every page shares (``st.cache_resource``): the run store and
the run manager. Runs live in the server process, not in a browser session, so closing the
browser does not stop them."""

from __future__ import annotations

import streamlit as st

from auditlib.engine.runs import RunManager
from auditlib.store import Store

# Progress granularity of dashboard runs: an event every EMIT_EVERY steps and a live image
# every IMAGE_EVERY steps, so a run of a hundred steps shows its reconstruction converging.
EMIT_EVERY = 5
IMAGE_EVERY = 10


@st.cache_resource(show_spinner=False)
def get_store() -> Store:
    """The run store of this server process (``$AUDIT_DATABASE_URL`` or SQLite in ./data)."""
    return Store()


@st.cache_resource(show_spinner="Starting the run engine (Ray; once per server, a few seconds) ...")
def get_manager() -> RunManager:
    """The run manager of this server process; its runs outlive every browser session.

    Creating it marks runs that an earlier server left unfinished as failed
    (``orphans_failed``). Ray starts in the background (``app.py`` asks for it on the first
    page view) and ``RunManager.start`` waits for it.
    """
    return RunManager(get_store(), emit_every=EMIT_EVERY, image_every=IMAGE_EVERY)
