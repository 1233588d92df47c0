"""What the result tables of the PDF report (section 4) state, as plain text: the runs'
rows (``subject.RunRow``) in the catalogue's headings and formats. ``sections_results``
escapes and lays them out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from auditlib.metrics.catalogue import CATALOGUE, epsilon_note
from auditlib.report.subject import RunRow, learns_nothing
from auditlib.report.text import NOT_AVAILABLE, metric_text, seconds_text
from auditlib.store.convert import finite_number


def recovered_text(row: RunRow) -> str:
    """'k of B' images recovered beyond the best guess; n/a for runs scored before guesses."""
    if row.beyond_guess is None:
        return NOT_AVAILABLE
    return f"{row.beyond_guess[0]} of {row.beyond_guess[1]}"


def twin_rows(rows: Sequence[RunRow]) -> list[tuple[str, str, str, str]]:
    """(run, plain PSNR, knowing-the-defense PSNR, the stronger) where a twin ran; "equal"
    where the two read the same as printed (a difference below the printed precision is
    no finding either way)."""
    return [
        (r.label, plain, twin, _stronger(r, plain, twin))
        for r in rows
        if r.adaptive_psnr is not None
        for plain, twin in [
            (metric_text("psnr", r.plain_psnr), metric_text("psnr", r.adaptive_psnr))
        ]
    ]


def _stronger(row: RunRow, plain: str, twin: str) -> str:
    if plain == twin:
        return "equal"
    return "knowing the defense" if (row.adaptive_psnr or 0) > (row.plain_psnr or 0) else "plain"


@dataclass(frozen=True)
class Column:
    key: str  # a catalogue key, or the table's own ("run", "chance", "undefended", "attack_s", ...)
    head: str
    cells: tuple[str, ...]


def cost_columns(rows: Sequence[RunRow]) -> list[Column]:
    """The defense-cost table: accuracy beside chance (where known) and the undefended
    accuracy, macro F1, accuracy without the key (FedKL, where measured), ε, and the attacks'
    and the utility training's wall times (``TIME_COLUMNS_NOTE``)."""

    def texts(key: str, values: Sequence[float | None]) -> tuple[str, ...]:
        return tuple(CATALOGUE[key].text(v) for v in values)

    def metric(key: str, values: Sequence[float | None]) -> Column:
        return Column(key, CATALOGUE[key].heading, texts(key, values))

    columns = [Column("run", "Run", tuple(r.label for r in rows))]
    columns.append(metric("accuracy", [r.utility_accuracy for r in rows]))
    if any(finite_number(r.utility_chance) is not None for r in rows):
        columns.append(
            Column("chance", "Chance", texts("accuracy", [r.utility_chance for r in rows]))
        )
    undefended = [r.utility_accuracy if r.series == "none" else r.utility_undefended for r in rows]
    columns.append(Column("undefended", "Undefended", texts("accuracy", undefended)))
    columns.append(metric("macro_f1", [r.utility_f1 for r in rows]))
    if any(finite_number(r.utility_without_key) is not None for r in rows):
        columns.append(metric("accuracy_without_key", [r.utility_without_key for r in rows]))
    columns.append(metric("epsilon", [r.epsilon for r in rows]))
    columns.append(Column("attack_s", "Attack s", tuple(seconds_text(r.seconds) for r in rows)))
    columns.append(
        Column("training_s", "Training s", tuple(seconds_text(r.utility_seconds) for r in rows))
    )
    return columns


# What the defense-cost table's two time columns hold: the same quantity in every row.
TIME_COLUMNS_NOTE = (
    "Attack s: the wall time of all the attacks the run ran (under a defense with an "
    "attacker that knows it, the plain attack and its twin: two attacks where the undefended "
    "run ran one); Training s: the wall time of the utility training under the run's defense"
)


def cost_notes(rows: Sequence[RunRow]) -> list[str]:
    """What the defense-cost table's figures mean where they need a word: each setting whose
    defended model learns nothing (``subject.learns_nothing``), and an ε too large to
    guarantee anything (``catalogue.epsilon_note``)."""
    notes = [f"{r.label}: {why}" for r in rows if (why := learns_nothing(r))]
    epsilon = epsilon_note(r.epsilon for r in rows)
    return notes + ([epsilon] if epsilon else [])
