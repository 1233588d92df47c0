"""The PDF audit report of one run, a comparison or a sweep (reportlab platypus, A4).

Sections: title page (what was audited, when, by which version), executive summary (the
risk in plain words), threat model and FL scenario, attack and defense settings, metric
tables, reconstructions beside their originals, charts (the dashboard's plotly figures,
drawn by kaleido; see ``export.py``), metric definitions, limits, and a reproducibility
appendix (spec hashes, seeds, package versions).

Every number comes from :func:`auditlib.report.subject.summary_row` or the stored summary;
nothing is recomputed here. Every text that comes from a user (titles, labels, image
names, errors) is escaped before it enters reportlab's Paragraph markup. The report
renders whatever happens to Chromium: without it, the charts are replaced by a sentence
saying why.
"""

from __future__ import annotations

import ast
import functools
import io
import json
import math
import os
import platform
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, unescape

import numpy as np
from PIL import Image as PILImage
from reportlab.lib import colors
from reportlab.lib.enums import TA_CENTER
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle
from reportlab.lib.units import cm
from reportlab.pdfbase import pdfmetrics
from reportlab.pdfbase.ttfonts import TTFont
from reportlab.pdfgen import canvas as pdf_canvas
from reportlab.platypus import (
    CondPageBreak,
    Flowable,
    KeepTogether,
    PageBreak,
    Paragraph,
    Preformatted,
    SimpleDocTemplate,
    Spacer,
    Table,
    TableStyle,
)
from reportlab.platypus import Image as PDFImage

import auditlib
from auditlib.attacks import ATTACKS
from auditlib.errors import AuditInputError
from auditlib.grids import split_grid
from auditlib.metrics.risk import LEVEL_MEANING, LEVELS, RECOVERED_RULE
from auditlib.report import verdict_section as verdicts
from auditlib.report.subject import (
    ReportEntry,
    ReportSubject,
    dig,
    success_curves,
    summary_rows,
    unavailable_reasons,
    utility_caveat,
)
from auditlib.store.convert import finite_number
from auditlib.words import count_of

PAGE_WIDTH, PAGE_HEIGHT = A4
MARGIN = 1.8 * cm
BODY_WIDTH = PAGE_WIDTH - 2 * MARGIN
GRID_COLUMNS = 8  # pairs per row of a reconstruction grid: 64 images are 8 rows
MAX_PAIR_WIDTH = 3.4 * cm
MAX_PAIR_HEIGHT = 6.5 * cm
MAX_PAIR_PIXELS = 256  # wider pairs are resampled: 3.4 cm need no more, and the PDF stays small
CHART_SIZE = (1000, 500)  # layout pixels of an exported chart (drawn at twice that)
FONT_DIRS = (
    "/usr/share/fonts/truetype/dejavu",  # Debian / Ubuntu: fonts-dejavu-core
    "/usr/share/fonts/dejavu",
    "/usr/share/fonts/TTF",
    "/usr/local/share/fonts",
)
NOT_AVAILABLE = "n/a"
METRIC_NAMES = {
    "lpips": "LPIPS-Alex",
    "lpips_vgg": "LPIPS-VGG",
    "ssim": "SSIM",
    "rdlv": "RDLV",
    "psnr": "PSNR",
    "mse": "MSE",
}
# The attack-success table: short heads, widths in cm (the body is 17.4 cm wide).
ATTACK_COLUMNS = (
    ("Run", 3.6),
    ("Status", 1.6),
    ("PSNR dB", 1.3),
    ("SSIM", 1.2),
    ("LPIPS", 1.2),
    ("MSE", 1.7),
    ("Labels", 1.3),
    ("Recovered", 1.6),
    ("RDLV", 1.3),
    ("Verdict", 1.8),
)
CELL_PADDING = 3  # points each side of a table cell (see _Builder.table)
REPORT_PACKAGES = ("reportlab", "plotly", "kaleido", "numpy", "torch", "pillow", "sqlalchemy")


@dataclass(frozen=True)
class ReportInfo:
    """What :func:`build_report` wrote: the file (None for bytes), its pages, the charts."""

    path: Path | None
    pages: int
    charts_drawn: bool
    charts_unavailable_reason: str | None


# ------------------------------------------------------------------------------ fonts, text


@dataclass(frozen=True)
class _Fonts:
    regular: str
    bold: str
    mono: str
    unicode: bool  # DejaVu (Greek, maths symbols) rather than the Latin-1 PDF base fonts


@functools.cache
def _fonts() -> _Fonts:
    """DejaVu Sans where installed (so ε, ≥ and names in other scripts show), else Helvetica."""
    for folder in FONT_DIRS:
        base = Path(folder)
        if not (base / "DejaVuSans.ttf").is_file():
            continue
        files = {
            "AuditSans": "DejaVuSans.ttf",
            "AuditSans-Bold": "DejaVuSans-Bold.ttf",
            "AuditSans-Oblique": "DejaVuSans-Oblique.ttf",
            "AuditSans-BoldOblique": "DejaVuSans-BoldOblique.ttf",
            "AuditMono": "DejaVuSansMono.ttf",
        }
        found: dict[str, str] = {}
        try:
            for name, file in files.items():
                path = base / file
                if path.is_file():
                    pdfmetrics.registerFont(TTFont(name, str(path)))
                    found[name] = name
        except Exception:  # a broken font file: fall back to the base fonts
            break
        regular = found["AuditSans"]
        bold = found.get("AuditSans-Bold", regular)
        pdfmetrics.registerFontFamily(
            regular,
            normal=regular,
            bold=bold,
            italic=found.get("AuditSans-Oblique", regular),
            boldItalic=found.get("AuditSans-BoldOblique", bold),
        )
        return _Fonts(regular, bold, found.get("AuditMono", "Courier"), True)
    return _Fonts("Helvetica", "Helvetica-Bold", "Courier", False)


_LATIN_STAND_INS = {"≥": "&gt;=", "≤": "&lt;=", "ε": "eps", "δ": "delta", "→": "-&gt;", "−": "-"}


def _latin(markup: str) -> str:
    """Markup for the Latin-1 base fonts: symbols they lack get ASCII stand-ins, or '?'."""
    out = []
    for char in markup:
        try:
            char.encode("cp1252")
            out.append(char)
        except UnicodeEncodeError:
            out.append(_LATIN_STAND_INS.get(char, "?"))
    return "".join(out)


def esc(value: Any, limit: int | None = None) -> str:
    """Any value as text safe inside Paragraph markup (control characters dropped)."""
    text = "".join(c if c.isprintable() or c in "\n\t" else "?" for c in str(value))
    if limit is not None and len(text) > limit:
        text = text[: max(1, limit - 1)] + "…"
    return escape(text)


def _named(labels: Sequence[str], most: int = 6) -> str:
    """'a, b, c and 4 more': the runs a note is about, escaped, at most ``most`` named."""
    named = ", ".join(esc(label) for label in labels[:most])
    return named + (f" and {len(labels) - most} more" if len(labels) > most else "")


