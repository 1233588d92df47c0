"""Attack lab: choose the scenario, the attack, the defense and the budget; start and watch.

A run executes in the process-wide RunManager (on Ray), never in this page: Start returns at
once with a run id, which goes into the URL (``?run=...``). The live view polls the store
about once a second through a fragment while the run is in progress and stops polling when
it ends; closing the browser does not stop the run.
"""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from auditlib.attacks import ALL_ATTACKS
from auditlib.engine.controls import control_finding, start_with_control
from auditlib.errors import AuditInputError
from auditlib.metrics.risk import RECOVERED_RULE
from auditlib.metrics.verdict import Verdict
from auditlib.result_json import summary_json
from auditlib.store import CANCELLED, COMPLETED, FAILED, TIMED_OUT, RunRecord
from auditlib.words import count_of
from dashboard.common import (
    HISTORY_PAGE,
    NO_VERDICT,
    OUTCOME_STYLE,
    SETUP_PAGE,
    SOK_CITATION,
    LabChoices,
    Setup,
    build_run,
    check_components,
    current_setup,
    defended_spec,
    get_manager,
    get_store,
    metric_rows,
    number,
    png_width,
    privacy_text,
    run_verdict,
    setup_problems,
    spec_text,
)
from dashboard.forms import attack_inputs, budget_inputs, defense_inputs, scenario_inputs
from dashboard.state import set_url_state

REFRESH_S = 1.0
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


# --- starting ----------------------------------------------------------------------------


def _start(setup: Setup, lab: LabChoices) -> None:
    """Start the run; on success its id goes into the session and the URL."""
    st.session_state.pop("start_error", None)
    errors, missing = setup_problems(setup)
    errors += check_components(lab) + missing
    if errors:
        st.session_state["start_error"] = "Not started: " + " ".join(errors)
        return
    try:
        spec, assets, title = build_run(setup, lab)
        # A defended run is judged beside the same attack without the defense (its control).
        run_id, control_id = start_with_control(get_manager(), spec, assets, title)
    except AuditInputError as exc:
        st.session_state["start_error"] = f"Not started: {exc}"
        return
    except Exception as exc:  # Ray or the store failed: say so, keep the page alive
        st.session_state["start_error"] = (
            f"The run could not be started: {type(exc).__name__}: {exc}. This is a problem of "
            "the dashboard or its Ray instance, not of your input."
        )
        return
    set_url_state("run", run_id)
    st.session_state.pop("_events", None)
    st.session_state["control_started"] = control_id


# --- watching a run -------------------------------------------------------------------------


def _events(run_id: str) -> list:
    """The run's events, fetched incrementally (only the new ones on each poll)."""
    cache = st.session_state.get("_events")
    if not cache or cache["run"] != run_id:
        cache = {"run": run_id, "events": []}
    last = cache["events"][-1].seq if cache["events"] else -1
    cache["events"] = cache["events"] + get_store().events(run_id, after_seq=last)
    st.session_state["_events"] = cache
    return cache["events"]


def _loss_figure(events: list) -> go.Figure:
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


def _progress(record: RunRecord, events: list) -> None:
    if not events:
        text = (
            "waiting for a worker"
            if record.status == "queued"
            else "preparing the victim's update and starting the attack"
        )
        if record.finished:
            text = STATUS_TEXT.get(record.status, record.status)
        st.progress(0.0, text=text)
        return
    last = events[-1]
    total = max(int(last.total), 1)
    losses = ", ".join(f"{k} {v:.4g}" for k, v in last.losses.items() if v is not None)
    text = f"step {last.step:,} of {total:,} · {last.elapsed_s:.1f} s"
    if losses:
        text += f" · {losses}"
    if record.finished:
        text = f"{STATUS_TEXT.get(record.status, record.status)}: {text}"
    elif record.stage:  # the attack is done; the run goes on with its utility training
        text = f"{record.stage} · the attack: {text}"
    st.progress(min(max(last.step / total, 0.0), 1.0), text=text)


