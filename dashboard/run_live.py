"""The Attack lab's view of a run in progress: status, progress, the reconstruction under
the originals, the loss curve, Cancel, and where its undefended control stands.

Each view is drawn as a fragment that polls the store about once a second while its run
is in progress (the live view four times a second until a worker takes the run) and redraws
the whole page when it ends.
"""

from __future__ import annotations

from datetime import UTC, datetime

import plotly.graph_objects as go
import streamlit as st

from auditlib.engine.controls import control_finding
from auditlib.store import CANCELLED, COMPLETED, FAILED, TIMED_OUT, EventRecord, RunRecord
from dashboard.auth import signed_in_only
from dashboard.image_display import show_grid
from dashboard.resources import get_manager, get_store
from dashboard.result_words import ATTACK_TIME
from dashboard.state import set_url_state
from dashboard.stored_runs import defended_spec

REFRESH_S = 1.0
# While a run just started waits for its worker the view polls four times as often, so the
# worker's first word ("preparing the victim's update") shows within a quarter second of it,
# not up to a second later (issue 52: a run shows life at once); once a second when it has
# started, or when it has waited QUEUED_FAST_S (behind other runs: no gain in hurrying).
QUEUED_REFRESH_S = 0.25
QUEUED_FAST_S = 10.0
# Entries of an event's "losses" that count work rather than measure a loss: shown in the
# progress text, not drawn on the loss axis.
COUNTERS = frozenset({"evaluations"})
STATUS_TEXT = {
    "queued": "waiting for a worker",
    "running": "running",
    COMPLETED: "completed",
    CANCELLED: "cancelled",
    TIMED_OUT: "stopped by its time budget",
    FAILED: "failed",
}


def started_text(record: RunRecord) -> str:
    """When the run began: its own start (a comparison's or sweep's runs are all recorded at
    the batch's creation and start one after another), or when it was queued, if it has
    not started yet."""
    if record.started_at is None:
        return f"queued {record.created_at.astimezone():%Y-%m-%d %H:%M:%S}"
    return f"{record.started_at.astimezone():%Y-%m-%d %H:%M:%S}"


@signed_in_only
def _cancel_run(run_id: str) -> None:
    """Cancel for the user as the users file has them at the click (not as the page was
    drawn for them)."""
    get_manager().cancel(run_id)


@signed_in_only
def open_run(run_id: str) -> None:
    """Show run ``run_id`` (its id goes into the session and the URL)."""
    set_url_state("run", run_id)
    st.session_state.pop("_events", None)


@signed_in_only
def close_run() -> None:
    set_url_state("run", None)
    st.session_state.pop("_events", None)


def events(run_id: str) -> list:
    """The run's events, fetched incrementally (only the new ones on each poll)."""
    cache = st.session_state.get("_events")
    if not cache or cache["run"] != run_id:
        cache = {"run": run_id, "events": []}
    last = cache["events"][-1].seq if cache["events"] else -1
    cache["events"] = cache["events"] + get_store().events(run_id, after_seq=last)
    st.session_state["_events"] = cache
    return cache["events"]


def loss_figure(events: list) -> go.Figure:
    keys = [k for k in dict.fromkeys(k for e in events for k in e.losses) if k not in COUNTERS]
    steps = [e.step for e in events]
    fig = go.Figure()
    values = []
    for key in keys:
        ys = [e.losses.get(key) for e in events]
        values += [y for y in ys if y is not None]
        fig.add_scatter(x=steps, y=ys, mode="lines+markers", name=key, marker={"size": 4})
    fig.update_layout(
        title="Attack loss",
        height=340,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        xaxis_title="step",
        yaxis_title="loss (log scale)" if values and min(values) > 0 else "loss",
        legend={"orientation": "h", "y": -0.25},
    )
    if values and min(values) > 0:
        fig.update_yaxes(type="log")
    return fig


# Counts an attack reports beside its losses, in words (never the attack's internal key).
COUNT_WORDS = {
    "images_not_read_back": ("image not read back", "images not read back"),
    "evaluations": ("evaluation", "evaluations"),
}


def _loss_words(key: str, value: float) -> str:
    """'loss 0.0123', '4 images not read back', '1 evaluation'."""
    if key in COUNT_WORDS and float(value).is_integer():
        one, many = COUNT_WORDS[key]
        return f"{int(value):,} {one if int(value) == 1 else many}"
    return f"{key.replace('_', ' ')} {value:.4g}"


def progress_text(record: RunRecord, last: EventRecord) -> str:
    """The progress line under the bar: the step, the seconds spent in the attacks, the
    latest losses. A finished run states the steps and seconds its timing recorded (the
    Timing section's figures, ``RunRecord.iterations``/``seconds``), not its last event's."""
    total = max(int(last.total), 1)
    steps, seconds = last.step, last.elapsed_s
    if record.finished and record.iterations is not None and record.seconds is not None:
        steps, seconds = record.iterations, record.seconds
    losses = ", ".join(_loss_words(k, v) for k, v in last.losses.items() if v is not None)
    text = f"step {steps:,} of {total:,} · {seconds:.1f} s {ATTACK_TIME}"
    if losses:
        text += f" · {losses}"
    if record.finished:
        text = f"{STATUS_TEXT.get(record.status, record.status)}: {text}"
    elif record.stage:  # the attack is done; the run goes on with its utility training
        text = f"{record.stage} · the attack: {text}"
    return text