def fmt(value: Any, kind: str) -> str:
    """A table number: PSNR 2 decimals, SSIM/LPIPS/RDLV 3, shares as %, None as n/a."""
    number = finite_number(value)
    if number is None:
        return NOT_AVAILABLE
    if kind == "db":
        return f"{number:.2f}"
    if kind in ("ssim", "lpips", "rdlv"):
        return f"{number:.3f}"
    if kind == "pct":
        return f"{number * 100:.1f}%"
    if kind == "s":
        return f"{number:.1f}"
    if kind == "e" and number != 0 and not 1e-3 <= abs(number) < 1e4:
        mantissa, exponent = f"{number:.2e}".split("e")
        return f"{mantissa}e{int(exponent)}"  # 2.06e-5: short, one word
    return f"{number:.3g}"


def plain(value: Any) -> str:
    """A value as words: mappings as "key: value" lists, sequences comma-separated, never
    a Python repr of a dict."""
    if isinstance(value, dict):
        return "; ".join(f"{k}: {plain(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list | tuple):
        return ", ".join(plain(v) for v in value) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _settings_text(settings: Any) -> str:
    """Settings as "key: value" items; nested settings (one set per attack) one line each."""
    if isinstance(settings, dict):
        items = list(settings.items())
    elif isinstance(settings, list | tuple):
        items = [tuple(p) for p in settings if isinstance(p, list | tuple) and len(p) == 2]
    else:
        items = []
    if items and all(isinstance(v, dict) for _, v in items):
        return "\n".join(f"{k}: ({_settings_text(v)})" for k, v in items)
    return "; ".join(f"{k}: {plain(v)}" for k, v in items) or "defaults"


def _lines(text: str) -> str:
    """Escaped text whose line breaks become Paragraph breaks."""
    return "<br/>".join(esc(line) for line in text.split("\n"))


_DICT_TAIL = re.compile(r"^(.*?)(\{.*\})\s*$")


def _knowledge_text(item: str) -> str:
    """A "server knows" item whose tail is a Python dict (runs before verdicts wrote the
    client protocol so) as "key: value" words."""
    found = _DICT_TAIL.match(item)
    if found is None:
        return item
    try:
        value = ast.literal_eval(found.group(2))
    except (ValueError, SyntaxError):
        return item
    return f"{found.group(1).strip()} ({plain(value)})" if isinstance(value, dict) else item


_TAG = re.compile(r"<[^>]*>")


def _tokens(markup: str) -> list[str]:
    """The words of a cell's markup, as printed (a table never breaks inside one)."""
    text = unescape(_TAG.sub(" ", markup), {"&nbsp;": " ", "&quot;": '"', "&#39;": "'"})
    return text.split()


def fit_widths(widths: Sequence[float], minimums: Sequence[float], total: float) -> list[float]:
    """Column widths that fit ``total`` and give each column at least its minimum (its
    longest word) where the others have room to spare: a number never wraps mid-number."""
    fitted = [max(w, m) for w, m in zip(widths, minimums, strict=True)]
    excess = sum(fitted) - total
    slack = [f - m for f, m in zip(fitted, minimums, strict=True)]
    if excess > 0 and sum(slack) > 0:
        share = min(1.0, excess / sum(slack))
        fitted = [f - s * share for f, s in zip(fitted, slack, strict=True)]
    scale = min(1.0, total / sum(fitted))
    return [f * scale for f in fitted]


def _when(moment: datetime | None) -> str:
    if moment is None:
        return NOT_AVAILABLE
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


# ------------------------------------------------------------------------------ page canvas


def _canvas_class(footer: str, fonts: _Fonts, counter: dict[str, int]) -> type:
    """A canvas that holds its pages until the end so each footer can say "page i of n"."""

    class FooterCanvas(pdf_canvas.Canvas):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._held: list[dict[str, Any]] = []

        def showPage(self) -> None:  # reportlab's name
            self._held.append(dict(self.__dict__))
            self._startPage()

        def save(self) -> None:
            total = len(self._held)
            for state in self._held:
                self.__dict__.update(state)
                self.setFont(fonts.regular, 7.5)
                self.setFillColor(colors.grey)
                self.drawString(MARGIN, MARGIN / 2, footer)
                self.drawRightString(
                    PAGE_WIDTH - MARGIN, MARGIN / 2, f"page {self._pageNumber} of {total}"
                )
                super().showPage()
            counter["pages"] = total
            super().save()

    return FooterCanvas


# ------------------------------------------------------------------------------ the report


class _Builder:
    """The flowables of one report; each section method returns a list of them."""

    def __init__(self, subject: ReportSubject, fonts: _Fonts) -> None:
        self.subject = subject
        self.fonts = fonts
        self.entries = subject.entries
        self.rows = summary_rows(subject.entries)
        self.with_runs = [e for e in self.entries if e.run is not None]
        # Completed or timed out with scores: the runs whose numbers count.
        self.completed = [e for e in self.with_runs if e.has_result]
        summarised = [e for e in self.with_runs if e.run.summary]
        reference = (self.completed or summarised or self.with_runs or [None])[0]
        self.reference = reference
        self.summary: dict[str, Any] = (reference.run.summary if reference else None) or {}
        self.spec: dict[str, Any] = (reference.run.spec if reference else None) or {}
        self.styles = self._styles()
        self.limits: list[str] = []  # markup, collected by the sections, shown under Limits

    # -------------------------------------------------------------- building blocks

    def _styles(self) -> dict[str, ParagraphStyle]:
        regular, bold = self.fonts.regular, self.fonts.bold
        # No paragraph leaves its last line alone at the top of a page (a page before a page
        # break could otherwise hold that one line and nothing else).
        body = ParagraphStyle(
            "body",
            fontName=regular,
            fontSize=9.5,
            leading=12.5,
            spaceAfter=4,
            allowWidows=0,
            allowOrphans=0,
        )
        return {
            "body": body,
            "title": ParagraphStyle("title", body, fontName=bold, fontSize=22, leading=27),
            "subtitle": ParagraphStyle("subtitle", body, fontSize=14, leading=18, spaceAfter=14),
            "h1": ParagraphStyle(
                "h1",
                body,
                fontName=bold,
                fontSize=15,
                leading=19,
                spaceBefore=6,
                spaceAfter=8,
                keepWithNext=1,
            ),
            "h2": ParagraphStyle(
                "h2",
                body,
                fontName=bold,
                fontSize=11,
                leading=14,
                spaceBefore=8,
                spaceAfter=4,
                keepWithNext=1,
            ),
            "bullet": ParagraphStyle("bullet", body, leftIndent=12, bulletIndent=2, spaceAfter=2),
            "small": ParagraphStyle("small", body, fontSize=8, leading=10),
            "caption": ParagraphStyle(
                "caption", body, fontSize=8, leading=10, textColor=colors.dimgrey, spaceAfter=8
            ),
            "cell": ParagraphStyle("cell", body, fontSize=7.5, leading=9, spaceAfter=0),
            "head": ParagraphStyle(
                "head", body, fontName=bold, fontSize=7.5, leading=9, spaceAfter=0
            ),
            "tiny": ParagraphStyle(
                "tiny", body, fontSize=6, leading=7, alignment=TA_CENTER, spaceAfter=0
            ),
            "code": ParagraphStyle(
                "code", body, fontName=self.fonts.mono, fontSize=6.5, leading=7.8
            ),
        }

    def p(self, markup: str, style: str = "body", **kwargs: Any) -> Paragraph:
        """A Paragraph of markup whose dynamic parts the caller has passed through esc()."""
        if not self.fonts.unicode:
            markup = _latin(markup)
        return Paragraph(markup, self.styles[style], **kwargs)

    def bullets(self, items: Iterable[str]) -> list[Flowable]:
        return [self.p(item, "bullet", bulletText="•") for item in items]

    def table(
        self,
        header: Sequence[str],
        rows: Sequence[Sequence[str]],
        widths: Sequence[float],
        *,
        header_column: bool = False,
    ) -> Table:
        """A table of markup cells that fits the body width and repeats its header row;
        columns widen (at the cost of the others' slack) so no word or number wraps."""
        data: list[list[Any]] = []
        if header:
            data.append([self.p(h, "head") for h in header])
        for row in rows:
            cells = [self.p(c, "cell") for c in row]
            if header_column:
                cells[0] = self.p(row[0], "head")
            data.append(cells)
        minimums = self.word_widths([list(header)] if header else [], rows, len(widths))
        table = Table(
            data,
            colWidths=fit_widths(widths, minimums, BODY_WIDTH),
            repeatRows=1 if header else 0,
        )
        style = [
            ("VALIGN", (0, 0), (-1, -1), "TOP"),
            ("GRID", (0, 0), (-1, -1), 0.25, colors.lightgrey),
            ("TOPPADDING", (0, 0), (-1, -1), 2),
            ("BOTTOMPADDING", (0, 0), (-1, -1), 2),
            ("LEFTPADDING", (0, 0), (-1, -1), 3),
            ("RIGHTPADDING", (0, 0), (-1, -1), 3),
        ]
        if header:
            style += [
                ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#e8edf3")),
                ("ROWBACKGROUNDS", (0, 1), (-1, -1), [colors.white, colors.HexColor("#f7f7f7")]),
            ]
        table.setStyle(TableStyle(style))
        table.hAlign = "LEFT"
        return table

    def word_widths(
        self, heads: Sequence[Sequence[str]], rows: Sequence[Sequence[str]], columns: int
    ) -> list[float]:
        """Per column, the width of its longest word (bold in the header) plus padding."""
        minimums = [0.0] * columns
        size = self.styles["cell"].fontSize
        for font, lines in ((self.fonts.bold, heads), (self.fonts.regular, rows)):
            for row in lines:
                for i, cell in enumerate(row[:columns]):
                    for word in _tokens(cell if self.fonts.unicode else _latin(cell)):
                        width = pdfmetrics.stringWidth(word, font, size) + 2 * CELL_PADDING + 1
                        minimums[i] = max(minimums[i], width)
        return minimums

    def key_values(self, pairs: Sequence[tuple[str, str]], key_width: float = 4.2 * cm) -> Table:
        return self.table(
            (), [(k, v) for k, v in pairs], (key_width, BODY_WIDTH - key_width), header_column=True
        )

    # -------------------------------------------------------------- facts about the subject

    def summary_of(self, entry: ReportEntry) -> dict[str, Any]:
        return (entry.run.summary if entry.run is not None else None) or {}

    def attacks(self) -> list[str]:
        names = [dig(e.run.spec, "attack", "name") for e in self.with_runs]
        return list(dict.fromkeys(str(n) for n in names if n))

    def batch_size(self) -> int | None:
        names = dig(self.summary, "victim", "data", "names")
        if isinstance(names, list):
            return len(names)
        return dig(self.spec, "data", "batch_size")

    def _images_count(self, noun: str = "image") -> str:
        size = self.batch_size()
        return f"? {noun}s" if size is None else count_of(int(size), noun)

    def data_source(self) -> str:
        source = dig(self.summary, "victim", "data", "source")
        if source:
            return str(source)
        data = self.spec.get("data") or {}
        return f"{data.get('source', '?')} {data.get('location', '')}".strip()

    def model_text(self) -> str:
        model = dig(self.spec, "model", "spec") or {}
        shape = model.get("input_shape") or []
        shape_text = " x ".join(str(s) for s in shape) if shape else "?"
        text = (
            f"{model.get('architecture', '?')}, input {shape_text}, "
            f"{model.get('num_classes', '?')} classes"
        )
        parameters = dig(self.summary, "victim", "model", "num_parameters")
        if parameters:
            text += f", {parameters:,} parameters"
        if dig(self.spec, "model", "weights") or dig(self.spec, "model", "weights_asset"):
            text += ", uploaded weights"
        elif dig(self.spec, "model", "trusted_archive"):
            text += ", trusted archive"
        else:
            text += f", {model.get('init', 'default')} initialisation (seed {model.get('seed')})"
        return text

    def subject_text(self) -> str:
        count = len(self.entries)
        if self.subject.kind == "run":
            return "one audit run"
        if self.subject.kind == "comparison":
            return f"a comparison of {count} defenses under one attack"
        knobs = list(
            dict.fromkeys(f"{e.series} {e.knob}" for e in self.entries if e.knob is not None)
        )
        return f"a sweep of {count} runs over {', '.join(knobs) or 'defense settings'}"

    # -------------------------------------------------------------- sections

    def title_page(self) -> list[Flowable]:
        versions = sorted(
            {str(dig(self.summary_of(e), "versions", "auditlib")) for e in self.completed}
        )
        pairs = [
            ("Subject", esc(self.subject_text())),
            ("Identifier", esc(self.subject.id)),
            ("Recorded", esc(_when(self.subject.created_at))),
            ("Attack", esc(", ".join(self.attacks()) or NOT_AVAILABLE)),
            ("Target model", esc(self.model_text())),
            (
                "Private data",
                esc(f"{self._images_count()} from {self.data_source()}"),
            ),
            ("Runs", self.runs_text()),
            (
                "Report generated",
                esc(f"{_when(datetime.now(UTC))} by auditlib {auditlib.__version__}"),
            ),
            ("Runs audited with", esc(", ".join(f"auditlib {v}" for v in versions) or "n/a")),
        ]
        return [
            Spacer(1, 3 * cm),
            self.p("Gradient-leakage audit report", "title"),
            self.p(esc(self.subject.title), "subtitle"),
            self.key_values(pairs),
            Spacer(1, 0.8 * cm),
            self.p(
                "This report states how much of a federated-learning client's private "
                "images an attacker at the server reconstructed from the client's model "
                "update, with and without defenses, and at what cost in model accuracy. "
                "Every number was measured by the runs listed in the appendix; the "
                "definitions are in section 7 and the limits of the measurement in section 8."
            ),
            PageBreak(),
        ]

    def runs_text(self) -> str:
        timed_out = sum(1 for e in self.completed if e.run.status == "timed_out")
        text = f"{len(self.completed)} with results of {len(self.entries)}"
        return text + (f" ({timed_out} of them timed out)" if timed_out else "")

    def executive_summary(self) -> list[Flowable]:
        out: list[Flowable] = [self.p("1 Executive summary", "h1")]
        attack = ", ".join(self.attacks()) or "the attack"
        out.append(
            self.p(
                f"The server ran <b>{esc(attack)}</b> against the update of one client holding "
                f"{esc(self._images_count('private image'))} ({esc(self.data_source())}) "
                f"on a {esc(self.model_text())}."
            )
        )
        if self.subject.kind == "run":
            entry = self.entries[0]
            out += self.run_summary(entry)
        else:
            out += verdicts.batch_summary(self, self.entries)
            by_row = {id(e): r for e, r in zip(self.entries, self.rows, strict=True)}
            out += self.bullets(
                verdicts.run_line(e, self.utility_words(by_row[id(e)])) for e in self.entries
            )
        out.append(
            self.p(
                "A verdict is a bound, never a guarantee: <b>leaks</b> when the attack recovered "
                "images beyond the best guess that uses no update (levels: FedLeak's bands of "
                "the mean PSNR); <b>Low</b> only when a defended run recovered nothing beyond "
                "the guess while the same attack at the same budget broke the undefended "
                "update; otherwise <b>Inconclusive</b>, with the reason. The sections below give "
                "each run's scope, guesses and control.",
                "small",
            )
        )
        for number, entry in enumerate(self.entries, 1):
            out.append(CondPageBreak(6 * cm))
            out += verdicts.verdict_block(self, entry, f"1.{number} Verdict: {entry.label}")
        return out

    def run_summary(self, entry: ReportEntry) -> list[Flowable]:
        """The summary of a one-run report: its verdict's headline and sentence."""
        verdict = entry.verdict
        row = self.rows[0]
        if verdict is None:
            return [self.p(f"<b>{esc(verdicts.no_verdict_reason(entry).capitalize())}</b>.")]
        out = [self.p(f"<b>{esc(verdict.headline)}</b>"), self.p(esc(verdict.sentence))]
        utility = self.utility_words(row)
        if utility:
            out.append(self.p(utility.strip()))
        return out

    def utility_words(self, row: dict[str, Any]) -> str:
        """' Model accuracy after federated training x% (chance y%, undefended z%).' or ''."""
        if finite_number(row["utility_accuracy"]) is None:
            return ""
        beside = self.beside_accuracy(row)
        text = f" Model accuracy after federated training {fmt(row['utility_accuracy'], 'pct')}"
        text += f" ({beside})" if beside else ""
        if finite_number(row["epsilon"]) is not None:
            text += f", ε = {fmt(row['epsilon'], 'g')}"
        return text + "."

    def beside_accuracy(self, row: dict[str, Any]) -> str:
        """Chance level and the undefended accuracy, the figures an accuracy is read against."""
        parts = []
        if finite_number(row.get("utility_chance")) is not None:
            parts.append(f"chance {fmt(row['utility_chance'], 'pct')}")
        if row["series"] != "none" and finite_number(row.get("utility_undefended")) is not None:
            parts.append(f"undefended {fmt(row['utility_undefended'], 'pct')}")
        return ", ".join(parts)

    def threat_model(self) -> list[Flowable]:
        out: list[Flowable] = [self.p("2 Threat model and FL scenario", "h1")]
        cards = verdicts.threat_card_flowables(self, self.entries)
        out += cards or self.server_knows()
        out += self.scenario()
        return out

    def server_knows(self) -> list[Flowable]:
        """What the server knew, as runs recorded before verdicts (and their cards) list it."""
        out: list[Flowable] = []
        observation = dig(self.summary, "threat_model", "observation") or "update"
        known_lists = [
            [
                _knowledge_text(str(k))
                for k in dig(self.summary_of(e), "threat_model", "server_knows") or []
            ]
            for e in self.with_runs
        ]
        known_lists = [k for k in known_lists if k]
        common = (
            [k for k in known_lists[0] if all(k in other for other in known_lists)]
            if known_lists
            else []
        )
        out.append(
            self.p(
                f"The attacker is the server. It receives the client's <b>{esc(observation)}</b> "
                "for one round, as the defense left it, and knows:"
            )
        )
        out += self.bullets(esc(k) for k in common) if common else [self.p("n/a (no summary)")]
        extras = []
        for entry in self.with_runs:
            known = dig(self.summary_of(entry), "threat_model", "server_knows") or []
            more = [_knowledge_text(str(k)) for k in known]
            more = [k for k in more if k not in common]
            if more:
                extras.append(f"{esc(entry.label)}: also {esc('; '.join(more))}")
        if extras:
            out.append(self.p("Under some defenses the server knows more:"))
            out += self.bullets(extras)
        return out

    def scenario(self) -> list[Flowable]:
        out: list[Flowable] = [self.p("Scenario", "h2")]
        observation = dig(self.summary, "threat_model", "observation") or "update"
        protocol = dig(self.spec, "scenario", "protocol") or {}
        scenario = self.spec.get("scenario") or {}
        pairs = [
            ("FL algorithm", esc(protocol.get("algorithm", NOT_AVAILABLE))),
            (
                "Client training",
                esc(
                    (
                        f"{protocol['local_epochs']} local epoch(s)"
                        if protocol.get("local_epochs")
                        else f"{protocol.get('local_steps')} local step(s)"
                    )
                    + f" at learning rate {protocol.get('local_lr')}, local batch "
                    f"{protocol.get('local_batch_size') or 'the whole batch'}"
                ),
            ),
            ("Client sends", esc(protocol.get("shared", NOT_AVAILABLE))),
            (
                "Server observes",
                esc(f"the client's {observation} for one round, as the defense left it"),
            ),
            ("BatchNorm mode", esc(protocol.get("batchnorm_mode", NOT_AVAILABLE))),
            ("Labels known to server", "yes" if scenario.get("labels_known") else "no"),
        ]
        uploaded = any(
            dig(self.spec, "model", key) for key in ("weights", "weights_asset", "trusted_archive")
        )
        if scenario.get("pretrain_rounds"):
            pairs.append(
                (
                    "Global model",
                    esc(
                        f"trained for {scenario['pretrain_rounds']} FedAvg rounds on "
                        f"{scenario.get('pretrain_data')} before the attack"
                    ),
                )
            )
        elif uploaded:
            pairs.append(("Global model", "as uploaded, not trained further before the attack"))
        else:
            pairs.append(("Global model", "freshly initialised (the attack happens in round 1)"))
        pairs.append(("Model", esc(self.model_text())))
        data = dig(self.summary, "victim", "data") or {}
        names = [str(n) for n in data.get("names") or []]
        shown = ", ".join(esc(n, 40) for n in names[:24])
        if len(names) > 24:
            shown += f" … and {len(names) - 24} more"
        pairs += [
            ("Private data", esc(self.data_source())),
            ("Batch size", esc(self.batch_size() or NOT_AVAILABLE)),
            ("Images", shown or NOT_AVAILABLE),
            ("Labels", esc(data.get("label_source") or NOT_AVAILABLE)),
            ("Normalisation", esc(dig(self.spec, "data", "normalization") or "none")),
        ]
        out.append(self.key_values(pairs))
        return out

    def settings(self) -> list[Flowable]:
        out: list[Flowable] = [self.p("3 Attack and defense settings", "h1")]
        seen: set[str] = set()
        for entry in self.with_runs:
            spec = entry.run.spec
            name = str(dig(spec, "attack", "name"))
            budget = spec.get("budget") or {}
            key = json.dumps([spec.get("attack"), budget, spec.get("seed")], sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            info = ATTACKS.get(name)
            settings = dig(self.summary_of(entry), "config", "attack_settings")
            paper = info.paper_iterations if info else None
            iterations = budget.get("iterations")
            budget_text = f"{iterations} optimiser steps per restart"
            if paper:
                budget_text += f" (the paper: {paper})"
            if budget.get("max_seconds"):
                budget_text += f", at most {budget['max_seconds']:g} s"
            nets = dig(self.summary_of(entry), "config", "lpips_nets")
            pairs = [
                ("Attack", f"<b>{esc(name)}</b>" + (f": {esc(info.summary)}" if info else "")),
                ("Preset", esc(dig(spec, "attack", "preset") or "none")),
                (
                    "Settings",
                    _lines(
                        _settings_text(settings)
                        if settings is not None
                        else _settings_text(dig(spec, "attack", "params"))
                    ),
                ),
                ("Budget", esc(budget_text)),
                ("Seed, device", esc(f"{spec.get('seed')}, {spec.get('device')}")),
                ("LPIPS backbones", esc(", ".join(nets) if nets else "none")),
            ]
            out.append(self.key_values(pairs))
            out.append(Spacer(1, 4))
        out.append(self.p("Defenses", "h2"))
        rows = []
        for entry, row in zip(self.entries, self.rows, strict=True):
            summary = self.summary_of(entry)
            report = summary.get("defense_report") or {}
            settings = dig(summary, "config", "defense_settings")
            if settings is None and entry.run is not None:
                settings = dig(entry.run.spec, "defense", "params")
            before, after = report.get("update_norm_before"), report.get("update_norm_after")
            delta = report.get("delta")
            epsilon = fmt(row["epsilon"], "g")
            if finite_number(delta) is not None and epsilon != NOT_AVAILABLE:
                epsilon += f" (δ = {delta:g})"
            rows.append(
                (
                    esc(entry.label),
                    esc(row["series"]),
                    _lines(_settings_text(settings)) if entry.run is not None else NOT_AVAILABLE,
                    epsilon,
                    f"{fmt(before, 'g')} → {fmt(after, 'g')}",
                )
            )
        out.append(
            self.table(
                ("Run", "Defense", "Settings", "ε", "Update norm"),
                rows,
                (4.6 * cm, 2.4 * cm, 5.2 * cm, 2.2 * cm, 3.0 * cm),
            )
        )
        out.append(
            self.p(
                "Update norm: the L2 norm of the client's update before and after the defense.",
                "caption",
            )
        )
        out += self.utility_settings()
        return out

    def utility_settings(self) -> list[Flowable]:
        """How utility was measured; "Training starts from" only where a run recorded it."""
        utility_specs = [e.run.spec.get("utility") for e in self.with_runs]
        utility_spec = next((u for u in utility_specs if u), None)
        if not utility_spec:
            return []
        federation = utility_spec.get("federation") or {}
        starts = next(
            (
                dig(self.summary_of(e), "utility", "starts_from")
                for e in self.with_runs
                if dig(self.summary_of(e), "utility", "starts_from")
            ),
            None,
        )
        pairs = [
            ("Dataset", esc(utility_spec.get("dataset"))),
            (
                "Examples",
                esc(f"{utility_spec.get('train')} training, {utility_spec.get('test')} held out"),
            ),
            (
                "Federation",
                esc(
                    f"{federation.get('clients')} clients ({federation.get('split')}), "
                    f"{federation.get('rounds')} rounds of {federation.get('local_epochs')} "
                    f"local epoch(s) at learning rate {federation.get('local_lr')}, seed "
                    f"{federation.get('seed')}"
                ),
            ),
        ]
        if starts:
            pairs.append(("Training starts from", esc(starts)))
        pairs.append(("Defense", "the run's defense, applied to every client's update"))
        return [self.p("Utility measurement", "h2"), self.key_values(pairs)]

    def results(self) -> list[Flowable]:
        out: list[Flowable] = [self.p("4 Results", "h1"), self.p("Attack success", "h2")]
        out.append(
            self.table(
                [head for head, _ in ATTACK_COLUMNS],
                [self.attack_row(r) for r in self.rows],
                [width * cm for _, width in ATTACK_COLUMNS],
            )
        )
        out.append(
            self.p(
                "Means over the private images, attacker's selection among restarts. Labels: "
                "share of labels recovered; Recovered: images recovered beyond the best guess "
                "that uses no update, of the batch. PSNR is the stronger of each attack and its "
                "adaptive twin where one ran (the plain and adaptive figures are below). "
                "Verdict: the run's verdict beside its "
                "undefended control (section 1); a level only where the run shows one. A timed "
                "out run keeps what it recovered by then. n/a: the value does not exist for "
                "the run (section 8 says why).",
                "caption",
            )
        )
        twins = [r for r in self.rows if r["adaptive_psnr"] is not None]
        if twins:
            out.append(self.p("The attacker that knows the defense", "h2"))
            out.append(
                self.table(
                    ["Run", "plain attack PSNR", "knowing the defense PSNR", "stronger"],
                    [
                        (
                            esc(r["label"]),
                            fmt(r["plain_psnr"], "db"),
                            fmt(r["adaptive_psnr"], "db"),
                            "knowing the defense"
                            if (r["adaptive_psnr"] or 0) > (r["plain_psnr"] or 0)
                            else "plain",
                        )
                        for r in twins
                    ],
                    [6.5 * cm, 3.5 * cm, 4 * cm, 3.5 * cm],
                )
            )
            out.append(
                self.p(
                    "Beside each attack ran its adaptive twin, with the same settings and seed, "
                    "told the defense's mechanism and public parameters (not its secrets); "
                    "what each twin did is in the threat model of its verdict. The verdict "
                    "takes, per image, the best reconstruction of either.",
                    "caption",
                )
            )
        if any(e.run is not None and e.run.spec.get("utility") for e in self.entries):
            out += self.defense_cost()
        return out

    def attack_row(self, r: dict[str, Any]) -> tuple[str, ...]:
        if r["beyond_guess"] is not None:
            recovered = f"{r['beyond_guess'][0]}&nbsp;of&nbsp;{r['beyond_guess'][1]}"
        else:
            recovered = fmt(r["recovered"], "pct")
        if r["level"] is None:
            verdict = "no verdict" if r["has_result"] else NOT_AVAILABLE
        else:
            verdict = f"<b>{esc(r['level'])}</b>" if r["finding"] else esc(r["level"])
        return (
            esc(r["label"]),
            esc(str(r["status"]).replace("_", " ")),
            fmt(r["psnr"], "db"),
            fmt(r["ssim"], "ssim"),
            fmt(r["lpips"], "lpips"),
            fmt(r["mse"], "e"),
            fmt(r["label_accuracy"], "pct"),
            recovered,
            fmt(r["rdlv"], "rdlv"),
            verdict,
        )

    def defense_cost(self) -> list[Flowable]:
        """Accuracy under each defense, beside chance and the undefended accuracy."""
        without_key = any(finite_number(r["utility_without_key"]) is not None for r in self.rows)
        chance = any(finite_number(r["utility_chance"]) is not None for r in self.rows)
        header = ["Run", "Accuracy"]
        widths = [4.6 * cm, 1.9 * cm]
        if chance:
            header.append("Chance")
            widths.append(1.7 * cm)
        header += ["Undefended", "Macro F1"]
        widths += [2.2 * cm, 1.9 * cm]
        if without_key:
            header.append("Accuracy w/o key")
            widths.append(2.4 * cm)
        header += ["ε", "Time s"]
        widths += [1.8 * cm, 1.5 * cm]
        rows = []
        for r in self.rows:
            undefended = r["utility_accuracy"] if r["series"] == "none" else r["utility_undefended"]
            cells = [esc(r["label"]), fmt(r["utility_accuracy"], "pct")]
            if chance:
                cells.append(fmt(r["utility_chance"], "pct"))
            cells += [fmt(undefended, "pct"), fmt(r["utility_f1"], "pct")]
            if without_key:
                cells.append(fmt(r["utility_without_key"], "pct"))
            cells += [fmt(r["epsilon"], "g"), fmt(r["seconds"], "s")]
            rows.append(cells)
        return [
            self.p("Defense cost", "h2"),
            self.table(header, rows, widths),
            self.p(
                "Accuracy and macro F1 on held-out data after federated training under the "
                "run's defense, beside "
                + ("chance level (always guessing one class) and " if chance else "")
                + "the accuracy of the same training without the defense (the undefended run "
                "or the control); Time: the whole run, attack and training.",
                "caption",
            ),
        ]

    def reconstructions(self) -> list[Flowable]:
        out: list[Flowable] = [
            CondPageBreak(10 * cm),
            self.p("5 Reconstructions", "h1"),
            self.p(
                "Each pair shows a private image (top) above the attacker's reconstruction of "
                "it (bottom), matched by the Hungarian algorithm; below them the image's name, "
                "PSNR and level (FedLeak's band of its PSNR where it was recovered beyond the "
                "best guess; '≤ guess' where it was not)."
            ),
        ]
        for entry in self.entries:
            block: list[Flowable] = [self.p(esc(entry.label), "h2")]
            block += self.grid(entry)
            out.append(CondPageBreak(5 * cm))
            out += block
        return out

    def grid(self, entry: ReportEntry) -> list[Flowable]:
        run = entry.run
        if run is None or entry.grid_png is None or not run.summary:
            status = "not run" if run is None else run.status
            return [self.p(f"No reconstruction stored (run {esc(status)}).", "small")]
        names = [str(n) for n in dig(run.summary, "victim", "data", "names") or []]
        per_image = dig(run.summary, "metrics", "per_image") or []
        try:
            if not names:
                raise ValueError("the run's summary lists no images")
            originals, reconstructions = split_grid(entry.grid_png, 2, len(names))
        except Exception as exc:  # a grid of another layout, or not an image at all
            try:
                whole = self.whole_image(entry.grid_png)
            except Exception as unreadable:  # e.g. beyond PIL's decompression-bomb limit
                self.limits.append(
                    f"{esc(entry.label)}: the stored image could not be read ({esc(unreadable)})."
                )
                return [self.p("The stored reconstruction image could not be read.", "small")]
            self.limits.append(
                f"{esc(entry.label)}: the stored image grid could not be split ({esc(exc)}); "
                "it is shown whole."
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
        for i, (original, reconstruction) in enumerate(
            zip(originals, reconstructions, strict=True)
        ):
            white = np.full((gap, width, 3), 255, dtype=np.uint8)
            pair = PILImage.fromarray(np.concatenate([original, white, reconstruction], axis=0))
            if width > MAX_PAIR_PIXELS:
                size = (MAX_PAIR_PIXELS, round(pair.height * MAX_PAIR_PIXELS / width))
                pair = pair.resize(size, PILImage.Resampling.LANCZOS)
            buffer = io.BytesIO()
            pair.save(buffer, format="PNG")
            buffer.seek(0)
            info = per_image[i] if i < len(per_image) and isinstance(per_image[i], dict) else {}
            name = info.get("name", names[i])
            caption = f"{esc(name, 22)}<br/>{fmt(info.get('psnr'), 'db')}&nbsp;dB"
            level = verdicts.caption_level(info)
            caption += f"<br/>{level}" if level else ""
            cells.append(
                [PDFImage(buffer, width=pair_width, height=pair_height), self.p(caption, "tiny")]
            )
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

    def whole_image(self, png: bytes) -> Flowable:
        with PILImage.open(io.BytesIO(png)) as image:
            width, height = image.size
        scale = min(BODY_WIDTH / width, 12 * cm / height)
        return PDFImage(io.BytesIO(png), width=width * scale, height=height * scale)

    def figures(self) -> list[tuple[Any, str]]:
        """The charts of this subject with their captions (plotly figures)."""
        from auditlib.report.charts import comparison_figure, success_rate_figure, tradeoff_figure

        done = [r for r in self.rows if r["has_result"]]
        if not done:
            return []
        with_utility = [
            r
            for r in done
            if finite_number(r["utility_accuracy"]) is not None
            and finite_number(r["psnr"]) is not None
        ]
        figures: list[tuple[Any, str]] = []
        if self.subject.kind == "comparison":
            figures.append(
                (
                    comparison_figure(self.rows),
                    "Attack PSNR per defense (bars coloured by risk level; dotted lines: the "
                    "level bands) and the model's accuracy after federated training.",
                )
            )
        if with_utility and self.subject.kind in ("comparison", "sweep"):
            figures.append(
                (
                    tradeoff_figure(self.rows, "psnr"),
                    "Utility against privacy: each point is a run; further left is less "
                    "leakage, higher is more accuracy. Dotted lines: the risk level bands.",
                )
            )
        curves = success_curves(self.entries)
        if any(curves):
            figures.append(
                (
                    success_rate_figure(self.rows, curves),
                    "Share of the private images reconstructed at each PSNR threshold or "
                    "above, one line per run.",
                )
            )
        return figures

    def charts(self, draw: bool) -> tuple[list[Flowable], bool, str | None]:
        out: list[Flowable] = [PageBreak(), self.p("6 Charts", "h1")]
        figures = self.figures()
        if self.subject.kind == "sweep" and not any(
            finite_number(r["utility_accuracy"]) is not None for r in self.rows
        ):
            out.append(self.p("No run measured utility, so there is no utility-privacy chart."))
        if not figures:
            reason = "no completed run has values to chart"
            out.append(self.p(f"No charts: {esc(reason)}."))
            return out, False, reason
        if not draw:
            reason = "charts were not requested"
            out.append(self.p(f"The charts were left out: {esc(reason)}."))
            return out, False, reason
        from auditlib.report.export import figures_to_png

        images = figures_to_png([f for f, _ in figures], width=CHART_SIZE[0], height=CHART_SIZE[1])
        drawn = 0
        for (_, caption), png in zip(figures, images.pngs, strict=True):
            if png is None:
                continue
            drawn += 1
            height = BODY_WIDTH * CHART_SIZE[1] / CHART_SIZE[0]
            out.append(
                KeepTogether(
                    [
                        PDFImage(io.BytesIO(png), width=BODY_WIDTH, height=height),
                        self.p(esc(caption), "caption"),
                    ]
                )
            )
        if images.reason is not None:
            out.append(
                self.p(
                    f"<b>{len(figures) - drawn} of the {len(figures)} charts could not be "
                    f"drawn</b>: {esc(images.reason)}. The tables in section 4 hold the same "
                    "numbers."
                )
            )
            self.limits.append(f"Charts could not be drawn: {esc(images.reason)}.")
        return out, images.reason is None, images.reason

    def definitions(self) -> list[Flowable]:
        out: list[Flowable] = [self.p("7 Metric definitions", "h1")]
        bands = []
        for (name, floor), (_, above) in zip(
            LEVELS[:-1], ((None, math.inf), *LEVELS), strict=False
        ):
            band = f"≥ {floor:g} dB" if not math.isfinite(above) else f"{floor:g}–{above:g} dB"
            bands.append(f"<b>{esc(name)}</b> ({band}): {esc(LEVEL_MEANING[name])}")
        levels = "; ".join(bands)
        items = [
            "<b>PSNR</b> (peak signal-to-noise ratio, dB): 10·log10(1/MSE) between a private "
            "image and its reconstruction, pixel values in [0, 1], capped at 100 dB. Higher "
            "means more leakage.",
            "<b>SSIM</b> (structural similarity, up to 1): Gaussian window 11, σ 1.5. Higher "
            "means more leakage.",
            "<b>LPIPS</b> (learned perceptual distance, AlexNet features, 0 = identical): "
            "lower means more leakage.",
            "<b>MSE</b>: mean squared pixel error. Lower means more leakage.",
            "<b>Labels</b>: share of the private labels the attacker recovered (order-free).",
            "<b>Best guess</b>: what a server gets without the update (mid-grey; the data's "
            "mean image and mean colour where the data source gives one), scored like a "
            "reconstruction; per image the best of them.",
            f"<b>Recovered</b>: the images recovered, of the batch: {RECOVERED_RULE}.",
            "<b>RDLV</b> (relative data leakage value): (SSIM(x, x̂) − SSIM(x, prior)) / "
            "SSIM(x, prior), the prior being the data's mean image; above 0 the reconstruction "
            "reveals more than a guess from the data's average does.",
            "<b>Verdict</b>: <b>leaks</b> when the run recovered images beyond the best "
            f"guess, with a level from its mean PSNR (FedLeak's bands: {levels}; Medium too "
            "when only some images are recovered); <b>Low</b> only when under a defense the "
            "attack recovered nothing beyond the guess while the same attack at the same "
            f"budget broke the undefended update ({esc(LEVEL_MEANING['Low'])}); otherwise "
            "<b>Inconclusive</b> (cut short, no defense, or a control that did not leak or "
            "is missing), which says nothing about safety.",
            "<b>Accuracy</b>, <b>macro F1</b>: of the model trained with FedAvg under the "
            "defense, on held-out data; <b>accuracy w/o key</b>: FedKL's model used without "
            "its key.",
            "<b>ε</b> (with δ): the differential-privacy bound the defense's accountant "
            "states for the client's update; smaller is more private.",
        ]
        out += self.bullets(items)
        definition = dig(self.summary, "config", "metric_definition")
        if definition:
            out.append(self.p(f"As measured: {esc(definition)}.", "small"))
        return out

    def limits_section(self) -> list[Flowable]:
        out: list[Flowable] = [self.p("8 Limits", "h1")]
        items: list[str] = []
        for metric, reason in unavailable_reasons(self.entries).items():
            items.append(f"{esc(METRIC_NAMES.get(metric, metric))} unavailable: {esc(reason)}.")
        reduced: dict[tuple[str, int], int] = {}
        for entry in self.with_runs:
            name = str(dig(entry.run.spec, "attack", "name"))
            iterations = dig(entry.run.spec, "budget", "iterations")
            info = ATTACKS.get(name)
            if (
                info
                and info.paper_iterations
                and isinstance(iterations, int)
                and (iterations < info.paper_iterations)
            ):
                reduced[(name, iterations)] = info.paper_iterations
        for (name, iterations), paper in reduced.items():
            items.append(
                f"Budget reduced from the paper's: {esc(name)} ran {iterations} optimiser steps "
                f"per restart, its paper {paper}. A longer attack may reconstruct more: a "
                "leak found is a lower bound, and nothing found says little."
            )
        for entry in self.entries:
            summary = self.summary_of(entry)
            label = esc(entry.label)
            if entry.run is None:
                items.append(f"{label}: not run yet; it has no numbers.")
                continue
            if entry.run.status == "timed_out" and entry.has_result:
                items.append(
                    f"{label}: the run timed out; its numbers are what it had measured by then, "
                    "and count (a leak it found stands, a longer run can only find more)."
                )
            elif entry.run.status != "completed":
                error = f": {esc(entry.run.error, 300)}" if entry.run.error else ""
                items.append(f"{label}: the run is {esc(entry.run.status)}{error}.")
            stop = summary.get("stop_reason")
            if stop and stop != "completed":
                steps = dig(summary, "timing", "iterations")
                items.append(
                    f"{label}: the attack stopped early ({esc(stop)}) after {esc(steps)} steps."
                )
            utility = summary.get("utility")
            if isinstance(utility, dict) and utility.get("unavailable_reason"):
                items.append(f"{label}: no utility: {esc(utility['unavailable_reason'])}.")
            elif isinstance(utility, dict) and utility.get("complete") is False:
                why = {
                    "time budget": f"at its time budget ({fmt(utility.get('budget_s'), 'g')} s)",
                    "cancelled": "when the run was cancelled",
                }.get(utility.get("stop_reason"), "early")
                rounds = dig(utility, "federation", "rounds")
                items.append(
                    f"{label}: the utility training stopped {esc(why)} after "
                    f"{esc(utility.get('rounds_completed'))} of {esc(rounds)} rounds; its "
                    "accuracy is that of a shorter training."
                )
        caveat = utility_caveat(self.entries)
        if caveat:
            items.append(f"Utility: {esc(caveat)}.")
        no_epsilon: dict[str, list[str]] = {}
        for entry, row in zip(self.entries, self.rows, strict=True):
            if row["has_result"] and finite_number(row["epsilon"]) is None:
                reason = dig(self.summary_of(entry), "defense_report", "epsilon_unavailable_reason")
                reason = str(reason or "the defense states no privacy guarantee")
                no_epsilon.setdefault(reason, []).append(entry.label)
        for reason, labels in no_epsilon.items():
            items.append(f"ε n/a for {_named(labels)}: {esc(reason)}.")
        # What each ε is about: the neighbouring relation and any amplification, once each.
        relations: dict[str, list[str]] = {}
        for entry, row in zip(self.entries, self.rows, strict=True):
            report = dig(self.summary_of(entry), "defense_report")
            if row["has_result"] and finite_number(row["epsilon"]) is not None:
                said = [report.get(k) for k in ("neighbours", "sampling")] if report else []
                text = "; ".join(str(x) for x in said if x)
                if text:
                    relations.setdefault(text, []).append(entry.label)
        for text, labels in relations.items():
            items.append(f"ε of {_named(labels)}: {esc(text)}.")
        items += self.limits
        items.append(
            "Each run attacks one batch of one client once, with one seed; another batch, "
            "seed or training stage can give other numbers. The tables report the "
            "attacker's own choice among restarts, not the best one in hindsight."
        )
        if not self.fonts.unicode:
            items.append(
                "The DejaVu fonts were not found: characters outside Latin-1 are shown as '?'."
            )
        out += self.bullets(items)
        return out

    def appendix(self) -> list[Flowable]:
        out: list[Flowable] = [
            PageBreak(),
            self.p("Appendix: reproducibility", "h1"),
            self.p(
                "Each run is identified by the sha256 of its spec (everything that determines "
                "its result); a run with the same spec id gives the same numbers on the same "
                "device and versions. Data: sha256 of the private images and labels used."
            ),
        ]
        rows = []
        for entry in self.entries:
            run = entry.run
            if run is None:
                rows.append((esc(entry.label), "not run"))
                continue
            data_hash = dig(run.summary, "victim", "data", "content_sha256")
            seed = run.spec.get("seed")
            ids = (
                f"<font name='{self.fonts.mono}' size='6.5'>run&nbsp;&nbsp;{esc(run.id)}<br/>"
                f"spec&nbsp;{esc(run.spec_id)}<br/>data&nbsp;{esc(data_hash or NOT_AVAILABLE)}"
                "</font>"
                f"<br/>seed {esc(seed)}, {esc(run.status)}, started {esc(_when(run.started_at))}"
            )
            rows.append((esc(entry.label), ids))
        out.append(self.table(("Run", "Identifiers"), rows, (4.4 * cm, BODY_WIDTH - 4.4 * cm)))
        versions: dict[str, int] = {}
        for entry in self.completed:
            recorded = dig(self.summary_of(entry), "versions") or {}
            text = ", ".join(f"{k} {v}" for k, v in recorded.items())
            versions[text] = versions.get(text, 0) + 1
        out.append(self.p("Versions", "h2"))
        pairs = [(f"{count} run(s)", esc(text)) for text, count in versions.items()]
        pairs.append(
            (
                "This report",
                esc(
                    f"auditlib {auditlib.__version__}, python {platform.python_version()}, "
                    + ", ".join(f"{n} {_package_version(n)}" for n in REPORT_PACKAGES)
                ),
            )
        )
        out.append(self.key_values(pairs))
        if self.spec:
            shared = (
                "the run's spec"
                if self.subject.kind == "run"
                else (
                    "the spec of the first completed run; the others differ only in the defense "
                    "(section 3)"
                )
            )
            out.append(self.p("Spec", "h2"))
            out.append(self.p(f"As JSON, {esc(shared)}:", "small"))
            lines = [
                f"{json.dumps(key)}: {json.dumps(value, sort_keys=True, default=str)}"
                for key, value in sorted(self.spec.items())
            ]
            out.append(Preformatted("\n".join(lines), self.styles["code"], maxLineLength=120))
        return out


def _render(subject: ReportSubject, target: Any, charts: bool) -> tuple[int, bool, str | None]:
    fonts = _fonts()
    builder = _Builder(subject, fonts)
    story: list[Flowable] = []
    story += builder.title_page()
    story += builder.executive_summary()
    story += builder.threat_model()
    story += builder.settings()
    story += builder.results()
    story += builder.reconstructions()
    chart_story, drawn, reason = builder.charts(charts)
    story += chart_story
    story += builder.definitions()
    story += builder.limits_section()  # after the sections that add limits
    story += builder.appendix()
    counter = {"pages": 0}
    footer = f"auditlib {auditlib.__version__} · {subject.kind} {subject.id[:12]}"
    document = SimpleDocTemplate(
        target,
        pagesize=A4,
        leftMargin=MARGIN,
        rightMargin=MARGIN,
        topMargin=MARGIN,
        bottomMargin=MARGIN,
        title=f"Gradient-leakage audit: {subject.title}",
        author=f"auditlib {auditlib.__version__}",
        subject=f"{subject.kind} {subject.id}",
        creator="auditlib.report.pdf",
    )
    document.build(story, canvasmaker=_canvas_class(footer, fonts, counter))
    return counter["pages"], drawn, reason


def render_report(subject: ReportSubject, *, charts: bool = True) -> tuple[bytes, ReportInfo]:
    """The report as PDF bytes (the dashboard's download), and what went into it."""
    buffer = io.BytesIO()
    pages, drawn, reason = _render(subject, buffer, charts)
    return buffer.getvalue(), ReportInfo(None, pages, drawn, reason)


def report_bytes(subject: ReportSubject, *, charts: bool = True) -> bytes:
    return render_report(subject, charts=charts)[0]


def build_report(subject: ReportSubject, out: str | Path, *, charts: bool = True) -> ReportInfo:
    """Write the report of ``subject`` to the PDF file ``out`` (replaced whole, never left
    half-written). Refuses a folder or a path whose folder does not exist."""
    path = Path(out)
    if path.is_dir():
        raise AuditInputError(f"{path} is a folder; give the PDF file to write")
    if not path.parent.is_dir():
        raise AuditInputError(f"the folder {path.parent} does not exist")
    data, info = render_report(subject, charts=charts)
    handle, temporary = tempfile.mkstemp(prefix=".report-", suffix=".pdf", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide the report from others
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return ReportInfo(path, info.pages, info.charts_drawn, info.charts_unavailable_reason)
