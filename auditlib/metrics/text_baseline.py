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

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from auditlib.data.text_tokenizer import TextTokenizer
from auditlib.metrics.text import rouge, rouge1_of_words, words

UNIGRAM_MODE = "the most likely sequence under the public unigram counts"
COMMONEST = "the public text's commonest tokens"
TYPICAL = "the most typical public sequence"
_COUNTED = 4000  # public sequences counted: the commonest tokens settle well before
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


@functools.lru_cache(maxsize=8)
def text_guesses(
    public_texts: tuple[str, ...], tok: TextTokenizer, length: int, seed: int = 0
) -> tuple[TextGuess, ...]:
    """The guesses of ``length`` tokens of ``tok`` from ``public_texts`` (kept: an audit's
    runs and its controls share them)."""
    rng = np.random.default_rng(seed)
    sample = [public_texts[int(i)] for i in rng.permutation(len(public_texts))[:_COUNTED]]
    encoded = [e.ids for e in tok.tokenizer.encode_batch(sample, add_special_tokens=False)]
    counts = Counter(t for ids in encoded for t in ids)
    ranked = [t for t, _ in counts.most_common(length)]
    mode = tok.decode([ranked[0]] * length)
    commonest = tok.decode(ranked)
    pool = [tok.decode(ids[:length]) for ids in encoded[:_TYPICAL_POOL]]
    references = [
        words(r) for r in sample[_TYPICAL_POOL : _TYPICAL_POOL + _TYPICAL_REFERENCES] or sample
    ]
    pool_words = [words(p) for p in pool]
    best = max(
        range(len(pool)),
        key=lambda i: np.mean([rouge1_of_words(r, pool_words[i]) for r in references]),
    )
    typical = pool[best]
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
