"""LAMP's language-model prior: how natural a token sequence reads, as a language model's
mean next-token cross-entropy (the log-perplexity LAMP weighs against the gradient
distance).

LAMP's prior is a pretrained GPT-2 (trained on WikiText-103 with the attacked BERT's
tokenizer). Nothing is downloaded here, so the prior is a small GPT-2 trained at first use
on the PUBLIC demo text (text a server may hold), with the audited model's own tokenizer,
for a bounded number of steps and seconds, and kept as safetensors under the data folder.
Where the audited model is a decoder, it may serve as the prior itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

from auditlib.data.demo_text import demo_text
from auditlib.data.text_tokenizer import TextTokenizer
from auditlib.errors import AuditInputError
from auditlib.models.text import DECODER, TextModel
from auditlib.paths import data_dir, private

PUBLIC, AUDITED = "public-text", "audited-model"
# Our "gpt2-tiny" architecture (2 blocks of width 128), as a prior.
PRIOR_LAYERS, PRIOR_WIDTH, PRIOR_HEADS, PRIOR_FF = 2, 128, 2, 512
PRIOR_SEQUENCE = 48  # tokens per training verse (longer ones cut)
PRIOR_BATCH = (
    8  # small batches: more steps in the time bound (the softmax over the vocabulary dominates)
)
PRIOR_LR = 2e-3


@dataclass(frozen=True, eq=False)
class LanguagePrior:
    module: torch.nn.Module  # a GPT2LMHeadModel over the audited model's token ids
    description: str  # which prior, in words (for the result's notes)

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of the sequences ``ids`` (B x n), as LAMP reads
        ``lm(input_ids=ids, labels=ids).loss``."""
        with torch.no_grad():
            logits = self.module(input_ids=ids).logits[:, :-1]
            return torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
            )


def _prior_config(tok: TextTokenizer) -> GPT2Config:
    return GPT2Config(
        vocab_size=tok.vocab_size, n_positions=512, n_embd=PRIOR_WIDTH, n_layer=PRIOR_LAYERS,
        n_head=PRIOR_HEADS, n_inner=PRIOR_FF, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=tok.pad_id, eos_token_id=tok.pad_id, pad_token_id=tok.pad_id,
    )  # fmt: skip


def _public_sequences(tok: TextTokenizer) -> list[list[int]]:
    """The public verses as the audited model sees a sequence ([CLS] .. [SEP] for encoders)."""
    out = []
    for text in demo_text().public:
        ids = tok.encode(text)
        if tok.bos_id is not None:
            ids = [tok.bos_id, *ids[: PRIOR_SEQUENCE - 2], tok.eos_id]
        if len(ids) >= 2:
            out.append(ids[:PRIOR_SEQUENCE])
    return out


def _batch(sequences: list[list[int]], rows: np.ndarray, pad: int) -> tuple[torch.Tensor, ...]:
    width = max(len(sequences[r]) for r in rows)
    # On the host: the prior trains on the CPU (``train_prior``), then goes to the model's device.
    ids = torch.full((len(rows), width), pad, dtype=torch.int64)  # on the host
    labels = torch.full((len(rows), width), -100, dtype=torch.int64)  # on the host
    for i, r in enumerate(rows):
        seq = torch.tensor(sequences[r])  # on the host
        ids[i, : len(seq)] = seq
        labels[i, : len(seq)] = seq
    return ids, labels


def train_prior(
    tok: TextTokenizer, max_steps: int, max_seconds: float, seed: int = 0
) -> tuple[GPT2LMHeadModel, int, float]:
    """A small GPT-2 trained on the public text until ``max_steps`` or ``max_seconds``."""
    sequences = _public_sequences(tok)
    rng = np.random.default_rng(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        module = GPT2LMHeadModel(_prior_config(tok))
    module.train()
    optimiser = torch.optim.AdamW(module.parameters(), lr=PRIOR_LR, weight_decay=0.01)
    started, steps = time.perf_counter(), 0
    while steps < max_steps and time.perf_counter() - started < max_seconds:
        ids, labels = _batch(sequences, rng.choice(len(sequences), PRIOR_BATCH), tok.pad_id)
        loss = module(input_ids=ids, labels=labels).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        steps += 1
    return module.eval(), steps, time.perf_counter() - started


def _cache_path(tok: TextTokenizer, max_steps: int, max_seconds: float, seed: int):
    key = json.dumps(
        [tok.tokenizer.to_str(), PRIOR_LAYERS, PRIOR_WIDTH, PRIOR_HEADS, PRIOR_FF,
         PRIOR_SEQUENCE, PRIOR_BATCH, PRIOR_LR, max_steps, max_seconds, seed],
    )  # fmt: skip
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    folder = data_dir() / "cache" / "text"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder / f"lm-prior-{tok.kind}-{digest}.safetensors"


def public_text_prior(
    tok: TextTokenizer, max_steps: int = 3000, max_seconds: float = 60.0, seed: int = 0
) -> LanguagePrior:
    """The prior trained on the public demo text, from the cache where it was trained before
    with the same tokenizer and budget (safetensors; never pickle)."""
    path = _cache_path(tok, max_steps, max_seconds, seed)
    module = GPT2LMHeadModel(_prior_config(tok))
    if path.exists():
        state = load_file(str(path))
        with safe_open(str(path), "pt") as handle:  # the steps it was trained, and for how long
            meta = handle.metadata() or {}
        module.load_state_dict(state, strict=False)
        module.tie_weights()
    else:
        module, steps, seconds = train_prior(tok, max_steps, max_seconds, seed)
        meta = {"steps": str(steps), "seconds": f"{seconds:.1f}"}
        state = {k: v.contiguous() for k, v in module.state_dict().items() if k != "lm_head.weight"}
        partial = path.with_suffix(f".{os.getpid()}.part")
        save_file(state, str(partial), metadata=meta)
        private(partial, 0o600)
        partial.replace(path)
    return LanguagePrior(
        module.eval(),
        f"a GPT-2 of {PRIOR_LAYERS} blocks of width {PRIOR_WIDTH} trained on the public demo "
        f"text for {meta.get('steps', '?')} steps ({meta.get('seconds', '?')} s) with the "
        "audited model's tokenizer (LAMP's pretrained GPT-2 cannot be downloaded here)",
    )


def audited_model_prior(model: TextModel) -> LanguagePrior:
    """The audited decoder as its own prior (its next-token head scores the sequence)."""
    if model.family != DECODER:
        raise AuditInputError(
            "the audited model is an encoder: it has no next-token head to serve as the prior; "
            f"use the prior '{PUBLIC}'"
        )
    return LanguagePrior(model.module, f"the audited decoder itself ({model.source})")
