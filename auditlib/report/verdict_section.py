"""The verdict in the PDF report as flowables: the summary of a run or a batch, each run's
verdict block (scope, guesses, control, images recovered) and the threat-model card.

Everything here reads the composed :class:`~auditlib.metrics.verdict.Verdict` of an entry
(``ReportEntry.verdict``: the run's own finding judged beside its undefended control), never
``Risk.level`` alone; the words are ``verdict_facts``'.
"""

from __future__ import annotations

from collections.abc import Sequence

from reportlab.lib.units import cm
from reportlab.platypus import Flowable, KeepTogether, Spacer

from auditlib.metrics.risk import RECOVERED_RULE
from auditlib.metrics.scores import ImageScore
from auditlib.metrics.verdict import Verdict
from auditlib.report.layout import Builder, esc
from auditlib.report.subject import ReportEntry
from auditlib.report.text import metric_text
from auditlib.report.verdict_facts import (
    NO_VERDICT,
    counts_sentence,
    image_level,
    no_verdict_reason,
    recovered_words,
    scope_pairs,
    threat_cards,
    worst_point,
)

SOK_CITATION = (
    "Carletti et al., SoK: Gradient Inversion Attacks in Federated Learning, USENIX Security 2025"
)
PER_IMAGE_ROWS = 16  # larger batches: the levels are in the captions of section 5


# ------------------------------------------------------------------------------ summary


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
                    "No run with a finding leaked: every defense with a finding stopped these "
                    "attacks, its attacker that knows the defense included, at this budget, "
                    "which says nothing about a stronger one."
                )
            )
        elif verdict.outcome == "labels_leak":
            out.append(
                b.p(
                    "No run with a finding rebuilt an image, but the private labels leaked: "
                    f"{esc(verdict.finding.label_words())}."
                    + (f" The images: {esc(verdict.images_words)}." if verdict.images_words else "")
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


def verdict_block(
    b: Builder, entry: ReportEntry, title: str, unusable: str | None = None
) -> list[Flowable]:
    """The verdict of one run: headline (with ``unusable``, ``subject.learns_nothing``'s
    words, beside it), sentence, scope, guesses, control, images."""
    out: list[Flowable] = [b.p(esc(title), "h2")]
    verdict = entry.verdict
    if verdict is None:
        out.append(b.p(f"{esc(entry.label)}: {esc(no_verdict_reason(entry))}."))
        return out
    out.append(b.p(f"<b>{esc(verdict.headline)}</b>"))
    if unusable:
        out.append(b.p(f"<b>Not usable</b>: {esc(unusable)}."))
    out.append(b.p(esc(verdict.sentence)))
    out.append(b.plain_pairs(scope_pairs(entry, verdict)))
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
    per_image = () if entry.scores is None else entry.scores.per_image
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


def baseline_table(b: Builder, entry: ReportEntry, verdict: Verdict) -> Flowable:
    finding = verdict.finding
    defense = verdict.scope.defense
    rows = [
        (
            (
                f"<b>{esc(finding.one_server)}'s server, the best single server (its own pick)</b>"
                if finding.one_server
                else "<b>The attacks, per image the best of their own picks (auditor's view)</b>"
                if entry.scores is not None and entry.scores.view
                else "<b>The attack</b>"
            )
            + (f" under {esc(defense)}" if defense != "none" else ""),
            metric_text("psnr", finding.psnr_mean),
            metric_text("ssim", finding.ssim_mean),
            recovered_words(finding),
        )
    ]
    guesses = None if entry.scores is None else entry.scores.guesses
    for guess in guesses or ():
        rows.append(
            (
                f"Guess: {esc(guess.name)}",
                metric_text("psnr", guess.psnr_mean),
                metric_text("ssim", guess.ssim_mean),
                "",
            )
        )
    rows.append(
        (
            "Best guess, per image",
            metric_text("psnr", finding.guess_psnr_mean),
            metric_text("ssim", finding.guess_ssim_mean),
            "",
        )
    )
    if verdict.control is not None:
        control = verdict.control
        rows.append(
            (
                "Control: no defense",
                metric_text("psnr", control.psnr_mean),
                metric_text("ssim", control.ssim_mean),
                recovered_words(control)
                + (f", {esc(control.level)}" if control.leaked and control.level else ""),
            )
        )
    return b.table(
        ("", "Mean PSNR dB", "Mean SSIM", "Recovered beyond guess"),
        rows,
        (6.4 * cm, 2.6 * cm, 2.4 * cm, 6.0 * cm),
    )


def per_image_table(b: Builder, per_image: Sequence[ImageScore]) -> Flowable:
    with_attack = any(i.attack is not None for i in per_image)
    header = ["Image", "PSNR dB", "Guess dB", "SSIM", "Guess SSIM", "Level"]
    widths = [4.4, 1.8, 1.8, 1.6, 1.9, 3.0]
    if with_attack:
        header.append("Attack")
        widths.append(2.6)
    rows = []
    for image in per_image:
        row = [
            esc(image.name[:40]),
            metric_text("psnr", image.psnr),
            metric_text("psnr", image.guess_psnr),
            metric_text("ssim", image.ssim),
            metric_text("ssim", image.guess_ssim),
            esc(image_level(image)),
        ]
        if with_attack:
            row.append(esc(image.attack or ""))
        rows.append(row)
    return b.table(header, rows, [w * cm for w in widths])


# ------------------------------------------------------------------------------ threat card


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
