"""The process-wide resources every page shares (``st.cache_resource``): the run store and
the run manager. Runs live in the server process, not in a browser session, so closing the
browser does not stop them. Pages reach both only as the signed-in user sees them
(:func:`get_store`, :func:`get_manager`): their own runs, batches and uploads."""

from __future__ import annotations

from auditlib.engine.user_runs import UserRuns
from auditlib.store.scoped import UserStore
from dashboard.auth import current_principal
from dashboard.run_engine import EMIT_EVERY, IMAGE_EVERY, shared_manager, shared_store

__all__ = [
    "EMIT_EVERY",
    "IMAGE_EVERY",
    "get_manager",
    "get_store",
    "shared_manager",
    "shared_store",
]


def get_store() -> UserStore:
    """The store as the signed-in user sees it."""
    return UserStore(shared_store(), current_principal())


def get_manager() -> UserRuns:
    """The run manager as the signed-in user uses it (their runs, their uploads)."""
    return UserRuns(shared_manager(), get_store())
