"""The Attack lab's view of a finished run, read from its typed result (``RunRecord.result``):
the verdict and its scope, the reconstruction, the metrics, the defense's privacy statement,
the timing, per-image scores and the downloads (result.json, the grid, the PDF report).

Labels, units and formats of the metrics come from the catalogue
(``auditlib.metrics.catalogue``).
"""

from __future__ import annotations

import dataclasses

import streamlit as st

from auditlib.attacks import ALL_ATTACKS
from auditlib.metrics.catalogue import CATALOGUE
from auditlib.metrics.risk import RECOVERED_RULE
from auditlib.metrics.verdict import ASSUMED_SETTINGS, Verdict
from auditlib.report.subject import learns_nothing, run_row, run_subject
from auditlib.report.unscored_words import LOSS_HEADING, NO_PICK, rows_caption
from auditlib.result import AuditSummary
from auditlib.result_json import summary_json
from auditlib.store import CANCELLED, COMPLETED, FAILED, RunRecord
from auditlib.words import count_of
from dashboard.auth import signed_in_only
from dashboard.downloads import private_download
from dashboard.failures import failure_line
from dashboard.image_display import show_grid
from dashboard.plain import literal
from dashboard.resources import get_store
from dashboard.result_words import (
    ATTACK_TIME,
    metric_rows,
    model_check_text,
    number,
    privacy_text,
    timing_text,
)
from dashboard.run_live import events, loss_figure
from dashboard.spec_words import scenario_threat
from dashboard.stored_runs import result_problem, run_result, run_verdict, stored_spec
from dashboard.verdict_words import (
    NO_VERDICT,
    OUTCOME_STYLE,
    SERVER_LINES,
    SOK_CITATION,
    attributed_words,
    server_lines,
    whose_images_words,
)

PSNR, SSIM, LPIPS = CATALOGUE["psnr"], CATALOGUE["ssim"], CATALOGUE["lpips"]


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


def _usable(record: RunRecord, result: AuditSummary) -> None:
    """Beside the verdict: that the setting is no usable defense, where the defended model
    learns nothing in the utility training (``subject.learns_nothing``)."""
    if result.measured_utility is None or result.defense == "none":
        return
    unusable = learns_nothing(run_row(run_subject(get_store(), record.id).entries[0]))
    if unusable:
        st.warning(f"Not usable: {unusable}.", icon=":material/block:")


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


def _attacks_table(result: AuditSummary) -> None:
    """The attacks the run planned, where it tried more than one or skipped one."""
    tried = result.attacks
    if len(tried) > 1 or any(a.skipped for a in tried):
        attributes = any(a.images_attributed is not None for a in tried)
        rows = []
        for a in tried:
            row = {
                "attack": a.label or a.attack,
                "settings": a.preset or "library defaults",
                "result": f"skipped: {a.skipped}" if a.skipped else (a.stop_reason or "n/a"),
                "steps": number(a.steps, ","),
                PSNR.heading: PSNR.text(a.psnr_mean),
                f"oracle {PSNR.heading}": PSNR.text(a.oracle_psnr_mean),
                "recovered": number(a.images_recovered, "d"),
            }
            if attributes:
                row["attributed"] = number(a.images_attributed, "d")
            rows.append(row)
        st.table(rows)


