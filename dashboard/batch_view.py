"""The view of a comparison, a sweep or a sample, shared by the Compare, Trade-off and Sample
pages (not a page).

A batch's runs execute in the process-wide RunManager like any run; this view only starts
them, polls the store about once a second while any is in progress (points and grids
appear as runs finish) and stops polling when all have ended. Numbers come from
``auditlib.report.subject.run_rows``, the same rows the PDF report prints; the table is
``dashboard/batch_table.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import plotly.graph_objects as go
import streamlit as st

from auditlib.access import AccessDenied
from auditlib.engine import batches
from auditlib.engine.controls import WITH_RESULT
from auditlib.errors import AuditInputError
from auditlib.metrics.catalogue import CATALOGUE, epsilon_note
from auditlib.report.charts import (
    PRIVACY_METRICS,
    comparison_figure,
    success_rate_figure,
    tradeoff_figure,
)
from auditlib.report.subject import (
    batch_subject,
    learns_nothing,
    run_rows,
    sample_verdict,
    success_curves,
    utility_caveat,
)
from auditlib.store import TIMED_OUT, UNFINISHED
from auditlib.words import count_of
from dashboard.auth import signed_in_fragment, signed_in_only
from dashboard.batch_table import (  # display_rows: also tests/test_report.py's entry point
    chance_accuracy,
    display_rows,
    undefended_accuracy,
)
from dashboard.downloads import private_download
from dashboard.failures import failure_line
from dashboard.image_display import inline, png_width
from dashboard.resources import get_manager, get_store
from dashboard.run_choices import run_assets
from dashboard.spec_words import settings_text
from dashboard.state import persist
from dashboard.state import set_url_state as _set_url_state
from dashboard.stored_runs import run_verdict
from dashboard.verdict_words import verdict_cell

REFRESH_S = 1.0
GRID_COLUMNS = 3
PSNR = CATALOGUE["psnr"]


def _chart(name: str, figure: Callable[..., go.Figure], *inputs: Any) -> None:
    """``st.plotly_chart(figure(*inputs))``, the figure kept for this session while its inputs
    stay equal: a live view redraws every second, most seconds with no run changed, and
    building a plotly figure takes about 0.1 s of the CPU the runs are using."""
    key = f"_chart.{name}"
    kept = st.session_state.get(key)
    if kept is None or kept[0] != inputs:
        kept = (inputs, figure(*inputs))
        st.session_state[key] = kept
    st.plotly_chart(kept[1], config={"displayModeBar": False})


def start_batch(
    kind: str, title: str, members: Sequence[batches.BatchMember], assets: dict[str, bytes]
) -> str | None:
    """Record the batch and start its runs; its id goes into the URL. Returns an error text."""
    try:
        store = get_store()
        batch_id = batches.record_batch(store, kind, title, members)
        batch = store.get_batch(batch_id)
        assert batch is not None
        manager = get_manager()
        with manager.one_start():  # a batch is admitted whole or refused whole
            batches.launch(manager, batch, assets)
    except AuditInputError as exc:
        return f"Not started: {exc}"
    except Exception as exc:  # Ray or the store failed: say so, keep the page alive
        return failure_line(exc, "The runs could not be started")
    _set_url_state(kind, batch_id)
    return None


@signed_in_only
def _resume(kind: str, batch_id: str) -> None:
    store = get_store()
    batch = store.get_batch(batch_id)
    if batch is None:
        return
    if batch.owner != store.principal.username:  # its runs are its owner's: an admin looks
        st.session_state[f"{kind}.error"] = (
            f"Not restarted: this {kind} belongs to {batch.owner or 'no one'}; only its owner "
            "can restart its runs."
        )
        return
    try:
        assets: dict[str, bytes] = {}
        for member in batches.members_of(batch):
            assets.update(run_assets(member.spec))
        manager = get_manager()
        with manager.one_start():
            batches.launch(manager, batch, assets)
    except AuditInputError as exc:
        st.session_state[f"{kind}.error"] = f"Not restarted: {exc}"
    except Exception as exc:  # Ray or the store failed: say so, keep the page alive
        st.session_state[f"{kind}.error"] = failure_line(exc, "The runs could not be restarted")


def members_words(states: Sequence[batches.MemberState]) -> str:
    """What the batch's runs share, in words: 'attack rtf [audit] · fedsgd, malicious
    server, secure aggregation of 8' (each distinct value where they differ)."""
    settings = [settings_text(s.member.spec) for s in states]
    attacks = ", ".join(dict.fromkeys(t.attack for t in settings)) or "none"
    scenarios = ", ".join(dict.fromkeys(t.scenario for t in settings)) or "none"
    return f"attack {attacks} · {scenarios}"


