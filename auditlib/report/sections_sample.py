"""The sample's section of a report: the share of images recovered over every update with
its 95 % interval, the worst case, and one row per update (``metrics.sample``)."""

from __future__ import annotations

from reportlab.platypus import Flowable

from auditlib.report.layout import BODY_WIDTH, Builder, esc
from auditlib.report.subject import sample_verdict
from auditlib.report.text import NOT_AVAILABLE

COLUMNS = ("update", "images", "recovered", "verdict", "best image (dB)")
WIDTHS = (0.14, 0.30, 0.12, 0.30, 0.14)


def sample_block(b: Builder) -> list[Flowable]:
    sample = sample_verdict(b.entries)
    out: list[Flowable] = [b.p("The sample", "h2")]
    if sample is None:
        return [*out, b.p("No update of the sample has a scored result yet.")]
    out.append(b.p(f"<b>{esc(sample.headline)}</b>"))
    out.append(b.p(esc(sample.sentence)))
    out.append(
        b.p(
            "Each update is one client's batch of the set, audited and judged on its own "
            "(beside its own control under a defense); an image counts as recovered where "
            "its update's attack rebuilt it beyond the best guess. The interval is "
            "Clopper-Pearson's exact binomial interval over the updates, each counted by the "
            "share of its images recovered (with one image an update, over the images): the "
            "images of one update are attacked together and may come back together.",
            "small",
        )
    )
    rows = [
        (
            str(u.index + 1),
            esc(", ".join(u.names)),
            f"{u.images_recovered} of {len(u.names)}",
            esc(u.headline),
            NOT_AVAILABLE if u.worst_psnr is None else f"{u.worst_psnr:.2f}",
        )
        for u in sample.updates
    ]
    out.append(b.table(COLUMNS, rows, tuple(w * BODY_WIDTH for w in WIDTHS)))
    return out
