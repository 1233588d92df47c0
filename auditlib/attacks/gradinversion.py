"""GradInversion (Yin, Mallya, Vahdat, Alvarez, Kautz, Molchanov, CVPR 2021, "See through
Gradients: Image Batch Recovery via GradInversion").

The images x of a batch are optimised to minimise (Eqs. 3-7)

    alpha_G * L_grad(x) + alpha_TV * TV(x) + alpha_l2 * ||x||_2 + alpha_BN * R_BN(x),

where L_grad compares the update the client would compute on (x, y) with the observed one
(per-layer L2 norms of the difference, summed over layers) and the BatchNorm prior

    R_BN(x) = sum_l ||mu_l(x) - mu_l^BN||_2 + ||sigma^2_l(x) - sigma^2_l^BN||_2

compares the per-channel mean and variance of the candidate batch at the input of every
BatchNorm layer with the running statistics stored in the server's global model (the
DeepInversion prior). The statistics are read by forward hooks while the client is
simulated; with several FedAvg local steps, those of the first step count. Labels are
restored first from the last layer's update (each class row's most negative entry, Sec.
3.2) and kept fixed. Adam lr 0.1 with a warm-up, cosine decay and small Langevin-style
gradient noise (breaching's ``seethroughgradients`` recipe), a box constraint to the pixel
range, and restarts from which the attacker keeps the lowest final objective. The paper's group-consistency term
(several seeds registered to their mean) is not implemented; see docs/ALGORITHMS.md.

Raced starts (each its own seed), and several updates' starts, advance together as rows of
one batched computation (:class:`_Rows`): the updates by one ``vmap`` pass, the BatchNorm
statistics by another over the first local step's examples.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

from auditlib.attacks.base import (
    AttackInfo,
    AuditPreset,
    ProgressEvent,
    RunControl,
    register,
    snapshot,
)
from auditlib.attacks.batchnorm_prior import BATCHNORM_TYPES, BatchNormPrior
from auditlib.attacks.captured import (
    CAPTURED_HELP,
    CapturedGradient,
    one_way_of_stepping,
    stepped,
    stepping,
)
from auditlib.attacks.compiled import (
    CompiledGradient,
    apart_when_compiled,
    held,
    traced_model,
    why_not_compiled,
)
from auditlib.attacks.labels import infer_batch_labels
from auditlib.attacks.loop import run_restarts, stacked
from auditlib.attacks.objectives import (
    UpdateMatcher,
    backward_to,
    random_images,
    total_variation,
    why_not_together,
)
from auditlib.attacks.row_index import RowIndex, full_rows
from auditlib.attacks.updates import UpdatesMatcher
from auditlib.attacks.updates_loop import run_updates
from auditlib.config import check_ranges, param
from auditlib.errors import AttackUnsupportedError
from auditlib.threat import MATCHES_THROUGH, AttackerKnowledge, Observation


@dataclass(frozen=True)
class GradInversionConfig:
    lr: float = param(
        0.1, "Adam step size on the images (peak, after the warm-up)", low=0, low_open=True, high=10
    )
    distance: Literal["layer-l2", "l2", "cosine"] = param(
        "layer-l2",
        "update distance: per-layer L2 norms of the difference, summed (paper), squared L2, or "
        "1 - cosine",
    )
    gradient_weight: float = param(
        1.0, "alpha_G, weight of the update distance", low=0, low_open=True, high=1e6
    )
    tv: float = param(1e-4, "alpha_TV, weight of the total-variation prior", low=0, high=1e3)
    l2: float = param(1e-6, "alpha_l2, weight of the images' L2-norm prior", low=0, high=1e3)
    bn: float = param(
        0.1,
        "alpha_BN, weight of the BatchNorm prior (the batch's statistics against the model's "
        "running ones; 0: off)",
        low=0,
        high=1e3,
    )
    noise: float = param(
        0.01,
        "Langevin-style noise added to the image gradient, times the current step size",
        low=0,
        high=10,
    )
    schedule: Literal["cosine", "step", "constant"] = param(
        "cosine",
        "step-size schedule after the warm-up: cosine decay, steps of 0.1 at 3/8, 5/8 and 7/8 "
        "of the run, or constant",
    )
    warmup: int = param(50, "steps of linear warm-up of the step size", low=0, high=100_000)
    boxed: bool = param(True, "clamp the images into the valid pixel range after every step")
    restarts: int = param(
        1,
        "random starts; the one with the lowest final objective is kept (raced under the "
        "audit preset)",
        low=1,
        high=64,
    )
    labels: Literal["auto", "known", "inferred"] = param(
        "auto",
        "labels: known to the server, or inferred from the last layer's update and kept "
        "fixed; auto: known if the server knows them, else inferred",
    )
    label_rule: Literal["auto", "distinct", "counts", "bias-counts"] = param(
        "auto",
        "batch label rule: distinct (the most negative class scores, no repeats), counts "
        "(FedLeak's estimate), bias-counts (from the bias update); auto: distinct while the "
        "batch fits in the classes, else counts",
    )
    label_reduce: Literal["sum", "min"] = param(
        "min",
        "class score from the last layer's weight rows: the most negative entry (paper) or "
        "the row's sum (iDLG)",
    )
    # Raced starts advance together, one batched computation; False: one after another.
    together: bool = param(
        True,
        "advance raced starts (each its own seed) together as one batched computation (false: "
        "one after another; the same objective)",
    )
    # The step traced and compiled (attacks.compiled): a CUDA graph on a GPU. Asked for, not
    # the default: compiling costs seconds per number of running starts before it pays.
    compiled: bool = param(
        False,
        "trace and compile the objective and its gradient with torch.compile (a CUDA graph on "
        "a GPU): faster steps where kernels are small, after seconds to minutes of compiling "
        "per number of running starts; the starts advance together (raced, or one), and "
        "several updates one after another",
        identity=False,  # the same algorithm: a stored eager run stands for a compiled one
    )
    # The eager step recorded as a CUDA graph after its first steps (attacks.captured).
    captured: bool | None = param(None, CAPTURED_HELP, identity=False)  # the same algorithm

    def __post_init__(self) -> None:
        check_ranges(self)
        one_way_of_stepping(self)


# --- Objective pieces ---------------------------------------------------------------------


def image_norm(images: torch.Tensor) -> torch.Tensor:
    """The L2 image prior: each image's L2 norm, averaged over the batch (B x C x H x W), or
    one value per restart over R x B x C x H x W."""
    return torch.linalg.vector_norm(images.flatten(-3), dim=-1).mean(-1)


class Objective:
    """The GradInversion objective; returns the total and its named parts."""

    def __init__(
        self,
        matcher: UpdateMatcher | UpdatesMatcher,
        config: GradInversionConfig,
        prior: BatchNormPrior | None,
    ) -> None:
        self.matcher = matcher
        self.config = config
        self.prior = prior

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self.prior is not None:
            self.prior.reset()
        distance = self.matcher(images, labels)
        bn = None if self.prior is None else self.prior.loss(images)
        return self._total(distance, images, bn)

    def rows(
        self, images: torch.Tensor, labels: torch.Tensor, rows: list[int] | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The objective of R stacked restarts (``images`` R x B x C x H x W; ``labels`` B, or
        R x B: each row its update's), one value per row: :meth:`__call__` of each alone, up
        to float order. ``rows``: their positions (an ``UpdatesMatcher``'s owners)."""
        matcher = self.matcher if rows is None else self.matcher.at(rows)  # None: traced
        if rows is not None and len(rows) == 1 and isinstance(matcher, UpdateMatcher):
            total, parts = self._alone(images[0], labels)  # a race's lone start
            return total.unsqueeze(0), {name: v.unsqueeze(0) for name, v in parts.items()}
        if self.prior is None:
            return self._total(matcher.together(images, labels), images, None)
        # The prior's statistics from the update's own pass (its first local step's forward).
        updates, seen = self.first.recorded_updates(images, labels, self.prior.hooks.recording)
        bn = self.prior.against_running(seen, images)
        return self._total(matcher.measured(updates, images), images, bn)

    def _alone(self, images: torch.Tensor, labels: torch.Tensor):
        """One start's objective as a start alone takes it: plain autograd, the prior read
        by its hooks during the simulation (no ``vmap``: measured, a lone start of the audit
        preset's race stepped at 0.75x of its pace alone through it, ResNet-20, CPU)."""
        if self.prior is None:
            return self(images, labels)
        with self.prior.attached():
            return self(images, labels)

    @property
    def first(self) -> UpdateMatcher:
        """A matcher of the (shared) model: the updates' first where several advance."""
        matcher = self.matcher
        return matcher.matchers[0] if isinstance(matcher, UpdatesMatcher) else matcher

    def _total(self, distance, images, bn) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        config = self.config
        parts = {"update_distance": distance}
        total = config.gradient_weight * distance
        if config.tv > 0:
            parts["tv"] = total_variation(images)
            total = total + config.tv * parts["tv"]
        if config.l2 > 0:
            parts["l2"] = image_norm(images)
            total = total + config.l2 * parts["l2"]
        if bn is not None:
            parts["bn"] = bn
            total = total + config.bn * bn
        return total, parts