@signed_in_only
def _cancel(batch_id: str) -> None:
    batch = get_store().get_batch(batch_id)
    if batch is not None:
        batches.cancel(get_manager(), batch)


@signed_in_only
def _picked(kind: str) -> None:
    chosen = st.session_state.get(f"{kind}.picker")
    if chosen:
        _set_url_state(kind, chosen)


def _batch_picker(kind: str) -> bool:
    """Reopen a stored comparison or sweep; False where none is stored (no picker shown)."""
    stored = get_store().list_batches(kind, limit=50)
    if not stored:
        return False
    labels = {
        b.id: f"{b.title or kind} · {b.created_at.astimezone():%Y-%m-%d %H:%M}" for b in stored
    }
    current = st.session_state.get(kind)
    options = [None, *labels]
    # The picker follows the open batch (a new one, or one from a link) until the user picks.
    st.session_state[f"{kind}.picker"] = current if current in options else None
    st.selectbox(
        f"Open a stored {kind}",
        options,
        format_func=lambda i: "—" if i is None else labels[i],
        key=f"{kind}.picker",
        on_change=_picked,
        args=(kind,),
    )
    return True


def _grids(entries) -> None:
    store = get_store()
    columns = st.columns(GRID_COLUMNS)
    for i, entry in enumerate(entries):
        with columns[i % GRID_COLUMNS]:
            run = entry.run
            st.markdown(f"**{entry.label}**")
            if run is None:
                st.caption("not run yet")
                continue
            if entry.grid_png is not None:
                value = None if entry.scores is None else entry.scores.psnr_mean
                verdict = verdict_cell(run_verdict(run), control=False)
                st.image(
                    inline(entry.grid_png),
                    width=min(png_width(entry.grid_png), 360),
                    caption=f"{PSNR.label} {PSNR.text(value)} {PSNR.unit} · {verdict}",
                )
                continue
            live = store.image(run.id, "live")
            if live is not None:
                st.image(
                    inline(live.png),
                    width=min(png_width(live.png), 360),
                    caption=f"step {live.step}",
                )
            event = store.latest_event(run.id)
            progress = 0.0 if event is None or not event.total else event.step / event.total
            status = f"{run.status}: {run.stage}" if run.stage else run.status
            st.progress(min(progress, 1.0), text=status)


# The sample's worst case, by whether its image came back beyond its best guess (None: not
# known, a result scored before the guesses).
WORST_HELP = {
    True: "the best-reconstructed image recovered beyond its best guess.",
    False: "the best reconstruction; no image came back beyond its best guess.",
    None: "the sample's best-reconstructed image.",
}


def _sample(entries) -> None:
    """The verdict over the sample's updates that have a verdict so far."""
    sample = sample_verdict(entries)
    if sample is None:
        st.info("The sample's verdict appears as its updates finish.")
        return
    with st.container(border=True):
        st.subheader("The sample")
        st.markdown(f"**{sample.headline}**")
        st.markdown(sample.sentence)
        low, high = sample.interval
        col1, col2, col3 = st.columns(3)
        col1.metric("Images recovered", f"{sample.images_recovered} of {sample.images}")
        # The interval under the figure, not in it: "100% (29% to 100%)" was cut to
        # "100% (29% to 10..." in a third of the page (issue 52).
        col2.metric("Share of the images recovered", f"{sample.share:.0%}")
        col2.caption(f"95 % interval: {low:.0%} to {high:.0%}")
        worst = sample.worst
        if worst is not None:
            col3.metric(
                worst.worst_label,
                f"{PSNR.text(worst.worst_psnr)} {PSNR.unit}",
                help=f"{worst.worst_image}, update {worst.index + 1}: "
                + WORST_HELP[worst.worst_recovered],
            )
        if len(sample.updates) < len(entries):
            st.caption(
                f"Over the {count_of(len(sample.updates), 'update')} with a verdict so far, "
                f"of {len(entries)}."
            )


