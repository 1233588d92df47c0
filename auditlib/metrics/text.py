"""Scores of recovered text against the private sequences: ROUGE-1, ROUGE-2 and ROUGE-L
(F-measure, Google's ``rouge-score``, as DAGER, LAMP and TAG report), token accuracy and
exact sequences, over a one-to-one matching of recovered to private sequences.

The matching is the Hungarian assignment maximising ROUGE-1 + ROUGE-2; a private sequence
left without a recovered one scores 0. At most as many recovered sequences as the batch
holds are scored (the attack's first ones, its best): more guesses would buy matches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rouge_score import rouge_scorer
from scipy.optimize import linear_sum_assignment

ROUGE_KINDS = ("rouge1", "rouge2", "rougeL")
_SCORER = rouge_scorer.RougeScorer(list(ROUGE_KINDS), use_stemmer=False)


@dataclass(frozen=True)
class SequenceScore:
    """One private sequence against the recovered one matched to it (None: none was)."""

    matched: int | None
    rouge1: float
    rouge2: float
    rougeL: float
    token_accuracy: float  # share of its tokens recovered at their position
    exact: bool


@dataclass(frozen=True)
class TextScores:
    per_sequence: tuple[SequenceScore, ...]

    def _mean(self, field: str) -> float:
        return float(np.mean([getattr(s, field) for s in self.per_sequence]))

    @property
    def rouge1(self) -> float:
        return self._mean("rouge1")

    @property
    def rouge2(self) -> float:
        return self._mean("rouge2")

    @property
    def rougeL(self) -> float:
        return self._mean("rougeL")

    @property
    def token_accuracy(self) -> float:
        return self._mean("token_accuracy")

    @property
    def exact(self) -> int:
        return sum(s.exact for s in self.per_sequence)


def rouge(reference: str, candidate: str) -> tuple[float, float, float]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F-measures of ``candidate`` against ``reference``."""
    scores = _SCORER.score(reference, candidate)
    return tuple(float(scores[k].fmeasure) for k in ROUGE_KINDS)  # type: ignore[return-value]


def words(text: str) -> Counter[str]:
    """The text's words as ROUGE counts them (rouge-score's own tokenizer)."""
    return Counter(_SCORER._tokenizer.tokenize(text))


def rouge1_of_words(reference: Counter[str], candidate: Counter[str]) -> float:
    """ROUGE-1's F-measure from word counts (what ``rouge`` gives, without re-tokenizing:
    the typical-guess search compares thousands of pairs)."""
    overlap = sum((reference & candidate).values())
    if not overlap:
        return 0.0
    precision, recall = overlap / sum(candidate.values()), overlap / sum(reference.values())
    return 2 * precision * recall / (precision + recall)


def _token_accuracy(private: Sequence[int], recovered: Sequence[int]) -> float:
    if not private:
        return 0.0
    same = sum(a == b for a, b in zip(private, recovered, strict=False))
    return same / len(private)


def score_text(
    private_texts: Sequence[str],
    private_ids: Sequence[Sequence[int]],
    recovered_texts: Sequence[str],
    recovered_ids: Sequence[Sequence[int]],
) -> TextScores:
    """The private sequences (texts and real tokens) against the recovered ones."""
    size = len(private_texts)
    recovered_texts = list(recovered_texts)[:size]
    recovered_ids = list(recovered_ids)[:size]
    if not recovered_texts:
        return TextScores(
            tuple(SequenceScore(None, 0.0, 0.0, 0.0, 0.0, False) for _ in range(size))
        )
    table = np.array(
        [[rouge(p, r) for r in recovered_texts] for p in private_texts]
    )  # size x recovered x 3
    rows, cols = linear_sum_assignment(-(table[:, :, 0] + table[:, :, 1]))
    match = dict(zip(rows.tolist(), cols.tolist(), strict=True))
    out = []
    for i in range(size):
        j = match.get(i)
        if j is None:
            out.append(SequenceScore(None, 0.0, 0.0, 0.0, 0.0, False))
            continue
        r1, r2, rl = table[i, j]
        acc = _token_accuracy(private_ids[i], recovered_ids[j])
        exact = list(private_ids[i]) == list(recovered_ids[j])
        out.append(SequenceScore(j, float(r1), float(r2), float(rl), acc, exact))
    return TextScores(tuple(out))
