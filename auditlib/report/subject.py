"""What a report (or a Compare / Trade-off page) is about: runs read from the store.

One definition of a run's table row (:func:`summary_row`), used by the pages, the charts
and the PDF, so the dashboard and the report never disagree about a number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from auditlib.engine.batches import batch_state
from auditlib.engine.controls import WITH_RESULT, control_finding, stored_verdict, verdict_of
from auditlib.errors import AuditInputError
from auditlib.metrics.verdict import Verdict
from auditlib.spec import run_spec_from_dict
from auditlib.store import RECONSTRUCTION, RunRecord, Store

RECOVERED_PSNR_DB = 20.0  # FedLeak's "Very High" floor: an image counts as recovered above it


@dataclass(frozen=True)
class ReportEntry:
    """One run of the subject, with its place in the batch."""

    label: str
    series: str
    knob: str | None
    value: float | None
    run: RunRecord | None  # None: the member has not been run yet
    grid_png: bytes | None  # originals (top row) over the matched reconstructions
    verdict: Verdict | None = None  # composed with the control; None: no result or no verdict
    control_run: RunRecord | None = None  # the undefended control of a defended run

    @property
    def has_result(self) -> bool:
        """Completed or timed out with scores: a run whose numbers count."""
        return self.run is not None and self.run.status in WITH_RESULT and bool(self.run.summary)


@dataclass(frozen=True)
class ReportSubject:
    kind: Literal["run", "comparison", "sweep"]
    id: str  # the run's or the batch's id
    title: str
    created_at: datetime
    entries: tuple[ReportEntry, ...]


def _grid(store: Store, run: RunRecord | None) -> bytes | None:
    if run is None:
        return None
    image = store.image(run.id, RECONSTRUCTION)
    return None if image is None else image.png


def _judged(store: Store, run: RunRecord | None) -> tuple[Verdict | None, RunRecord | None]:
    """The run's verdict composed with its control (``controls.verdict_of``), and the
    control's run; (None, None) for a run without a result or stored before verdicts."""
    if run is None or run.status not in WITH_RESULT or not run.summary:
        return None, None
    try:
        spec = run_spec_from_dict(run.spec)
    except (AuditInputError, KeyError, TypeError, ValueError):  # a spec of an older version
        return stored_verdict(run.summary), None
    control_run = control_finding(store, spec)[2] if spec.control() is not None else None
    return verdict_of(store, run), control_run


def _entry(
    store: Store,
    label: str,
    series: str,
    knob: str | None,
    value: float | None,
    run: RunRecord | None,
) -> ReportEntry:
    verdict, control_run = _judged(store, run)
    return ReportEntry(label, series, knob, value, run, _grid(store, run), verdict, control_run)


def run_subject(store: Store, run_id: str) -> ReportSubject:
    run = store.get_run(run_id)
    if run is None:
        raise AuditInputError(f"no run {run_id!r} in {store.url}")
    defense = run.spec.get("defense", {}).get("name", "?")
    entry = _entry(store, run.title or defense, defense, None, None, run)
    return ReportSubject("run", run.id, run.title or f"run {run.id[:8]}", run.created_at, (entry,))


def batch_subject(store: Store, batch_id: str) -> ReportSubject:
    batch = store.get_batch(batch_id)
    if batch is None:
        raise AuditInputError(f"no comparison or sweep {batch_id!r} in {store.url}")
    entries = tuple(
        _entry(store, s.member.label, s.member.series, s.member.knob, s.member.value, s.run)
        for s in batch_state(store, batch)
    )
    kind: Literal["comparison", "sweep"] = "sweep" if batch.kind == "sweep" else "comparison"
    return ReportSubject(kind, batch.id, batch.title or batch.kind, batch.created_at, entries)


def dig(mapping: Any, *keys: str) -> Any:
    """``mapping[k1][k2]...``, or None where a level is missing or not a dict."""
    for key in keys:
        if not isinstance(mapping, dict):
            return None
        mapping = mapping.get(key)
    return mapping


def recovered_share(metrics: dict[str, Any] | None) -> float | None:
    """Share of matched images at or above RECOVERED_PSNR_DB (the attack's success rate)."""
    for point in dig(metrics, "risk", "psnr_success_rate") or []:
        if point["threshold"] == RECOVERED_PSNR_DB:
            return point["rate"]
    return None


def beyond_guess(metrics: dict[str, Any] | None) -> tuple[int, int] | None:
    """(images recovered beyond the best guess, batch size); None for runs scored before
    the guesses."""
    risk = dig(metrics, "risk") or {}
    if risk.get("images_recovered") is None or not risk.get("batch_size"):
        return None
    return int(risk["images_recovered"]), int(risk["batch_size"])


def verdict_level(entry: ReportEntry) -> str | None:
    """The level a table may print: the composed verdict's ("Inconclusive" where it is
    one, never a band of a run that showed nothing); None without a verdict."""
    return entry.verdict.level if entry.verdict is not None else None


def undefended_accuracy(entry: ReportEntry) -> float | None:
    """The accuracy of the same utility training without the defense: the run's own when
    it has none, else its control's."""
    if entry.run is not None and entry.run.spec.get("defense", {}).get("name") == "none":
        return dig(entry.run.summary, "utility", "accuracy")
    control = entry.control_run
    if control is None or control.status not in WITH_RESULT:
        return None
    return dig(control.summary, "utility", "accuracy")


