"""The verdict in the PDF report: the summary of a run or a batch, each run's verdict
block (scope, guesses, control, images recovered) and the threat-model card.

Everything here reads the composed :class:`~auditlib.metrics.verdict.Verdict` of an entry
(``ReportEntry.verdict``: the run's own finding judged beside its undefended control), never
``metrics.risk.level`` alone, so a run that recovered nothing is never printed with a level
it has not shown. The functions take the report builder of ``pdf.py`` for its paragraph and
table helpers (``p``, ``table``, ``key_values``, ``bullets``) and return flowables or markup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol
from xml.sax.saxutils import escape

from reportlab.lib.units import cm
from reportlab.platypus import Flowable, KeepTogether, Spacer

from auditlib.metrics.risk import LEVELS, RECOVERED_RULE
from auditlib.metrics.verdict import OUTCOME_TITLE, Finding, ThreatCard, Verdict
from auditlib.report.subject import ReportEntry, dig
from auditlib.store.convert import finite_number

SOK_CITATION = (
    "Carletti et al., SoK: Gradient Inversion Attacks in Federated Learning, USENIX Security 2025"
)
NO_VERDICT = "no verdict (recorded before verdicts)"
LEVEL_RANK = {name: i for i, (name, _) in enumerate(LEVELS)}  # Very High first
PER_IMAGE_ROWS = 16  # larger batches: the levels are in the captions of section 5


class Builder(Protocol):
    """What these functions use of ``pdf._Builder``."""

    def p(self, markup: str, style: str = "body", **kwargs: Any) -> Flowable: ...
    def bullets(self, items: Any) -> list[Flowable]: ...
    def table(self, header: Any, rows: Any, widths: Any, **kwargs: Any) -> Flowable: ...
    def key_values(self, pairs: Any, key_width: float = ...) -> Flowable: ...


def esc(value: Any) -> str:
    return escape("".join(c if c.isprintable() else "?" for c in str(value)))


def num(value: Any, digits: int = 2) -> str:
    number = finite_number(value)
    return "n/a" if number is None else f"{number:.{digits}f}"


# ------------------------------------------------------------------------------ facts


def no_verdict_reason(entry: ReportEntry) -> str:
    """Why an entry has no verdict, in a few words."""
    if entry.run is None:
        return "not run yet"
    if not entry.has_result:
        return f"no result (run {entry.run.status})"
    return NO_VERDICT


def leakage_key(verdict: Verdict) -> tuple[int, int, float]:
    """Orders verdicts by how much they leaked: leaks first, by band, then by PSNR gained
    over the best guess."""
    finding = verdict.finding
    return (
        1 if verdict.outcome == "leaks" else 0,
        -LEVEL_RANK.get(verdict.level, len(LEVEL_RANK)),
        finding.psnr_mean - finding.guess_psnr_mean,
    )


def worst_point(entries: Sequence[ReportEntry]) -> ReportEntry | None:
    """The entry with the highest leakage among those whose verdict is a finding."""
    found = [e for e in entries if e.verdict is not None and e.verdict.is_finding]
    return max(found, key=lambda e: leakage_key(e.verdict)) if found else None


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


# ------------------------------------------------------------------------------ summary


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


def batch_summary(b: Builder, entries: Sequence[ReportEntry]) -> list[Flowable]:
    """The verdict of a comparison or sweep: its worst measured point, named, and how many
    runs are inconclusive (each says why in its own block)."""
    worst = worst_point(entries)
    with_result = [e for e in entries if e.has_result]
    out: list[Flowable] = []
    if worst is not None:
        verdict = worst.verdict
        assert verdict is not None
        out.append(
            b.p(
                f"<b>Worst measured point: {esc(worst.label)}</b>: {esc(verdict.headline)}. "
                f"{esc(verdict.finding.figures())}."
            )
        )
        if verdict.outcome == "defense_held":
            out.append(
                b.p(
                    "No run with a finding leaked: every defense with a finding stopped this "
                    "attack at this budget, which says nothing about a stronger or adaptive one."
                )
            )
    elif with_result and all(e.verdict is None for e in with_result):
        out.append(
            b.p(
                f"<b>The runs of this report have {NO_VERDICT}</b>; section 4 lists "
                "their numbers without one."
            )
        )
    elif with_result:
        out.append(
            b.p(
                "<b>Inconclusive</b>: no run of this report has a finding; nothing it "
                "measured shows a leak or a defense that held. Each run's verdict below says why."
            )
        )
    else:
        out.append(
            b.p(
                "<b>No run of this report has a result yet</b>, so there is no verdict; the "
                "status of each run is in section 4."
            )
        )
    out.append(b.p(esc(counts_sentence(entries))))
    return out


def run_line(entry: ReportEntry, utility: str = "") -> str:
    """One bullet of the summary: the run's headline (or why it has none)."""
    label = f"<b>{esc(entry.label)}</b>"
    if entry.run is not None and entry.run.status == "timed_out" and entry.has_result:
        label += " (timed out; its scores count)"
    if entry.verdict is None:
        return f"{label}: {esc(no_verdict_reason(entry))}.{utility}"
    return f"{label}: {esc(entry.verdict.headline)}.{utility}"


