"""What the closing sections of the PDF report state, as plain values and text: the
metric definitions (the catalogue's), the limits of the measurement (including what a run
stored by an earlier version did not record), and the reproducibility appendix. Pure
functions over the subject's entries and rows, like ``facts``; ``sections_back`` lays them
out."""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass

import auditlib
from auditlib.attacks import ATTACKS
from auditlib.metrics.catalogue import (
    CATALOGUE,
    EPSILON_NOTE,
    RECONSTRUCTION_METRICS,
    MetricInfo,
    epsilon_note,
)
from auditlib.report.facts import completed, with_runs
from auditlib.report.subject import ReportEntry, RunRow, unavailable_reasons, utility_caveat
from auditlib.report.text import (
    NOT_AVAILABLE,
    NOT_RECORDED,
    clip,
    named,
    number_text,
    package_version,
    when,
)
from auditlib.result import AuditSummary, UtilityUnavailable
from auditlib.store.convert import finite_number
from auditlib.words import count_of

REPORT_PACKAGES = ("reportlab", "plotly", "kaleido", "numpy", "torch", "pillow", "sqlalchemy")
DIRECTION_WORDS = {
    "higher leaks": "Higher means more leakage.",
    "lower leaks": "Lower means more leakage.",
    "higher is better": "",
    "lower is more private": "Smaller is more private.",
}


# ------------------------------------------------------------------------------ definitions


def metric_definitions(
    metrics: Sequence[MetricInfo] = RECONSTRUCTION_METRICS,
) -> list[tuple[str, str]]:
    """(heading, definition) of each metric, from the catalogue, with which way leaks."""
    return [
        (m.heading, " ".join(filter(None, (f"{m.definition}.", DIRECTION_WORDS[m.direction]))))
        for m in metrics
    ]


def metric_definition(entry: ReportEntry | None) -> str | None:
    """How the reference run measured (the definition its result recorded)."""
    return None if entry is None or entry.result is None else entry.result.config.metric_definition


# ------------------------------------------------------------------------------ limits


def limits(entries: Sequence[ReportEntry], rows: Sequence[RunRow]) -> list[str]:
    """What the numbers cannot say, run by run: metrics not computed, budgets below the
    papers', runs not run, failed, timed out or cut short, ε not stated and what it is about."""
    items: list[str] = []
    for metric, reason in unavailable_reasons(entries).items():
        label = CATALOGUE[metric].label if metric in CATALOGUE else metric
        items.append(f"{label} unavailable: {reason}.")
    reduced: dict[tuple[str, int], int] = {}
    for entry in with_runs(entries):
        if entry.spec is None:
            continue
        name, iterations = entry.spec.attack.name, entry.spec.budget.iterations
        info = ATTACKS.get(name)
        if info and info.paper_iterations and iterations < info.paper_iterations:
            reduced[(name, iterations)] = info.paper_iterations
    for (name, iterations), paper in reduced.items():
        items.append(
            f"Budget reduced from the paper's: {name} ran {iterations} optimiser steps per "
            f"restart, its paper {paper}. A longer attack may reconstruct more: a leak found "
            "is a lower bound, and nothing found says little."
        )
    for entry in entries:
        items += run_limits(entry)
    caveat = utility_caveat(entries)
    if caveat:
        items.append(f"Utility: {caveat}.")
    no_epsilon: dict[str, list[str]] = {}
    relations: dict[str, list[str]] = {}  # what each ε is about: neighbours, amplification
    for entry, row in zip(entries, rows, strict=True):
        if not row.has_result or entry.result is None:
            continue
        report = entry.result.defense_report
        if finite_number(row.epsilon) is None:
            reason = report.epsilon_unavailable_reason or "the defense states no privacy guarantee"
            no_epsilon.setdefault(reason, []).append(entry.label)
            continue
        said = [report.neighbours, report.sampling]
        text = "; ".join(str(x) for x in said if x)
        if text:
            relations.setdefault(text, []).append(entry.label)
    items += [f"ε n/a for {named(labels)}: {reason}." for reason, labels in no_epsilon.items()]
    items += [f"ε of {named(labels)}: {text}." for text, labels in relations.items()]
    large = [r.label for r in rows if r.has_result and epsilon_note([r.epsilon])]
    if large:
        items.append(f"ε of {named(large)}: {EPSILON_NOTE}.")
    return items


