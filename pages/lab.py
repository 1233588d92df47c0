"""Attack lab: choose the scenario, the attack, the defense and the budget; start and watch.

A run executes in the process-wide RunManager (on Ray), never in this page: Start returns at
once with a run id, which goes into the URL (``?run=...``). The live view
(``dashboard/run_live.py``) polls the store through a fragment while the run is in progress
(four times a second while a run just started waits for a worker, then once a second) and
stops polling when it ends; closing the browser does not stop the
run. A finished run is drawn by ``dashboard/run_result.py``.
"""

from __future__ import annotations

import streamlit as st

from auditlib.access import AccessDenied
from auditlib.engine.controls import needs_control, start_with_control
from auditlib.engine.identity import run_identity
from auditlib.engine.preflight import estimate_time
from auditlib.errors import AuditInputError
from auditlib.spec import RunSpec
from auditlib.store import RunRecord
from auditlib.words import count_of
from dashboard.auth import signed_in_fragment
from dashboard.entry import through_app
from dashboard.failures import failure_line
from dashboard.forms import run_inputs
from dashboard.navigation import HISTORY, SETUP
from dashboard.resources import EMIT_EVERY, get_manager, get_store
from dashboard.run_choices import (
    LabChoices,
    build_run,
    check_clients_fit,
    check_components,
)
from dashboard.run_live import (
    REFRESH_S,
    close_run,
    control_running,
    control_view,
    live_view,
    open_run,
    poll_interval,
    started_text,
)
from dashboard.run_result import results
from dashboard.setup_state import Setup, current_setup, setup_problems
from dashboard.spec_words import settings_text, threat_words
from dashboard.stored_runs import run_settings, stored_spec

through_app()  # a run that did not come through app.py goes through it (dashboard/entry.py)


def _start(setup: Setup, lab: LabChoices) -> None:
    """Start the run; on success its id goes into the session and the URL."""
    st.session_state.pop("start_error", None)
    errors, missing = setup_problems(setup)
    errors += check_components(lab) + check_clients_fit(setup, lab) + missing
    if errors:
        st.session_state["start_error"] = "Not started: " + " ".join(errors)
        return
    try:
        spec, assets, title = build_run(setup, lab)
        manager = get_manager()
        # A defended run is judged beside the same attack without the defense (its control);
        # one Start: both are admitted, or neither (the per-user queue limit).
        with manager.one_start():
            run_id, control_id = start_with_control(manager, spec, assets, title)
    except AuditInputError as exc:
        st.session_state["start_error"] = f"Not started: {exc}"
        return
    except Exception as exc:  # Ray or the store failed: say so, keep the page alive
        st.session_state["start_error"] = failure_line(exc, "The run could not be started")
        return
    open_run(run_id)
    st.session_state["control_started"] = control_id


def _estimate(setup: Setup, lab: LabChoices) -> tuple[str | None, str]:
    """What the run Start would begin will take here (``engine.preflight.estimate_time``:
    a few of its attacks' real steps, measured), in words, with the settings it was
    measured for; and the key it holds for (``_estimate_key``; None: no run to measure)."""
    try:
        spec, assets, _ = build_run(setup, lab)
        key = _estimate_key(spec)
    except AuditInputError as exc:
        return None, f"No estimate: {exc}"
    try:
        # The race's rungs on the page's event grid, as its runs place them: one count.
        estimate = estimate_time(spec, assets, emit_every=EMIT_EVERY)
    except AuditInputError as exc:  # refused as the run would be: said until an input changes
        return key, f"No estimate: {exc}"
    settings = settings_text(spec)
    if estimate is None:
        return key, f"No estimate for {settings.model}: it runs in a process of its own."
    text = f"{settings.attack} on {settings.model}: {_sentence(estimate.words())}"
    # Start runs the defended run's control beside it where none is stored (one Start, both
    # runs: ``start_with_control``), so its time is said too, measured as its own.
    control = needs_control(get_manager().store, spec)
    if control is None:
        return key, text
    beside = " Start also runs its control (the same attack without the defense) beside it"
    try:
        control_estimate = estimate_time(control, assets, EMIT_EVERY)
    except AuditInputError as exc:  # refused as its run would be: said, the run's words kept
        return key, f"{text}{beside}, and it would be refused: {exc}"
    if control_estimate is not None:
        text += f"{beside}, sharing this machine: {_sentence(control_estimate.words())}"
    return key, text


def _sentence(words: str) -> str:
    return f"{words[0].upper()}{words[1:]}."


def _estimate_key(spec: RunSpec) -> str:
    """What an estimate holds for: the run's identity (resolving it refuses a bad parameter
    as the run would) and the spec as written (how it computes: a compiled step, left out
    of the identity, changes the pace)."""
    return f"{run_identity(spec)}/{spec.identity()}"


def _run_key(setup: Setup, lab: LabChoices) -> str | None:
    """The estimate key of the run Start would begin (None where it cannot be built)."""
    try:
        return _estimate_key(build_run(setup, lab)[0])
    except AuditInputError:
        return None