# ------------------------------------------------------------------------------ one run


def verdict_block(b: Builder, entry: ReportEntry, title: str) -> list[Flowable]:
    """The verdict of one run: headline, sentence, scope, guesses, control, images."""
    out: list[Flowable] = [b.p(esc(title), "h2")]
    verdict = entry.verdict
    if verdict is None:
        out.append(b.p(f"{esc(entry.label)}: {esc(no_verdict_reason(entry))}."))
        return out
    out.append(b.p(f"<b>{esc(verdict.headline)}</b>"))
    out.append(b.p(esc(verdict.sentence)))
    out.append(scope_table(b, entry, verdict))
    out.append(Spacer(1, 4))
    out.append(
        KeepTogether(
            [
                b.p("Against the best guess and the control", "small"),
                baseline_table(b, entry, verdict),
            ]
        )
    )
    out.append(
        b.p(
            "Guesses use no update (mid-grey; the data's mean image and mean colour where "
            f"the data source has one); {RECOVERED_RULE}. Control: the same attack at the "
            "same budget on the undefended update.",
            "caption",
        )
    )
    per_image = dig(entry.run.summary if entry.run else None, "metrics", "per_image") or []
    if per_image and len(per_image) <= PER_IMAGE_ROWS:
        out.append(per_image_table(b, per_image))
        out.append(
            b.p(
                "Level: FedLeak's band of the image's PSNR, given only to images "
                "recovered beyond the best guess.",
                "caption",
            )
        )
    return out


def scope_table(b: Builder, entry: ReportEntry, verdict: Verdict) -> Flowable:
    scope, finding = verdict.scope, verdict.finding
    per_level = dig(entry.run.summary if entry.run else None, "metrics", "risk", "images_per_level")
    recovered = f"{recovered_words(finding)} recovered beyond the best guess"
    if finding.images_recovered and isinstance(per_level, dict):
        bands = ", ".join(f"{n} {esc(k)}" for k, n in per_level.items() if n)
        recovered += f" ({bands})" if bands else ""
    control = (
        f"{esc(verdict.control.figures())}; {esc(verdict.control_note)}"
        if verdict.control is not None
        else esc(verdict.control_note or "none")
    )
    pairs = [
        ("Outcome", esc(OUTCOME_TITLE.get(verdict.outcome, verdict.outcome))),
        ("Attacks tried", esc(", ".join(scope.attacks) or "n/a")),
        ("Defense", esc(scope.defense)),
        ("Restart schedule", esc(scope.restarts)),
        ("Budget", esc(scope.budget_words())),
        ("Attack stopped", esc(stop_words(finding))),
        ("Share recovered", recovered),
        ("Control", control),
    ]
    return b.key_values(pairs)


