"""FedLeak (Fan, Wang, Chen, Zhou, USENIX Security 2025): boosted gradient leakage.

Optimises candidate pixels x' in [0, 1] (U(0, 1) start, projected back after every step) to
match the server's gradient estimate g^ with two additions to L1 + cosine matching:

- partial gradient matching (Sec. 4.2): only the top R % of gradient elements, ranked by
  the magnitude of the candidate's own gradient g' and re-ranked every iteration, enter the
  distance D = ||g'[L] - g^[L]||_1 + (1 - cos(g'[L], g^[L]));
- gradient regularisation (Sec. 4.3): the step follows the blend
  (1 - lambda') grad J(x') + lambda' grad J(x' + phi) of the gradient at the iterate and at a
  look-ahead point, a first-order, Hessian-free stand-in for penalising ||grad D||.

The full objective adds alpha TV(x') + beta sum_l mean|F_l(x')| (activation sparsity); Adam
(lr 1e-4, 10,000 iterations) minimises it (Algorithm 1). Labels are inferred from the last
layer's update (Sec. 5, Appendix F). A FedAvg update is read as one gradient,
(w_old - w_new) / (lr K) (Sec. 4.5); ``unroll=True`` simulates the local steps instead.

This module holds the config (each field declared with its paper default and range), the
client simulation, the objective that assembles the loss terms, the run and the presets.
The loss terms themselves (top-R masks, masked distance, look-ahead blend, activation
prior) are in ``fedleak_terms.py``; the iteration, one restart's and the restarts' stacked,
eager or compiled, in ``fedleak_step.py``; what FedLeak shares with other attacks lives
in ``objectives.py``, ``labels.py`` and ``loop.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from auditlib.attacks.base import (
    AttackInfo,
    AuditPreset,
    ProgressEvent,
    RunControl,
    register,
)
from auditlib.attacks.captured import (
    CAPTURED_HELP,
    one_way_of_stepping,
    stepped,
    stepping,
)
from auditlib.attacks.compiled import (
    apart_when_compiled,
    held,
    traced_model,
    why_not_compiled,
)
from auditlib.attacks.fedleak_step import Restarts
from auditlib.attacks.fedleak_terms import (
    UpdatesObjective,
    activation_modules,
    activation_penalty,
    keep_output,
    masked_distance,
    top_ratio_masks,
)
from auditlib.attacks.forward_hooks import HeldHooks
from auditlib.attacks.labels import gradient_estimate, infer_batch_labels
from auditlib.attacks.loop import run_restarts
from auditlib.attacks.objectives import (
    ThroughDefense,
    matched_parameters,
    restart_buffers,
    total_variation,
    why_not_together,
)
from auditlib.attacks.updates_loop import run_updates
from auditlib.client.update import client_update, read_as_gradient
from auditlib.config import check_ranges, param, require
from auditlib.errors import AttackUnsupportedError
from auditlib.threat import MATCHES_THROUGH, AttackerKnowledge, Observation

Tensors = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class FedLeakConfig:
    lr: float = param(
        1e-4, "Adam step size on the pixels (paper: 1e-4)", low=0, low_open=True, high=10
    )
    tv: float = param(1e-5, "alpha, weight of the total-variation prior", low=0, high=10)
    activation: float = param(
        1e-4,
        "beta, weight of the activation-sparsity prior (mean |output| per layer)",
        low=0,
        high=10,
    )
    activation_layers: Literal["activations", "stages"] = param(
        "activations",
        "outputs the sparsity prior reads: every activation module, or a ResNet's residual "
        "stages (the activations without them)",
    )
    match_ratio: float = param(
        0.5,
        "R, share of the gradient entries matched: the largest by the candidate's own gradient, "
        "re-ranked every iteration",
        low=0,
        low_open=True,
        high=1,
    )
    mask_scope: Literal["global", "per_layer"] = param(
        "global", "the top-R ranking over the whole update or within each layer"
    )
    distance: Literal["mean", "sum", "per_layer"] = param(
        "mean",
        "L1 + (1 - cosine) on the matched entries: L1 averaged over them, L1 summed, or both "
        "per layer and summed (the released code)",
    )
    blend: float = param(
        0.7,
        "lambda', weight of the look-ahead gradient in the step (0: plain gradient matching)",
        low=0,
        high=1,
    )
    lookahead: Literal["descent_step", "ascent_normalized"] = param(
        "descent_step",
        "look-ahead point: after one optimiser step (the released code), or a step of RMS "
        "length k per pixel along the gradient (Eqs. 10-12)",
    )
    k: float = param(
        1e-4,
        "ascent_normalized: RMS length per pixel of the look-ahead step (||phi|| = k sqrt(n))",
        low=0,
        low_open=True,
        high=1,
    )
    lookahead_mask: Literal["reuse", "recompute"] = param(
        "reuse", "entries matched at the look-ahead point: those of the iterate, or ranked anew"
    )
    signed: bool = param(
        False, "use the sign of each pixel gradient (the iterate's and the look-ahead's)"
    )
    schedule: Literal["none", "cosine"] = param(
        "none", "step-size schedule: constant (paper) or cosine decay over the iterations"
    )
    median_filter: int = param(
        0,
        "odd window of a median filter on the output images, 3 to 15 (the released code); 0: none",
        low=0,
        high=15,
    )
    restarts: int = param(
        1,
        "random starts; the one with the lowest gradient distance is kept (raced under the "
        "audit preset)",
        low=1,
        high=64,
    )
    labels: Literal["auto", "known", "infer"] = param(
        "auto",
        "labels: known to the server, or inferred from the last layer's update (paper); auto: "
        "known if the server knows them, else inferred",
    )
    label_rule: Literal["auto", "distinct", "counts", "bias-counts"] = param(
        "auto",
        "batch label rule: distinct (the most negative class scores, no repeats), counts "
        "(the paper's estimate), bias-counts (from the bias update); auto: distinct while the "
        "batch fits in the classes, else counts",
    )
    label_fill: Literal["largest-remainder", "lowest-class"] = param(
        "largest-remainder",
        "counts: the samples the floors leave out go one each to the largest remainders, or "
        "all to the class of the most negative row (the paper read literally)",
    )
    unroll: bool = param(
        False,
        "simulate the client's FedAvg local steps, instead of reading the update as one "
        "gradient (paper)",
    )
    # Restarts advance together, one batched computation (attacks.loop); False: one after
    # another. The same objective either way.
    together: bool = param(
        True,
        "advance the restarts together as one batched computation (false: one after another; "
        "the same objective)",
    )

    # The step traced and compiled (attacks.compiled): a CUDA graph on a GPU. Asked for, not
    # the default: compiling costs seconds per number of running starts before it pays.
    compiled: bool = param(
        False,
        "trace and compile the step with torch.compile (a CUDA graph on a GPU): faster steps "
        "where kernels are small, after seconds to minutes of compiling per number of running "
        "starts (two graphs each: the iterate, and the look-ahead on its masks); the starts "
        "advance together, and several updates one after another",
        identity=False,  # the same algorithm: a stored eager run stands for a compiled one
    )
    # The eager step recorded as a CUDA graph after its first steps (attacks.captured): two
    # graphs per count of running starts, as compiled.
    captured: bool | None = param(None, CAPTURED_HELP, identity=False)  # the same algorithm

    def __post_init__(self) -> None:
        check_ranges(self)
        one_way_of_stepping(self)
        require(
            self.median_filter == 0 or (self.median_filter % 2 == 1 and self.median_filter >= 3),
            f"median_filter must be 0 (off) or an odd window from 3 to 15, got {self.median_filter}",
        )


# --- The client simulation --------------------------------------------------------------------


class GradientModel:
    """The candidate's gradient (as the server reads the update) and the target g^."""

    def __init__(
        self, observation: Observation, knowledge: AttackerKnowledge, unroll: bool
    ) -> None:
        self.knowledge = knowledge
        self.parameters = matched_parameters(observation, knowledge)
        device = knowledge.device
        protocol = knowledge.protocol
        self.unroll = unroll and protocol.algorithm != "fedsgd"
        # FedLeak matches one gradient even for FedAvg: the one client definition, as FedSGD.
        self.protocol = (
            protocol if self.unroll else dataclasses.replace(protocol, algorithm="fedsgd")
        )
        self.passes = len(protocol.minibatch_slices(knowledge.batch_size)) if self.unroll else 1
        self.view = ThroughDefense(knowledge)  # the identity for the plain attacker
        self.target = self.view.masked(
            tuple(
                gradient_estimate(observation, knowledge, i).to(device)
                for i in range(len(observation.tensors))
            )
        )

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, differentiable: bool, buffers=None
    ) -> Tensors:
        """The candidate's update; with ``buffers``, through torch.func (under vmap)."""
        update = client_update(
            self.knowledge.model,
            self.parameters,
            images,
            labels,
            self.protocol,
            differentiable=differentiable,
            buffers=buffers,
        )
        if self.unroll:  # the simulated local steps read as the server reads the observed ones
            update = read_as_gradient(update, self.parameters, self.protocol, images.shape[0])
        return self.view.candidate(update)


