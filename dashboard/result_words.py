"""A result in words: the headline metrics table and the defense's privacy statement.

Every metric's label, unit, format and definition come from the one catalogue
(``auditlib.metrics.catalogue``); this module only lays them out.
"""

from __future__ import annotations

import math
from typing import Any

from auditlib.metrics.catalogue import CATALOGUE, RECONSTRUCTION_METRICS, MetricInfo, epsilon_note
from auditlib.metrics.scores import Scores
from auditlib.metrics.verdict import Verdict
from auditlib.report.step_words import steps_text
from auditlib.result import AuditSummary, DefenseReport
from auditlib.store import RunRecord
from auditlib.words import count_of
from dashboard.verdict_words import NO_VERDICT

# What the progress line's seconds are, and the Timing section's first figure: the attacks'
# wall time (every attack and twin, from the first one's start).
ATTACK_TIME = "in the attacks"
# The statistics of a metric's spread the table shows (the mean of every other metric).
SPREAD_ROWS = {"psnr": ("mean", "std", "max")}


def number(value: Any, fmt: str) -> str:
    """A number that is not a catalogue metric (steps, seconds, counts); "n/a" for None."""
    if value is None:
        return "n/a"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, fmt)


def row_label(info: MetricInfo, stat: str | None = None) -> str:
    """'PSNR mean (dB)': the catalogue's label, the statistic, the unit."""
    label = f"{info.label} {stat}" if stat else info.label
    return f"{label} ({info.unit})" if info.unit and info.unit != "%" else label


def metric_rows(
    scores: Scores, verdict: Verdict | None = None
) -> tuple[list[dict[str, str]], list[str]]:
    """The headline metrics as (metric, value) rows, the verdict first, and the notes that
    say why a metric is unavailable: the table says "unavailable (note 1)" and each
    distinct reason is written once below it, however many rows share it. The run's FedLeak
    band is never shown alone: only the verdict's level, which is "Inconclusive" where
    nothing follows from the run."""
    out = [{"Metric": "Verdict", "Value": verdict.headline if verdict else NO_VERDICT}]
    notes: list[str] = []
    for info in RECONSTRUCTION_METRICS:
        spread = scores.spreads.get(info.key)
        if info.key == "label_accuracy":
            cells = [(row_label(info), scores.label_accuracy)]
        else:
            stats = SPREAD_ROWS.get(info.key, ("mean",))
            values = [None if spread is None else getattr(spread, s) for s in stats]
            cells = [(row_label(info, s), v) for s, v in zip(stats, values, strict=True)]
        for label, value in cells:
            if value is not None:
                text = info.text(value)
            elif reason := scores.why_unavailable(info.key):
                if reason not in notes:
                    notes.append(reason)
                text = f"unavailable (note {notes.index(reason) + 1})"
            else:
                text = "not computed"
            out.append({"Metric": label, "Value": text})
    return out, [f"{i}. {reason}" for i, reason in enumerate(notes, 1)]


def privacy_text(report: DefenseReport | None) -> str:
    """The defense's privacy statement in words: epsilon, or why there is none."""
    if report is None or (report.epsilon is None and report.epsilon_unavailable_reason is None):
        return "No formal privacy guarantee: the update leaves the client as computed."
    if report.epsilon is None:
        return f"ε unavailable: {report.epsilon_unavailable_reason}"
    parts = [f"ε = {CATALOGUE['epsilon'].text(report.epsilon)}"]
    if report.delta is not None:
        parts.append(f"δ = {number(report.delta, '.3g')}")
    if report.noise_multiplier is not None:
        parts.append(f"noise multiplier {number(report.noise_multiplier, '.3g')}")
    text = ", ".join(parts)
    details = [
        fact
        for fact in (report.accountant, report.unit, report.neighbours, report.sampling)
        if fact
    ]
    text = f"{text} ({'; '.join(details)})" if details else text
    note = epsilon_note([report.epsilon])
    return f"{text}. {note[0].upper()}{note[1:]}." if note else text


def timing_text(record: RunRecord, result: AuditSummary) -> str:
    """The run's two times, each named: the attacks' (the figure the progress line ends on)
    and the whole run's, from its start to its end (victim, attacks, scoring, and the
    utility training where it had one)."""
    timing = result.timing
    per_second = timing.iterations_per_second
    text = (
        f"{number(timing.seconds, '.1f')} s {ATTACK_TIME} (every attack and twin, from the "
        f"first one's start) for {count_of(timing.iterations, 'step')}"
        + (f" ({per_second:.2f} per second)" if per_second else "")
        + f"; stop reason: {result.stop_reason}."
    )
    if record.started_at is not None and record.finished_at is not None:
        whole = (record.finished_at - record.started_at).total_seconds()
        parts = "the victim's update, the attacks, scoring" + (
            " and the utility training" if result.utility is not None else ""
        )
        text += f" The whole run, from its start to its end ({parts}): {whole:.1f} s."
    steps = steps_text(result.attacks)
    return text if steps is None else f"{text} {steps}"


def model_check_text(report: DefenseReport | None) -> str | None:
    """What the client's model check saw ('flagged ...' or 'passed ...'), where the run's
    defense is one (``model-check`` reports it under ``model_check``); None otherwise."""
    seen = None if report is None else report.details.get("model_check")
    return None if seen is None else f"Model check: {seen}."
