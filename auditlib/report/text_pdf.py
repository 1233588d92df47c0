"""The PDF of a text audit (reportlab, A4, the image report's fonts and styles from
``layout``): the verdict with its scope (attacks, defense, whether the attacker that knows
the defense ran, epsilon), the scores per attack beside the guess from public text, the
private and recovered sequences side by side, and what each attack noted of its
assumptions.

It reads the stored result (``text_result_read.StoredTextResult``, from result.json) and
recomputes nothing. With ``mask_private`` the private and the recovered text are replaced
by a mask that keeps only each word's length, so the PDF can be shared: the recovered
text is the private text wherever the attack was exact, and close to it elsewhere.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from reportlab.lib.pagesizes import A4
from reportlab.lib.units import cm
from reportlab.platypus import CondPageBreak, Flowable, SimpleDocTemplate, Spacer

import auditlib
from auditlib.errors import AuditInputError
from auditlib.metrics.verdict import OUTCOME_TITLE
from auditlib.report import layout
from auditlib.report.layout import BODY_WIDTH, esc
from auditlib.text_result_read import AttackRow, StoredTextResult

MASK_CHAR = "•"  # in the PDF base fonts too (cp1252 0x95)
NOT_SCORED = "n/a"  # the guess has no tokens at positions, nor an exact sequence, to count
ADAPTIVE_WORDS = {
    "ran": "ran (DAGER ranking candidates through the defense's noise)",
    "not offered": "not offered: no attack here has a form that knows this defense",
    "none": "did not run",
    "no defense": "no defense to know",
}
RECOVERED_RULE = (
    "A sequence is recovered when the attack got at least half of its words (ROUGE-1 at "
    "least 0.5) and clearly more than the best guess from public text (0.2 above its "
    "ROUGE-1); its level is Very High where it reads back verbatim (exact, or ROUGE-2 at "
    "least 0.9), High where most phrases do (ROUGE-2 at least 0.5), Medium for words "
    "without their order. ROUGE is Google's rouge-score F-measure; token accuracy is the "
    "share of a sequence's tokens recovered at their position."
)


@dataclass(frozen=True)
class TextReportInfo:
    path: Path | None
    pages: int
    masked: bool


def mask_text(text: str) -> str:
    """The text with every word replaced by dots of its length: its shape, not its words."""
    return re.sub(r"\S+", lambda m: MASK_CHAR * len(m.group()), text)


class _Builder(layout.Builder):
    """``layout.Builder``'s blocks (paragraphs, tables) without an image report's subject."""

    def __init__(self, used: layout.Fonts) -> None:  # no subject to read
        self.fonts = used
        self.styles = layout.styles(used)
        self.limits: list[str] = []


def _num(value: float | None) -> str:
    return NOT_SCORED if value is None else f"{value:.2f}"


def _epsilon(result: StoredTextResult) -> str:
    privacy = result.privacy
    if result.spec.defense == "none":
        return "none: no defense"
    if privacy.epsilon is None:
        return "none" + (f": {privacy.reason}" if privacy.reason else " given by the defense")
    delta = f", δ = {privacy.delta:.3g}" if privacy.delta is not None else ""
    how = f" ({privacy.accountant})" if privacy.accountant else ""
    return f"ε = {privacy.epsilon:.4g}{delta}{how}"


def _verdict(b: _Builder, r: StoredTextResult) -> list[Flowable]:
    v = r.verdict
    pairs = [
        ("Outcome", OUTCOME_TITLE.get(v.outcome, v.outcome)),
        ("Level", v.level),
        ("Attacks", ", ".join(v.attacks) or "none"),
        ("Defense", v.defense),
        ("Attacker that knows the defense", ADAPTIVE_WORDS.get(v.adaptive, v.adaptive)),
        ("Privacy (epsilon)", _epsilon(r)),
    ]
    return [
        b.p("Verdict", "h1"),
        b.p(f"<b>{esc(v.headline)}</b>", "subtitle"),
        b.p(esc(v.sentence)),
        b.plain_pairs(pairs),
    ]


def _settings(b: _Builder, r: StoredTextResult) -> list[Flowable]:
    s = r.spec
    pairs = [
        ("Model", r.model),
        ("Private text", r.data),
        ("Sequences (batch)", str(s.batch_size)),
        ("Tokens per sequence", str(s.length)),
        ("What trains", f"LoRA adapters of rank {s.lora_rank}" if s.lora_rank else "every weight"),
        (
            "Client protocol",
            f"{s.algorithm}, {s.local_steps} local step(s), lr {s.learning_rate:g}",
        ),
        ("Defense", s.defense + "".join(f", {k}={v}" for k, v in sorted(s.defense_params.items()))),
        (
            "Optimising attacks (TAG, LAMP)",
            f"{s.preset} preset, "
            + (f"{s.iterations} steps" if s.iterations else "the preset's steps"),
        ),
        ("Seed", str(s.seed)),
        ("Audit time", f"{r.seconds:.1f} s"),
    ]
    if r.stopped:
        pairs.append(("Cancelled", "yes: an attack was cut short and what followed it did not run"))
    # The auditor's files by the sha256 of their bytes: what exactly was audited.
    pairs += [(f"sha256 of {name}", digest) for name, digest in r.inputs]
    return [b.p("Settings", "h2"), b.plain_pairs(pairs)]


def _score_row(run: AttackRow, size: int) -> list[str]:
    return [
        esc(run.label),
        _num(run.rouge1), _num(run.rouge2), _num(run.rougeL),
        f"{run.exact} of {size}", _num(run.token_accuracy),
        f"{run.recovered} of {size}", esc(run.level or "none"), f"{run.seconds:.1f}",
    ]  # fmt: skip


def _scores(b: _Builder, r: StoredTextResult) -> list[Flowable]:
    size = len(r.private_texts)
    header = ["Attack", "ROUGE-1", "ROUGE-2", "ROUGE-L", "Exact", "Token acc.",
              "Recovered", "Level", "Seconds"]  # fmt: skip
    rows = [_score_row(run, size) for run in (*r.runs, *r.controls)]
    rows.append(
        [
            "guess from public text (no update)",
            _num(r.bar_mean("rouge1")),
            _num(r.bar_mean("rouge2")),
            _num(r.bar_mean("rougeL")),
            NOT_SCORED,
            NOT_SCORED,
            "-",
            "-",
            "-",
        ]
    )
    widths = [4.2 * cm] + [(BODY_WIDTH - 4.2 * cm) / 8] * 8
    guesses = [f"<i>{esc(g.name)}</i>: {esc(g.text)}" for g in r.guesses]
    return [
        b.p("Scores", "h1"),
        b.table(header, rows, widths),
        b.p(
            "Means over the sequences. The guess's row is, per sequence and per measure, the "
            "best of the server's guesses without the update (below): the bar a recovery must "
            f"clear. It has no token positions or exact sequences to count ({NOT_SCORED}). "
            + esc(RECOVERED_RULE),
            "caption",
        ),
        b.p("The guesses from public text", "h2"),
        *b.bullets(guesses),
    ]


def _sequences(b: _Builder, r: StoredTextResult, masked: bool) -> list[Flowable]:
    story: list[Flowable] = [b.p("Private and recovered sequences", "h1")]
    if masked:
        story.append(
            b.p(
                "Masked for sharing: every word of the private and the recovered text is "
                f"shown as {MASK_CHAR * 3} of its length.",
                "caption",
            )
        )
    show = mask_text if masked else (lambda t: t)
    header = ["#", "Private", "Recovered", "R-1", "R-2", "Exact", "Recovered?"]
    widths = [0.7 * cm, 6.2 * cm, 6.2 * cm, 1.0 * cm, 1.0 * cm, 1.0 * cm, 1.6 * cm]
    for run in (*r.runs, *r.controls):
        title = run.label
        rows = [
            [
                str(i + 1), esc(show(s.private)),
                esc(show(s.recovered)) if s.recovered is not None else "<i>none matched</i>",
                _num(s.rouge1), _num(s.rouge2), "yes" if s.exact else "no",
                esc(s.level) if s.is_recovered and s.level else ("yes" if s.is_recovered else "no"),
            ]
            for i, s in enumerate(run.sequences)
        ]  # fmt: skip
        story += [b.p(esc(title), "h2"), b.table(header, rows, widths)]
    return story


def _notes(b: _Builder, r: StoredTextResult) -> list[Flowable]:
    story: list[Flowable] = [b.p("What the attacks noted", "h1")]
    for run in (*r.runs, *r.controls):
        held = {True: "held", False: "did not hold", None: "none: it claims no exactness"}
        title = run.label
        story.append(b.p(f"{esc(title)}: its assumptions {held[run.assumptions_hold]}", "h2"))
        story += b.bullets([esc(n) for n in run.notes] or ["no notes"])
    return story


def _story(r: StoredTextResult, b: _Builder, masked: bool) -> list[Flowable]:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    story: list[Flowable] = [
        b.p("Text-model gradient-leakage audit", "title"),
        b.p(esc(f"{r.model} · {r.data}"), "subtitle"),
        b.p(esc(f"written {when} by auditlib {auditlib.__version__}"), "small"),
        Spacer(1, 0.4 * cm),
    ]
    story += _verdict(b, r)
    story += _settings(b, r)
    story += _scores(b, r)
    story.append(
        CondPageBreak(8 * cm)
    )  # the sequences start on a fresh page only where little is left
    story += _sequences(b, r, masked)
    story += _notes(b, r)
    return story


def render_text_report(result: StoredTextResult, *, mask_private: bool = False) -> bytes:
    """The PDF's bytes (the dashboard's download)."""
    return _render(result, mask_private)[0]


def _render(result: StoredTextResult, masked: bool) -> tuple[bytes, int]:
    used = layout.fonts()
    buffer = io.BytesIO()
    counter = {"pages": 0}
    footer = f"auditlib {auditlib.__version__} · text audit" + (" · masked" if masked else "")
    document = SimpleDocTemplate(
        buffer, pagesize=A4, leftMargin=layout.MARGIN, rightMargin=layout.MARGIN,
        topMargin=layout.MARGIN, bottomMargin=layout.MARGIN,
        title="Text-model gradient-leakage audit", author=f"auditlib {auditlib.__version__}",
        creator="auditlib.report.text_pdf",
    )  # fmt: skip
    story = _story(result, _Builder(used), masked)
    document.build(story, canvasmaker=layout.canvas_class(footer, used, counter))
    return buffer.getvalue(), counter["pages"]


def build_text_report(
    result: StoredTextResult, out: str | Path, *, mask_private: bool = False
) -> TextReportInfo:
    """Write the PDF to ``out`` (replaced whole, never left half-written)."""
    path = Path(out)
    if path.is_dir():
        raise AuditInputError(f"{path} is a folder; give the PDF file to write")
    if not path.parent.is_dir():
        raise AuditInputError(f"the folder {path.parent} does not exist")
    data, pages = _render(result, mask_private)
    handle, temporary = tempfile.mkstemp(prefix=".report-", suffix=".pdf", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        mask = os.umask(0o077)
        os.umask(mask)
        os.chmod(temporary, 0o666 & ~mask)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return TextReportInfo(path, pages, mask_private)