# --- The attack -------------------------------------------------------------------------------


def _resolve_labels(
    observation: Observation, knowledge: AttackerKnowledge, config: FedLeakConfig
) -> tuple[torch.Tensor, dict]:
    strategy = config.labels
    if strategy == "auto":
        strategy = "known" if knowledge.labels is not None else "infer"
    if strategy == "known":
        if knowledge.labels is None:
            raise AttackUnsupportedError(
                "labels=known needs a scenario in which the server knows the labels (--labels-known)"
            )
        return knowledge.labels.clone().long().cpu(), {"rule": "known to the server (threat model)"}
    labels, record = infer_batch_labels(
        observation, knowledge, rule=config.label_rule, reduce="sum", fill=config.label_fill
    )
    return labels.long(), record


class Objective:
    """J(x01) = D + alpha TV + beta activations, with its gradient in pixel space."""

    def __init__(
        self,
        gradients: GradientModel,
        knowledge: AttackerKnowledge,
        labels: torch.Tensor,
        config: FedLeakConfig,
    ) -> None:
        self.gradients = gradients
        self.normalize = knowledge.normalization.normalize
        self.labels = labels
        self.config = config
        self.modules = (
            activation_modules(knowledge.model, config.activation_layers)
            if config.activation > 0
            else []
        )
        # The prior's hooks: held for a compiled run (a trace cannot register them), else
        # registered for each evaluation.
        self.hooks = HeldHooks(self.modules, keep_output, list)

    def masks(self, candidate: Tensors) -> Tensors:
        return top_ratio_masks(candidate, self.config.match_ratio, self.config.mask_scope)

    def at(self, positions) -> Objective:
        """The objective of these restarts (``fedleak_terms.UpdatesObjective`` gives each its
        own update's): this one, whose target every restart matches."""
        return self

    def _update(self, x01: torch.Tensor, buffers=None, labels=None) -> tuple[Tensors, Tensors]:
        """The candidate's update at one restart's ``x01`` (with ``labels``, else the
        objective's) and its prior terms (alpha TV, beta activations), in the order J adds
        them."""
        config = self.config
        labels = self.labels if labels is None else labels
        with self.hooks.recording() as outputs:
            candidate = self.gradients(
                self.normalize(x01), labels, differentiable=True, buffers=buffers
            )
        priors = []
        if config.tv > 0:
            priors.append(config.tv * total_variation(x01))
        if outputs:
            penalty = activation_penalty(outputs, self.gradients.passes, x01)
            priors.append(config.activation * penalty)
        return candidate, tuple(priors)

    def _terms(
        self, candidate: Tensors, priors: Tensors, masks: Tensors | None, stacked=False, target=None
    ) -> tuple[torch.Tensor, torch.Tensor, Tensors]:
        """(J, D, masks) of one update, or of R ``stacked`` ones (each its own masks); fresh
        masks unless given; ``target``: one per row (updates together), else the update's."""
        if masks is None:
            masks = torch.func.vmap(self.masks)(candidate) if stacked else self.masks(candidate)
        target = self.gradients.target if target is None else target
        distance = masked_distance(candidate, target, masks, self.config.distance)
        objective = distance
        for prior in priors:
            objective = objective + prior
        return objective, distance, masks

    def _direction(self, objective: torch.Tensor, x01: torch.Tensor) -> torch.Tensor:
        (direction,) = torch.autograd.grad(objective.sum(), x01)
        return direction.sign() if self.config.signed else direction

    def evaluate(
        self, x01: torch.Tensor, masks: Tensors | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Tensors]:
        """(direction grad_x J, J, D, masks) at ``x01``; fresh masks unless given."""
        x01 = x01.detach().requires_grad_(True)
        objective, distance, masks = self._terms(*self._update(x01), masks)
        return self._direction(objective, x01), objective.detach(), distance.detach(), masks

    def evaluate_together(
        self, x01: torch.Tensor, masks: Tensors | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Tensors]:
        """:meth:`evaluate` of R restarts at once (``x01`` is R x B x C x H x W), each its own
        J, masks and direction: the R updates in one ``torch.func.vmap`` pass, the masks and
        distances on them stacked (matrix-vector products, not vmap's batched dot)."""
        x01 = x01.detach().requires_grad_(True)
        if x01.shape[0] == 1:  # a race's lone start: plain autograd, without vmap
            candidate, priors = self._update(x01[0])
            rows = (tuple(c.unsqueeze(0) for c in candidate), tuple(p[None] for p in priors))
            objective, distance, masks = self._terms(*rows, masks, stacked=True)
        else:
            objective, distance, masks = self.stacked_terms(x01, masks)
        return self._direction(objective, x01), objective.detach(), distance.detach(), masks

    def stacked_terms(
        self, x01: torch.Tensor, masks: Tensors | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, Tensors]:
        """(J, D, masks) of R restarts at once, one value each: what
        :meth:`evaluate_together` differentiates by autograd and a compiled step traces."""
        buffers = restart_buffers(self.gradients.knowledge.model, x01.shape[0])
        candidate, priors = torch.func.vmap(self._update)(x01, buffers)
        return self._terms(candidate, priors, masks, stacked=True)

    def score(self, x01: torch.Tensor) -> float:
        """The attacker's selection score: D at ``x01`` with its own top-R mask, no priors."""
        with torch.enable_grad():
            candidate = self.gradients(
                self.normalize(x01.detach()), self.labels, differentiable=False
            )
        masks = self.masks(candidate)
        return float(masked_distance(candidate, self.gradients.target, masks, self.config.distance))


