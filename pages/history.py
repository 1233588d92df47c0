"""History page: every run in the store with its settings and metrics; open or delete one.

Opening a run puts its id into the URL (``?run=...``) and shows it in the Attack lab, live if
it is still in progress. The table refreshes itself while runs are in progress.
"""

from __future__ import annotations

import streamlit as st

from auditlib.metrics.catalogue import CATALOGUE
from auditlib.store import STATUSES, RunRecord
from dashboard.auth import signed_in_fragment
from dashboard.deletion_words import deleted_text
from dashboard.entry import through_app
from dashboard.navigation import LAB
from dashboard.resources import get_manager, get_store
from dashboard.run_live import open_run, started_text
from dashboard.state import set_url_state, url_state
from dashboard.stored_runs import run_result, run_settings, run_verdict
from dashboard.verdict_words import verdict_cell

through_app()  # a run that did not come through app.py goes through it (dashboard/entry.py)

LIMIT = 200
REFRESH_S = 2.0
# The run's headline metrics, kept as columns of the store (``RunRecord``).
PSNR, SSIM, LPIPS = CATALOGUE["psnr"], CATALOGUE["ssim"], CATALOGUE["lpips"]
LABELS = CATALOGUE["label_accuracy"]


def _verdict(record: RunRecord) -> str | None:
    """The verdict cell: None while a run has no result (unfinished, failed)."""
    if run_result(record) is None:
        return None
    return verdict_cell(run_verdict(record))


def _rows(records: list[RunRecord]) -> list[dict]:
    rows = []
    for r in records:
        settings = run_settings(r)
        # The verdict and PSNR first: what a reader looks for must not hide off to the right.
        rows.append(
            {
                "started": started_text(r),
                "status": r.status,
                "verdict": _verdict(r),
                PSNR.heading: r.psnr_mean,
                "attack": settings.attack,
                "defense": settings.defense,
                "model": settings.model,
                "batch": settings.batch,
                "scenario": settings.scenario,
                "iterations": r.iterations if r.iterations is not None else settings.iterations,
                "seconds": None if r.seconds is None else round(r.seconds, 1),
                SSIM.heading: r.ssim_mean,
                LPIPS.heading: r.lpips_mean,
                LABELS.heading: None if r.label_accuracy is None else LABELS.text(r.label_accuracy),
                "run": r.id,
            }
        )
    return rows


def _label(record: RunRecord) -> str:
    psnr = (
        f" · {PSNR.label} {PSNR.text(record.psnr_mean)} {PSNR.unit}"
        if record.psnr_mean is not None
        else ""
    )
    verdict = _verdict(record)
    return f"{started_text(record)} · {record.title or record.id[:8]} · {record.status}{psnr}" + (
        f" · {verdict}" if verdict else ""
    )


def _table(live: bool, statuses: list[str]) -> None:
    """The run table; a fragment that reruns while runs are in progress."""
    records = get_store().list_runs(limit=LIMIT)
    if statuses:
        records = [r for r in records if r.status in statuses]
    if live and not get_manager().active_runs():
        st.rerun()  # the last run ended: redraw once and stop refreshing
    if not records:
        st.info("No runs yet. Start one in the Attack lab.")
        return
    st.dataframe(
        _rows(records),
        hide_index=True,
        column_config={
            "run": st.column_config.TextColumn("run id", width="small"),
            "verdict": st.column_config.TextColumn(
                "verdict",
                width="large",
                help="The run judged beside the best guess without the update and, for a "
                "defended run, its undefended control. Only a leak (of images, or 'Labels' "
                "of the private labels), or a defense that held against a control that "
                "leaked, carries a level; anything else is Inconclusive.",
            ),
            # Numbers in the catalogue's format (they stay numbers, so the columns sort).
            **{
                m.heading: st.column_config.NumberColumn(format=f"%{m.format}")
                for m in (PSNR, SSIM, LPIPS)
            },
        },
    )
    st.caption(f"{len(records)} run(s), newest first (at most {LIMIT}).")


def _open(run_id: str) -> None:
    open_run(run_id)
    st.switch_page(LAB.path, query_params=url_state())


def main() -> None:
    st.title("History")
    if "_deleted" in st.session_state:
        st.success(st.session_state.pop("_deleted"))
    manager = get_manager()
    if orphans := manager.orphans_failed:
        st.warning(
            f"{orphans:,} of your runs {'was' if orphans == 1 else 'were'} still in progress "
            "when the dashboard process running them stopped. Their workers are gone, so they "
            "are marked failed (each says why); start them again to get a result."
        )
    statuses = st.multiselect(
        "Status", sorted(STATUSES), key="history_status", placeholder="every status"
    )
    live = bool(manager.active_runs())
    st.fragment(signed_in_fragment(_table), run_every=REFRESH_S if live else None)(live, statuses)

    records = get_store().list_runs(limit=LIMIT)
    if statuses:
        records = [r for r in records if r.status in statuses]
    if not records:
        return
    st.subheader("Open a run")
    by_id = {r.id: r for r in records}
    labels = {r.id: _label(r) for r in records}  # now: a label reads the signed-in user's store
    current = st.session_state.get("run")
    ids = list(by_id)
    run_id = st.selectbox(
        "Run",
        ids,
        index=ids.index(current) if current in by_id else 0,
        format_func=labels.__getitem__,
        key="history_run",
    )
    open_col, delete_col, _ = st.columns([2, 1, 3])
    if open_col.button("Open in the Attack lab", type="primary", key="open_run"):
        _open(run_id)
    record = by_id[run_id]
    active = manager.is_active(run_id) or not record.finished
    with delete_col.popover("Delete…", disabled=active, help="Only finished runs can be deleted."):
        st.write(
            f"Delete run {run_id[:8]} with its events and images, and the uploads (weights, "
            "images) no other run uses? This cannot be undone."
        )
        if st.button("Delete", key="delete_run"):
            freed = get_store().delete_run(run_id)
            if st.session_state.get("run") == run_id:
                set_url_state("run", None)
            for asset in freed:  # a page that still names it would say it is gone
                if st.session_state.get("weights") == asset.sha256:
                    set_url_state("weights", None)
                if st.session_state.get("images") == asset.sha256:
                    set_url_state("images", None)
            st.session_state["_deleted"] = deleted_text(run_id, freed)
            st.rerun()


main()