# --- Labels and schedule ------------------------------------------------------------------


def resolve_labels(
    observation: Observation, knowledge: AttackerKnowledge, config: GradInversionConfig
) -> tuple[torch.Tensor, dict[str, Any]]:
    strategy = config.labels
    if strategy == "auto":
        strategy = "known" if knowledge.labels is not None else "inferred"
    if strategy == "known":
        if knowledge.labels is None:
            raise AttackUnsupportedError(
                "labels=known needs a scenario in which the server knows the labels (--labels-known)"
            )
        return knowledge.labels.detach().cpu().clone(), {
            "rule": "known to the server (threat model)"
        }
    labels, record = infer_batch_labels(
        observation, knowledge, rule=config.label_rule, reduce=config.label_reduce
    )
    return labels, dict(record)


def lr_factor(schedule: str, warmup: int, iterations: int):
    """Multiplier of the base lr after ``step`` optimiser steps (LambdaLR convention)."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup  # linear warm-up
        if schedule == "cosine":
            span = max(iterations - warmup, 1)
            return 0.5 * (1 + math.cos(math.pi * min(step - warmup, span) / span))
        if schedule == "step":
            # Inverting Gradients' milestones at 3/8, 5/8, 7/8 of the run.
            milestones = (iterations // 2.667, iterations // 1.6, iterations // 1.142)
            return 0.1 ** sum(step >= m for m in milestones)
        return 1.0

    return factor


# --- The attack ---------------------------------------------------------------------------


def run_gradinversion(
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: GradInversionConfig,
    control: RunControl,
    seed: int,
) -> Iterator[ProgressEvent]:
    raced = control.race is not None
    config, how = stepping("gi", config, knowledge, _why_not_compiled(knowledge, config, raced))
    labels, record = resolve_labels(observation, knowledge, config)
    prior, record["batchnorm_prior"] = _prior_and_record(knowledge, config)
    objective = Objective(UpdateMatcher(observation, knowledge, config.distance), config, prior)
    together = stepped(config) or (
        config.restarts > 1
        and _why_updates_apart(config, raced) is None
        and why_not_together(knowledge) is None
    )
    if together:

        def make(generators, clock):
            rows = _Rows(generators, objective, knowledge, config, labels, control.max_steps)
            if stepped(config):
                rows.traced(knowledge.device, config.captured)
                how.made(rows.compiled)
            return rows

        events = run_restarts(make, config.restarts, True, control, seed, "objective", record)
        if not stepped(config):
            return how.told(events)
        hooks = () if prior is None else (prior.hooks,)  # the prior's hooks, held for the run
        return how.told(held(traced_model(knowledge, *hooks), events))
    events = _run(objective, knowledge, config, control, seed, labels, record)
    return how.told(events if prior is None else _with_hooks(prior, events))


def _prior_and_record(knowledge: AttackerKnowledge, config: GradInversionConfig):
    prior = BatchNormPrior(knowledge.model) if config.bn > 0 else None
    if prior is not None and len(prior) == 0:
        return None, "off: the model has no BatchNorm layer with running statistics"
    if prior is None:
        return None, "off: bn weight is 0"
    return prior, f"{len(prior)} BatchNorm layers matched to running statistics"


def _why_not_compiled(
    knowledge: AttackerKnowledge, config: GradInversionConfig, raced: bool
) -> str | None:
    """Why GradInversion's step cannot be traced here: the traced step is the starts'
    stacked one, so whatever keeps them apart keeps it eager."""
    if config.restarts > 1 and (reason := _why_updates_apart(config, raced)) is not None:
        return f"{reason} (a compiled step steps its starts together)"
    return why_not_compiled(knowledge)


def _why_updates_apart(config: GradInversionConfig, raced: bool) -> str | None:
    """Why GradInversion's starts (and so its updates) run one after another: unraced starts
    draw their Langevin noise in turn from one stream, the papers' way, so together they
    would draw other numbers than apart."""
    if not config.together:
        return "gi was asked to run its starts apart (together=false)"
    if not raced and config.restarts > 1 and config.noise > 0:
        return "gi's unraced starts draw their noise in turn from one stream"
    return None


def run_gi_updates(observations, knowledges, config, control, seeds):
    """GradInversion on several updates together (``AttackInfo.run_updates``): update u's
    starts are rows u R .. u R + R - 1 of one batched Adam run, each matching update u's
    target with update u's own labels, the BatchNorm prior against the shared model's
    running statistics (``attacks.updates_loop``)."""
    read = [resolve_labels(o, k, config) for o, k in zip(observations, knowledges, strict=True)]
    prior, note = _prior_and_record(knowledges[0], config)
    restarts = config.restarts
    owners = [u for u in range(len(observations)) for _ in range(restarts)]
    matchers = [
        UpdateMatcher(o, k, config.distance) for o, k in zip(observations, knowledges, strict=True)
    ]
    objective = Objective(UpdatesMatcher(matchers, owners), config, prior)
    labels = torch.stack([read[u][0] for u in owners])  # K x B: each row its update's

    def make(generators, clock):
        return _Rows(generators, objective, knowledges[0], config, labels, control.max_steps)

    inferences = [record | {"batchnorm_prior": note} for _, record in read]
    return run_updates(make, restarts, control, seeds, "objective", inferences)


def _with_hooks(prior: BatchNormPrior, events: Iterator[ProgressEvent]) -> Iterator[ProgressEvent]:
    # Hooks live exactly as long as the run, also when the consumer stops iterating early.
    with prior.attached():
        yield from events


def _run(objective, knowledge, config, control, seed, fixed_labels, record):
    def make(generators, clock):
        return _Restart(generators, objective, knowledge, config, fixed_labels, control.max_steps)

    # One after another: the BatchNorm prior reads the model's activations through hooks
    # in each restart's own simulation (``_Rows``: the stacked form).
    return run_restarts(make, config.restarts, False, control, seed, "objective", record)


class _Descent:
    """GradInversion's descent on ``images`` (one restart's, or K starts' stacked as rows):
    Adam with the warm-up and decay schedule, Langevin noise on the gradient scaled by the
    current lr, and the box on the pixels. One definition for :class:`_Restart` and
    :class:`_Rows`, so a row steps as a restart alone does."""

    def __init__(self, images, knowledge, config, iterations):
        self.images = images
        self.config = config
        self.optimizer = torch.optim.Adam([images], lr=config.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(config.schedule, config.warmup, iterations)
        )
        self.low, self.high = knowledge.normalization.pixel_bounds(
            torch.zeros((), device=knowledge.device)
        )

    def step(self, loss: torch.Tensor | None, add_noise, grad: torch.Tensor | None = None) -> None:
        """One step down ``loss`` (or along ``grad``, the images' gradient a traced step
        took); ``add_noise(grad, scale)`` adds the exploration noise."""
        self.optimizer.zero_grad()
        if grad is None:
            backward_to(loss, self.optimizer)
        else:
            self.images.grad = grad
        if self.config.noise > 0:
            add_noise(self.images.grad, self.config.noise * self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        if self.config.boxed:
            with torch.no_grad():
                self.images.copy_(torch.maximum(torch.minimum(self.images, self.high), self.low))


class _Restart:
    """One GradInversion restart: Adam on the images with warm-up, decay and noise."""

    def __init__(self, generators, objective, knowledge, config, fixed_labels, iterations):
        (self.generator,) = generators
        self.objective = objective
        self.labels = fixed_labels.to(knowledge.device)
        self.hard_labels = fixed_labels.cpu()
        self.images = random_images(knowledge, self.generator).requires_grad_(True)
        self.descent = _Descent(self.images, knowledge, config, iterations)

    def _add_noise(self, grad: torch.Tensor, scale: float) -> None:
        noise = torch.randn(grad.shape, generator=self.generator)
        # Not blocking: the host's draw is staged at once, and the host need not wait for
        # the device's queue to drain (a host synchronisation every step on a GPU).
        grad.add_(noise.to(grad.device, non_blocking=True), alpha=scale)

    def step(self, alive):
        loss, parts = self.objective(self.images, self.labels)
        self.descent.step(loss, self._add_noise)
        losses = {"objective": loss.detach()} | {k: v.detach() for k, v in parts.items()}
        return {k: v.reshape(1) for k, v in losses.items()}

    def frame(self, position):
        return snapshot(self.images), self.hard_labels

    def candidate(self, position):
        # Restarts are scored by the whole objective at the final images (no ground truth).
        with torch.enable_grad():
            score = float(self.objective(self.images.detach(), self.labels)[0].detach())
        return snapshot(self.images), self.hard_labels, score


class _Rows:
    """GradInversion's restarts stacked, one row each: one update's raced starts, or several
    updates' (an ``UpdatesMatcher``, labels K x B). Adam, the schedule, the box and each row's
    noise (from its own start's generator, as it draws alone) are per row, so each row is
    :class:`_Restart` alone, up to float order."""

    def __init__(self, generators, objective, knowledge, config, fixed_labels, iterations):
        self.generators = list(generators)
        self.objective = objective
        self.labels = fixed_labels.to(knowledge.device)
        self.per_row = self.labels.dim() == 2
        self.images = stacked([random_images(knowledge, g) for g in self.generators])
        self.descent = _Descent(self.images, knowledge, config, iterations)
        self._index = RowIndex(knowledge.device)  # the running rows, made once per set
        self.compiled: CompiledGradient | CapturedGradient | None = None

    def traced(self, device: torch.device, captured: bool = False) -> None:
        """Step by the traced objective from now on, compiled (``attacks.compiled``) or
        recorded as a CUDA graph (``attacks.captured``): one update's (such a run attacks
        updates one after another)."""
        objective, labels = self.objective, self.labels
        objective.matcher.factored = False  # a trace cannot register the factored form's hooks

        def terms(images: torch.Tensor):
            return objective.rows(images, labels, None)

        gradient = CapturedGradient if captured else CompiledGradient
        self.compiled = gradient(terms, device)

    def _labels(self, rows: list[int]) -> torch.Tensor:
        return self.labels.index_select(0, self._index(rows)) if self.per_row else self.labels

    def step(self, alive):
        index = self._index(alive)
        images = self.images.index_select(0, index)
        grad = None
        if self.compiled is None:
            loss, parts = self.objective.rows(images, self._labels(alive), alive)
        else:
            (rows,), loss, parts = self.compiled(images)
            grad = full_rows(self.images, index, rows)

        def add_noise(grad: torch.Tensor, scale: float) -> None:
            # Each alive row its own start's draw, as that start alone draws it.
            shape = grad.shape[1:]
            noise = torch.stack([torch.randn(shape, generator=self.generators[p]) for p in alive])
            noise = noise.to(grad.device, non_blocking=True)  # as _Restart's: no wait
            grad.index_add_(0, self._index(alive), noise, alpha=scale)

        self.descent.step(loss.sum(), add_noise, grad)
        return {"objective": loss.detach()} | {k: v.detach() for k, v in parts.items()}

    def _hard_labels(self, position: int) -> torch.Tensor:
        return (self.labels[position] if self.per_row else self.labels).cpu()

    def frame(self, position):
        return snapshot(self.images[position]), self._hard_labels(position)

    def candidate(self, position):
        # Scored as a restart alone is: the whole objective at its final images.
        images = self.images[position].detach()
        with torch.enable_grad():
            loss, _ = self.objective.rows(images[None], self._labels([position]), [position])
        return snapshot(images), self._hard_labels(position), float(loss.detach()[0])


def _needs_batchnorm(observation: Observation, knowledge: AttackerKnowledge) -> str | None:
    if not any(isinstance(m, BATCHNORM_TYPES) for m in knowledge.model.modules()):
        return "GradInversion's prior is the BatchNorm statistics; the model has no BatchNorm"
    return None


_GI_PAPER = {
    "lr": 0.1,
    "distance": "layer-l2",
    "gradient_weight": 1.0,
    "tv": 1e-4,
    "l2": 1e-6,
    "bn": 0.1,
    "noise": 0.01,
    "schedule": "cosine",
    "warmup": 50,
    "boxed": True,
    "label_reduce": "min",
}

register(
    AttackInfo(
        name="gi",
        summary=(
            "GradInversion (Yin et al. 2021): per-layer L2 update matching + TV + L2 + "
            "BatchNorm-statistics prior, inferred labels, Adam with cosine decay, restarts."
        ),
        config_type=GradInversionConfig,
        run=run_gradinversion,
        run_updates=run_gi_updates,
        why_updates_apart=apart_when_compiled("gi", _why_updates_apart),
        presets={
            # The paper's Adam lr 0.1 and its per-layer L2 matching (Eq. 4), with breaching's
            # seethroughgradients values where the paper's are not known to us: warm-up 50,
            # cosine decay, TV 1e-4, L2 1e-6, BN 0.1, Langevin noise 0.01.
            "paper": _GI_PAPER,
            # breaching's seethroughgradients.yaml as a whole: squared L2 matching scaled by
            # 1e-4, so the priors weigh far more than in the paper preset.
            "breaching": {**_GI_PAPER, "distance": "l2", "gradient_weight": 1e-4},
        },
        audit=AuditPreset(
            {**_GI_PAPER, "restarts": 4},
            iterations=300,
            why="the paper preset (per-layer L2, BatchNorm prior, cosine schedule, label row-minimum rule) with 4 raced starts, the paper's multi-seed search",
        ),
        paper_iterations=20_000,
        not_applicable=_needs_batchnorm,
        # Its BatchNorm prior hooks the server's model, so it fits no unknown parameters.
        adapts=MATCHES_THROUGH - {"unknowns"},
    )
)
