"""What a report (or a Compare / Trade-off page) is about: runs read from the store.

Each run is read once, typed: its result (:class:`~auditlib.result.AuditSummary`, any stored
shape) and its spec (:class:`~auditlib.spec.RunSpec`, or None for a spec of an older
version). One definition of a run's table row (:class:`RunRow`, built by :func:`run_row`),
used by the pages, the charts and the PDF, so the dashboard and the report never disagree
about a number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from auditlib.engine.batches import batch_state
from auditlib.engine.controls import WITH_RESULT, control_finding, stored_verdict, verdict_of
from auditlib.errors import AuditInputError
from auditlib.fl.federated import LEARNED_MARGIN, learned
from auditlib.metrics.catalogue import CATALOGUE, RECOVERED_PSNR_DB
from auditlib.metrics.sample import SampleVerdict, UpdateOutcome
from auditlib.metrics.scores import Scores, SuccessPoint
from auditlib.metrics.verdict import Outcome, Verdict
from auditlib.result import AuditSummary, UtilityRecord, UtilityUnavailable
from auditlib.spec import RunSpec, run_spec_from_dict
from auditlib.store import RECONSTRUCTION, RunRecord, Store
from auditlib.store.convert import finite_number
from auditlib.store.engine import describe
from auditlib.store.retention import where_and_how_long

SPEC_ERRORS = (AuditInputError, KeyError, TypeError, ValueError)  # a spec of an older version


@dataclass(frozen=True)
class ReportEntry:
    """One run of the subject, with its place in the batch, read from the store."""

    label: str
    series: str
    knob: str | None
    value: float | None
    run: RunRecord | None  # None: the member has not been run yet
    grid_png: bytes | None  # originals (top row) over the matched reconstructions
    verdict: Verdict | None = None  # composed with the control; None: no result or no verdict
    control_run: RunRecord | None = None  # the undefended control of a defended run
    result: AuditSummary | None = None  # the run's typed result; None: none (or unreadable)
    spec: RunSpec | None = None  # None: not run, or a spec this version no longer reads
    unreadable: str | None = None  # why a stored result could not be read

    @property
    def has_result(self) -> bool:
        """Completed or timed out with scores: a run whose numbers count."""
        return self.run is not None and self.run.status in WITH_RESULT and self.result is not None

    @property
    def scores(self) -> Scores | None:
        """The attacker-selected scores (the headline numbers), where the run has a result."""
        return None if self.result is None else self.result.metrics


@dataclass(frozen=True)
class ReportSubject:
    kind: Literal["run", "comparison", "sweep", "sample"]
    id: str  # the run's or the batch's id
    title: str
    created_at: datetime
    entries: tuple[ReportEntry, ...]
    storage: str = ""  # where the audit's data lives and for how long (store.retention)


def read_result(run: RunRecord | None) -> tuple[AuditSummary | None, str | None]:
    """The run's typed result and, where a stored one cannot be read, why."""
    if run is None:
        return None, None
    try:
        return run.result, None
    except AuditInputError as exc:
        return None, str(exc)


def read_spec(run: RunRecord | None, result: AuditSummary | None) -> RunSpec | None:
    """The run's spec, typed: as stored with the run, else as its result recorded it; None
    where neither reads (a spec of an older version)."""
    candidates = [] if run is None else [run.spec]
    if result is not None:
        candidates.append(dict(result.config.spec))
    for data in candidates:
        try:
            return run_spec_from_dict(data)
        except SPEC_ERRORS:
            continue
    return None


def _grid(store: Store, run: RunRecord | None) -> bytes | None:
    if run is None:
        return None
    image = store.image(run.id, RECONSTRUCTION)
    return None if image is None else image.png


def _judged(
    store: Store, run: RunRecord | None, result: AuditSummary | None
) -> tuple[Verdict | None, RunRecord | None]:
    """The run's verdict composed with its control (``controls.verdict_of``, which reads the
    stored spec), and the control's run; the run's own verdict where its stored spec no
    longer reads; (None, None) for a run without a result or stored before verdicts."""
    if run is None or run.status not in WITH_RESULT or result is None:
        return None, None
    try:
        stored = run_spec_from_dict(run.spec)
    except SPEC_ERRORS:
        return stored_verdict(run), None
    control_run = control_finding(store, stored)[2] if stored.control() is not None else None
    return verdict_of(store, run), control_run