def _live_view(run_id: str, live: bool) -> None:
    """Status, progress, the reconstruction under the originals and the loss curve.

    Drawn as a fragment that reruns every second while the run is in progress; when it sees
    the run finished it reruns the whole page, which draws the results and stops polling.
    """
    store = get_store()
    record = store.get_run(run_id)
    if record is None:
        return
    if live and record.finished:
        st.rerun()
    events = _events(run_id)
    _progress(record, events)
    if record.finished:
        return
    cancel_col, note_col = st.columns([1, 4], vertical_alignment="center")
    cancel_col.button(
        "Cancel run",
        key="cancel",
        on_click=get_manager().cancel,
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
    images_col, chart_col = st.columns([3, 2], gap="large")
    with images_col:
        originals = store.image(run_id, "originals")
        current = store.image(run_id, "live")
        if originals is not None:
            st.image(
                originals.png,
                width=png_width(originals.png),
                caption="Private images (only the auditor sees them)",
            )
        if current is not None:
            st.image(
                current.png,
                width=png_width(current.png),
                caption=f"The attacker's reconstruction at step {current.step:,}, each image "
                "under the original it matches",
            )
        elif originals is None:
            st.caption("The images appear once the worker has prepared the victim.")
    with chart_col:
        if events:
            st.plotly_chart(_loss_figure(events), config={"displayModeBar": False})


def _verdict_box(verdict: Verdict | None) -> None:
    """The verdict's headline in the colour of its outcome, then its sentence."""
    if verdict is None:
        st.info(
            f"{NO_VERDICT.capitalize()}: this run was stored before the dashboard judged runs "
            "against a guess and an undefended control. Run it again for a verdict.",
            icon=":material/history:",
        )
        return
    kind, icon = OUTCOME_STYLE[verdict.outcome]
    getattr(st, kind)(f"**{verdict.headline}**", icon=icon)
    st.markdown(verdict.sentence)


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


def _scope(summary: dict, verdict: Verdict) -> None:
    """How far the verdict reaches: attacks, restarts, budget, the guesses it was measured
    against, the control, the share of the batch recovered and the threat model."""
    scope, finding = verdict.scope, verdict.finding
    metrics = summary.get("metrics", {})
    with st.container(border=True):
        st.subheader("Scope")
        left, right = st.columns([1, 1], gap="large")
        with left:
            st.markdown(
                f"**Attacks tried** {', '.join(scope.attacks) or 'none'}  \n"
                f"**Restarts** {scope.restarts or 'one start'}  \n"
                f"**Budget** {scope.budget_words()}  \n"
                f"**Defense** {scope.defense}"
            )
            tried = summary.get("attacks") or []
            if len(tried) > 1 or any(a.get("skipped") for a in tried):
                st.table(
                    [
                        {
                            "attack": a.get("label") or a.get("attack"),
                            "settings": a.get("preset") or "library defaults",
                            "result": f"skipped: {a['skipped']}"
                            if a.get("skipped")
                            else a.get("stop_reason", "n/a"),
                            "steps": number(a.get("steps"), ","),
                            "PSNR (dB)": number(a.get("psnr_mean"), ".2f"),
                            "recovered": number(a.get("images_recovered"), "d"),
                        }
                        for a in tried
                    ]
                )
            st.markdown("**Baseline: the best guess without the update**")
            guesses = (metrics.get("baseline") or {}).get("guesses") or []
            st.table(
                [
                    {
                        "reconstruction": "the attack (attacker's pick)",
                        "PSNR (dB)": number(finding.psnr_mean, ".2f"),
                        "SSIM": number(finding.ssim_mean, ".3f"),
                    },
                    *(
                        {
                            "reconstruction": f"guess: {g.get('name')}",
                            "PSNR (dB)": number(g.get("psnr_mean"), ".2f"),
                            "SSIM": number(g.get("ssim_mean"), ".3f"),
                        }
                        for g in guesses
                    ),
                ]
            )
            st.caption(RECOVERED_RULE[0].upper() + RECOVERED_RULE[1:] + ".")
            st.markdown("**Undefended control**")
            if verdict.control is not None:
                st.markdown(f"{verdict.control.figures()} ({verdict.control_note}).")
            else:
                st.markdown(f"{verdict.control_note or 'none'}.")
        with right:
            share = finding.images_recovered / finding.batch_size if finding.batch_size else 0.0
            st.markdown(
                f"**Recovered** {finding.images_recovered} of {count_of(finding.batch_size, 'image')} "
                f"({share:.0%} of the batch) beyond the best guess"
            )
            every = any("attack" in p for p in metrics.get("per_image", []))
            rows = []
            for p in metrics.get("per_image", []):
                row = {
                    "image": p.get("name"),
                    "PSNR (dB)": number(p.get("psnr"), ".2f"),
                    "best guess (dB)": f"{number(p.get('guess_psnr'), '.2f')}"
                    + (f" ({p['best_guess']})" if p.get("best_guess") else ""),
                    "beyond guess": _yes_no(p.get("beyond_guess")),
                    "level": p.get("leakage_level") or "—",
                }
                if every:
                    row["attack"] = p.get("attack", "n/a")
                rows.append(row)
            st.table(rows)
            threat = scope.threat
            st.markdown(
                f"**Threat model** SoK model {threat.sok_model}: {threat.sok_name} ({SOK_CITATION})"
            )
            st.table(
                [
                    {"the attacker": k.item, "knows": "✔" if k.known else "✗", "how": k.detail}
                    for k in threat.knowledge
                ]
            )


def _results(record: RunRecord) -> None:
    summary = record.summary
    status = record.status
    if status == FAILED:
        st.error(f"The run failed: {record.error or 'no reason recorded'}")
    elif status == CANCELLED and summary is None:
        st.warning(f"The run was cancelled before it had a result. {record.error or ''}")
    if summary is None:
        return
    metrics = summary.get("metrics", {})
    oracle = summary.get("oracle_best", {})
    timing = summary.get("timing", {})
    stop_reason = summary.get("stop_reason", status)
    verdict = run_verdict(record)
    st.subheader("Verdict")
    _verdict_box(verdict)
    attack = summary.get("attack", "?")
    headline = (
        f"{'every applicable attack' if attack == ALL_ATTACKS else attack} against "
        f"{summary.get('defense', '?')}: PSNR "
        f"{number(metrics.get('psnr_mean'), '.2f')} dB (mean over "
        f"{count_of(len(metrics.get('per_image', [])), 'image')}), {timing.get('iterations', '?')} "
        f"iterations in {number(timing.get('seconds'), '.1f')} s, stopped: {stop_reason}."
    )
    if status == COMPLETED:
        st.caption(headline)
    else:
        st.warning(f"{headline} The attack did not run to the end; it is scored as it stood.")
    if verdict is not None:
        _scope(summary, verdict)

    st.subheader("Result")
    grid = get_store().image(record.id, "reconstruction")
    grid_col, chart_col = st.columns([3, 2], gap="large")
    if grid is not None:
        grid_col.image(
            grid.png,
            width=png_width(grid.png),
            caption="Top: the private images (only the auditor sees them). Bottom: the "
            "attacker's reconstruction (its lowest-loss restart, chosen without ground truth), "
            "each matched to its original.",
        )
    events = _events(record.id)
    if events:
        chart_col.plotly_chart(_loss_figure(events), config={"displayModeBar": False})
    col1, col2, col3 = st.columns(3)
    col1.metric("PSNR mean (attacker's pick)", f"{number(metrics.get('psnr_mean'), '.2f')} dB")
    col2.metric(
        "Oracle best PSNR (uses ground truth)",
        f"{number(oracle.get('psnr_mean'), '.2f')} dB",
        help="The best restart chosen with the private images: an upper bound on what the "
        "attack found, not a choice the attacker can make.",
    )
    col3.metric("SSIM mean", number(metrics.get("ssim_mean"), ".3f"))

    table_col, side_col = st.columns([1, 1], gap="large")
    with table_col:
        st.subheader("Metrics (attacker's pick)")
        rows, notes = metric_rows(metrics, verdict)
        st.table(rows)
        for note in notes:
            st.caption(note)
        definition = summary.get("config", {}).get("metric_definition")
        if definition:
            st.caption(f"Metric definition: {definition}.")
    with side_col:
        st.subheader("Defense")
        report = summary.get("defense_report") or {}
        st.write(privacy_text(report))
        before, after = report.get("update_norm_before"), report.get("update_norm_after")
        if before is not None and after is not None:
            st.caption(f"Update norm before the defense {before:.4g}, after {after:.4g}.")
        st.subheader("Timing")
        per_second = timing.get("iterations_per_second")
        st.write(
            f"{number(timing.get('seconds'), '.1f')} s for {timing.get('iterations', '?')} "
            "iterations"
            + (f" ({per_second:.2f} per second)" if per_second else "")
            + f"; stop reason: {stop_reason}."
        )

    with st.expander("Per image"):
        rows = [
            {
                "image": p.get("name"),
                "true label": str(p.get("true_label")),
                "recovered label": str(p.get("recovered_label", "n/a")),
                "PSNR (dB)": number(p.get("psnr"), ".2f"),
                "SSIM": number(p.get("ssim"), ".3f"),
                "LPIPS (AlexNet)": number(p.get("lpips_alex"), ".3f"),
            }
            for p in metrics.get("per_image", [])
        ]
        st.table(rows)
    with st.expander("Threat model and victim"):
        st.json(
            summary_json(
                {"threat_model": summary.get("threat_model"), "victim": summary.get("victim")}
            )
        )
    col_json, col_png, col_pdf = st.columns(3)
    col_json.download_button(
        "Download result.json",
        summary_json(summary),
        file_name="result.json",
        mime="application/json",
        key="download_json",
    )
    if grid is not None:
        col_png.download_button(
            "Download reconstruction.png",
            grid.png,
            file_name="reconstruction.png",
            mime="image/png",
            key="download_png",
        )
    col_pdf.button(
        "Build the PDF report",
        key="run_report",
        on_click=_build_report,
        args=(record.id,),
        help="Title page, verdict, threat model, settings, grid, tables, charts, metric "
        "definitions, limits and a reproducibility appendix.",
    )
    report_error = st.session_state.pop("run_report_error", None)
    if report_error:
        col_pdf.error(report_error)
    built = st.session_state.get("run_report_pdf")
    if built and built[0] == record.id:
        col_pdf.download_button(
            "Download the PDF report",
            built[1],
            file_name=f"audit-run-{record.id[:8]}.pdf",
            mime="application/pdf",
            key="download_pdf",
        )


def _build_report(run_id: str) -> None:
    from auditlib.report.pdf import report_bytes
    from auditlib.report.subject import run_subject

    try:
        st.session_state["run_report_pdf"] = (
            run_id,
            report_bytes(run_subject(get_store(), run_id)),
        )
    except Exception as exc:  # the report must never take the page down
        st.session_state["run_report_error"] = f"The report could not be built: {exc}"


def _open_run(run_id: str) -> None:
    set_url_state("run", run_id)
    st.session_state.pop("_events", None)


def _control_view(run_id: str, live: bool) -> None:
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
    _, note, control = control_finding(store, spec)
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
        on_click=_open_run,
        args=(control.id,),
        help="The verdict of this run reads its result beside the control's.",
    )