def summary_row(entry: ReportEntry) -> dict[str, Any]:
    """The table row of one run: status, attack metrics, verdict, utility, epsilon.

    Values are None where the run has none (not run, unfinished, metric unavailable).
    ``level`` is the composed verdict's level ("Inconclusive" included), ``finding``
    whether it is one a reviewer may quote; both come only from ``entry.verdict``.
    """
    run = entry.run
    summary = run.summary if run is not None else None
    metrics = dig(summary, "metrics")
    utility = dig(summary, "utility")
    verdict = entry.verdict
    return {
        "label": entry.label,
        "series": entry.series,
        "knob": entry.knob,
        "value": entry.value,
        "status": "not run" if run is None else run.status,
        "has_result": entry.has_result,
        "run_id": None if run is None else run.id,
        "psnr": dig(metrics, "psnr_mean"),
        "ssim": dig(metrics, "ssim_mean"),
        "lpips": dig(metrics, "lpips_mean"),
        "mse": dig(metrics, "mse_mean"),
        "label_accuracy": dig(metrics, "label_accuracy"),
        "recovered": recovered_share(metrics),
        "beyond_guess": beyond_guess(metrics),
        "rdlv": dig(metrics, "rdlv_mean"),
        "plain_psnr": twin_psnr(summary, adaptive=False),
        "adaptive_psnr": twin_psnr(summary, adaptive=True),
        "level": verdict_level(entry),
        "finding": verdict is not None and verdict.is_finding,
        "outcome": None if verdict is None else verdict.outcome,
        "utility_accuracy": dig(utility, "accuracy"),
        "utility_chance": dig(utility, "chance_accuracy"),
        "utility_undefended": undefended_accuracy(entry),
        "utility_f1": dig(utility, "macro_f1"),
        "utility_without_key": dig(utility, "accuracy_without_key"),
        "utility_cut_short": utility_cut_short(utility),
        "epsilon": dig(summary, "defense_report", "epsilon"),
        "seconds": None if run is None else run.seconds,
    }


def twin_psnr(summary: Any, *, adaptive: bool) -> float | None:
    """The best mean PSNR of the run's plain attacks, or of their adaptive twins (the
    attacker that knows the defense); None unless twins ran (the verdict takes the stronger)."""
    records = dig(summary, "attacks") or []
    if not any(r.get("adaptive") for r in records):
        return None
    values = [
        r["psnr_mean"]
        for r in records
        if bool(r.get("adaptive")) == adaptive and r.get("psnr_mean") is not None
    ]
    return max(values, default=None)


def utility_cut_short(utility: Any) -> str | None:
    """'2 of 5 rounds, time budget' for a utility training that stopped early; else None."""
    if not isinstance(utility, dict) or utility.get("complete") is not False:
        return None
    rounds = dig(utility, "federation", "rounds")
    return (
        f"{utility.get('rounds_completed')} of {rounds} rounds, "
        f"{utility.get('stop_reason') or 'stopped early'}"
    )


def success_curves(entries: Sequence[ReportEntry]) -> list[list[dict[str, float]]]:
    """Each run's PSNR success-rate curve (``risk["psnr_success_rate"]``; [] if none)."""
    return [
        dig(e.run.summary if e.run else None, "metrics", "risk", "psnr_success_rate") or []
        for e in entries
    ]


def summary_rows(entries: Sequence[ReportEntry]) -> list[dict[str, Any]]:
    return [summary_row(e) for e in entries]


def unavailable_reasons(entries: Sequence[ReportEntry]) -> dict[str, str]:
    """Every "<metric>_unavailable_reason" met in the runs' metrics (first reason per metric)."""
    reasons: dict[str, str] = {}
    for entry in entries:
        metrics = dig(entry.run.summary if entry.run else None, "metrics") or {}
        for key, value in metrics.items():
            if key.endswith("_unavailable_reason") and value:
                reasons.setdefault(key.removesuffix("_unavailable_reason"), str(value))
    return reasons


LEARNED_MARGIN = 0.05  # accuracy the training must add for its costs to be readable


def utility_caveat(entries: Sequence[ReportEntry]) -> str | None:
    """Why the utility column cannot be read as the defenses' cost, or None.

    The cost of a defense is the accuracy it takes away from a model that learns. When the
    undefended run (or, without one, every run) gains less than LEARNED_MARGIN over its
    initial accuracy, the training itself failed (DLG's sigmoid LeNet does in a few FedAvg
    rounds), and equal accuracies say nothing about the defenses.
    """
    measured = []
    for entry in entries:
        utility = dig(entry.run.summary if entry.run else None, "utility")
        if isinstance(utility, dict) and utility.get("accuracy") is not None:
            measured.append((entry, utility))
    if not measured:
        return None
    baseline = [(e, u) for e, u in measured if e.series == "none"] or measured
    if any(u["accuracy"] - u["initial_accuracy"] >= LEARNED_MARGIN for _, u in baseline):
        return None
    entry, utility = baseline[0]
    who = "the undefended model" if entry.series == "none" else "no run's model"
    return (
        f"{who} barely learned in the utility training ({utility['initial_accuracy']:.1%} "
        f"before, {utility['accuracy']:.1%} after {utility['rounds_completed']} rounds), so "
        "the accuracies do not measure what the defenses cost; train longer, or use a "
        "model that trains under FedAvg (DLG's sigmoid LeNet does not in a few rounds: a "
        "ReLU activation does)"
    )
