"""The report's closing sections as flowables: 7 the metric definitions (the catalogue's,
``metrics.catalogue``), 8 the limits of the measurement, and the reproducibility appendix
(spec hashes, seeds, package versions)."""

from __future__ import annotations

import math

from reportlab.lib.units import cm
from reportlab.platypus import Flowable, PageBreak, Preformatted

from auditlib.metrics.catalogue import UTILITY_METRICS
from auditlib.metrics.risk import HELD_RULE, LABEL_RULE, LEVEL_MEANING, LEVELS, RECOVERED_RULE
from auditlib.metrics.verdict import CONTROL_LEAK_SHARE
from auditlib.report import facts_back
from auditlib.report.layout import BODY_WIDTH, Builder, esc


def level_bands() -> str:
    """FedLeak's bands with what each means (markup)."""
    bands = []
    for (name, floor), (_, above) in zip(LEVELS[:-1], ((None, math.inf), *LEVELS), strict=False):
        band = f"≥ {floor:g} dB" if not math.isfinite(above) else f"{floor:g}–{above:g} dB"
        bands.append(f"<b>{esc(name)}</b> ({band}): {esc(LEVEL_MEANING[name])}")
    return "; ".join(bands)


def definitions(b: Builder) -> list[Flowable]:
    out: list[Flowable] = [b.p("7 Metric definitions", "h1")]

    def term(heading: str, text: str) -> str:
        return f"<b>{esc(heading)}</b>: {esc(text)}"

    items = [term(h, t) for h, t in facts_back.metric_definitions()]
    items += [
        "<b>Best guess</b>: what a server gets without the update (mid-grey; the data's "
        "mean image and mean colour where the data source gives one), scored like a "
        "reconstruction; per image the best of them.",
        f"<b>Recovered</b> (section 4): the images recovered beyond the best guess, of the "
        f"batch: {esc(RECOVERED_RULE)}.",
        "<b>Verdict</b>: <b>leaks</b> when the run recovered images beyond the best "
        f"guess, with a level from its mean PSNR (FedLeak's bands: {level_bands()}; Medium "
        "too when only some images are recovered); <b>Labels</b> when no image but the "
        f"private labels were recovered beyond chance ({esc(LABEL_RULE)}; one image's label "
        "read by iDLG's rule where it is exact by construction needs no test), with what is "
        "known of the images beside them; <b>Low</b> only "
        f"when under a defense every image stayed below the best guess ({esc(HELD_RULE)}), "
        "the attacker that knows the defense ran, and the same attack at the same budget "
        f"broke the undefended update, at least {CONTROL_LEAK_SHARE:.0%} of its images "
        f"recovered ({esc(LEVEL_MEANING['Low'])}); otherwise <b>Inconclusive</b> (cut "
        "short, every attack diverged, no defense, a control that did not leak or is "
        "missing, a reconstruction between the guess and the recovered line, or a defense "
        "held against the plain attack only), which says nothing about safety.",
    ]
    items += [term(h, t) for h, t in facts_back.metric_definitions(UTILITY_METRICS)]
    out += b.bullets(items)
    definition = facts_back.metric_definition(b.reference)
    if definition:
        out.append(b.p(f"As measured: {esc(definition)}.", "small"))
    return out


def limits_section(b: Builder) -> list[Flowable]:
    """What the numbers cannot say; after the sections that add to ``b.limits``."""
    items = [*facts_back.limits(b.entries, b.rows), *b.limits]
    items.append(
        "Each run attacks one batch of one client once, with one seed; another batch, "
        "seed or training stage can give other numbers. The tables report the "
        "attacker's own choice among restarts, not the best one in hindsight."
    )
    if not b.fonts.unicode:
        items.append(
            "The DejaVu fonts were not found: characters outside Latin-1 are shown as '?'."
        )
    return [b.p("8 Limits", "h1"), *b.bullets(esc(item) for item in items)]


def appendix(b: Builder) -> list[Flowable]:
    out: list[Flowable] = [
        PageBreak(),
        b.p("Appendix: reproducibility", "h1"),
        b.p(
            "Each run is identified by the sha256 of its spec (everything that determines "
            "its result); a run with the same spec id gives the same numbers on the same "
            "device and versions. Data: sha256 of the private images and labels used."
        ),
    ]
    rows = []
    for entry in b.entries:
        ids = facts_back.identifiers(entry)
        if ids is None:
            rows.append((esc(entry.label), "not run"))
            continue
        mono = (
            f"<font name='{b.fonts.mono}' size='6.5'>run&nbsp;&nbsp;{esc(ids.run_id)}<br/>"
            f"spec&nbsp;{esc(ids.spec_id)}<br/>data&nbsp;{esc(ids.data_sha256)}</font>"
        )
        rows.append(
            (
                esc(entry.label),
                mono + f"<br/>seed {esc(ids.seed)}, {esc(ids.status)}, started {esc(ids.started)}",
            )
        )
    out.append(b.table(("Run", "Identifiers"), rows, (4.4 * cm, BODY_WIDTH - 4.4 * cm)))
    pairs = [
        (f"{count} run(s)", text) for text, count in facts_back.version_counts(b.entries).items()
    ]
    pairs.append(("This report", facts_back.report_versions()))
    out += [b.p("Versions", "h2"), b.plain_pairs(pairs)]
    if b.subject.storage:
        out += [b.p("Where the data lives", "h2"), b.p(esc(b.subject.storage))]
    lines = facts_back.spec_lines(b.reference)
    if lines:
        shared = (
            "the run's spec"
            if b.subject.kind == "run"
            else "the spec of the first completed run; the others differ only in the defense "
            "(section 3)"
        )
        out.append(b.p("Spec", "h2"))
        out.append(b.p(f"As JSON, {esc(shared)}:", "small"))
        out.append(Preformatted("\n".join(lines), b.styles["code"], maxLineLength=120))
    return out
