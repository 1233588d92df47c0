"""Labels for the private batch: read from a CSV, checked against the model, or assigned."""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Sequence

import numpy as np

from auditlib.errors import AuditInputError

_FILE_COLUMNS = ("filename", "file", "name")
_SHOWN = 3  # offenders named per problem; the rest are counted
# A row is a file name (a path, at most 4,096 characters) and a label: a labels file holds
# at most that per image, and a header and 100 spare rows (blank lines, a longer list).
MAX_ROW_CHARS = 4_096
_SPARE_ROWS = 100
_EXPECTED_ROWS = "a header 'filename,label' and one row per image"


def _few(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_SHOWN])
    return shown if len(items) <= _SHOWN else f"{shown} and {len(items) - _SHOWN} more"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_labels_csv(
    text: str, names: Sequence[str], *, source: str = "labels.csv"
) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
    """Read one label per image from CSV text with a ``filename,label`` header.

    The file column may also be called ``file`` or ``name``; other columns are ignored. A label is
    either a class id (an integer >= 0) or a class name; with names, the sorted distinct names
    become ids 0..K-1 and are returned as the class names (otherwise ``None``). Every image in
    ``names`` needs exactly one row. All problems found are reported together in one message.
    """
    most = (len(names) + 1 + _SPARE_ROWS) * MAX_ROW_CHARS
    if len(text) > most:  # bounds what the CSV reader is given, before it reads a row
        raise AuditInputError(
            f"{source} holds {len(text):,} characters; expected {_EXPECTED_ROWS} (at most "
            f"{most:,} characters for {len(names)} images)"
        )
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    try:
        # (line number, cells) of the non-blank rows; line numbers count blank lines too.
        numbered = [(reader.line_num, row) for row in reader if any(c.strip() for c in row)]
    except csv.Error as exc:  # a field over csv's limit, an unterminated quote, a NUL
        raise AuditInputError(
            f"{source} cannot be read as CSV at line {reader.line_num} ({exc}); expected "
            f"{_EXPECTED_ROWS}"
        ) from None
    rows = [row for _, row in numbered]
    if not rows:
        raise AuditInputError(f"{source} is empty; expected {_EXPECTED_ROWS}")
    header = [cell.strip().lower() for cell in rows[0]]
    file_col = next((header.index(c) for c in _FILE_COLUMNS if c in header), None)
    if file_col is None or "label" not in header:
        raise AuditInputError(
            f"{source} header is {','.join(rows[0])!r}; expected 'filename,label' "
            "(or 'file,label' / 'name,label')"
        )
    label_col = header.index("label")
    needed = max(file_col, label_col) + 1

    problems: list[str] = []
    short_lines: list[str] = []
    raw: dict[str, str] = {}
    seen: Counter[str] = Counter()
    for line_no, row in numbered[1:]:
        if len(row) < needed:
            short_lines.append(str(line_no))
            continue
        # Backslashes: a CSV written on Windows for class subfolders ("cat\\1.png").
        name = row[file_col].strip().replace("\\", "/")
        seen[name] += 1
        raw.setdefault(name, row[label_col].strip())
    if short_lines:
        problems.append(
            f"{source} has {len(short_lines)} rows with too few values (lines "
            f"{_few(short_lines)}); expected 'filename,label'"
        )

    wanted = set(names)
    duplicates = [n for n, k in seen.items() if k > 1]
    if duplicates:
        problems.append(
            f"{source} lists {len(duplicates)} files more than once: {_few(duplicates)}"
        )
    missing = [n for n in names if n not in raw]
    if missing:
        problems.append(
            f"{source} has no row for {len(missing)} of the {len(names)} images: {_few(missing)}"
        )
    unknown = [n for n in raw if n not in wanted]
    if unknown:
        problems.append(
            f"{source} names {len(unknown)} files that are not among the images: {_few(unknown)}"
        )

    values = {n: raw[n] for n in names if n in raw}
    empty = [n for n, v in values.items() if not v]
    numeric = {n: v for n, v in values.items() if v and _is_number(v)}
    textual = {n: v for n, v in values.items() if v and not _is_number(v)}
    bad_numbers = [
        f"{v!r} for {n}" for n, v in numeric.items() if not (v.isdigit() and v.isascii())
    ]
    if empty:
        problems.append(f"{source} has an empty label for {len(empty)} files: {_few(empty)}")
    if bad_numbers:
        problems.append(
            f"{source} has {len(bad_numbers)} labels that are not whole numbers >= 0: "
            f"{_few(bad_numbers)}"
        )
    if numeric and textual:
        example_id = next(iter(numeric.values()))
        example_name = next(iter(textual.values()))
        problems.append(
            f"{source} mixes class ids and class names (e.g. {example_id!r} and {example_name!r}); "
            "expected all integer ids or all names"
        )
    if problems:
        raise AuditInputError("; ".join(problems))

    if textual:
        class_names = tuple(sorted(set(textual.values())))
        index = {c: i for i, c in enumerate(class_names)}
        return tuple(index[values[n]] for n in names), class_names
    return tuple(int(values[n]) for n in names), None


def check_labels_fit(
    labels: Sequence[int], num_classes: int, names: Sequence[str] | None = None
) -> None:
    """Refuse labels the model cannot output (ids outside 0..num_classes-1)."""
    if num_classes < 1:
        raise AuditInputError(f"the model has {num_classes} classes; expected at least 1")
    bad = [i for i, label in enumerate(labels) if not 0 <= label < num_classes]
    if not bad:
        return
    first = bad[0]
    who = names[first] if names is not None else f"image {first + 1}"
    more = f" (and {len(bad) - 1} more labels)" if len(bad) > 1 else ""
    raise AuditInputError(
        f"label {labels[first]} of {who} is outside the model's {num_classes} classes "
        f"(0-{num_classes - 1}){more}"
    )


def assign_labels(count: int, num_classes: int, seed: int, first: int = 0) -> tuple[int, ...]:
    """Deterministic labels for unlabelled images (the victim needs labels for its loss).

    Every image's class is drawn uniformly and independently (with replacement) from a
    generator seeded by ``seed``, and kept by the image's place in its set: the images at
    places ``first`` .. ``first + count - 1`` get the draws of those places, so an image has
    one label whichever batch holds it and the batches of a sample are independent draws.
    Not without replacement: B distinct labels would meet any B distinct classes a label
    rule guesses (``attacks.labels.distinct_labels``) in at least 2B - C of them whatever
    the update says, and the same label in every update of a sample would make their
    agreement one fact, not N. Independent uniform draws are class-symmetric, which the
    label test needs (``metrics.risk.label_test``); as in a client's batch drawn from a
    class-balanced set, classes may repeat.
    """
    if count < 0:
        raise AuditInputError(f"cannot assign labels to {count} images; expected a count >= 0")
    if num_classes < 1:
        raise AuditInputError(f"the model has {num_classes} classes; expected at least 1")
    if first < 0:
        raise AuditInputError(f"the first image's place is {first}; expected >= 0")
    drawn = np.random.default_rng(seed).integers(0, num_classes, size=first + count)
    return tuple(int(v) for v in drawn[first:])