def _control_running(record: RunRecord) -> bool:
    spec = defended_spec(record)
    if spec is None:
        return False
    _, _, control = control_finding(get_store(), spec)
    return control is not None and not control.finished


def _close_run() -> None:
    set_url_state("run", None)
    st.session_state.pop("_events", None)


def _run_view(run_id: str) -> None:
    record = get_store().get_run(run_id)
    if record is None:
        st.warning(
            f"Run {run_id} is not in this dashboard's store: it was deleted, or the link comes "
            "from another dashboard."
        )
        st.button("Close it", key="close_run", on_click=_close_run)
        return
    head_col, close_col = st.columns([5, 1])
    head_col.header(record.title or f"Run {run_id[:8]}")
    close_col.button("Close", key="close_run", on_click=_close_run, help="Close this view.")
    settings = spec_text(record.spec)
    st.caption(
        f"Run {run_id} · started "
        f"{record.created_at.astimezone():%Y-%m-%d %H:%M:%S} · attack {settings['attack']} · "
        f"defense {settings['defense']} · model {settings['model']} · batch "
        f"{settings['batch']} · {settings['scenario']} · {settings['iterations']} iterations"
    )
    live = not record.finished
    st.fragment(_live_view, run_every=REFRESH_S if live else None)(run_id, live)
    control_live = _control_running(record)
    st.fragment(_control_view, run_every=REFRESH_S if control_live else None)(run_id, control_live)
    if record.finished:
        _results(record)


def main() -> None:
    st.title("Attack lab")
    setup = current_setup()
    lab = LabChoices()
    with st.sidebar:
        scenario_inputs(lab)
        attack_inputs(lab)
        defense_inputs(lab)
        budget_inputs(lab)

    setup_errors, missing = setup_problems(setup)
    errors = setup_errors + check_components(lab)
    images = (
        f"{setup.count} from the '{setup.sample_set}' sample set"
        if setup.source == "samples"
        else count_of(setup.upload_count, "uploaded image")
        if setup.upload_count
        else "every uploaded image"
    )
    info_col, link_col = st.columns([4, 1])
    info_col.markdown(f"**Model** {setup.model_text()} · **Private images** {images}")
    link_col.page_link(SETUP_PAGE, label="Change", icon=":material/tune:")
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

    run_id = st.session_state.get("run")
    if run_id:
        _run_view(run_id)
    else:
        st.info("No run open. Start one, or open a past run from the History page.")
        st.page_link(HISTORY_PAGE, label="History", icon=":material/history:")


main()