def _entry(
    store: Store,
    label: str,
    series: str,
    knob: str | None,
    value: float | None,
    run: RunRecord | None,
) -> ReportEntry:
    result, unreadable = read_result(run)
    verdict, control_run = _judged(store, run, result)
    return ReportEntry(
        label,
        series,
        knob,
        value,
        run,
        _grid(store, run),
        verdict,
        control_run,
        result,
        read_spec(run, result),
        unreadable,
    )


def run_subject(store: Store, run_id: str) -> ReportSubject:
    run = store.get_run(run_id)
    if run is None:
        raise AuditInputError(f"no run {run_id!r} in {describe(store.url)}")
    result, _ = read_result(run)
    spec = read_spec(run, result)
    defense = spec.defense.name if spec is not None else result.defense if result else "?"
    entry = _entry(store, run.title or defense, defense, None, None, run)
    title = run.title or f"run {run.id[:8]}"
    return ReportSubject("run", run.id, title, run.created_at, (entry,), where_and_how_long(store))


def batch_subject(store: Store, batch_id: str) -> ReportSubject:
    batch = store.get_batch(batch_id)
    if batch is None:
        raise AuditInputError(
            f"no comparison, sweep or sample {batch_id!r} in {describe(store.url)}"
        )
    entries = tuple(
        _entry(store, s.member.label, s.member.series, s.member.knob, s.member.value, s.run)
        for s in batch_state(store, batch)
    )
    kinds: dict[str, Literal["comparison", "sweep", "sample"]] = {
        "sweep": "sweep",
        "sample": "sample",
    }
    kind = kinds.get(batch.kind, "comparison")
    return ReportSubject(
        kind,
        batch.id,
        batch.title or batch.kind,
        batch.created_at,
        entries,
        where_and_how_long(store),
    )


# ------------------------------------------------------------------------------ one run's row


@dataclass(frozen=True)
class RunRow:
    """The table row of one run: status, attack metrics, verdict, utility, epsilon.

    Values are None where the run has none (not run, unfinished, metric unavailable).
    ``level`` is the composed verdict's level ("Inconclusive" included), ``finding``
    whether it is one a reviewer may quote; both come only from the entry's verdict.
    """

    label: str
    series: str
    knob: str | None
    value: float | None
    status: str  # the run's status, or "not run"
    has_result: bool
    run_id: str | None
    psnr: float | None
    ssim: float | None
    lpips: float | None
    mse: float | None
    label_accuracy: float | None
    recovered: float | None  # share at or above RECOVERED_PSNR_DB (the catalogue's "recovered")
    beyond_guess: tuple[int, int] | None  # (images recovered beyond the best guess, batch)
    rdlv: float | None
    plain_psnr: float | None  # with an adaptive twin: the plain attacks' best mean PSNR
    adaptive_psnr: float | None  # ... and the twins'
    level: str | None
    finding: bool
    outcome: Outcome | None
    utility_accuracy: float | None
    utility_chance: float | None
    utility_undefended: float | None  # the same training without the defense
    utility_f1: float | None
    utility_without_key: float | None
    utility_cut_short: str | None  # "2 of 5 rounds, time budget"
    epsilon: float | None
    seconds: float | None  # the attacks' wall time (the plain attacks and their twins)
    utility_seconds: float | None = None  # the utility training's wall time

    def metric(self, key: str) -> float | None:
        """The row's value of a catalogue metric (``metrics.catalogue.CATALOGUE`` key)."""
        return getattr(self, _ROW_FIELD.get(key, key))


_ROW_FIELD = {  # catalogue keys whose row field is named otherwise
    "accuracy": "utility_accuracy",
    "macro_f1": "utility_f1",
    "accuracy_without_key": "utility_without_key",
}