def baseline_table(b: Builder, entry: ReportEntry, verdict: Verdict) -> Flowable:
    finding = verdict.finding
    rows = [
        (
            "<b>The attack</b>"
            + (f" under {esc(verdict.scope.defense)}" if verdict.scope.defense != "none" else ""),
            num(finding.psnr_mean),
            num(finding.ssim_mean, 3),
            recovered_words(finding),
        )
    ]
    guesses = dig(entry.run.summary if entry.run else None, "metrics", "baseline", "guesses")
    for guess in guesses or []:
        rows.append(
            (
                f"Guess: {esc(guess.get('name'))}",
                num(guess.get("psnr_mean")),
                num(guess.get("ssim_mean"), 3),
                "",
            )
        )
    rows.append(
        (
            "Best guess, per image",
            num(finding.guess_psnr_mean),
            num(finding.guess_ssim_mean, 3),
            "",
        )
    )
    if verdict.control is not None:
        control = verdict.control
        rows.append(
            (
                "Control: no defense",
                num(control.psnr_mean),
                num(control.ssim_mean, 3),
                recovered_words(control)
                + (f", {esc(control.level)}" if control.leaked and control.level else ""),
            )
        )
    return b.table(
        ("", "Mean PSNR dB", "Mean SSIM", "Recovered beyond guess"),
        rows,
        (6.4 * cm, 2.6 * cm, 2.4 * cm, 6.0 * cm),
    )


def image_level(image: dict[str, Any]) -> str:
    """An image's level where it was recovered beyond the guess, else why it has none."""
    if image.get("beyond_guess") is None:
        return "n/a"
    return esc(image.get("leakage_level")) if image.get("beyond_guess") else "not beyond guess"


def per_image_table(b: Builder, per_image: Sequence[dict[str, Any]]) -> Flowable:
    with_attack = any("attack" in i for i in per_image)
    header = ["Image", "PSNR dB", "Guess dB", "SSIM", "Guess SSIM", "Level"]
    widths = [4.4, 1.8, 1.8, 1.6, 1.9, 3.0]
    if with_attack:
        header.append("Attack")
        widths.append(2.6)
    rows = []
    for image in per_image:
        row = [
            esc(str(image.get("name", "?"))[:40]),
            num(image.get("psnr")),
            num(image.get("guess_psnr")),
            num(image.get("ssim"), 3),
            num(image.get("guess_ssim"), 3),
            image_level(image),
        ]
        if with_attack:
            row.append(esc(image.get("attack", "")))
        rows.append(row)
    return b.table(header, rows, [w * cm for w in widths])


def caption_level(image: dict[str, Any]) -> str:
    """The level shown under an image of the reconstruction grid (markup)."""
    if image.get("beyond_guess") is None:
        return ""
    return esc(image.get("leakage_level")) if image.get("beyond_guess") else "≤ guess"


# ------------------------------------------------------------------------------ threat card


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


def threat_card_flowables(b: Builder, entries: Sequence[ReportEntry]) -> list[Flowable]:
    """The threat-model card(s): the SoK's model letter and name, and what was known."""
    cards = threat_cards(entries)
    out: list[Flowable] = []
    for card, labels in cards:
        applies = ""
        if len(cards) > 1:
            applies = f" (runs {esc(', '.join(labels))})"
        out.append(
            b.p(
                f"Threat model <b>{esc(card.sok_model)}: {esc(card.sok_name)}</b>{applies}, "
                f"in the taxonomy of {esc(SOK_CITATION)}."
            )
        )
        rows = [
            (esc(k.item), "known" if k.known else "not known", esc(k.detail))
            for k in card.knowledge
        ]
        out.append(
            b.table(
                ("What the attacker had", "Known", "Detail"), rows, (6.2 * cm, 2.2 * cm, 9.0 * cm)
            )
        )
        out.append(Spacer(1, 4))
    return out
