"""The report of an observed update audited without the client's images.

Nothing can be scored: there are no private images to compare the reconstructions with.
The report says so first, then shows what the server received (the bundle and how the
client trained), what each attack reconstructed, with its own loss (a fit to the update,
not a distance to the images), the threat model and the reproducibility appendix. No PSNR,
level or verdict beyond "Unavailable" appears, since none was measured.
"""

from __future__ import annotations

from datetime import UTC, datetime

from reportlab.lib.units import cm
from reportlab.platypus import Flowable, PageBreak, Spacer

import auditlib
from auditlib.report import facts, sections_back, sections_front
from auditlib.report.layout import BODY_WIDTH, Builder, esc
from auditlib.report.sections_results import whole_image
from auditlib.report.text import NOT_AVAILABLE, when
from auditlib.report.unscored_words import LOSS_HEADING, NO_PICK, rows_caption


def is_unscored(b: Builder) -> bool:
    """A report of one run whose result has no scores (``AuditSummary.unscored``)."""
    entries = b.entries
    return (
        len(entries) == 1
        and entries[0].result is not None
        and entries[0].result.unscored is not None
    )


def story(b: Builder) -> list[Flowable]:
    entry = b.entries[0]
    result = entry.result
    assert result is not None and result.unscored is not None
    observed = result.victim.to_json().get("observed") or {}
    training = observed.get("training") or {}
    bundle = str(observed.get("content_sha256") or "")[:12] or NOT_AVAILABLE
    out: list[Flowable] = [
        Spacer(1, 3 * cm),
        b.p("Gradient-leakage audit report", "title"),
        b.p(esc(b.subject.title), "subtitle"),
        b.plain_pairs(
            [
                ("Subject", facts.subject_text(b.subject)),
                ("Identifier", b.subject.id),
                ("Recorded", when(b.subject.created_at)),
                ("Attack", ", ".join(facts.attack_names(b.entries)) or NOT_AVAILABLE),
                ("Target model", facts.model_text(b.reference)),
                ("Update", f"observed (bundle {bundle}), {observed.get('shared', '?')} sent"),
                ("Private data", "none given: the reconstructions cannot be scored"),
                (
                    "Report generated",
                    f"{when(datetime.now(UTC))} by auditlib {auditlib.__version__}",
                ),
            ]
        ),
        PageBreak(),
        b.p("1 Verdict", "h1"),
    ]
    verdict = entry.verdict
    headline = verdict.headline if verdict is not None else f"Unavailable: {result.unscored}"
    out.append(b.p(f"<b>{esc(headline)}</b>"))
    out.append(
        b.p(
            "This run audited an update a client actually sent (an observed update), without "
            "the client's private images. The attacks' reconstructions are shown below, but "
            "nobody can say from them alone how close they are to the client's images: no "
            "PSNR, level or share recovered is given, and this is no evidence of safety "
            "either. Audit the same bundle with the client's images for scores and a verdict."
        )
    )
    out += sections_front.threat_model(b)  # section 2
    out.append(b.p("3 The observed update: how the client trained", "h1"))
    out.append(b.plain_pairs([(k, str(v)) for k, v in training.items() if v not in (None, {})]))
    out.append(b.p("4 What the attacks reconstructed", "h1"))
    if entry.grid_png is not None:
        out.append(whole_image(entry.grid_png))
        out.append(
            b.p(esc(rows_caption([a.label or a.attack for a in result.attacks if not a.skipped])))
        )
    else:
        out.append(b.p("No reconstruction image was stored for this run."))
    rows = [
        (
            esc(a.label or a.attack),
            esc(f"skipped: {a.skipped}" if a.skipped else (a.stop_reason or NOT_AVAILABLE)),
            f"{a.steps:,}" if a.steps is not None else NOT_AVAILABLE,
            f"{a.attack_loss:.4g}" if a.attack_loss is not None else NOT_AVAILABLE,
        )
        for a in result.attacks
    ]
    third = BODY_WIDTH / 4
    out.append(b.table(("attack", "result", "steps", LOSS_HEADING), rows, (third,) * 4))
    out.append(
        b.p(
            "The loss is the attack's own objective: how far the update of its "
            "reconstruction is from the observed update. It ranks an attack's restarts; it is "
            "not a distance to the private images. " + esc(NO_PICK)
        )
    )
    out += sections_back.appendix(b)
    return out
