"""The run store and the run manager of this server process (``st.cache_resource``), and
their start and stop with the server (``app.py``'s lifespan).

Apart from ``resources.py`` (the pages' view of them, as the signed-in user) because the
lifespan imports this module before any page runs, and it must import no sign-in code then:
imported there, outside a script run, ``dashboard.auth`` (with streamlit-authenticator)
lost the sign-in throttle's count between runs (the guessing browser test found it).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from auditlib.engine.runs import RunManager
from auditlib.store import Store

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
    manager = RunManager(shared_store(), emit_every=EMIT_EVERY, image_every=IMAGE_EVERY)
    _MADE.append(manager)
    return manager


# The managers made, each ended at the server's stop (one per server and kind of run;
# tests clear the cache).
_MADE: list[Any] = []


def end_at_stop(manager: Any) -> None:
    """``manager.shutdown()`` at the server's stop (:func:`stop_engine`), before Ray stops:
    the text runs' manager (``text_engine.py``) as the image runs'."""
    _MADE.append(manager)


def start_engine() -> None:
    """At the server's start, before any page view: the run manager (and with it the
    reconciliation of runs a stopped process left) and Ray, in the background."""
    shared_manager()


def stop_engine() -> None:
    """At the server's stop (SIGTERM, Ctrl-C): the runs of this process end failed with the
    reason, their Ray tasks are cancelled, then Ray stops, before the interpreter's exit
    would tear it down under running threads."""
    import ray

    for manager in _MADE:  # none where the store never answered: nothing to end
        manager.shutdown()
    if ray.is_initialized():
        ray.shutdown()
