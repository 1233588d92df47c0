"""The PDF audit report of one run, a comparison or a sweep (reportlab platypus, A4).

Sections: title page (what was audited, when, by which version), executive summary (the
risk in plain words), threat model and FL scenario, attack and defense settings, metric
tables, reconstructions beside their originals, charts (the dashboard's plotly figures,
drawn by kaleido; see ``export.py``), metric definitions, limits, and a reproducibility
appendix (spec hashes, seeds, package versions).

The package is facts and sections. Facts (``subject``'s entries and rows, ``facts``,
``verdict_facts``, ``facts_results``, ``facts_back``, ``text``) are pure functions over the
typed results and specs of the runs, returning plain values and words, without reportlab;
labels, formats and definitions of the metrics are the catalogue's (``metrics.catalogue``).
Sections (``sections_front`` with ``verdict_section``, ``sections_results``,
``sections_back``) escape those words and lay them out through the building blocks of
``layout``. Nothing is recomputed: every number was stored by the runs.
Every text that comes from a user (titles, labels, image names, errors) is escaped before
it enters reportlab's Paragraph markup. The report renders whatever happens to Chromium:
without it, the charts are replaced by a sentence saying why.
"""

from __future__ import annotations

import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reportlab.lib.pagesizes import A4
from reportlab.platypus import Flowable, SimpleDocTemplate

import auditlib
from auditlib.errors import AuditInputError
from auditlib.report import (
    layout,
    sections_back,
    sections_front,
    sections_results,
    sections_unscored,
)
from auditlib.report.subject import ReportSubject

# Why an unscored run's report has no charts: they plot scores.
UNSCORED = "no charts: the run has no scores to plot (no private images to compare with)"


@dataclass(frozen=True)
class ReportInfo:
    """What :func:`build_report` wrote: the file (None for bytes), its pages, the charts."""

    path: Path | None
    pages: int
    charts_drawn: bool
    charts_unavailable_reason: str | None


def _render(subject: ReportSubject, target: Any, charts: bool) -> tuple[int, bool, str | None]:
    fonts = layout.fonts()
    b = layout.Builder(subject, fonts)
    if sections_unscored.is_unscored(b):  # an observed update without the client's images
        return _build(subject, target, sections_unscored.story(b), fonts), False, UNSCORED
    story: list[Flowable] = []
    story += sections_front.title_page(b)
    story += sections_front.executive_summary(b)
    story += sections_front.threat_model(b)
    story += sections_front.settings(b)
    story += sections_results.results(b)
    story += sections_results.reconstructions(b)
    chart_story, drawn, reason = sections_results.charts(b, charts)
    story += chart_story
    story += sections_back.definitions(b)
    story += sections_back.limits_section(b)  # after the sections that add limits
    story += sections_back.appendix(b)
    return _build(subject, target, story, fonts), drawn, reason


def _build(subject: ReportSubject, target: Any, story: list[Flowable], fonts) -> int:
    """Lay ``story`` out on A4 pages into ``target``; the number of pages."""
    counter = {"pages": 0}
    footer = f"auditlib {auditlib.__version__} · {subject.kind} {subject.id[:12]}"
    document = SimpleDocTemplate(
        target,
        pagesize=A4,
        leftMargin=layout.MARGIN,
        rightMargin=layout.MARGIN,
        topMargin=layout.MARGIN,
        bottomMargin=layout.MARGIN,
        title=f"Gradient-leakage audit: {subject.title}",
        author=f"auditlib {auditlib.__version__}",
        subject=f"{subject.kind} {subject.id}",
        creator="auditlib.report.pdf",
    )
    document.build(story, canvasmaker=layout.canvas_class(footer, fonts, counter))
    return counter["pages"]


def render_report(subject: ReportSubject, *, charts: bool = True) -> tuple[bytes, ReportInfo]:
    """The report as PDF bytes (the dashboard's download), and what went into it."""
    buffer = io.BytesIO()
    pages, drawn, reason = _render(subject, buffer, charts)
    return buffer.getvalue(), ReportInfo(None, pages, drawn, reason)


def report_bytes(subject: ReportSubject, *, charts: bool = True) -> bytes:
    return render_report(subject, charts=charts)[0]


def _umask() -> int:
    mask = os.umask(0o077)  # read it (the only way); set back at once
    os.umask(mask)
    return mask


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
        os.chmod(temporary, 0o666 & ~_umask())  # as any file the user writes, not mkstemp's
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return ReportInfo(path, info.pages, info.charts_drawn, info.charts_unavailable_reason)
