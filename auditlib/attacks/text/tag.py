"""TAG (Deng et al., Findings of EMNLP 2021): text from a transformer's update by gradient
matching in embedding space.

Dummy input embeddings (and, where the server does not know them, dummy labels: free
logits, softmaxed) are optimised with Adam so that the gradient they cause matches the
observed update under TAG's distance, sum over weights of ||d||^2 + alpha * ||d||_1; each
position is then projected to its nearest token (cosine). Shared machinery:
``opt_embeddings``.

Settings. TAG released no code; the ``paper`` preset takes the settings with which LAMP's
authors ran TAG as their baseline (eth-sri/lamp ``tag.sh``: alpha 0.01, Adam lr 0.1 with
no decay, 2500 steps, N(0, 1) start, one run). breaching's TAG (``config/attack/tag.yaml``)
differs: alpha 0.1 with linearly decreasing per-layer weights, AdamW with warm-up and
linear decay at 0.05, gradient clipping at 1, a start of 0.1 N(0, 1) clipped to +-0.1;
the per-layer weights are ``layer_weights="linear"`` here. The default (strongest) starts
and steps the embeddings in units of the token embeddings' standard deviation (a N(0, 1)
start is ~50 times longer than a token of a 0.02-initialised model, which drowns the
position embeddings), adds restarts scored by the gradient distance of their projected
tokens, and decays the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

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
from auditlib.attacks.text.opt_embeddings import (
    L2_L1,
    LowestLoss,
    MatchingProblem,
    decode,
    fix_positions,
    l1_layer_weights,
    matching_loss,
    matching_problem,
    nearest_tokens,
    projected_distance,
    twice_differentiable,
)
from auditlib.config import build_config, check_ranges, param

NAME = "tag"


@dataclass(frozen=True)
class TagConfig:
    steps: int = param(
        2500, "Adam steps per restart (TAG as LAMP ran it: 2500)", low=1, high=100_000
    )
    restarts: int = param(
        4, "independent starts; the one whose tokens match the update best is kept", low=1, high=64
    )
    lr: float = param(0.1, "Adam's step size", low=0, low_open=True, high=10)
    lr_decay: float = param(
        0.985, "step size multiplied by this every 50 steps (1: constant, as LAMP's TAG runs)",
        low=0, low_open=True, high=1,
    )  # fmt: skip
    alpha: float = param(
        0.01, "weight of the L1 term in ||d||^2 + alpha ||d||_1 (LAMP's TAG 0.01, breaching 0.1)",
        low=0, high=100,
    )  # fmt: skip
    layer_weights: Literal["uniform", "linear"] = param(
        "uniform",
        "the L1 term's weight per matched weight: uniform, or breaching's linear decrease "
        "from 1 (first weight) to 1/L (last)",
    )
    init_scale: float = param(
        1.0,
        "standard deviation of the N(0, s^2) start (breaching: 0.1, clipped)",
        low=0,
        low_open=True,
        high=100,
    )
    token_units: bool = param(
        True,
        "the embeddings' start and step size in units of the token embeddings' standard "
        "deviation (the labels' stay as given); off: raw units, as the paper",
    )  # fmt: skip
    decoder_targets: Literal["joint", "tied"] = param(
        "joint",
        "a decoder's next-token targets: free logits optimised beside the embeddings (DLG/TAG's "
        "dummy labels, breaching's TAG) or read from the embeddings themselves",
    )
    grad_clip: float | None = param(
        None, "clip the embeddings' gradient to this norm (breaching: 1; none: no clipping)",
        low=0, low_open=True, high=1e6,
    )  # fmt: skip
    progress_every: int = param(50, "steps between progress events", low=1, high=100_000)
    seed: int = param(0, "seed of the random starts", low=0, high=2**31 - 1)

    def __post_init__(self) -> None:
        check_ranges(self)


# The paper preset: TAG as LAMP's authors ran it (eth-sri/lamp tag.sh with --baseline).
PRESETS: dict[str, dict] = {
    "strongest": {},
    "paper": {
        "steps": 2500,
        "restarts": 1,
        "lr": 0.1,
        "lr_decay": 1.0,
        "alpha": 0.01,
        "init_scale": 1.0,
        "token_units": False,
    },
}


def tag_config(preset: str = "strongest", **params) -> TagConfig:
    """The preset's settings ("strongest", the default, or "paper"), overridden by ``params``."""
    return build_config(TagConfig, {**PRESETS[preset], **params}, f"attack {NAME} ({preset})")


