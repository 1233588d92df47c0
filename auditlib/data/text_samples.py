"""The private text batch: the auditor's sequences (a text file, one per line, or a CSV with a
``text`` column and an optional ``label`` column) or verses of the demo text, tokenized to a
fixed length.

An encoder's sequence is ``[CLS] tokens [SEP]``; a decoder's is its tokens. Sequences shorter
than the length are padded on the right and masked; longer ones are cut.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, replace

import numpy as np
import torch

from auditlib.data.demo_text import demo_text
from auditlib.data.text_tokenizer import TextTokenizer
from auditlib.errors import AuditInputError

MAX_TEXT_BYTES = 8 * 1024 * 1024
MAX_ROWS = 100_000
MAX_SEQUENCE_TOKENS = 512


@dataclass(frozen=True, eq=False)
class TextBatch:
    """Token sequences as the model sees them, and the text each one is."""

    input_ids: torch.Tensor  # B x n int64
    attention_mask: torch.Tensor  # B x n int64, 1 on real tokens
    labels: torch.Tensor | None  # B int64 for an encoder's classes; None for a decoder
    texts: tuple[str, ...]  # each sequence's tokens decoded (what an exact attack recovers)
    source: str

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())

    def to(self, device: torch.device) -> TextBatch:
        """The same batch with its tensors on ``device`` (the model's)."""
        labels = None if self.labels is None else self.labels.to(device)
        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            labels=labels,
        )


@dataclass(frozen=True)
class TextRows:
    texts: tuple[str, ...]
    labels: tuple[int, ...] | None


def parse_text_file(name: str, data: bytes) -> TextRows:
    """The auditor's sequences: ``.txt`` (one per line) or ``.csv`` (``text``, ``label``)."""
    if len(data) > MAX_TEXT_BYTES:
        raise AuditInputError(f"{name}: {len(data)} bytes; expected at most {MAX_TEXT_BYTES}")
    try:
        content = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AuditInputError(f"{name}: not UTF-8 text (byte {exc.start})") from None
    labels: list[int] | None = None
    if name.lower().endswith(".csv"):
        reader = csv.DictReader(io.StringIO(content))
        fields = [f.strip().lower() for f in reader.fieldnames or []]
        if "text" not in fields:
            raise AuditInputError(f"{name}: expected a header with a 'text' column, got {fields}")
        texts, labels = [], [] if "label" in fields else None
        for row_number, row in enumerate(reader, start=2):
            row = {(k or "").strip().lower(): (v or "") for k, v in row.items()}
            if not row["text"].strip():
                continue
            texts.append(" ".join(row["text"].split()))
            if labels is not None:
                try:
                    labels.append(int(row["label"]))
                except ValueError:
                    raise AuditInputError(
                        f"{name}, row {row_number}: label {row['label']!r}; expected an integer"
                    ) from None
    elif name.lower().endswith(".txt"):
        texts = [" ".join(line.split()) for line in content.splitlines() if line.strip()]
    else:
        raise AuditInputError(f"{name}: expected a .txt (one sequence per line) or .csv file")
    if not texts:
        raise AuditInputError(f"{name}: no sequences in it")
    if len(texts) > MAX_ROWS:
        raise AuditInputError(f"{name}: {len(texts)} sequences; expected at most {MAX_ROWS}")
    if labels is not None and min(labels) < 0:
        raise AuditInputError(f"{name}: a label is negative; expected class numbers from 0")
    return TextRows(tuple(texts), tuple(labels) if labels is not None else None)


def _tokens(tok: TextTokenizer, text: str, length: int) -> list[int]:
    if tok.bos_id is None:
        return tok.encode(text)[:length]
    return [tok.bos_id, *tok.encode(text)[: length - 2], tok.eos_id]


def make_batch(
    tok: TextTokenizer,
    rows: TextRows,
    size: int,
    length: int,
    seed: int,
    *,
    full_only: bool = False,
    num_labels: int = 2,
    source: str = "the auditor's text",
) -> TextBatch:
    """``size`` sequences drawn from ``rows`` (seeded, without repeats), ``length`` tokens
    each; with ``full_only`` only sequences that fill the length are drawn."""
    if not 1 <= size <= 1024:
        raise AuditInputError(f"batch of {size} sequences; expected 1 to 1024")
    if not 2 <= length <= MAX_SEQUENCE_TOKENS:
        raise AuditInputError(f"{length} tokens a sequence; expected 2 to {MAX_SEQUENCE_TOKENS}")
    encoded = [_tokens(tok, text, length) for text in rows.texts]
    pool = [i for i, ids in enumerate(encoded) if len(ids) == length or not full_only]
    if len(pool) < size:
        raise AuditInputError(
            f"{source} has {len(pool)} usable sequences"
            + (f" of {length} tokens or more" if full_only else "")
            + f"; asked for {size}"
        )
    chosen = np.random.default_rng(seed).choice(len(pool), size=size, replace=False)
    ids = torch.full((size, length), tok.pad_id, dtype=torch.int64)
    mask = torch.zeros((size, length), dtype=torch.int64)
    for row, index in enumerate(chosen):
        seq = encoded[pool[int(index)]]
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    labels = None
    if tok.bos_id is not None:  # an encoder classifies
        if rows.labels is not None:
            picked = [rows.labels[pool[int(i)]] for i in chosen]
            if max(picked) >= num_labels:
                raise AuditInputError(
                    f"{source}: label {max(picked)}; the model has {num_labels} classes"
                )
            labels = torch.tensor(picked, dtype=torch.int64)
        else:
            labels = torch.zeros(size, dtype=torch.int64)
    texts = tuple(tok.decode(ids[r, : int(mask[r].sum())].tolist()) for r in range(size))
    return TextBatch(ids, mask, labels, texts, source)


def demo_batch(tok: TextTokenizer, size: int, length: int, seed: int = 0) -> TextBatch:
    """``size`` New Testament verses that fill ``length`` tokens (cut there), seeded."""
    rows = TextRows(demo_text().private, None)
    return make_batch(
        tok, rows, size, length, seed, full_only=True, source="the demo text (New Testament)"
    )