def unrecorded_parts(result: AuditSummary) -> list[str]:
    """The parts of the report a result stored by an earlier version has no record of."""
    parts = []
    if result.verdict is None:
        parts.append("the verdict")
    if result.metrics.guesses is None or result.metrics.risk is None:
        parts.append("the best guesses (so the images recovered beyond them)")
    if result.metrics.mean("rdlv") is None and result.metrics.why_unavailable("rdlv") is None:
        parts.append("RDLV")
    return parts


def run_limits(entry: ReportEntry) -> list[str]:
    """One run's limits: not run, not completed, stopped early, utility missing or short."""
    label, run, result = entry.label, entry.run, entry.result
    if run is None:
        return [f"{label}: not run yet; it has no numbers."]
    items = []
    if run.status == "timed_out" and entry.has_result:
        items.append(
            f"{label}: the run timed out; its numbers are what it had measured by then, and "
            "count (a leak it found stands, a longer run can only find more)."
        )
    elif run.status != "completed":
        error = f": {clip(run.error, 300)}" if run.error else ""
        items.append(f"{label}: the run is {run.status}{error}.")
    if entry.unreadable:
        items.append(f"{label}: its stored result could not be read ({entry.unreadable}).")
    if result is None:
        return items
    missing = unrecorded_parts(result)
    if missing:
        items.append(
            f"{label}: stored by an earlier version of auditlib; {NOT_RECORDED}: "
            f"{', '.join(missing)}."
        )
    if result.stop_reason and result.stop_reason != "completed":
        items.append(
            f"{label}: the attack stopped early ({result.stop_reason}) after "
            f"{count_of(result.timing.iterations, 'step')}."
        )
    if isinstance(result.utility, UtilityUnavailable):
        items.append(f"{label}: no utility: {result.utility.unavailable_reason}.")
    elif result.measured_utility is not None and not result.measured_utility.complete:
        measured = result.measured_utility
        why = {
            "time budget": f"at its time budget ({number_text(measured.budget_s)} s)",
            "cancelled": "when the run was cancelled",
        }.get(measured.stop_reason, "early")
        items.append(
            f"{label}: the utility training stopped {why} after {measured.rounds_completed} "
            f"of {measured.federation.rounds} rounds; its accuracy is that of a shorter training."
        )
    return items


# ------------------------------------------------------------------------------ appendix


@dataclass(frozen=True)
class Identifiers:
    run_id: str
    spec_id: str
    data_sha256: str
    seed: str
    status: str
    started: str


def identifiers(entry: ReportEntry) -> Identifiers | None:
    """What identifies a run and its data (None: not run)."""
    run = entry.run
    if run is None:
        return None
    data = None if entry.result is None else entry.result.victim.data.content_sha256
    return Identifiers(
        run.id,
        run.spec_id,
        data or NOT_AVAILABLE,
        NOT_RECORDED if entry.spec is None else str(entry.spec.seed),
        run.status,
        when(run.started_at),
    )


def version_counts(entries: Sequence[ReportEntry]) -> dict[str, int]:
    """The package versions the runs with results recorded, with how many runs each."""
    counts: dict[str, int] = {}
    for entry in completed(entries):
        if entry.result is not None:
            text = ", ".join(f"{k} {v}" for k, v in entry.result.versions.items())
            counts[text or NOT_RECORDED] = counts.get(text or NOT_RECORDED, 0) + 1
    return counts


def report_versions() -> str:
    return f"auditlib {auditlib.__version__}, python {platform.python_version()}, " + ", ".join(
        f"{n} {package_version(n)}" for n in REPORT_PACKAGES
    )


def spec_lines(entry: ReportEntry | None) -> list[str]:
    """The reference run's spec as stored, one JSON line per top-level key."""
    if entry is None or entry.run is None:
        return []
    return [
        f"{json.dumps(key)}: {json.dumps(value, sort_keys=True, default=str)}"
        for key, value in sorted(entry.run.spec.items())
    ]
