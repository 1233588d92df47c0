"""What a server guesses of a text batch without the update, scored like a recovery.

ROUGE rewards common words: a sequence of "the" and "and" scores against any English
sentence. Every text result therefore scores the guesses a server makes from public text
alone, and a sequence counts as recovered only beyond the best of them
(``metrics.text_risk``). The guesses, each ``length`` tokens of the tokenizer:

- the most likely sequence under the public text's unigram counts (its commonest token,
  repeated);
- the public text's commonest tokens, most common first (the bag a unigram guesser would
  bet on for ROUGE-1);
- the most typical public sequence: the public sequence with the highest mean ROUGE-1
  against a seeded sample of the others.

The best guess is taken per private sequence and per measure, with the private text: a
bar as high as any of these guesses could be, so "beyond the guess" is a strict test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from auditlib.metrics.text import rouge

UNIGRAM_MODE = "the most likely sequence under the public unigram counts"
COMMONEST = "the public text's commonest tokens"
TYPICAL = "the most typical public sequence"
_TYPICAL_POOL = 300
_TYPICAL_REFERENCES = 100


@dataclass(frozen=True)
class TextGuess:
    name: str
    text: str


@dataclass(frozen=True)
class GuessBar:
    """Per private sequence, the best guess's ROUGE-1, ROUGE-2 and ROUGE-L (each measure's
    own best), and which guess gave its ROUGE-L."""

    rouge1: tuple[float, ...]
    rouge2: tuple[float, ...]
    rougeL: tuple[float, ...]
    best: tuple[str, ...]


def text_guesses(
    public_texts: Sequence[str], encode, decode, length: int, seed: int = 0
) -> tuple[TextGuess, ...]:
    """The guesses of ``length`` tokens from ``public_texts`` (``encode``/``decode``: the
    model's tokenizer, without special tokens)."""
    rng = np.random.default_rng(seed)
    sample = [public_texts[int(i)] for i in rng.permutation(len(public_texts))[:20_000]]
    counts = Counter(t for text in sample for t in encode(text))
    ranked = [t for t, _ in counts.most_common(length)]
    mode = decode([ranked[0]] * length)
    commonest = decode(ranked)
    pool = [decode(encode(t)[:length]) for t in sample[:_TYPICAL_POOL]]
    references = sample[_TYPICAL_POOL : _TYPICAL_POOL + _TYPICAL_REFERENCES] or sample
    typical = max(pool, key=lambda p: np.mean([rouge(r, p)[0] for r in references]))
    return (
        TextGuess(UNIGRAM_MODE, mode),
        TextGuess(COMMONEST, commonest),
        TextGuess(TYPICAL, typical),
    )


def guess_bar(private_texts: Sequence[str], guesses: Sequence[TextGuess]) -> GuessBar:
    scores = np.array([[rouge(p, g.text) for g in guesses] for p in private_texts])  # B x G x 3
    best = tuple(guesses[int(i)].name for i in scores[:, :, 2].argmax(axis=1))
    r1, r2, rl = (tuple(float(x) for x in scores[:, :, k].max(axis=1)) for k in range(3))
    return GuessBar(r1, r2, rl, best)
