"""A finished text run's actions on the Text page: run it again (its settings on its
uploads, read back from the store by their sha256, as the signed-in user may see them) and
delete it, with the uploads no other run uses."""

from __future__ import annotations

import streamlit as st

from auditlib.engine.text_runs import stored_text_spec, stored_uploads
from auditlib.errors import AuditInputError
from auditlib.store.text_runs import TextRunRecord
from dashboard.auth import current_principal
from dashboard.deletion_words import deleted_text
from dashboard.failures import failure_line
from dashboard.text_choices import forget_uploads, read_visible
from dashboard.text_engine import shared_text_manager, user_text_runs
from dashboard.text_view import RUN_KEY, open_text_run

MESSAGE = "text_action_message"  # session: (kind, words) said once on the next run of the page


def _run_again(record: TextRunRecord) -> None:
    try:
        uploads = stored_uploads(record.spec, read_visible)
        run_id = shared_text_manager().start(
            stored_text_spec(record.spec), uploads,
            owner=current_principal().username, title=record.title,
        )  # fmt: skip
    except AuditInputError as exc:
        st.session_state[MESSAGE] = ("error", f"Not started again: {exc}")
        return
    except Exception as exc:  # Ray or the store failed: said, the page stays
        st.session_state[MESSAGE] = ("error", failure_line(exc, "The text audit could not start"))
        return
    open_text_run(run_id)


def _delete(record: TextRunRecord) -> None:
    freed = user_text_runs().delete(record.id)
    forget_uploads({a.sha256 for a in freed})
    st.session_state.pop(RUN_KEY, None)
    st.query_params.pop(RUN_KEY, None)
    st.session_state[MESSAGE] = ("success", deleted_text(record.id, freed, "text run"))


def said_once() -> None:
    """The last action's message, once."""
    kind, words = st.session_state.pop(MESSAGE, (None, ""))
    if kind == "error":
        st.error(words)
    elif kind == "success":
        st.success(words)


def text_run_actions(record: TextRunRecord) -> None:
    """Run again and Delete, for a finished run."""
    again, remove, _ = st.columns([2, 1, 3])
    if again.button(
        "Run again", key="text_run_again",
        help="The same settings on the same model and text (read back from the store).",
    ):  # fmt: skip
        _run_again(record)
        st.rerun()
    with remove.popover("Delete…"):
        st.write(
            f"Delete text run {record.id[:8]} with its private and recovered text, and the "
            "uploads (model files, text file) no other run uses? This cannot be undone."
        )
        if st.button("Delete", key="text_delete_run"):
            _delete(record)
            st.rerun()
