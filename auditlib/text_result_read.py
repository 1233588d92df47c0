"""A text audit's result.json (``text_result_json.text_result_dict``) read back into typed,
frozen records: what the PDF (``report.text_pdf``) and the dashboard's Text page read, so
neither reads the JSON by string keys. Plain data: no tensors, nothing unpickled.

A file that is not a text result, or one written by a newer version, is refused with
AuditInputError rather than half read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from auditlib.engine.text_audit import TextAuditSpec
from auditlib.errors import AuditInputError
from auditlib.metrics.text_baseline import TextGuess
from auditlib.text_result_json import TEXT_RESULT_VERSION

MAX_RESULT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class SequenceRow:
    """One private sequence beside the recovered one matched to it (None: none was)."""

    private: str
    recovered: str | None
    rouge1: float
    rouge2: float
    rougeL: float
    token_accuracy: float
    exact: bool
    is_recovered: bool  # beyond the guess from public text (metrics.text_risk)
    level: str | None


@dataclass(frozen=True)
class AttackRow:
    """One attack's run on one update (the audited one, or the undefended control)."""

    attack: str
    control: bool  # on the undefended update, beside a defended run
    seconds: float
    assumptions_hold: bool | None
    notes: tuple[str, ...]
    rouge1: float
    rouge2: float
    rougeL: float
    token_accuracy: float
    exact: int
    recovered: int  # sequences recovered beyond the guess
    nothing_shown: int  # sequences that showed nothing beyond the guess
    level: str | None
    sequences: tuple[SequenceRow, ...]
    stopped: bool = False  # cut short by a Cancel: what it had recovered then

    @property
    def label(self) -> str:
        """Its name as a table shows it: the attack, and what kind of run it was."""
        return (
            self.attack
            + (" (control: undefended)" if self.control else "")
            + (" (cut short by a cancel)" if self.stopped else "")
        )


@dataclass(frozen=True)
class TextVerdictView:
    outcome: str  # "leaks", "defense_held", "inconclusive"
    level: str
    headline: str
    sentence: str
    attacks: tuple[str, ...]
    defense: str
    adaptive: str  # "ran", "not offered", "none", "no defense"


@dataclass(frozen=True)
class PrivacyView:
    epsilon: float | None
    delta: float | None
    reason: str | None  # why there is no epsilon, where the defense said
    accountant: str | None


@dataclass(frozen=True)
class StoredTextResult:
    spec: TextAuditSpec
    model: str
    data: str
    seconds: float
    guesses: tuple[TextGuess, ...]
    bar_rouge1: tuple[float, ...]  # per private sequence, the best guess's (metrics.text_baseline)
    bar_rouge2: tuple[float, ...]
    bar_rougeL: tuple[float, ...]
    runs: tuple[AttackRow, ...]
    controls: tuple[AttackRow, ...]
    verdict: TextVerdictView
    privacy: PrivacyView
    stopped: bool = False  # cancelled: an attack cut short, the rest not run
    # (file, sha256) of each of the auditor's files read, in the result's order
    # (TextAuditResult.inputs); empty for a preset on the demo text or an older result.
    inputs: tuple[tuple[str, str], ...] = ()

    @property
    def private_texts(self) -> tuple[str, ...]:
        first = (self.runs or self.controls or (None,))[0]
        return tuple(s.private for s in first.sequences) if first is not None else ()

    def bar_mean(self, measure: str) -> float | None:
        """The guess's mean over the sequences of ``measure`` (rouge1, rouge2, rougeL)."""
        values = getattr(self, f"bar_{measure}")
        return sum(values) / len(values) if values else None


def _floats(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _sequence(row: dict[str, Any]) -> SequenceRow:
    return SequenceRow(
        str(row["private"]),
        None if row.get("recovered") is None else str(row["recovered"]),
        float(row["rouge1"]), float(row["rouge2"]), float(row["rougeL"]),
        float(row["token_accuracy"]), bool(row["exact"]), bool(row["is_recovered"]),
        row.get("level"),
    )  # fmt: skip


def _attack(row: dict[str, Any], control: bool) -> AttackRow:
    return AttackRow(
        str(row["attack"]), control, float(row["seconds"]), row.get("assumptions_hold"),
        tuple(str(n) for n in row.get("notes", ())), float(row["rouge1"]), float(row["rouge2"]),
        float(row["rougeL"]), float(row["token_accuracy"]), int(row["exact"]),
        int(row["recovered"]), int(row["nothing_shown"]), row.get("level"),
        tuple(_sequence(s) for s in row["sequences"]), bool(row.get("stopped", False)),
    )  # fmt: skip


def _spec(data: dict[str, Any]) -> TextAuditSpec:
    known = {f.name for f in fields(TextAuditSpec)}
    given = {k: v for k, v in data.items() if k in known}
    if "attacks" in given:
        given["attacks"] = tuple(given["attacks"])
    return TextAuditSpec(**given)


def _inputs(data: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(data, dict):
        raise TypeError("inputs: expected an object of file: sha256")
    for name, digest in data.items():
        if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
            raise ValueError(f"inputs[{name!r}]: expected a sha256 in hex")
    return tuple((str(name), digest) for name, digest in data.items())


def _privacy(data: dict[str, Any]) -> PrivacyView:
    return PrivacyView(
        _optional_float(data.get("epsilon")),
        _optional_float(data.get("delta")),
        data.get("epsilon_unavailable_reason"),
        data.get("accountant"),
    )


def read_text_result(data: dict[str, Any]) -> StoredTextResult:
    """The typed result of ``data`` (result.json of a text audit, parsed)."""
    if not isinstance(data, dict) or data.get("modality") != "text":
        raise AuditInputError('not a text audit\'s result.json (no "modality": "text")')
    version = data.get("version")
    if not isinstance(version, int) or version > TEXT_RESULT_VERSION:
        raise AuditInputError(
            f"a text result of version {version!r}; this release reads up to {TEXT_RESULT_VERSION}"
        )
    try:
        v = data["verdict"]
        bar = data["guess_bar"]
        return StoredTextResult(
            _spec(data["spec"]), str(data["model"]), str(data["data"]), float(data["seconds"]),
            tuple(TextGuess(str(g["name"]), str(g["text"])) for g in data["guesses"]),
            _floats(bar["rouge1"]), _floats(bar["rouge2"]), _floats(bar["rougeL"]),
            tuple(_attack(r, False) for r in data["runs"]),
            tuple(_attack(r, True) for r in data["controls"]),
            TextVerdictView(
                str(v["outcome"]), str(v["level"]), str(v["headline"]), str(v["sentence"]),
                tuple(v["attacks"]), str(v["defense"]), str(v["adaptive"]),
            ),
            _privacy(data.get("privacy") or {}), bool(data.get("stopped", False)),
            _inputs(data.get("inputs") or {}),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise AuditInputError(f"a text result.json missing or mistyping {exc}") from None


def load_text_result(path: str | Path) -> StoredTextResult:
    """result.json of ``audit --text-model`` from a file (JSON only; nothing unpickled)."""
    path = Path(path)
    if not path.is_file():
        raise AuditInputError(f"{path}: no such file; expected the result.json of a text audit")
    if path.stat().st_size > MAX_RESULT_BYTES:
        raise AuditInputError(f"{path}: larger than {MAX_RESULT_BYTES} bytes")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AuditInputError(f"{path}: not JSON ({exc})") from None
    return read_text_result(data)