def run_fedleak(
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: FedLeakConfig,
    control: RunControl,
    seed: int,
) -> Iterator[ProgressEvent]:
    config, how = stepping("fedleak", config, knowledge, why_not_compiled(knowledge))
    labels, inference = _resolve_labels(observation, knowledge, config)
    gradients = GradientModel(observation, knowledge, config.unroll)
    inference = {**inference, "labels": labels.tolist()}
    objective = Objective(gradients, knowledge, labels.to(knowledge.device), config)

    def make(generators, clock):
        restarts = Restarts(generators, knowledge, config, objective, labels, control.max_steps)
        if stepped(config):
            restarts.traced(knowledge.device, config.captured)
            how.made(*restarts.compiled)
        return restarts

    # A compiled or captured step is the batched one: the starts advance together.
    together = stepped(config) or (config.together and why_not_together(knowledge) is None)
    events = run_restarts(
        make, config.restarts, together, control, seed, "gradient_distance", inference
    )
    if not stepped(config):
        return how.told(events)
    return how.told(held(traced_model(knowledge, objective.hooks), events))  # its hooks too


def run_fedleak_updates(observations, knowledges, config, control, seeds):
    """FedLeak on several updates together (``AttackInfo.run_updates``): update u's
    restarts are rows u R .. u R + R - 1 of one stacked Adam run, each matching update u's
    gradient estimate with update u's labels, masks of its own
    (``fedleak_terms.UpdatesObjective``)."""
    objectives, inferences = [], []
    for observation, knowledge in zip(observations, knowledges, strict=True):
        labels, inference = _resolve_labels(observation, knowledge, config)
        gradients = GradientModel(observation, knowledge, config.unroll)
        objectives.append(Objective(gradients, knowledge, labels.to(knowledge.device), config))
        inferences.append({**inference, "labels": labels.tolist()})
    restarts = config.restarts
    owners = [u for u in range(len(observations)) for _ in range(restarts)]
    objective = UpdatesObjective(objectives, owners)
    labels = torch.stack([objectives[u].labels.cpu() for u in owners])

    def make(generators, clock):
        first = knowledges[0]
        return Restarts(
            generators, first, config, objective, labels, control.max_steps, label_rows=True
        )

    return run_updates(make, restarts, control, seeds, "gradient_distance", inferences)