def _live(kind: str, batch_id: str, live: bool) -> None:
    store = get_store()
    subject = batch_subject(store, batch_id)
    rows = run_rows(subject.entries)
    unfinished = [r for r in rows if r.status in UNFINISHED]
    if live and not unfinished:
        st.rerun()  # the whole page: the report button appears, polling stops
    # A run stopped by its time budget has a result (scored as it stood): not missing.
    done = [r for r in rows if r.status in WITH_RESULT]
    timed_out = sum(r.status == TIMED_OUT for r in done)
    missing = [r for r in rows if r.status not in (*WITH_RESULT, *UNFINISHED)]
    st.caption(
        f"{len(done)} of {len(rows)} runs have results"
        + (f" ({timed_out} stopped by the time budget)" if timed_out else "")
        + (f", {len(unfinished)} queued or running" if unfinished else "")
        + (f", {len(missing)} not run, cancelled or failed" if missing else "")
        + ". Runs go on in the background; you can leave this page."
    )
    caveat = utility_caveat(subject.entries)
    if caveat:
        st.warning(f"Utility: {caveat}.")
    cancel_col, resume_col, _ = st.columns([1, 1, 3])
    if unfinished:
        cancel_col.button(
            "Cancel the runs", key=f"{kind}.cancel", on_click=_cancel, args=(batch_id,)
        )
    if missing:
        resume_col.button(
            "Run the missing points",
            key=f"{kind}.resume",
            on_click=_resume,
            args=(kind, batch_id),
            help="Starts only the runs without a result; those with one (completed, or stopped "
            "by the time budget) are reused.",
        )
    if kind == "sample":
        _sample(subject.entries)
        _grids(subject.entries)
    elif kind == "comparison":
        _grids(subject.entries)
        _chart("comparison", comparison_figure, rows)
        curves = success_curves(subject.entries)
        if any(curves):
            with st.expander("Attack success rate over PSNR thresholds"):
                _chart("success_rate", success_rate_figure, rows, curves)
    else:
        privacy = st.selectbox(
            "Privacy axis",
            list(PRIVACY_METRICS),
            format_func=lambda k: PRIVACY_METRICS[k][0],
            key=persist("sweep.privacy_axis", "psnr"),
        )
        plotted = [
            r for r in rows if r.metric(privacy) is not None and r.utility_accuracy is not None
        ]
        if plotted:
            _chart("tradeoff", tradeoff_figure, rows, privacy)
        else:
            reason = "no point has finished yet"
            if rows and all(r.status == "completed" for r in rows):
                reason = f"the runs have no {CATALOGUE[privacy].label} and utility to plot"
            st.info(f"The curve appears as points finish ({reason}).")
    verdicts = [run_verdict(e.run) if e.run is not None else None for e in subject.entries]
    undefended, chance = undefended_accuracy(rows), chance_accuracy(rows)
    st.dataframe(
        display_rows(rows, verdicts, first="update" if kind == "sample" else "defense"),
        hide_index=True,
        column_config={
            # "completed" was cut to "complete" at the default width (issue 52).
            "status": st.column_config.TextColumn("status", width="medium"),
            "verdict": st.column_config.TextColumn(
                "verdict",
                width="large",
                help="Each run judged beside the best guess without the update and its "
                "undefended control at the same budget: a level only for a leak ('Labels' "
                "where only the private labels leaked), or 'Low' for a defense that held, "
                "its attacker that knows the defense included, against a control that "
                "leaked; otherwise Inconclusive.",
            ),
        },
    )
    for row in rows:
        unusable = learns_nothing(row)
        if unusable:
            st.warning(f"{row.label}: {unusable}.", icon=":material/block:")
    epsilon = epsilon_note(r.epsilon for r in rows)
    if epsilon:
        st.caption(f"ε: {epsilon}.")
    notes = []
    if undefended is not None:
        notes.append(f"without a defense the model reaches {undefended:.1%}")
    if chance is not None:
        notes.append(f"a guess by class reaches {chance:.1%} (chance)")
    if notes:
        st.caption(f"Utility accuracy: {'; '.join(notes)}.")


