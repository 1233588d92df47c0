"""The text audits' run manager of this server process (``st.cache_resource``, beside the
image runs' in ``run_engine.py``) and the signed-in user's view of the text runs."""

from __future__ import annotations

import streamlit as st

from auditlib.engine.text_runs import TextRunManager
from auditlib.store.text_runs import UserTextRuns
from dashboard.auth import current_principal
from dashboard.run_engine import end_at_stop, shared_manager, shared_store


@st.cache_resource(show_spinner=False)
def shared_text_manager() -> TextRunManager:
    """Made once per server; its runs belong to this process's instance (the image run
    manager's), so a later start fails them if this process is gone."""
    manager = TextRunManager(shared_store(), instance=shared_manager().keeper.id)
    end_at_stop(manager)  # its runs end failed with the reason at the server's stop
    return manager


def user_text_runs() -> UserTextRuns:
    """The text runs the signed-in user may see."""
    return UserTextRuns(shared_text_manager().runs, current_principal())