PAPER = {
    "lr": 1e-4,
    "tv": 1e-5,
    "activation": 1e-4,
    "match_ratio": 0.5,
    "mask_scope": "global",
    "distance": "mean",
    "blend": 0.7,
    "lookahead": "descent_step",
    "lookahead_mask": "reuse",
    "signed": False,
    "schedule": "none",
    "median_filter": 0,
}

register(
    AttackInfo(
        name="fedleak",
        summary=(
            "FedLeak (Fan et al. 2025): top-50% partial gradient matching, L1 + cosine, "
            "look-ahead gradient regularisation, TV and activation priors, inferred labels."
        ),
        config_type=FedLeakConfig,
        run=run_fedleak,
        run_updates=run_fedleak_updates,
        why_updates_apart=apart_when_compiled("fedleak"),
        presets={
            # Sec. 5 and Algorithm 1: Adam 1e-4 on pixels for 10,000 iterations.
            "paper": PAPER,
            # The released code's loss and optimiser, on pixels (no generator).
            "artifact": {
                **PAPER,
                "lr": 1e-2,
                "activation": 0.0,
                "mask_scope": "per_layer",
                "distance": "per_layer",
                "blend": 0.3,
                "lookahead_mask": "recompute",
                "signed": True,
                "schedule": "cosine",
                "median_filter": 5,
            },
            # CPU-scaled runs of a few hundred iterations (our departure): lr 0.1, cosine decay.
            "cpu": {**PAPER, "lr": 0.1, "schedule": "cosine", "k": 0.1},
        },
        audit=AuditPreset(
            {**PAPER, "lr": 0.1, "schedule": "cosine", "k": 0.1, "restarts": 4},
            iterations=300,
            why="the paper's loss (top-50% partial matching, look-ahead regularisation, TV and activation priors) with Adam lr 0.1 and cosine decay, which converge in hundreds of steps where the paper's lr 1e-4 needs 10 000, and 4 raced starts",
        ),
        paper_iterations=10_000,
        # Its objective differentiates by hand in pixel space: no unknown model parameters.
        # Its own masked L1 + cosine distance stays: it takes no noise's likelihood.
        adapts=MATCHES_THROUGH - {"unknowns", "distance", "likelihood"},
    )
)