@signed_in_only
def _report(kind: str, batch_id: str) -> None:
    from auditlib.report.pdf import report_bytes

    try:
        subject = batch_subject(get_store(), batch_id)
        st.session_state[f"{kind}.pdf"] = (batch_id, report_bytes(subject))
    except Exception as exc:  # the report must never take the page down
        st.session_state[f"{kind}.error"] = failure_line(exc, "The report could not be built")


@signed_in_only
def _delete(kind: str, batch_id: str) -> None:
    store = get_store()
    batch = store.get_batch(batch_id)
    if batch is None:
        return
    try:
        runs, freed = batches.delete(store, batch)
    except AuditInputError as exc:
        st.session_state[f"{kind}.error"] = f"Not deleted: {exc}"
        return
    _set_url_state(kind, None)
    uploads = f" and {count_of(len(freed), 'upload')} no other run used" if freed else ""
    st.session_state[f"{kind}.deleted"] = (
        f"Deleted the {kind} {batch_id[:8]} with {count_of(runs, 'run')}{uploads}."
    )


@signed_in_only
def _close(kind: str) -> None:
    _set_url_state(kind, None)


def _batch_view(kind: str, batch_id: str) -> None:
    store = get_store()
    try:
        batch = store.get_batch(batch_id)
    except AccessDenied as exc:  # a link to another user's comparison or sweep
        st.error(f"This {kind} cannot be opened: {exc}")
        st.button("Close it", key=f"{kind}.close", on_click=_close, args=(kind,))
        return
    if batch is None or batch.kind != kind:
        st.warning(f"{kind.capitalize()} {batch_id} is not in this dashboard's store.")
        st.button("Close it", key=f"{kind}.close", on_click=_close, args=(kind,))
        return
    head_col, close_col = st.columns([5, 1])
    head_col.header(batch.title or kind.capitalize())
    close_col.button("Close", key=f"{kind}.close", on_click=_close, args=(kind,))
    states = batches.batch_state(store, batch)
    st.caption(
        f"{kind.capitalize()} {batch.id} · created "
        f"{batch.created_at.astimezone():%Y-%m-%d %H:%M:%S} · {members_words(states)}"
    )
    error = st.session_state.pop(f"{kind}.error", None)
    if error:
        st.error(error)
    live = any(s.run is not None and s.run.status in UNFINISHED for s in states)
    st.fragment(signed_in_fragment(_live), run_every=REFRESH_S if live else None)(
        kind, batch_id, live
    )
    if live:
        return
    st.button(
        "Build the PDF report",
        key=f"{kind}.report",
        on_click=_report,
        args=(kind, batch_id),
        help="Title page, verdict, threat model, settings, grids, tables, charts, metric "
        "definitions, limits and a reproducibility appendix.",
    )
    built = st.session_state.get(f"{kind}.pdf")
    if built and built[0] == batch_id:
        private_download(
            st,
            "Download the PDF report",
            built[1],
            file_name=f"audit-{kind}-{batch_id[:8]}.pdf",
            mime="application/pdf",
            key=f"{kind}.download",
        )
    with st.popover("Delete…"):
        st.write(
            f"Delete this {kind} with its runs, their events and images, and the uploads no "
            "other run uses? Runs another of your comparisons or sweeps stands on stay. "
            "This cannot be undone."
        )
        st.button("Delete", key=f"{kind}.delete", on_click=_delete, args=(kind, batch_id))


def open_batch(kind: str) -> None:
    """The reopen picker, then the open comparison or sweep (``?comparison=`` / ``?sweep=``)."""
    deleted = st.session_state.pop(f"{kind}.deleted", None)
    if deleted:
        st.success(deleted)
    stored = _batch_picker(kind)
    batch_id = st.session_state.get(kind)
    if batch_id:
        _batch_view(kind, batch_id)
    elif stored:
        st.info(f"No {kind} open. Run one with the button above, or open a stored one above.")
    else:
        st.info(f"No {kind} open, and none is stored yet. Run one with the button above.")
