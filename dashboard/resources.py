"""The process-wide resources every page shares (``st.cache_resource``): the run store and
the run manager. Runs live in the server process, not in a browser session, so closing the
browser does not stop them. Pages reach both only as the signed-in user sees them
(:func:`get_store`, :func:`get_manager`): their own runs, batches and uploads."""

from __future__ import annotations

import streamlit as st

from auditlib.engine.runs import RunManager
from auditlib.engine.user_runs import UserRuns
from auditlib.store import Store
from auditlib.store.scoped import UserStore
from dashboard.auth import current_principal

# Progress granularity of dashboard runs: an event every EMIT_EVERY steps and a live image
# every IMAGE_EVERY steps, so a run of a hundred steps shows its reconstruction converging.
EMIT_EVERY = 5
IMAGE_EVERY = 10


@st.cache_resource(show_spinner=False)
def shared_store() -> Store:
    """The run store of this server process (``$AUDIT_DATABASE_URL`` or SQLite in ./data)."""
    return Store()


@st.cache_resource(show_spinner="Starting the run engine (Ray; once per server, a few seconds) ...")
def shared_manager() -> RunManager:
    """The run manager of this server process; its runs outlive every browser session.

    Made when the server starts (``app.py``'s lifespan calls :func:`start_engine`): it
    registers this process as an instance of the store and fails the runs of processes that
    are gone (``orphans_failed``), then on every heartbeat. Ray starts in the background and
    ``RunManager.start`` waits for it.
    """
    return RunManager(shared_store(), emit_every=EMIT_EVERY, image_every=IMAGE_EVERY)


def start_engine() -> None:
    """At the server's start, before any page view: the run manager (and with it the
    reconciliation of runs a stopped process left) and Ray, in the background."""
    shared_manager()


def stop_engine() -> None:
    """At the server's stop (SIGTERM, Ctrl-C): the runs of this process end failed with the
    reason, their Ray tasks are cancelled, then Ray stops, before the interpreter's exit
    would tear it down under running threads."""
    import ray

    shared_manager().shutdown()
    if ray.is_initialized():
        ray.shutdown()


def get_store() -> UserStore:
    """The store as the signed-in user sees it."""
    return UserStore(shared_store(), current_principal())


def get_manager() -> UserRuns:
    """The run manager as the signed-in user uses it (their runs, their uploads)."""
    return UserRuns(shared_manager(), get_store())