def run_row(entry: ReportEntry) -> RunRow:
    """The row of one run, from its typed result and composed verdict."""
    run, result, verdict = entry.run, entry.result, entry.verdict
    scores = entry.scores
    utility = None if result is None else result.measured_utility
    return RunRow(
        label=entry.label,
        series=entry.series,
        knob=entry.knob,
        value=entry.value,
        status="not run" if run is None else run.status,
        has_result=entry.has_result,
        run_id=None if run is None else run.id,
        psnr=_mean(scores, "psnr"),
        ssim=_mean(scores, "ssim"),
        lpips=_mean(scores, "lpips"),
        mse=_mean(scores, "mse"),
        label_accuracy=_mean(scores, "label_accuracy"),
        recovered=recovered_share(scores),
        beyond_guess=beyond_guess(scores),
        rdlv=_mean(scores, "rdlv"),
        plain_psnr=twin_psnr(result, adaptive=False),
        adaptive_psnr=twin_psnr(result, adaptive=True),
        level=verdict_level(entry),
        finding=verdict is not None and verdict.is_finding,
        outcome=None if verdict is None else verdict.outcome,
        utility_accuracy=None if utility is None else utility.accuracy,
        utility_chance=None if utility is None else utility.chance_accuracy,
        utility_undefended=undefended_accuracy(entry),
        utility_f1=None if utility is None else utility.macro_f1,
        utility_without_key=None if utility is None else utility.accuracy_without_key,
        utility_cut_short=utility_cut_short(utility),
        epsilon=None if result is None else result.defense_report.epsilon,
        seconds=None if run is None else run.seconds,
        utility_seconds=utility.seconds if isinstance(utility, UtilityRecord) else None,
    )


def run_rows(entries: Sequence[ReportEntry]) -> list[RunRow]:
    return [run_row(e) for e in entries]


def _mean(scores: Scores | None, metric: str) -> float | None:
    return None if scores is None else scores.mean(metric)


def recovered_share(scores: Scores | None) -> float | None:
    """Share of matched images at or above RECOVERED_PSNR_DB (the attack's success rate);
    None for runs scored before the risk."""
    if scores is None or scores.risk is None:
        return None
    return scores.risk.psnr_rate_at(RECOVERED_PSNR_DB)


def beyond_guess(scores: Scores | None) -> tuple[int, int] | None:
    """(images recovered beyond the best guess, batch size); None for runs scored before
    the guesses."""
    if scores is None or scores.risk is None or not scores.risk.batch_size:
        return None
    return scores.risk.images_recovered, scores.risk.batch_size


def verdict_level(entry: ReportEntry) -> str | None:
    """The level a table may print: the composed verdict's ("Inconclusive" where it is
    one, never a band of a run that showed nothing); None without a verdict."""
    return entry.verdict.level if entry.verdict is not None else None


def _defense_name(entry: ReportEntry) -> str | None:
    if entry.spec is not None:
        return entry.spec.defense.name
    return None if entry.result is None else entry.result.defense


def undefended_accuracy(entry: ReportEntry) -> float | None:
    """The accuracy of the same utility training without the defense: the run's own when
    it has none, else its control's."""
    if entry.run is not None and _defense_name(entry) == "none":
        own = None if entry.result is None else entry.result.measured_utility
        return None if own is None else own.accuracy
    control = entry.control_run
    if control is None or control.status not in WITH_RESULT:
        return None
    result, _ = read_result(control)
    utility = None if result is None else result.measured_utility
    return None if utility is None else utility.accuracy


def twin_psnr(result: AuditSummary | None, *, adaptive: bool) -> float | None:
    """The best mean PSNR of the run's plain attacks, or of their adaptive twins (the
    attacker that knows the defense); None unless twins ran (the verdict takes the stronger)."""
    records = () if result is None else result.attacks
    if not any(r.adaptive for r in records):
        return None
    values = [r.psnr_mean for r in records if r.adaptive == adaptive and r.psnr_mean is not None]
    return max(values, default=None)