def _estimate_box(setup: Setup, lab: LabChoices, blocked: bool) -> None:
    """The estimate button, and once asked, the estimate for the run Start would begin now:
    measured again whenever an input that changes the run changed since (a stale estimate
    is never shown)."""
    asked = st.button(
        "Estimate the time on this machine",
        key="estimate",
        disabled=blocked,
        help="Runs a few real steps of the run's attacks on this model, batch and device "
        "(a few seconds; an attack asked to compile its step compiles it first, which took "
        "20 s to 80 s on a 2-core CPU) and scales them by the planned steps, before anything "
        "runs.",
    )
    shown = st.session_state.get("estimate_shown")  # (estimate key, words)
    if blocked or not (asked or shown):
        st.session_state.pop("estimate_shown", None)
        return
    if asked or shown[0] != _run_key(setup, lab):
        with st.spinner("Measuring a few steps of the run's attacks on this machine..."):
            shown = _estimate(setup, lab)
        st.session_state["estimate_shown"] = shown
    st.info(shown[1], icon=":material/timer:")


def _setup_differs(record: RunRecord, setup: Setup) -> bool:
    """Whether the open run's model (architecture, classes, input, weights) is not the one
    the current Setup describes, the one Start would run."""
    spec = stored_spec(record)
    if spec is None:
        return True  # a spec of an older version: say which runs, to be safe
    ran, now = spec.model.spec, setup.model_spec()
    run_model = (ran.architecture, ran.num_classes, tuple(ran.input_shape))
    setup_model = (now.architecture, now.num_classes, tuple(now.input_shape))
    return run_model != setup_model or spec.model.weights_asset != setup.weights


def _run_view(run_id: str, setup: Setup) -> None:
    try:
        record = get_store().get_run(run_id)
    except AccessDenied as exc:  # a link to another user's run
        st.error(f"This run cannot be opened: {exc}")
        st.button("Close it", key="close_run", on_click=close_run)
        return
    if record is None:
        st.warning(
            f"Run {run_id} is not in this dashboard's store: it was deleted, or the link comes "
            "from another dashboard."
        )
        st.button("Close it", key="close_run", on_click=close_run)
        return
    head_col, close_col = st.columns([5, 1])
    head_col.header(record.title or f"Run {run_id[:8]}")
    close_col.button("Close", key="close_run", on_click=close_run, help="Close this view.")
    settings = run_settings(record)
    st.markdown(f"**This run's model** {settings.model} · **Private images** {settings.batch}")
    started = started_text(record)  # "queued ..." where it has not started
    iterations = (
        settings.iterations_text
        if settings.iterations is None
        else count_of(settings.iterations, "iteration")
    )
    st.caption(
        f"Run {run_id} · {started if record.started_at is None else f'started {started}'} · "
        f"attack {settings.attack} · defense {settings.defense} · {settings.scenario} · "
        f"{iterations} per start"
    )
    if _setup_differs(record, setup):
        st.info(
            f"This run's model is not the Setup's ({setup.model_text()}): Start runs the "
            "Setup's. To run this one again, choose its model on the Setup page.",
            icon=":material/info:",
        )
    interval = poll_interval(record)
    st.fragment(signed_in_fragment(live_view), run_every=interval)(run_id, interval)
    control_live = control_running(record)
    st.fragment(signed_in_fragment(control_view), run_every=REFRESH_S if control_live else None)(
        run_id, control_live
    )
    if record.finished:
        results(record)


def main() -> None:
    st.title("Attack lab")
    setup = current_setup()
    lab = LabChoices()
    run_inputs(lab, setup)

    setup_errors, missing = setup_problems(setup)
    errors = setup_errors + check_components(lab) + check_clients_fit(setup, lab)
    images = setup.images_text()
    info_col, link_col = st.columns([4, 1])
    threat = threat_words(lab.server, lab.secure_aggregation)
    start_runs = "**Start runs the Setup** · " if st.session_state.get("run") else ""
    info_col.markdown(
        f"{start_runs}**Model** {setup.model_text()} · **Private images** {images}"
        + (f" · **Threat model** {threat}" if threat else "")
    )
    link_col.page_link(SETUP.path, label="Change", icon=":material/tune:")
    for message in missing:
        st.info(message)
    for message in errors:
        st.error(message)
    blocked = bool(errors or missing)
    # The click is handled here, after every widget above has given its current value (a
    # callback would see the values of the previous run).
    if st.button(
        "Start the attack",
        type="primary",
        key="start",
        disabled=blocked,
        help="Fix the problems above first."
        if blocked
        else "Runs in the background; you can "
        "leave this page or close the browser, the run goes on.",
    ):
        _start(setup, lab)
    start_error = st.session_state.pop("start_error", None)  # shown once
    if start_error:
        st.error(start_error)
    _estimate_box(setup, lab, blocked)

    run_id = st.session_state.get("run")
    if run_id:
        _run_view(run_id, setup)
    else:
        st.info("No run open. Start one, or open a past run from the History page.")
        st.page_link(HISTORY.path, label="History", icon=":material/history:")


main()
