"""LAMP (Balunovic et al., NeurIPS 2022): text from a transformer's update by alternating
continuous and discrete optimisation, guided by a language model's prior.

1. Start: the best of ``init_candidates`` Gaussian draws by gradient distance, then the best
   of as many reorderings of it; each vector scaled to ``init_size``.
2. Continuous: Adam on the embeddings, minimising the gradient distance (``cosine``: mean
   over weights of 1 - cos, LAMP_Cos; ``l2_l1``: ||d||^2 + alpha ||d||_1, LAMP_L1+L2) plus
   ``coeff_reg`` (mean embedding length - init_size)^2, the length regulariser.
3. Discrete, every ``swap_every`` steps after the burn-in: per sequence, ``swap_candidates``
   reorderings (swap two tokens, move a token, move a span, move a prefix to the end; the
   first candidate the unchanged sequence) and keep the one minimising the gradient distance
   plus ``coeff_perplexity`` times the prior's log-perplexity of its projected tokens.
4. The continuous state of lowest loss, projected to the nearest tokens (cosine).

Settings from eth-sri/lamp (``args_factory.py``, ``lamp_cos.sh``, ``lamp_l1l2.sh``); the prior
is ``lm_prior`` (a small GPT-2 trained on the public demo text: LAMP's pretrained GPT-2
cannot be downloaded here). Shared machinery: ``opt_embeddings``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
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
from auditlib.attacks.text.lm_prior import (
    AUDITED,
    PUBLIC,
    LanguagePrior,
    audited_model_prior,
    public_text_prior,
)
from auditlib.attacks.text.opt_embeddings import (
    JOINT,
    LowestLoss,
    MatchingProblem,
    decode,
    fix_positions,
    matching_loss,
    matching_problem,
    nearest_tokens,
    twice_differentiable,
)
from auditlib.attacks.text.opt_reorderings import reorderings
from auditlib.config import build_config, check_ranges, param

NAME = "lamp"


@dataclass(frozen=True)
class LampConfig:
    # L1+L2 by default: at BERT-base size it recovered more than the cosine at batch 1 and 4
    # (docs/PERFORMANCE.md, "Text models"); the cosine is the "cosine" and "paper" presets.
    distance: Literal["cosine", "l2_l1"] = param(
        "l2_l1", "gradient distance: LAMP_L1+L2 (||d||^2 + l1_weight ||d||_1), or LAMP_Cos"
    )
    steps: int = param(2000, "continuous Adam steps (LAMP: 2000)", low=1, high=100_000)
    lr: float = param(
        0.2, "Adam's step size for the embeddings (LAMP: 0.01 raw, about 0.2 BERT token units)",
        low=0, low_open=True, high=10,
    )  # fmt: skip
    label_lr: float = param(
        1.0, "Adam's step size for free label logits (LAMP assumes labels known)", low=0,
        low_open=True, high=10,
    )  # fmt: skip
    lr_decay: float = param(
        0.89, "step size multiplied by this every 50 steps (LAMP: 0.89)", low=0, low_open=True,
        high=1,
    )  # fmt: skip
    token_units: bool = param(
        True,
        "the start's and the step's scale in units of the token embeddings' standard "
        "deviation (off: raw units, as LAMP on pretrained BERT)",
    )
    coeff_perplexity: float = param(
        60.0, "alpha_lm, the prior's weight in the discrete step (L1+L2 60, Cos 0.2)", low=0,
        high=1e6,
    )  # fmt: skip
    coeff_reg: float = param(
        25.0, "weight of the embedding-length regulariser (L1+L2 25, Cos 1)", low=0, high=1e6
    )
    l1_weight: float = param(0.01, "the L1 term's weight under l2_l1 (LAMP: 0.01)", low=0, high=100)
    init_size: float | None = param(
        None,
        "target length of each embedding (LAMP: 1.4, BERT's mean token-embedding length; "
        "none: the audited model's mean token-embedding length)",
        low=0, low_open=True, high=1000,
    )  # fmt: skip
    init_candidates: int = param(
        500, "random starts (and reorderings) tried, the best kept (LAMP: 500)", low=1,
        high=100_000,
    )  # fmt: skip
    swap_every: int = param(75, "steps between discrete steps (LAMP: 75)", low=1, high=100_000)
    swap_burnin: float = param(
        0.1, "share of the steps before the first discrete step (LAMP: 0.1)", low=0, high=1
    )
    swap_candidates: int = param(
        200, "reorderings tried per sequence in a discrete step (LAMP: 200)", low=1, high=100_000
    )
    prior: Literal["public-text", "audited-model"] = param(
        PUBLIC,
        "the language model scoring naturalness: a small GPT-2 trained on the public demo text, "
        "or the audited model itself (decoders only)",
    )
    prior_seconds: float = param(
        60.0, "time bound on training the public-text prior (once; cached)", low=0,
        low_open=True, high=3600,
    )  # fmt: skip
    prior_steps: int = param(3000, "step bound on training that prior", low=1, high=1_000_000)
    decoder_targets: Literal["joint", "tied"] = param(
        "joint", "a decoder's next-token targets: free logits beside the embeddings, or tied"
    )
    grad_clip: float | None = param(
        None, "clip the embeddings' gradient to this norm (LAMP: BERT-large only)", low=0,
        low_open=True, high=1e6,
    )  # fmt: skip
    progress_every: int = param(50, "steps between progress events", low=1, high=100_000)
    seed: int = param(0, "seed of the starts and the discrete step's draws", low=0, high=2**31 - 1)

    def __post_init__(self) -> None:
        check_ranges(self)


PRESETS: dict[str, dict] = {
    "strongest": {},
    # The strongest settings with LAMP_Cos's distance and weights (stronger than L1+L2 at
    # TinyBERT-4 size on a batch of 4, weaker at BERT-base size).
    "cosine": {"distance": "cosine", "coeff_perplexity": 0.2, "coeff_reg": 1.0},
    # eth-sri/lamp lamp_cos.sh on BERT: raw units, init_size 1.4 is BERT's own mean length.
    "paper": {"distance": "cosine", "coeff_perplexity": 0.2, "coeff_reg": 1.0, "lr": 0.01,
              "lr_decay": 0.89, "steps": 2000, "token_units": False},
    # eth-sri/lamp lamp_l1l2.sh.
    "paper-l1l2": {"distance": "l2_l1", "coeff_perplexity": 60.0, "coeff_reg": 25.0,
                   "l1_weight": 0.01, "lr": 0.01, "lr_decay": 0.89, "steps": 2000,
                   "token_units": False},
}  # fmt: skip


def lamp_config(preset: str = "strongest", **params) -> LampConfig:
    """The preset's settings ("strongest", "cosine", "paper", "paper-l1l2"), overridden by
    ``params``."""
    return build_config(LampConfig, {**PRESETS[preset], **params}, f"attack {NAME} ({preset})")


@dataclass
class LampState:
    """The continuous variables: embeddings, and free label logits where any."""

    embeds: torch.Tensor
    labels: torch.Tensor | None


def make_prior(target: TextTarget, config: LampConfig) -> LanguagePrior:
    if config.prior == AUDITED:
        return audited_model_prior(target.model)
    prior = public_text_prior(target.model.tokenizer, config.prior_steps, config.prior_seconds)
    prior.module.to(target.model.device)  # trained (or read) on the CPU; scored beside the model
    return prior


def reconstruction_loss(
    problem: MatchingProblem, state: LampState, config: LampConfig, create_graph: bool
) -> torch.Tensor:
    return matching_loss(
        problem, state.embeds, state.labels, config.decoder_targets, config.distance,
        config.l1_weight, create_graph=create_graph,
    )  # fmt: skip


def combined_objective(
    problem: MatchingProblem, state: LampState, prior: LanguagePrior, config: LampConfig
) -> float:
    """What the discrete step minimises: gradient distance + alpha_lm * log-perplexity of the
    projected tokens (LAMP's ``get_loss``)."""
    ids = nearest_tokens(problem, state.embeds, state.labels, config.decoder_targets)
    rec = reconstruction_loss(problem, state, config, create_graph=False)
    return float(rec.detach()) + config.coeff_perplexity * float(prior.loss(ids))


def _permuted(state: LampState, row: int, order: list[int], decoder_joint: bool) -> LampState:
    embeds = state.embeds.detach().clone()
    embeds[row] = state.embeds.detach()[row, order]
    labels = state.labels
    if labels is not None and decoder_joint:  # per-position targets move with their tokens
        labels = labels.detach().clone()
        labels[row] = state.labels.detach()[row, order]
    return LampState(embeds, labels)


def discrete_step(
    problem: MatchingProblem,
    state: LampState,
    prior: LanguagePrior,
    config: LampConfig,
    rng: np.random.Generator,
) -> tuple[float, float]:
    """LAMP's discrete step, in place: per sequence, the best of ``swap_candidates``
    reorderings (the first the unchanged one) by the combined objective. Returns the
    objective before and after; the unchanged candidate makes after <= before."""
    decoder_joint = problem.decoder and config.decoder_targets == JOINT
    free = problem.free_positions
    before = current = combined_objective(problem, state, prior, config)
    for row in range(problem.target.batch_size):
        best, best_value = None, current
        for order in reorderings(problem.target.length, free, config.swap_candidates - 1, rng):
            candidate = _permuted(state, row, order, decoder_joint)
            value = combined_objective(problem, candidate, prior, config)
            if value < best_value:
                best, best_value = candidate, value
        if best is not None:
            with torch.no_grad():
                state.embeds[row] = best.embeds[row]
                if decoder_joint:
                    state.labels[row] = best.labels[row]
            current = best_value
    return before, current


def _mean_token_length(problem: MatchingProblem) -> float:
    return float(problem.table[problem.allowed].norm(dim=1).mean())


def initial_state(
    problem: MatchingProblem,
    config: LampConfig,
    generator: torch.Generator,
    unit: float,
    should_stop: StopCheck = never_stop,
) -> LampState:
    """LAMP's start: the best random draw by gradient distance, then the best reordering of
    its free positions, each vector scaled to the target length (a stop request ends the
    search with the best so far)."""
    device = problem.table.device
    shape = problem.label_shape(config.decoder_targets)
    # Drawn on the CPU generator, then moved: a seed starts the same on every device.
    labels = None if shape is None else torch.randn(shape, generator=generator).to(device)
    best, best_loss = None, float("inf")
    for i in range(config.init_candidates):
        if i and should_stop():
            break
        embeds = torch.randn(problem.shape, generator=generator).to(device) * unit
        fix_positions(problem, embeds)
        loss = float(reconstruction_loss(problem, LampState(embeds, labels), config, False))
        if loss < best_loss:
            best, best_loss = embeds, loss
    free = torch.tensor(problem.free_positions)  # on the host, as the generator's draws
    for _ in range(config.init_candidates):
        if should_stop():
            break
        order = torch.arange(problem.target.length)  # on the host: moved once made
        order[free] = free[torch.randperm(len(free), generator=generator)]
        embeds = best[:, order.to(device)]
        loss = float(reconstruction_loss(problem, LampState(embeds, labels), config, False))
        if loss < best_loss:
            best, best_loss = embeds, loss
    size = config.init_size if config.init_size is not None else _mean_token_length(problem)
    best = best / best.norm(dim=2, keepdim=True) * size
    fix_positions(problem, best)
    return LampState(
        best.clone().requires_grad_(True), None if labels is None else labels.requires_grad_(True)
    )


def run_lamp(
    target: TextTarget,
    config: LampConfig = LampConfig(),
    on_progress: OnProgress = no_progress,
    should_stop: StopCheck = never_stop,
) -> RecoveredText:
    started = time.perf_counter()
    problem = matching_problem(target)
    prior = make_prior(target, config)
    tok = target.model.tokenizer
    generator = torch.Generator().manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    unit = float(problem.table.std()) if config.token_units else 1.0
    size = config.init_size if config.init_size is not None else _mean_token_length(problem)
    state = initial_state(problem, config, generator, unit, should_stop)
    groups = [{"params": [state.embeds], "lr": config.lr * unit}]
    if state.labels is not None:
        groups.append({"params": [state.labels], "lr": config.label_lr})
    optimiser = torch.optim.Adam(groups)
    schedule = torch.optim.lr_scheduler.StepLR(optimiser, step_size=50, gamma=config.lr_decay)
    variables = [g["params"][0] for g in groups]
    best = LowestLoss(state.embeds, state.labels, or_equal=True)
    swaps, done = [], 0
    for step in range(config.steps):
        if should_stop():
            break
        optimiser.zero_grad()
        with twice_differentiable():
            rec = reconstruction_loss(problem, state, config, create_graph=True)
            reg = (state.embeds.norm(dim=2).mean() - size).square()
            total = rec + config.coeff_reg * reg
            total.backward(inputs=variables)
        if config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_([state.embeds], config.grad_clip)
        best.keep(total, state.embeds, state.labels)  # the state that gave it, before the step
        optimiser.step()
        schedule.step()
        fix_positions(problem, state.embeds)
        done = step + 1
        if step >= config.swap_burnin * config.steps and step % config.swap_every == 1:
            swaps.append(discrete_step(problem, state, prior, config, rng))
        if (step + 1) % config.progress_every == 0:
            ids = nearest_tokens(problem, state.embeds, state.labels, config.decoder_targets)
            texts = tuple(tok.decode(list(s)) for s in decode(problem, ids))
            on_progress(TextProgress(step + 1, config.steps, texts))
    # Stopped before its first step: its start is all it has (``LowestLoss``'s first state).
    ids = nearest_tokens(problem, best.embeds, best.labels, config.decoder_targets)
    sequences = decode(problem, ids)
    texts = tuple(tok.decode(list(s)) for s in sequences)
    on_progress(TextProgress(done, config.steps, texts, "done"))
    stopped = done < config.steps
    notes = (stopped_note(done, config.steps, "continuous steps"),) if stopped else ()
    notes += (
        f"{done} continuous steps ({config.distance} distance), {len(swaps)} discrete "
        f"steps of {config.swap_candidates} candidates per sequence; "
        f"{sum(after < before for before, after in swaps)} of them changed the order",
        f"prior: {prior.description}",
        f"embedding length target {size:.3g}",
    )
    if not problem.decoder and target.labels is None:
        notes += ("labels unknown (LAMP assumes them known): optimised jointly as free logits",)
    return RecoveredText(
        NAME, sequences, texts, time.perf_counter() - started, notes, stopped=stopped
    )
