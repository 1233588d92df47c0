"""Text models: audit a language model's update for the text it leaks.

Choose a preset or upload your model folder, the demo text or your own, the client's
protocol, the attacks and a defense; Start runs the audit on Ray (``engine.text_runs``)
and this page polls its progress (the best sequences so far), then shows the verdict, the
private and recovered sequences side by side and the PDF; a finished run can be run again
on its stored uploads, or deleted with them. Several runs' verdicts (under several
defenses) go side by side below. The open run is in the URL (``?text_run=``).
"""

from __future__ import annotations

import re
from dataclasses import replace

import streamlit as st

from auditlib.access import AccessDenied
from auditlib.engine.text_audit import TEXT_DEFENSES
from auditlib.errors import AuditInputError
from dashboard.auth import current_principal, signed_in_fragment
from dashboard.entry import through_app
from dashboard.failures import failure_line
from dashboard.text_actions import said_once, text_run_actions
from dashboard.text_choices import TextChoices, problems, text_form, uploads_of
from dashboard.text_engine import shared_text_manager, user_text_runs
from dashboard.text_view import (
    REFRESH_S,
    RUN_KEY,
    comparison_rows,
    live_text_view,
    open_text_run,
    result_view,
)

through_app()  # a run that did not come through app.py goes through it (dashboard/entry.py)


def _start(choices: TextChoices, defenses: list[str] | None = None) -> None:
    """Start the run (or one per defense in ``defenses``, each at its defaults)."""
    st.session_state.pop("text_start_error", None)
    found = problems(choices)
    if found:
        st.session_state["text_start_error"] = "Not started: " + " ".join(found)
        return
    try:
        uploads = uploads_of(choices)
        owner = current_principal().username
        manager = shared_text_manager()
        specs = [choices.spec()]
        if defenses:
            specs = [replace(specs[0], defense=d, defense_params={}) for d in defenses]
        run_ids = [manager.start(spec, uploads, owner=owner, title=spec.defense) for spec in specs]
    except AuditInputError as exc:
        st.session_state["text_start_error"] = f"Not started: {exc}"
        return
    except Exception as exc:  # Ray or the store failed: said, the page stays
        st.session_state["text_start_error"] = failure_line(exc, "The text audit could not start")
        return
    open_text_run(run_ids[0])
    st.session_state["text_compare_ids"] = run_ids if defenses else []


def _open_run_id() -> str | None:
    run_id = st.session_state.get(RUN_KEY) or st.query_params.get(RUN_KEY)
    if run_id and re.fullmatch(r"[0-9a-f]{32}", run_id):
        return run_id
    return None


st.title("Text models")
st.caption(
    "A client fine-tunes a language model on private sequences and sends its update; the "
    "server's attacks (DAGER, TAG, LAMP, UTR as registered) try to read the text back. Only "
    "you (and an admin) see your private and recovered text."
)

said_once()  # what Run again or Delete did
run_id = _open_run_id()
if run_id is not None:
    try:
        record = user_text_runs().get(run_id)
    except AccessDenied as exc:
        st.error(str(exc))
        record = None
    if record is not None:
        defense = record.title or record.spec.get("defense", "")
        st.header(f"Text audit {run_id[:8]} · defense {defense}")
        live = not record.finished
        st.fragment(signed_in_fragment(live_text_view), run_every=REFRESH_S if live else None)(
            run_id, live
        )
        if record.finished:
            result_view(record)
            text_run_actions(record)
    st.divider()

st.header("New text audit")
choices = text_form()
if st.button("Start text audit", type="primary", key="text_start"):
    _start(choices)
    st.rerun()
if st.session_state.get("text_start_error"):
    st.error(st.session_state["text_start_error"])

st.header("Compare defenses")
st.caption(
    "Start the same audit under several defenses at their default settings, or pick "
    "finished runs: their verdicts, the best attack's ROUGE and epsilon side by side."
)
several = st.multiselect("Defenses to compare", list(TEXT_DEFENSES), key="text_compare_defenses")
if st.button("Start one audit per defense", key="text_compare_start", disabled=not several):
    _start(choices, several)
    st.rerun()
mine = [r for r in user_text_runs().list() if r.finished and r.result is not None]
if mine:
    labels = {
        r.id: f"{r.id[:8]} · {r.title or r.spec.get('defense')} · {r.created_at:%H:%M:%S}"
        for r in mine
    }
    default = [i for i in st.session_state.get("text_compare_ids", []) if i in labels]
    chosen = st.multiselect(
        "Runs side by side", list(labels), default=default or list(labels)[:4],
        format_func=labels.get, key="text_compare_runs",
    )  # fmt: skip
    picked = [r for r in mine if r.id in chosen]
    if picked:
        st.dataframe(comparison_rows(picked), hide_index=True)
    opened = st.selectbox("Open a run", ["", *labels], format_func=lambda i: labels.get(i, "—"))
    if opened:
        open_text_run(opened)
        st.rerun()
else:
    st.caption("No finished text audits yet.")