def utility_cut_short(utility: UtilityRecord | UtilityUnavailable | None) -> str | None:
    """'2 of 5 rounds, time budget' for a utility training that stopped early; else None."""
    if not isinstance(utility, UtilityRecord) or utility.complete:
        return None
    return (
        f"{utility.rounds_completed} of {utility.federation.rounds} rounds, "
        f"{utility.stop_reason or 'stopped early'}"
    )


def success_curves(entries: Sequence[ReportEntry]) -> list[tuple[SuccessPoint, ...]]:
    """Each run's PSNR success-rate curve (``Risk.psnr_success_rate``; () if none)."""
    return [
        () if e.scores is None or e.scores.risk is None else e.scores.risk.psnr_success_rate
        for e in entries
    ]


def unavailable_reasons(entries: Sequence[ReportEntry]) -> dict[str, str]:
    """Every metric some run could not compute, with the first reason met."""
    reasons: dict[str, str] = {}
    for entry in entries:
        if entry.scores is not None:
            for metric, reason in entry.scores.unavailable.items():
                reasons.setdefault(metric, reason)
    return reasons


def utility_caveat(entries: Sequence[ReportEntry]) -> str | None:
    """Why the utility column cannot be read as the defenses' cost, or None.

    The cost of a defense is the accuracy it takes away from a model that learns. When the
    undefended run (or, without one, every run) gains less than LEARNED_MARGIN over its
    initial accuracy, the training itself failed (DLG's sigmoid LeNet does in a few FedAvg
    rounds), and equal accuracies say nothing about the defenses.
    """
    measured = [
        (e, e.result.measured_utility)
        for e in entries
        if e.result is not None and e.result.measured_utility is not None
    ]
    if not measured:
        return None
    baseline = [(e, u) for e, u in measured if e.series == "none"] or measured
    if any(u.accuracy - u.initial_accuracy >= LEARNED_MARGIN for _, u in baseline):
        return None
    entry, utility = baseline[0]
    who = "the undefended model" if entry.series == "none" else "no run's model"
    return (
        f"{who} barely learned in the utility training ({utility.initial_accuracy:.1%} "
        f"before, {utility.accuracy:.1%} after {utility.rounds_completed} rounds), so "
        "the accuracies do not measure what the defenses cost; train longer, or use a "
        "model that trains under FedAvg (DLG's sigmoid LeNet does not in a few rounds: a "
        "ReLU activation does)"
    )


def learns_nothing(row: RunRow) -> str | None:
    """Why a defended run's setting is no usable defense, or None.

    The defended model learns nothing when its accuracy after the utility training is not
    clearly above chance (``fl.federated.learned``: by ``LEARNED_MARGIN``, which is larger
    than the measurement's noise on the held-out split) while the same training without the
    defense is. Such a setting stops the attack by destroying the model: whatever its
    verdict, it is not a defense an auditor can recommend. None for an undefended run, a run
    without the three accuracies, or where the undefended model did not learn either (then
    ``utility_caveat`` says the training, not the defense, failed).
    """
    accuracy, chance = finite_number(row.utility_accuracy), finite_number(row.utility_chance)
    undefended = finite_number(row.utility_undefended)
    if row.series == "none" or accuracy is None or chance is None or undefended is None:
        return None
    if learned(accuracy, chance) or not learned(undefended, chance):
        return None
    text = CATALOGUE["accuracy"].text
    return (
        f"the defended model learns nothing (accuracy {text(accuracy)}, chance {text(chance)}, "
        f"{text(undefended)} without the defense): this setting is not a usable defense"
    )


# ------------------------------------------------------------------------------ a sample


def sample_verdict(entries: Sequence[ReportEntry]) -> SampleVerdict | None:
    """The verdict over a sample's updates that have a scored result and a verdict (None
    before any has); the page and the PDF both read it here."""
    outcomes = [
        UpdateOutcome.of(
            index,
            entry.verdict,
            entry.result.metrics.per_image,
            entry.result.timing.seconds,
        )
        for index, entry in enumerate(entries)
        if entry.has_result
        and entry.verdict is not None
        and entry.result is not None
        and entry.result.metrics is not None
    ]
    return SampleVerdict(tuple(outcomes)) if outcomes else None
