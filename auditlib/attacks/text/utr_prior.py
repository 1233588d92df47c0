"""UTR's language prior: a bigram model of the public text the server holds (the demo's Old
Testament), with the distribution of sequence-opening tokens, interpolated with unigram
counts so that no token has probability zero."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from auditlib.data.demo_text import demo_text
from auditlib.data.text_tokenizer import TextTokenizer


@dataclass(frozen=True, eq=False)
class BigramPrior:
    log_start: torch.Tensor  # V: log P(first token)
    log_unigram: torch.Tensor  # V
    rows: dict[int, tuple[torch.Tensor, torch.Tensor]]  # previous -> (next ids, counts)
    bigram_weight: float

    def log_next(self, previous: int) -> torch.Tensor:
        """log P(next | previous) over the vocabulary."""
        p = self.log_unigram.exp()
        row = self.rows.get(previous)
        if row is None:
            return self.log_unigram
        ids, counts = row
        mixed = (1 - self.bigram_weight) * p
        mixed[ids] += self.bigram_weight * counts / counts.sum()
        return mixed.log()


def build_prior(tok: TextTokenizer, texts: Iterable[str], bigram_weight: float) -> BigramPrior:
    vocab = tok.vocab_size
    start = torch.ones(vocab, dtype=torch.float64)  # add-one: every token may open a sequence
    unigram = torch.ones(vocab, dtype=torch.float64)
    pairs: dict[int, dict[int, int]] = {}
    encoded = tok.tokenizer.encode_batch(list(texts), add_special_tokens=False)
    for item in encoded:
        ids = item.ids
        if not ids:
            continue
        start[ids[0]] += 1
        for a in ids:
            unigram[a] += 1
        for a, b in zip(ids, ids[1:], strict=False):
            row = pairs.setdefault(a, {})
            row[b] = row.get(b, 0) + 1
    rows = {
        a: (torch.tensor(list(r)), torch.tensor(list(r.values()), dtype=torch.float64))
        for a, r in pairs.items()
    }
    return BigramPrior(
        (start / start.sum()).log(), (unigram / unigram.sum()).log(), rows, bigram_weight
    )


@functools.lru_cache(maxsize=4)
def public_prior(tok: TextTokenizer, bigram_weight: float) -> BigramPrior:
    """The prior of the demo's public text (the Old Testament), built once a tokenizer."""
    return build_prior(tok, demo_text().public, bigram_weight)
