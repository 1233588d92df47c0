"""The PDF's page and building blocks (reportlab): A4 geometry, fonts, paragraph styles,
markup escaping, tables that fit the body width, the "page i of n" footer, and the
:class:`Builder` every section writes through."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, unescape

from reportlab.lib import colors
from reportlab.lib.enums import TA_CENTER
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle
from reportlab.lib.units import cm
from reportlab.pdfbase import pdfmetrics
from reportlab.pdfbase.ttfonts import TTFont
from reportlab.pdfgen import canvas as pdf_canvas
from reportlab.platypus import Flowable, Paragraph, Table, TableStyle

from auditlib.report import facts
from auditlib.report.subject import ReportSubject, run_rows
from auditlib.report.text import clip

PAGE_WIDTH, PAGE_HEIGHT = A4
MARGIN = 1.8 * cm
BODY_WIDTH = PAGE_WIDTH - 2 * MARGIN
CELL_PADDING = 3  # points each side of a table cell (see Builder.table)
FONT_DIRS = (
    "/usr/share/fonts/truetype/dejavu",  # Debian / Ubuntu: fonts-dejavu-core
    "/usr/share/fonts/dejavu",
    "/usr/share/fonts/TTF",
    "/usr/local/share/fonts",
)


# ------------------------------------------------------------------------------ fonts, markup


@dataclass(frozen=True)
class Fonts:
    regular: str
    bold: str
    mono: str
    unicode: bool  # DejaVu (Greek, maths symbols) rather than the Latin-1 PDF base fonts


@functools.cache
def fonts() -> Fonts:
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
        return Fonts(regular, bold, found.get("AuditMono", "Courier"), True)
    return Fonts("Helvetica", "Helvetica-Bold", "Courier", False)


_LATIN_STAND_INS = {"≥": "&gt;=", "≤": "&lt;=", "ε": "eps", "δ": "delta", "→": "-&gt;", "−": "-"}


def latin(markup: str) -> str:
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
    return escape(clip(value, limit))


def lines(text: str) -> str:
    """Escaped text whose line breaks become Paragraph breaks."""
    return "<br/>".join(esc(line) for line in text.split("\n"))


_TAG = re.compile(r"<[^>]*>")


def tokens(markup: str) -> list[str]:
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


# ------------------------------------------------------------------------------ page canvas


def canvas_class(footer: str, used: Fonts, counter: dict[str, int]) -> type:
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
                self.setFont(used.regular, 7.5)
                self.setFillColor(colors.grey)
                self.drawString(MARGIN, MARGIN / 2, footer)
                self.drawRightString(
                    PAGE_WIDTH - MARGIN, MARGIN / 2, f"page {self._pageNumber} of {total}"
                )
                super().showPage()
            counter["pages"] = total
            super().save()

    return FooterCanvas


def styles(used: Fonts) -> dict[str, ParagraphStyle]:
    regular, bold = used.regular, used.bold
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
    heading = {"fontName": bold, "keepWithNext": 1}
    return {
        "body": body,
        "title": ParagraphStyle("title", body, fontName=bold, fontSize=22, leading=27),
        "subtitle": ParagraphStyle("subtitle", body, fontSize=14, leading=18, spaceAfter=14),
        "h1": ParagraphStyle(
            "h1", body, fontSize=15, leading=19, spaceBefore=6, spaceAfter=8, **heading
        ),
        "h2": ParagraphStyle(
            "h2", body, fontSize=11, leading=14, spaceBefore=8, spaceAfter=4, **heading
        ),
        "bullet": ParagraphStyle("bullet", body, leftIndent=12, bulletIndent=2, spaceAfter=2),
        "small": ParagraphStyle("small", body, fontSize=8, leading=10),
        "caption": ParagraphStyle(
            "caption", body, fontSize=8, leading=10, textColor=colors.dimgrey, spaceAfter=8
        ),
        "cell": ParagraphStyle("cell", body, fontSize=7.5, leading=9, spaceAfter=0),
        "head": ParagraphStyle("head", body, fontName=bold, fontSize=7.5, leading=9, spaceAfter=0),
        "tiny": ParagraphStyle(
            "tiny", body, fontSize=6, leading=7, alignment=TA_CENTER, spaceAfter=0
        ),
        "code": ParagraphStyle("code", body, fontName=used.mono, fontSize=6.5, leading=7.8),
    }


# ------------------------------------------------------------------------------ the builder


class Builder:
    """One report's subject, rows and styles, and the blocks its sections are made of.

    ``limits`` collects what a section could not show (an image it could not read, charts
    it could not draw), as plain text; the Limits section lists them.
    """

    def __init__(self, subject: ReportSubject, used: Fonts) -> None:
        self.subject = subject
        self.fonts = used
        self.entries = subject.entries
        self.rows = run_rows(subject.entries)
        self.reference = facts.reference(subject.entries)
        self.styles = styles(used)
        self.limits: list[str] = []

    def p(self, markup: str, style: str = "body", **kwargs: Any) -> Paragraph:
        """A Paragraph of markup whose dynamic parts the caller has passed through esc()."""
        if not self.fonts.unicode:
            markup = latin(markup)
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
            ("LEFTPADDING", (0, 0), (-1, -1), CELL_PADDING),
            ("RIGHTPADDING", (0, 0), (-1, -1), CELL_PADDING),
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
        for font, cells in ((self.fonts.bold, heads), (self.fonts.regular, rows)):
            for row in cells:
                for i, cell in enumerate(row[:columns]):
                    for word in tokens(cell if self.fonts.unicode else latin(cell)):
                        width = pdfmetrics.stringWidth(word, font, size) + 2 * CELL_PADDING + 1
                        minimums[i] = max(minimums[i], width)
        return minimums

    def key_values(self, pairs: Sequence[tuple[str, str]], key_width: float = 4.2 * cm) -> Table:
        """Two columns of markup: keys (bold) beside values."""
        return self.table(
            (), [(k, v) for k, v in pairs], (key_width, BODY_WIDTH - key_width), header_column=True
        )

    def plain_pairs(self, pairs: Sequence[tuple[str, str]]) -> Table:
        """Key-value rows of plain text (facts), escaped."""
        return self.key_values([(esc(k), esc(v)) for k, v in pairs])
