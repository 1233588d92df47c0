"""The report's measurements as flowables: 4 the result tables (attack success in the
catalogue's columns and formats, the plain attack beside its adaptive twin, the defense's
cost), 5 the reconstructions beside their originals, 6 the charts (the dashboard's plotly
figures, drawn by kaleido; see ``export.py``)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image as PILImage
from reportlab.lib.units import cm
from reportlab.platypus import (
    CondPageBreak,
    Flowable,
    KeepTogether,
    PageBreak,
    Spacer,
    Table,
    TableStyle,
)
from reportlab.platypus import Image as PDFImage

from auditlib.grids import split_grid
from auditlib.metrics.catalogue import CATALOGUE
from auditlib.report import facts_results, facts_server
from auditlib.report.layout import BODY_WIDTH, Builder, esc
from auditlib.report.subject import ReportEntry, RunRow, success_curves
from auditlib.report.text import NOT_AVAILABLE, metric_text
from auditlib.report.verdict_facts import caption_level
from auditlib.store.convert import finite_number

GRID_COLUMNS = 8  # pairs per row of a reconstruction grid: 64 images are 8 rows
MAX_PAIR_WIDTH = 3.4 * cm
MAX_PAIR_HEIGHT = 6.5 * cm
MAX_PAIR_PIXELS = 256  # wider pairs are resampled: 3.4 cm need no more, and the PDF stays small
CHART_SIZE = (1000, 500)  # layout pixels of an exported chart (drawn at twice that)
# The attack-success table: catalogue metrics (or the table's own columns), widths in cm
# (the body is 17.4 cm wide).
ATTACK_COLUMNS = (
    ("Run", 3.6),
    ("Status", 1.6),
    ("psnr", 1.3),
    ("ssim", 1.2),
    ("lpips", 1.5),
    ("mse", 1.5),
    ("label_accuracy", 1.6),
    ("Recovered", 1.6),
    ("rdlv", 1.3),
    ("Verdict", 1.8),
)
COST_WIDTHS = {  # the defense-cost table's columns (facts_results.cost_columns), in cm
    "run": 3.2,
    "accuracy": 1.9,
    "chance": 1.7,
    "undefended": 2.2,
    "macro_f1": 1.9,
    "accuracy_without_key": 2.4,
    "epsilon": 1.8,
    "attack_s": 1.5,
    "training_s": 1.7,
}


def results(b: Builder) -> list[Flowable]:
    out: list[Flowable] = [b.p("4 Results", "h1"), b.p("Attack success", "h2")]
    out.append(
        b.table(
            [esc(CATALOGUE[k].heading if k in CATALOGUE else k) for k, _ in ATTACK_COLUMNS],
            [attack_row(r) for r in b.rows],
            [width * cm for _, width in ATTACK_COLUMNS],
        )
    )
    out.append(
        b.p(
            "Means over the private images, attacker's selection among restarts. "
            f"{esc(CATALOGUE['label_accuracy'].label)}: share of labels recovered; Recovered: "
            "images recovered beyond the best guess that uses no update, of the batch. PSNR is "
            "the stronger of each attack and its adaptive twin where one ran (the plain and "
            "adaptive figures are below). Verdict: the run's verdict beside its "
            "undefended control (section 1); a level only where the run shows one. A timed "
            "out run keeps what it recovered by then. n/a: the value does not exist for "
            "the run (section 8 says why).",
            "caption",
        )
    )
    twins = facts_results.twin_rows(b.rows)
    if twins:
        out.append(b.p("The attacker that knows the defense", "h2"))
        out.append(
            b.table(
                ["Run", "plain attack PSNR", "knowing the defense PSNR", "stronger"],
                [tuple(esc(cell) for cell in row) for row in twins],
                [6.5 * cm, 3.5 * cm, 4 * cm, 3.5 * cm],
            )
        )
        out.append(
            b.p(
                "Beside each attack ran its adaptive twin, with the same settings and seed, "
                "told the defense's mechanism and public parameters (not its secrets); "
                "what each twin did is in the threat model of its verdict. The verdict "
                "takes, per image, the best reconstruction of either. Stronger: equal where "
                "the two PSNRs print alike.",
                "caption",
            )
        )
    out += server_section(b)
    if any(e.spec is not None and e.spec.utility for e in b.entries):
        out += defense_cost(b)
    return out


def server_section(b: Builder) -> list[Flowable]:
    """What a server that changes the model it sends recovered: what it changed, whether
    the client could have noticed, the images recovered and attributed, what the client's
    model check saw. Only where a run of the subject faced the malicious server."""
    facts = facts_server.malicious_server(b.entries)
    if facts is None:
        return []
    out: list[Flowable] = [
        b.p("What a server that changes the model recovers", "h2"),
        b.p(
            "Under the malicious-server threat model (section 2) the server changes the model "
            "it sends so that the client's update holds the client's images, then reads them "
            "back. What it changed and whether the client could have noticed are the lines of "
            "the threat card its runs recorded."
        ),
    ]
    for change in facts.changes:
        pairs = [
            ("What the server changed", esc(change.changed)),
            ("Could the client have noticed", esc(change.noticeable)),
        ]
        if change.aggregation:
            pairs.append(("Secure aggregation", esc(change.aggregation)))
        if len(facts.changes) > 1:
            pairs.insert(0, ("Runs", esc(", ".join(change.labels))))
        out.append(b.key_values(pairs, key_width=4.6 * cm))
        out.append(Spacer(1, 4))
    header = ["Run", "Defense", "Recovered"]
    widths = [4.2, 2.4, 4.6]
    if facts.attributes:
        header.append("Attributed")
        widths.append(4.6)
    if facts.checks:
        header.append("What the model check saw")
        widths.append(6.4)
    rows = []
    for run in facts.runs:
        row = [esc(run.label), esc(run.defense), esc(run.recovered)]
        if facts.attributes:
            row.append(esc(run.attributed or NOT_AVAILABLE))
        if facts.checks:
            row.append(esc(run.model_check or NOT_AVAILABLE))
        rows.append(row)
    out.append(b.table(header, rows, [w * cm for w in widths]))
    out.append(
        b.p(
            "Recovered: images recovered beyond the best guess that uses no update, of the "
            "batch. "
            + (
                "Attributed: images recovered and traced to the client that held them "
                "through secure aggregation's sum. "
                if facts.attributes
                else ""
            )
            + (
                "The model check (model-check) inspects the model the client received before "
                "training; where it flags one, the client sends nothing of its images."
                if facts.checks
                else "No run tried the client's model check (model-check), the defense "
                "against a server that changes the model."
            ),
            "caption",
        )
    )
    return out


def attack_row(row: RunRow) -> tuple[str, ...]:
    if row.level is None:
        verdict = "no verdict" if row.has_result else NOT_AVAILABLE
    else:
        verdict = f"<b>{esc(row.level)}</b>" if row.finding else esc(row.level)
    cells = {
        "Run": esc(row.label),
        "Status": esc(row.status.replace("_", " ")),
        "Recovered": esc(facts_results.recovered_text(row)).replace(" ", "&nbsp;"),
        "Verdict": verdict,
    }
    return tuple(
        cells[key] if key in cells else metric_text(key, row.metric(key))
        for key, _ in ATTACK_COLUMNS
    )


def defense_cost(b: Builder) -> list[Flowable]:
    """Accuracy under each defense, beside chance and the undefended accuracy."""
    columns = facts_results.cost_columns(b.rows)
    rows = [[esc(c.cells[i]) for c in columns] for i in range(len(b.rows))]
    chance = any(c.key == "chance" for c in columns)
    return [
        b.p("Defense cost", "h2"),
        b.table([esc(c.head) for c in columns], rows, [COST_WIDTHS[c.key] * cm for c in columns]),
        b.p(
            "Accuracy and macro F1 on held-out data after federated training under the "
            "run's defense, beside "
            + ("chance level (always guessing one class) and " if chance else "")
            + "the accuracy of the same training without the defense (the undefended run "
            f"or the control). {esc(facts_results.TIME_COLUMNS_NOTE)}."
            + "".join(f" {esc(n[0].upper() + n[1:])}." for n in facts_results.cost_notes(b.rows)),
            "caption",
        ),
    ]


# ------------------------------------------------------------------------------ reconstructions


def reconstructions(b: Builder) -> list[Flowable]:
    out: list[Flowable] = [
        CondPageBreak(10 * cm),
        b.p("5 Reconstructions", "h1"),
        b.p(
            "Each pair shows a private image (top) above the attacker's reconstruction of "
            "it (bottom), matched by the Hungarian algorithm; below them the image's name, "
            "PSNR and level (FedLeak's band of its PSNR where it was recovered beyond the "
            "best guess; '≤ guess' where it was not)."
        ),
    ]
    for entry in b.entries:
        out.append(CondPageBreak(5 * cm))
        out.append(b.p(esc(entry.label), "h2"))
        out += grid(b, entry)
    return out


def grid(b: Builder, entry: ReportEntry) -> list[Flowable]:
    run, result = entry.run, entry.result
    if run is None or entry.grid_png is None or result is None:
        status = "not run" if run is None else run.status
        return [b.p(f"No reconstruction stored (run {esc(status)}).", "small")]
    names = list(result.victim.data.names)
    per_image = result.metrics.per_image
    try:
        if not names:
            raise ValueError("the run's summary lists no images")
        originals, reconstructions = split_grid(entry.grid_png, 2, len(names))
    except Exception as exc:  # a grid of another layout, or not an image at all
        try:
            whole = whole_image(entry.grid_png)
        except Exception as unreadable:  # e.g. beyond PIL's decompression-bomb limit
            b.limits.append(f"{entry.label}: the stored image could not be read ({unreadable}).")
            return [b.p("The stored reconstruction image could not be read.", "small")]
        b.limits.append(
            f"{entry.label}: the stored image grid could not be split ({exc}); it is shown whole."
        )
        return [whole]
    columns = min(GRID_COLUMNS, len(names))
    cell_width = BODY_WIDTH / columns
    height, width = originals[0].shape[:2]
    gap = max(2, height // 16)
    pair_width = min(cell_width - 6, MAX_PAIR_WIDTH)
    pair_height = pair_width * (2 * height + gap) / width
    if pair_height > MAX_PAIR_HEIGHT:
        pair_width *= MAX_PAIR_HEIGHT / pair_height
        pair_height = MAX_PAIR_HEIGHT
    cells = []
    for i, (original, reconstruction) in enumerate(zip(originals, reconstructions, strict=True)):
        white = np.full((gap, width, 3), 255, dtype=np.uint8)
        pair = PILImage.fromarray(np.concatenate([original, white, reconstruction], axis=0))
        if width > MAX_PAIR_PIXELS:
            size = (MAX_PAIR_PIXELS, round(pair.height * MAX_PAIR_PIXELS / width))
            pair = pair.resize(size, PILImage.Resampling.LANCZOS)
        buffer = io.BytesIO()
        pair.save(buffer, format="PNG")
        buffer.seek(0)
        image = per_image[i] if i < len(per_image) else None
        name = names[i] if image is None else image.name
        psnr = metric_text("psnr", None if image is None else image.psnr)
        caption = f"{esc(name, 22)}<br/>{psnr}&nbsp;dB"
        level = caption_level(image)
        caption += f"<br/>{esc(level)}" if level else ""
        cells.append([PDFImage(buffer, width=pair_width, height=pair_height), b.p(caption, "tiny")])
    rows = [cells[i : i + columns] for i in range(0, len(cells), columns)]
    rows[-1] += [""] * (columns - len(rows[-1]))
    table = Table(rows, colWidths=[min(cell_width, pair_width + 12)] * columns)
    table.setStyle(
        TableStyle(
            [
                ("ALIGN", (0, 0), (-1, -1), "CENTER"),
                ("VALIGN", (0, 0), (-1, -1), "TOP"),
                ("LEFTPADDING", (0, 0), (-1, -1), 2),
                ("RIGHTPADDING", (0, 0), (-1, -1), 2),
                ("TOPPADDING", (0, 0), (-1, -1), 3),
                ("BOTTOMPADDING", (0, 0), (-1, -1), 3),
            ]
        )
    )
    table.hAlign = "LEFT"
    return [table]


def whole_image(png: bytes) -> Flowable:
    with PILImage.open(io.BytesIO(png)) as image:
        width, height = image.size
    scale = min(BODY_WIDTH / width, 12 * cm / height)
    return PDFImage(io.BytesIO(png), width=width * scale, height=height * scale)


# ------------------------------------------------------------------------------ charts


def figures(b: Builder) -> list[tuple[Any, str]]:
    """The charts of this subject with their captions (plotly figures)."""
    from auditlib.report.charts import comparison_figure, success_rate_figure, tradeoff_figure

    done = [r for r in b.rows if r.has_result]
    if not done:
        return []
    with_utility = [
        r
        for r in done
        if finite_number(r.utility_accuracy) is not None and finite_number(r.psnr) is not None
    ]
    out: list[tuple[Any, str]] = []
    if b.subject.kind == "comparison":
        out.append(
            (
                comparison_figure(b.rows),
                "Attack PSNR per defense (bars coloured by risk level; dotted lines: the "
                "level bands) and the model's accuracy after federated training.",
            )
        )
    if with_utility and b.subject.kind in ("comparison", "sweep"):
        out.append(
            (
                tradeoff_figure(b.rows, "psnr"),
                "Utility against privacy: each point is a run; further left is less "
                "leakage, higher is more accuracy. Dotted lines: the risk level bands.",
            )
        )
    curves = success_curves(b.entries)
    if any(curves):
        out.append(
            (
                success_rate_figure(b.rows, curves),
                "Share of the private images reconstructed at each PSNR threshold or "
                "above, one line per run.",
            )
        )
    return out


def charts(b: Builder, draw: bool) -> tuple[list[Flowable], bool, str | None]:
    out: list[Flowable] = [PageBreak(), b.p("6 Charts", "h1")]
    drawable = figures(b)
    if b.subject.kind == "sweep" and not any(
        finite_number(r.utility_accuracy) is not None for r in b.rows
    ):
        out.append(b.p("No run measured utility, so there is no utility-privacy chart."))
    if not drawable:
        reason = "no completed run has values to chart"
        out.append(b.p(f"No charts: {esc(reason)}."))
        return out, False, reason
    if not draw:
        reason = "charts were not requested"
        out.append(b.p(f"The charts were left out: {esc(reason)}."))
        return out, False, reason
    from auditlib.report.export import figures_to_png

    images = figures_to_png([f for f, _ in drawable], width=CHART_SIZE[0], height=CHART_SIZE[1])
    drawn = 0
    for (_, caption), png in zip(drawable, images.pngs, strict=True):
        if png is None:
            continue
        drawn += 1
        height = BODY_WIDTH * CHART_SIZE[1] / CHART_SIZE[0]
        out.append(
            KeepTogether(
                [
                    PDFImage(io.BytesIO(png), width=BODY_WIDTH, height=height),
                    b.p(esc(caption), "caption"),
                ]
            )
        )
    if images.reason is not None:
        out.append(
            b.p(
                f"<b>{len(drawable) - drawn} of the {len(drawable)} charts could not be "
                f"drawn</b>: {esc(images.reason)}. The tables in section 4 hold the same "
                "numbers."
            )
        )
        b.limits.append(f"Charts could not be drawn: {images.reason}.")
    return out, images.reason is None, images.reason
