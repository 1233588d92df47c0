"""UTR's language prior: a bigram model of the public text the server holds (the demo's Old
Testament), with the distribution of sequence-opening tokens, interpolated with unigram
counts so that no token has probability zero."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
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
    encoded = [e.ids for e in tok.tokenizer.encode_batch(list(texts), add_special_tokens=False)]
    encoded = [ids for ids in encoded if ids]
    # add-one: every token may open a sequence and has a unigram count
    start = np.bincount([ids[0] for ids in encoded], minlength=vocab) + 1.0
    flat = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in encoded])
    unigram = np.bincount(flat, minlength=vocab) + 1.0
    pairs = np.concatenate(
        [np.asarray(ids[:-1], dtype=np.int64) * vocab + np.asarray(ids[1:]) for ids in encoded]
    )
    codes, counts = np.unique(pairs, return_counts=True)  # sorted: rows are contiguous
    firsts = codes // vocab
    rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    bounds = np.flatnonzero(np.diff(firsts)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(codes)], strict=True):
        rows[int(firsts[lo])] = (
            torch.from_numpy(codes[lo:hi] % vocab),
            torch.from_numpy(counts[lo:hi].astype(np.float64)),
        )
    start_t, unigram_t = torch.from_numpy(start), torch.from_numpy(unigram)
    return BigramPrior(
        (start_t / start_t.sum()).log(), (unigram_t / unigram_t.sum()).log(), rows, bigram_weight
    )


@functools.lru_cache(maxsize=4)
def public_prior(tok: TextTokenizer, bigram_weight: float) -> BigramPrior:
    """The prior of the demo's public text (the Old Testament), built once a tokenizer."""
    return build_prior(tok, demo_text().public, bigram_weight)