def _restart(
    problem: MatchingProblem,
    config: TagConfig,
    generator: torch.Generator,
    report,
    should_stop: StopCheck,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """One restart: the best embeddings and labels it reached, and the steps it took."""
    unit = float(problem.table.std()) if config.token_units else 1.0
    device = problem.table.device
    # Drawn on the CPU generator, then moved: a seed starts the same on every device.
    embeds = torch.randn(problem.shape, generator=generator).to(device)
    embeds = embeds * (config.init_scale * unit)
    fix_positions(problem, embeds)
    embeds.requires_grad_(True)
    label_shape = problem.label_shape(config.decoder_targets)
    labels = None
    if label_shape is not None:
        labels = torch.randn(label_shape, generator=generator).to(device).requires_grad_(True)
    variables = [embeds] + ([labels] if labels is not None else [])
    groups = [{"params": [embeds], "lr": config.lr * unit}]
    groups += [{"params": [labels], "lr": config.lr}] if labels is not None else []
    optimiser = torch.optim.Adam(groups)
    schedule = torch.optim.lr_scheduler.StepLR(optimiser, step_size=50, gamma=config.lr_decay)
    weights = l1_layer_weights(len(problem.params), config.layer_weights)
    best = LowestLoss(embeds, labels)
    done = 0
    for step in range(config.steps):
        if should_stop():
            break
        optimiser.zero_grad()
        with twice_differentiable():
            loss = matching_loss(
                problem, embeds, labels, config.decoder_targets, L2_L1, config.alpha, weights
            )
            loss.backward(inputs=variables)
        if config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_([embeds], config.grad_clip)
        best.keep(loss, embeds, labels)  # the state that gave this loss, before the step
        optimiser.step()
        schedule.step()
        fix_positions(problem, embeds)
        done = step + 1
        if (step + 1) % config.progress_every == 0:
            report(step + 1, nearest_tokens(problem, embeds, labels, config.decoder_targets))
    # Stopped before its first step, a run's best is its start (``LowestLoss``).
    return best.embeds, best.labels, done


def run_tag(
    target: TextTarget,
    config: TagConfig = TagConfig(),
    on_progress: OnProgress = no_progress,
    should_stop: StopCheck = never_stop,
) -> RecoveredText:
    started = time.perf_counter()
    problem = matching_problem(target)
    tok = target.model.tokenizer
    generator = torch.Generator().manual_seed(config.seed)
    total = config.steps * config.restarts
    best_ids, best_score, scores, steps = None, float("inf"), [], 0
    for restart in range(config.restarts):
        if restart and should_stop():
            break

        def report(step: int, ids: torch.Tensor, run: int = restart) -> None:
            texts = tuple(tok.decode(list(s)) for s in decode(problem, ids))
            on_progress(TextProgress(run * config.steps + step, total, texts, f"restart {run + 1}"))

        embeds, labels, taken = _restart(problem, config, generator, report, should_stop)
        steps += taken
        ids = nearest_tokens(problem, embeds, labels, config.decoder_targets)
        weights = l1_layer_weights(len(problem.params), config.layer_weights)
        score = projected_distance(problem, ids, labels, L2_L1, config.alpha, weights)
        scores.append(score)
        if score < best_score:
            best_ids, best_score = ids, score
    sequences = decode(problem, best_ids)
    texts = tuple(tok.decode(list(s)) for s in sequences)
    on_progress(TextProgress(steps, total, texts, "done"))
    stopped = steps < total
    notes = _notes(target, problem, config, scores)
    if stopped:
        notes = (stopped_note(steps, total, "steps"), *notes)
    return RecoveredText(
        NAME, sequences, texts, time.perf_counter() - started, notes, stopped=stopped
    )


def _notes(
    target: TextTarget, problem: MatchingProblem, config: TagConfig, scores: list[float]
) -> tuple[str, ...]:
    notes = [
        f"{len(scores)} restart(s) of {config.steps} Adam steps; gradient distance of the "
        f"kept tokens {min(scores):.4g} (restarts: {', '.join(f'{s:.3g}' for s in scores)})",
        f"{len(problem.params)} weights matched; the word-embedding matrix is left out "
        "(inputs given as embeddings never reach it)",
    ]
    if problem.decoder:
        notes.append(
            "next-token targets: free logits per position optimised jointly; tokens 2.. are "
            "read from them (each is the previous position's target)"
            if config.decoder_targets == "joint"
            else "next-token targets read from the embeddings themselves (tied)"
        )
    elif target.labels is None:
        notes.append("labels unknown: optimised jointly as free logits (TAG's dummy labels)")
    if target.update.algorithm != "fedsgd":
        notes.append(
            "the update is FedAvg's weight change over several steps, matched as if it were "
            "one gradient: TAG's model of the update does not hold"
        )
    return tuple(notes)
