"""UTR (Chen et al., arXiv 2601.17533, 2026) on LoRA: text from the update of the adapters
alone, the backbone frozen, for a decoder trained on next-token prediction.

The paper's three stages (token presence, inversion inside the adapters' gradient, greedy
decoding under a language prior) read, in its public code, bottleneck adapters of width
d/2 whose bias gradients make each row of the weight gradient a point of the inputs' span.
LoRA of rank r gives no such span (r is far below the batch's token count, and at peft's
initialisation B = 0, so lora_A's gradient is zero). Here the same ideas are built on what
LoRA's update does carry (``utr_match``; docs/ALGORITHMS.md, "UTR"):

1. Greedy decoding: sequences grow one token a step, all at once. At each step the part of
   the update the known prefixes explain is taken out; every token's fit as the next target
   is its correlation with what is left, across every layer's adapters (one
   Jacobian-vector product for the whole vocabulary), standardised, plus ``prior_weight``
   times the bigram prior's log-probability. The opening token and its successor are chosen
   as pairs among the prior's likeliest openings.
2. Refinement: coordinate descent on the exact match. The server computes the update its
   candidate batch would give; each sequence tries its best-scoring single-token changes and
   keeps one only where the whole update's residual falls.

The result says which round it read (first: B = 0, only lora_B's gradient; later: both)
and how much of the update the recovered batch leaves unexplained (0: it reproduces it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from auditlib.attacks.text.base import (
    OnProgress,
    RecoveredText,
    StopCheck,
    TextProgress,
    TextTarget,
    never_stop,
    no_progress,
    stopped_note,
)
from auditlib.attacks.text.utr_match import AdapterMatcher, Grads, minus, norm
from auditlib.attacks.text.utr_prior import BigramPrior, public_prior
from auditlib.config import check_ranges, param
from auditlib.errors import AuditInputError
from auditlib.models.text import DECODER

NAME = "utr"


@dataclass(frozen=True)
class UtrConfig:
    prior_weight: float = param(
        0.3,
        "weight of the bigram prior's log-probability beside the standardised gradient fit "
        "(0: no prior; the paper's decoding is guided by one)",
        low=0, high=10,
    )  # fmt: skip
    bigram_weight: float = param(
        0.9, "the prior's bigram share (the rest unigram)", low=0, high=1, high_open=True
    )
    start_candidates: int = param(
        512, "opening tokens tried at the first step (the prior's likeliest)", low=1, high=65536
    )
    refine_iterations: int = param(
        20, "rounds of coordinate descent on the exact update match (0: greedy only)", low=0,
        high=1000,
    )  # fmt: skip
    refine_proposals: int = param(
        4, "single-token changes each sequence tries per round", low=1, high=64
    )
    refine_seconds: float = param(
        600.0, "time after which refinement stops", low=0, low_open=True, high=86400
    )

    def __post_init__(self) -> None:
        check_ranges(self)


def _adapter_gradients(target: TextTarget) -> Grads:
    grads = {k: v for k, v in target.update.gradients.items() if ".lora_" in k}
    if not grads:
        raise AuditInputError(
            "UTR reads an update of LoRA adapters; this update has none (no lora_A/lora_B "
            "gradients): use an attack on full updates (DAGER) or train with adapters"
        )
    if target.model.family != DECODER:
        raise AuditInputError(
            "UTR is implemented here for decoders (GPT-2, next-token training); "
            f"the model is an {target.model.family}"
        )
    known = dict(target.model.module.named_parameters())
    missing = [k for k in grads if k not in known]
    if missing:
        raise AuditInputError(
            f"the update names adapters the model does not have ({missing[0]}); expected the "
            "model the server sent, with the same LoRA wrap"
        )
    return grads


def _round(grads: Grads) -> str:
    a_zero = all(float(v.abs().max()) == 0 for k, v in grads.items() if ".lora_A" in k)
    return "first" if a_zero else "later"


def _opening_pairs(
    matcher: AdapterMatcher, prior: BigramPrior, residual: Grads, target: TextTarget,
    config: UtrConfig,
) -> list[list[int]]:  # fmt: skip
    """The best (opening token, next token) pairs, one per sequence."""
    vocab = matcher.embeddings.shape[0]
    k = min(vocab, config.start_candidates)
    openings = torch.argsort(prior.log_start, descending=True)[:k]  # the prior's: on the CPU
    dh, logits = matcher.correlations(openings[:, None].to(matcher.model.device), residual)
    fit = matcher.target_scores(dh[:, 0], logits[:, 0])  # k x V
    if config.prior_weight:
        log_prior = torch.stack([prior.log_next(int(a)) for a in openings])
        log_prior += prior.log_start[openings][:, None]
        fit = fit + config.prior_weight * log_prior.to(fit.device, fit.dtype)
    best = torch.topk(fit.reshape(-1), target.batch_size).indices
    return [[int(openings[i // vocab]), int(i % vocab)] for i in best.tolist()]


def _greedy(
    matcher: AdapterMatcher, prior: BigramPrior, target: TextTarget, config: UtrConfig,
    on_progress: OnProgress, should_stop: StopCheck,
) -> tuple[list[list[int]], int]:  # fmt: skip
    """The sequences decoded token by token, and the positions decoded (fewer than the
    length when a stop request cut it short)."""
    residual = dict(matcher.observed)
    sequences = _opening_pairs(matcher, prior, residual, target, config)
    device = matcher.model.device
    firsts = torch.tensor([[s[0]] for s in sequences], device=device)
    seconds = torch.tensor([s[1] for s in sequences], device=device)
    residual = minus(residual, matcher.term_gradient(firsts, seconds))
    tok = matcher.model.tokenizer
    for step in range(2, target.length):
        if should_stop():
            return sequences, step
        ids = torch.tensor(sequences, device=device)
        dh, logits = matcher.correlations(ids, residual)
        fit = matcher.target_scores(dh[:, -1], logits[:, -1])
        if config.prior_weight:
            log_prior = torch.stack([prior.log_next(s[-1]) for s in sequences])
            log_prior = log_prior.to(fit.device, fit.dtype)
            fit = fit + config.prior_weight * log_prior
        chosen = fit.argmax(-1)
        residual = minus(residual, matcher.term_gradient(ids, chosen))
        for s, v in zip(sequences, chosen.tolist(), strict=True):
            s.append(v)
        on_progress(
            TextProgress(step, target.length, tuple(tok.decode(s) for s in sequences), "greedy")
        )
    return sequences, target.length


def _refine(
    matcher: AdapterMatcher, prior: BigramPrior, sequences: list[list[int]], config: UtrConfig,
    on_progress: OnProgress, deadline: float, should_stop: StopCheck,
) -> tuple[int, int, bool]:  # fmt: skip
    """Coordinate descent in place; the rounds run, the changes kept, and whether a stop
    request ended it."""
    parts = [matcher.sequence_gradient(s) for s in sequences]
    residual = dict(matcher.observed)
    for part in parts:
        residual = minus(residual, part)
    current = norm(residual)
    rounds = kept = 0
    tok, device = matcher.model.tokenizer, matcher.model.device
    for rounds in range(1, config.refine_iterations + 1):
        if should_stop():
            return rounds - 1, kept, True
        dh, logits = matcher.correlations(torch.tensor(sequences, device=device), residual)
        fit = matcher.target_scores(dh[:, :-1], logits[:, :-1])  # B x (n-1) x V
        if config.prior_weight:
            for s, seq in enumerate(sequences):
                log_prior = torch.stack([prior.log_next(t) for t in seq[:-1]])
                fit[s] += config.prior_weight * log_prior.to(fit.device, fit.dtype)
        changed = 0
        for s, seq in enumerate(sequences):
            now = torch.tensor(seq[1:], device=device)
            gain = fit[s] - fit[s].gather(-1, now[:, None])
            order = torch.topk(gain.reshape(-1), config.refine_proposals).indices.tolist()
            vocab = gain.shape[-1]
            for flat in order:
                position, token = flat // vocab + 1, flat % vocab
                if token == seq[position]:
                    continue
                trial = [*seq[:position], token, *seq[position + 1 :]]
                part = matcher.sequence_gradient(trial)
                candidate = {k: residual[k] + parts[s][k] - part[k] for k in residual}
                value = norm(candidate)
                if value < current:
                    sequences[s], parts[s], residual, current = trial, part, candidate, value
                    changed += 1
                    break
        kept += changed
        on_progress(
            TextProgress(
                rounds, config.refine_iterations, tuple(tok.decode(s) for s in sequences),
                f"refinement: residual {current / max(norm(matcher.observed), 1e-30):.3g}",
            )
        )  # fmt: skip
        if not changed or time.perf_counter() > deadline:
            break
    return rounds, kept, False


def run_utr(
    target: TextTarget,
    config: UtrConfig = UtrConfig(),
    on_progress: OnProgress = no_progress,
    should_stop: StopCheck = never_stop,
) -> RecoveredText:
    started = time.perf_counter()
    grads = _adapter_gradients(target)
    if target.length < 2:
        raise AuditInputError("UTR needs sequences of at least 2 tokens")
    model = target.model
    count = target.batch_size * (target.length - 1)
    matcher = AdapterMatcher(model, grads, count)
    prior = public_prior(model.tokenizer, config.bigram_weight)
    which = _round(grads)
    notes = [
        f"{which} round: "
        + (
            "lora_A's gradient is zero (peft starts lora_B at zero); lora_B's gradient carries "
            "the inputs only through their rank-"
            f"{model.lora_rank} projection A x"
            if which == "first"
            else "lora_A's and lora_B's gradients both read"
        ),
        f"{len(grads)} adapter matrices matched; the loss assumed a mean over {count} "
        "predicted tokens (full-length sequences)",
    ]
    if target.update.algorithm != "fedsgd":
        notes.append(
            "the update is FedAvg's weight change over several steps, not one gradient: the "
            "match is approximate"
        )
    with torch.enable_grad():
        sequences, decoded = _greedy(matcher, prior, target, config, on_progress, should_stop)
        stopped = decoded < target.length
        if stopped:
            notes.insert(0, stopped_note(decoded, target.length, "positions decoded"))
        else:
            greedy_residual = _residual(matcher, sequences)
            notes.append(f"greedy decoding leaves {greedy_residual:.3g} of the update unexplained")
        if config.refine_iterations and not stopped:
            deadline = time.perf_counter() + config.refine_seconds
            rounds, kept, stopped = _refine(
                matcher, prior, sequences, config, on_progress, deadline, should_stop
            )
            if stopped:
                notes.insert(0, stopped_note(rounds, config.refine_iterations, "refinement rounds"))
            final = _residual(matcher, sequences)
            notes.append(
                f"refinement: {rounds} rounds, {kept} token changes kept; {final:.3g} of the "
                "update left unexplained (0: the recovered batch reproduces it)"
            )
    texts = tuple(model.tokenizer.decode(s) for s in sequences)
    on_progress(TextProgress(target.length, target.length, texts, "done"))
    return RecoveredText(
        NAME, tuple(tuple(s) for s in sequences), texts, time.perf_counter() - started,
        tuple(notes), None, stopped,
    )  # fmt: skip


def _residual(matcher: AdapterMatcher, sequences: list[list[int]]) -> float:
    residual = dict(matcher.observed)
    for s in sequences:
        residual = minus(residual, matcher.sequence_gradient(s))
    return norm(residual) / max(norm(matcher.observed), 1e-30)
