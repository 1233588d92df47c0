"""The verdict as the report words it: plain text over each entry's composed
:class:`~auditlib.metrics.verdict.Verdict` (the run's finding judged beside its undefended
control) and its typed scores, never ``Risk.level`` alone, so a run that recovered nothing
is never given a level it has not shown. ``verdict_section`` lays these out."""

from __future__ import annotations

from collections.abc import Sequence

from auditlib.metrics.risk import LEVELS
from auditlib.metrics.scores import ImageScore
from auditlib.metrics.verdict import OUTCOME_TITLE, Finding, ThreatCard, Verdict
from auditlib.report.subject import ReportEntry
from auditlib.report.text import NOT_AVAILABLE

NO_VERDICT = "no verdict (recorded before verdicts)"
LEVEL_RANK = {name: i for i, (name, _) in enumerate(LEVELS)}  # Very High first


def no_verdict_reason(entry: ReportEntry) -> str:
    """Why an entry has no verdict, in a few words."""
    if entry.run is None:
        return "not run yet"
    if not entry.has_result:
        return f"no result (run {entry.run.status})"
    return NO_VERDICT


OUTCOME_RANK = {"leaks": 2, "labels_leak": 1}  # images, then labels, then the rest


def leakage_key(verdict: Verdict) -> tuple[int, int, float]:
    """Orders verdicts by how much they leaked: image leaks first, by band, then label
    leaks, then by PSNR gained over the best guess."""
    finding = verdict.finding
    return (
        OUTCOME_RANK.get(verdict.outcome, 0),
        -LEVEL_RANK.get(verdict.level, len(LEVEL_RANK)),
        finding.psnr_mean - finding.guess_psnr_mean,
    )


def worst_point(entries: Sequence[ReportEntry]) -> ReportEntry | None:
    """The entry with the highest leakage among those whose verdict is a finding."""
    found = [e for e in entries if e.verdict is not None and e.verdict.is_finding]
    return max(found, key=lambda e: leakage_key(e.verdict)) if found else None  # type: ignore[arg-type]


def recovered_words(finding: Finding) -> str:
    plural = "s" if finding.batch_size != 1 else ""
    return f"{finding.images_recovered} of {finding.batch_size} image{plural}"


def stop_words(finding: Finding) -> str:
    steps = f"{finding.steps:,} of {finding.planned_steps:,} steps"
    if finding.stop_reason == "completed":
        return f"completed ({steps})"
    if finding.cut_short:
        return f"cut short by its {finding.stop_reason} after {steps}"
    return f"{finding.stop_reason} after {steps}"


def counts_sentence(entries: Sequence[ReportEntry]) -> str:
    """How many runs have a finding, are inconclusive, have no verdict or no result."""
    verdicts = [e.verdict for e in entries if e.verdict is not None]
    findings = sum(1 for v in verdicts if v.is_finding)
    inconclusive = len(verdicts) - findings
    old = sum(1 for e in entries if e.verdict is None and e.has_result)
    without = sum(1 for e in entries if not e.has_result)
    parts = [f"{findings} of the {len(entries)} runs have a finding"]
    parts.append(f"{inconclusive} {'is' if inconclusive == 1 else 'are'} inconclusive")
    if old:
        parts.append(f"{old} {'has' if old == 1 else 'have'} {NO_VERDICT}")
    if without:
        parts.append(f"{without} {'has' if without == 1 else 'have'} no result")
    return ", ".join(parts[:-1]) + " and " + parts[-1] + "."


def scope_pairs(entry: ReportEntry, verdict: Verdict) -> list[tuple[str, str]]:
    """How far the verdict reaches, as (key, text) rows."""
    scope, finding = verdict.scope, verdict.finding
    recovered = f"{recovered_words(finding)} recovered beyond the best guess"
    risk = None if entry.scores is None else entry.scores.risk
    if finding.images_recovered and risk is not None:
        bands = ", ".join(f"{n} {level}" for level, n in risk.images_per_level.items() if n)
        recovered += f" ({bands})" if bands else ""
    if verdict.control is not None:
        control = f"{verdict.control.figures()}; {verdict.control_note}"
    else:
        control = verdict.control_note or "none"
    labels = finding.label_words()
    return [
        ("Outcome", OUTCOME_TITLE.get(verdict.outcome, verdict.outcome)),
        ("Attacks tried", ", ".join(scope.attacks) or NOT_AVAILABLE),
        ("Defense", scope.defense),
        *([("Client refused the model", scope.refused)] if scope.refused else []),
        ("Restart schedule", scope.restarts),
        ("Budget", scope.budget_words()),
        ("Attack stopped", stop_words(finding)),
        ("Share recovered", recovered),
        *([("Labels", labels[0].upper() + labels[1:])] if labels else []),
        *([("Images", verdict.images_words)] if verdict.images_words else []),
        ("Attacker that knows the defense", f"{scope.twins}: {scope.twins_words}"),
        *(
            [
                (
                    "One server's model" if verdict.finding.one_server else "Combined scores",
                    entry.scores.view,
                )
            ]
            if entry.scores and entry.scores.view
            else []
        ),
        ("Control", control),
    ]


def image_level(image: ImageScore) -> str:
    """An image's level where it was recovered beyond the guess, else why it has none."""
    if image.beyond_guess is None:
        return NOT_AVAILABLE
    return str(image.leakage_level) if image.beyond_guess else "not beyond guess"


def caption_level(image: ImageScore | None) -> str:
    """The level shown under an image of the reconstruction grid."""
    if image is None or image.beyond_guess is None:
        return ""
    return str(image.leakage_level) if image.beyond_guess else "≤ guess"


def threat_cards(entries: Sequence[ReportEntry]) -> list[tuple[ThreatCard, list[str]]]:
    """The distinct threat-model cards of the runs, each with the runs it describes."""
    cards: list[tuple[ThreatCard, list[str]]] = []
    for entry in entries:
        if entry.verdict is None:
            continue
        card = entry.verdict.scope.threat
        for known, labels in cards:
            if known == card:
                labels.append(entry.label)
                break
        else:
            cards.append((card, [entry.label]))
    return cards