def waiting_text(record: RunRecord) -> str:
    """Why a queued run has not started, in one line (``RunManager.waiting_reason``)."""
    reason = get_manager().waiting_reason(record.id)
    return STATUS_TEXT["queued"] if reason is None else reason.words


def _progress(record: RunRecord, events: list[EventRecord]) -> None:
    if not events:
        text = (
            waiting_text(record)
            if record.status == "queued"
            else "preparing the victim's update and starting the attack"
        )
        if record.finished:
            text = STATUS_TEXT.get(record.status, record.status)
        st.progress(0.0, text=text)
        return
    last = events[-1]
    total = max(int(last.total), 1)
    st.progress(min(max(last.step / total, 0.0), 1.0), text=progress_text(record, last))


def poll_interval(record: RunRecord, now: datetime | None = None) -> float | None:
    """Seconds between the live view's polls of ``record`` (at ``now``, UTC): none once it
    has ended."""
    if record.finished:
        return None
    waited = ((now or datetime.now(UTC)) - record.created_at).total_seconds()
    hurry = record.status == "queued" and waited < QUEUED_FAST_S
    return QUEUED_REFRESH_S if hurry else REFRESH_S


def live_view(run_id: str, interval: float | None) -> None:
    """Status, progress, the reconstruction under the originals and the loss curve.

    Drawn as a fragment that reruns every ``interval`` seconds (``poll_interval``; None: the
    run had ended when the page was drawn) while the run is in progress; when the interval
    it should poll at changes (the run started, or waited long) it reruns the whole page at
    its next pass (``_rerun_due``), which then polls at the new one, and when it sees the
    run finished, the whole page draws the results and stops polling.
    """
    store = get_store()
    record = store.get_run(run_id)
    if record is None:
        return
    live = interval is not None
    if live and record.finished:
        st.rerun()
    seen = events(run_id)
    _progress(record, seen)
    if live and poll_interval(record) != interval and _rerun_due(run_id, interval):
        st.rerun()
    if record.finished:
        return
    cancel_col, note_col = st.columns([1, 4], vertical_alignment="center")
    cancel_col.button(
        "Cancel run",
        key="cancel",
        on_click=_cancel_run,
        args=(run_id,),
        disabled=record.cancel_requested,
        help="Stops the attack; what it has reconstructed so far is still scored.",
    )
    if record.cancel_requested:
        note_col.caption("Cancellation requested; the attack stops at its next step.")
    else:
        note_col.caption(
            "The run goes on in the background: you can leave this page or close the "
            "browser, and reopen it from History."
        )
    # The images over the full width, wrapped into blocks that fit; the chart under them
    # (beside them, a wide row of images ran under it: issue 52).
    originals = store.image(run_id, "originals")
    current = store.image(run_id, "live")
    if originals is not None:
        show_grid(st, originals.png, 1, "Private images (only the auditor sees them)")
    if current is not None:
        show_grid(
            st,
            current.png,
            1,
            f"The attacker's reconstruction at step {current.step:,}, each image in the place "
            "of the original it matches",
        )
    elif originals is None:
        st.caption("The images appear once the worker has prepared the victim.")
    chart_col, _ = st.columns([3, 2])
    if seen:
        chart_col.plotly_chart(loss_figure(seen), config={"displayModeBar": False})


def _rerun_due(run_id: str, interval: float) -> bool:
    """Whether the page reruns now to poll at the run's new interval: at the second pass
    that finds the fragment's interval stale, not the first. A bar drawn by a pass that
    then reruns the page shows only when the page has drawn it again: with a warm worker,
    the worker's first word ("preparing the victim") showed 0.69-0.80 s after Start so,
    0.57 s when the pass that first saw the run started kept its bar (docs/PERFORMANCE.md,
    the sixteen-image browser test timed in the page)."""
    stale = (run_id, interval)
    if st.session_state.get("live_interval_stale") == stale:
        return True
    st.session_state["live_interval_stale"] = stale
    return False


def control_view(run_id: str, live: bool) -> None:
    """Where the undefended control of a defended run stands, with a link to it; a fragment
    that polls while the control is in progress and redraws the page when it ends (the
    verdict of the defended run depends on it)."""
    store = get_store()
    record = store.get_run(run_id)
    if record is None:
        return
    spec = defended_spec(record)
    if spec is None:
        return
    _, note, control = control_finding(store, spec, of=record)
    if control is None:
        st.caption(f"Undefended control: {note}.")
        return
    if live and control.finished and record.finished:
        st.rerun()
    event = store.latest_event(control.id)
    progress = ""
    if not control.finished and event is not None and event.total:
        progress = f", step {event.step:,} of {int(event.total):,}"
    started = (
        " (started with this run)" if st.session_state.get("control_started") == control.id else ""
    )
    text_col, open_col = st.columns([4, 1], vertical_alignment="center")
    text_col.caption(
        f"Undefended control, the same attack at the same budget without the defense: run "
        f"{control.id[:8]}{started}, {STATUS_TEXT.get(control.status, control.status)}{progress}."
    )
    open_col.button(
        "Open the control",
        key="open_control",
        on_click=open_run,
        args=(control.id,),
        help="The verdict of this run reads its result beside the control's.",
    )


def control_running(record: RunRecord) -> bool:
    spec = defended_spec(record)
    if spec is None:
        return False
    _, _, control = control_finding(get_store(), spec, of=record)
    return control is not None and not control.finished