def _scope(result: AuditSummary, verdict: Verdict) -> None:
    """How far the verdict reaches: attacks, restarts, budget, the guesses it was measured
    against, the control, the share of the batch recovered and the threat model."""
    scope, finding = verdict.scope, verdict.finding
    metrics = result.metrics
    with st.container(border=True):
        st.subheader("Scope")
        left, right = st.columns([1, 1], gap="large")
        with left:
            st.markdown(
                f"**Attacks tried** {', '.join(scope.attacks) or 'none'}  \n"
                f"**Restarts** {scope.restarts or 'one start'}  \n"
                f"**Budget** {scope.budget_words()}  \n"
                f"**Defense** {scope.defense}"
                + (f"  \n**The client refused the model** {scope.refused}" if scope.refused else "")
                + (
                    f"  \n**Servers the check was tried against** {scope.twins_words}"
                    if scope.evading
                    else ""
                )
            )
            _attacks_table(result)
            if len(result.attacks) > 1:
                st.caption(
                    "Per attack: its own pick (by its own loss) and its oracle best (the "
                    "restart with the highest PSNR, chosen with the private images)."
                )
            st.markdown("**Baseline: the best guess without the update**")
            st.table(
                [
                    {
                        "reconstruction": f"{finding.one_server}'s server, the best single "
                        "server (its own pick)"
                        if finding.one_server
                        else "the attacks, per image the best of their own picks (auditor's view)"
                        if metrics.view
                        else "the attack (attacker's pick)",
                        PSNR.heading: PSNR.text(finding.psnr_mean),
                        SSIM.heading: SSIM.text(finding.ssim_mean),
                    },
                    *(
                        {
                            "reconstruction": f"guess: {g.name}",
                            PSNR.heading: PSNR.text(g.psnr_mean),
                            SSIM.heading: SSIM.text(g.ssim_mean),
                        }
                        for g in metrics.guesses or ()
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
            attributed = attributed_words(result)
            if attributed:
                st.markdown(f"**Attributed** {attributed}")
            every = any(p.attack is not None for p in metrics.per_image)
            rows = []
            for p in metrics.per_image:
                row = {
                    "image": p.name,
                    PSNR.heading: PSNR.text(p.psnr),
                    f"best guess ({PSNR.unit})": PSNR.text(p.guess_psnr)
                    + (f" ({p.best_guess})" if p.best_guess else ""),
                    "beyond guess": _yes_no(p.beyond_guess),
                    "level": p.leakage_level or "—",
                }
                if every:
                    row["attack"] = p.attack or "n/a"
                if p.client is not None:  # secure aggregation: whose image it was
                    row["held by client"] = str(p.client)
                if attributed:
                    row["attributed to client"] = number(p.attributed_client, "d")
                rows.append(row)
            st.table(rows)
            if metrics.view:
                what = "One server's model" if finding.one_server else "Combined scores"
                st.caption(f"{what}: {metrics.view}.")
            if finding.labels_beyond_chance:
                st.markdown(f"**Labels** {finding.label_words()}.")
            if verdict.images_words:  # beside a "Labels" verdict: what is known of the images
                st.markdown(f"**Images** {verdict.images_words}.")
            threat = scope.threat
            st.markdown(
                f"**Threat model** SoK model {threat.sok_model}: {threat.sok_name} ({SOK_CITATION})"
            )
            said = server_lines(threat)
            for heading, words in said:
                st.markdown(f"**{heading}** {words}")
            whose = whose_images_words(threat, result)
            if whose:
                st.markdown(f"**Whose images** {whose}.")
            # The server's lines said above are not the attacker's knowledge ("could have
            # noticed" under "knows" read as a tick for the attacker: issue 52).
            headings = {heading for heading, _ in said}
            st.table(
                [
                    {"the attacker": k.item, "knows": "✔" if k.known else "✗", "how": k.detail}
                    for k in threat.knowledge
                    if SERVER_LINES.get(k.item) not in headings
                ]
            )


def _headline(record: RunRecord, result: AuditSummary) -> None:
    metrics, timing = result.metrics, result.timing
    attack = "every applicable attack" if result.attack == ALL_ATTACKS else result.attack
    spec = stored_spec(record)
    threat = "" if spec is None else scenario_threat(spec.scenario)
    attack += f" ({threat})" if threat else ""
    headline = (
        f"{attack} against {result.defense}: {PSNR.label} {PSNR.text(metrics.psnr_mean)} "
        f"{PSNR.unit} (mean over {count_of(len(metrics.per_image), 'image')}), "
        f"{count_of(timing.iterations, 'step')} in {number(timing.seconds, '.1f')} s {ATTACK_TIME}, stopped: "
        f"{result.stop_reason}."
    )
    if record.status == COMPLETED:
        st.caption(headline)
    else:
        st.warning(f"{headline} The attack did not run to the end; it is scored as it stood.")


def _grid_and_losses(record: RunRecord, caption: str, rows: int = 1):
    """The run's stored grid of ``rows`` rows with ``caption``, its loss curve under it (never
    beside: a wide grid ran under the chart, issue 52); the grid (None where the run has
    none)."""
    grid = get_store().image(record.id, "reconstruction")
    if grid is not None:
        show_grid(st, grid.png, rows, caption)
    chart_col, _ = st.columns([3, 2])
    seen = events(record.id)
    if seen:
        chart_col.plotly_chart(loss_figure(seen), config={"displayModeBar": False})
    return grid


def _reconstruction(record: RunRecord, result: AuditSummary) -> bytes | None:
    """The grid of originals over the reconstruction, the loss curve and the three headline
    numbers; returns the grid's PNG (None where the run has none)."""
    grid = _grid_and_losses(
        record,
        "Top: the private images (only the auditor sees them). Bottom: the attacker's "
        "reconstruction (its lowest-loss restart, chosen without ground truth), each matched "
        "to its original.",
        rows=2,
    )
    col1, col2, col3 = st.columns(3)
    col1.metric(
        f"{PSNR.label} mean (attacker's pick)", f"{PSNR.text(result.metrics.psnr_mean)} {PSNR.unit}"
    )
    col2.metric(
        f"Oracle best {PSNR.label} (uses ground truth)",
        f"{PSNR.text(result.oracle_best.psnr_mean)} {PSNR.unit}",
        help="The best restart chosen with the private images: an upper bound on what the "
        "attack found, not a choice the attacker can make.",
    )
    col3.metric(f"{SSIM.label} mean", SSIM.text(result.metrics.ssim_mean))
    return None if grid is None else grid.png


def _numbers(record: RunRecord, result: AuditSummary, verdict: Verdict | None) -> None:
    """The metrics table with its notes, the defense's privacy statement and the timing."""
    table_col, side_col = st.columns([1, 1], gap="large")
    with table_col:
        st.subheader("Metrics (attacker's pick)")
        rows, notes = metric_rows(result.metrics, verdict)
        st.table(rows)
        for note in notes:
            st.caption(note)
        if result.config.metric_definition:
            st.caption(f"Metric definition: {result.config.metric_definition}.")
    with side_col:
        st.subheader("Defense")
        report = result.defense_report
        st.write(privacy_text(report))
        checked = model_check_text(report)
        if checked:
            st.write(checked)
        before, after = report.update_norm_before, report.update_norm_after
        if before is not None and after is not None:
            st.caption(f"Update norm before the defense {before:.4g}, after {after:.4g}.")
        st.subheader("Timing")
        st.write(timing_text(record, result))


def _details(result: AuditSummary) -> None:
    with st.expander("Per image"):
        st.table(
            [
                {
                    "image": p.name,
                    "true label": str(p.true_label),
                    "recovered label": number(p.recovered_label, "d"),
                    PSNR.heading: PSNR.text(p.psnr),
                    SSIM.heading: SSIM.text(p.ssim),
                    LPIPS.heading: LPIPS.text(p.lpips_alex),
                }
                for p in result.metrics.per_image
            ]
        )
    _threat_and_victim(result, "Threat model and victim")


def _unscored(record: RunRecord, result: AuditSummary, verdict: Verdict | None) -> None:
    """An observed update audited without the client's images: each attack's
    reconstruction and its own loss, never a score (there is nothing to compare with), and
    the training settings its client did not report (the threat card's line)."""
    timing = result.timing
    st.caption(
        f"{result.attack} on the observed update: not scored ({result.unscored}); "
        f"{count_of(timing.iterations, 'step')} in {number(timing.seconds, '.1f')} s {ATTACK_TIME}, "
        f"stopped: {result.stop_reason}."
    )
    st.subheader("Result")
    grid = _grid_and_losses(
        record,
        "What the attacker reconstructed from the update. "
        + rows_caption([a.label or a.attack for a in result.attacks if not a.skipped])
        + " Without the client's images nobody can say how close it is: look at it, or audit "
        "the bundle again with the client's images for scores and a verdict.",
    )
    st.table(
        [
            {
                "attack": a.label or a.attack,
                "result": f"skipped: {a.skipped}" if a.skipped else (a.stop_reason or "n/a"),
                "steps": number(a.steps, ","),
                LOSS_HEADING: number(a.attack_loss, ".4g"),
            }
            for a in result.attacks
        ]
    )
    st.caption(
        "The loss is the attack's own objective: how far its reconstruction's update is from "
        "the observed one. It ranks an attack's restarts; it is not a distance to the images. "
        + NO_PICK
    )
    card = () if verdict is None else verdict.scope.threat.knowledge
    for assumed in (k.detail for k in card if k.item == ASSUMED_SETTINGS):
        # The words are training.json's (a recorder's notes): shown as typed, never as Markdown.
        st.warning(f"**Training settings the client did not report**: {literal(assumed)}")
    _threat_and_victim(result, "Threat model and the observed update")
    _downloads(record, result, None if grid is None else grid.png)


def _threat_and_victim(result: AuditSummary, title: str) -> None:
    """What the attacker knew and what was audited, as result.json records them."""
    with st.expander(title):
        st.json(
            summary_json(
                {
                    "threat_model": dataclasses.asdict(result.threat_model),
                    "victim": result.victim.to_json(),
                }
            )
        )


def _downloads(record: RunRecord, result: AuditSummary, grid: bytes | None) -> None:
    col_json, col_png, col_pdf = st.columns(3)
    private_download(
        col_json,
        "Download result.json",
        summary_json(result.to_json()).encode(),
        file_name="result.json",
        mime="application/json",
        key="download_json",
    )
    if grid is not None:
        private_download(
            col_png,
            "Download reconstruction.png",
            grid,
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
        private_download(
            col_pdf,
            "Download the PDF report",
            built[1],
            file_name=f"audit-run-{record.id[:8]}.pdf",
            mime="application/pdf",
            key="download_pdf",
        )


@signed_in_only
def _build_report(run_id: str) -> None:
    from auditlib.report.pdf import report_bytes
    from auditlib.report.subject import run_subject

    try:
        st.session_state["run_report_pdf"] = (
            run_id,
            report_bytes(run_subject(get_store(), run_id)),
        )
    except Exception as exc:  # the report must never take the page down
        st.session_state["run_report_error"] = failure_line(exc, "The report could not be built")


def results(record: RunRecord) -> None:
    """Everything the finished run ``record`` has to show."""
    status = record.status
    result, problem = run_result(record), result_problem(record)
    if status == FAILED:
        st.error(f"The run failed: {record.error or 'no reason recorded'}")
    elif status == CANCELLED and result is None and problem is None:
        st.warning(f"The run was cancelled before it had a result. {record.error or ''}")
    if problem:
        st.error(f"The run's result cannot be shown: {problem}")
    if result is None:
        return
    verdict = run_verdict(record)
    st.subheader("Verdict")
    _verdict_box(verdict)
    if result.metrics is None:  # an observed update audited without the client's images
        _unscored(record, result, verdict)
        return
    _usable(record, result)
    _headline(record, result)
    if verdict is not None:
        _scope(result, verdict)
    st.subheader("Result")
    grid = _reconstruction(record, result)
    _numbers(record, result, verdict)
    _details(result)
    _downloads(record, result, grid)
