"""GRNN, Generative Regression Neural Network (Ren, Deng, Xie, ACM TIST 13(4), 2022).

The attacker does not optimise pixels but the weights of a generator G. A latent matrix
v ~ N(0, I) (one row of ``latent_dim`` per image) is drawn once and kept fixed; G maps it to
a batch of images (image branch: a fractionally-strided convolution to a 4x4 map, then
upsampling blocks "nearest x2 -> conv 3x3 -> BatchNorm -> GLU", a sigmoid at the end, so
pixels lie in [0, 1]) and to soft labels (label branch: one linear layer and a softmax).
The update the client would compute on (images, soft labels) is regressed onto the observed
one with Eq. 3.4 of the thesis,

    L = MSE(g, g_hat) + WD(g, g_hat) + alpha * TV(x_hat),

and G's weights are trained with RMSprop (lr 1e-4, momentum 0.99). The recovered labels
are the argmax of the label branch. Public code: github.com/Rand2AI/GRNN (``GRNN.py``,
``Generator/model.py``, ``utils.py``), whose definitions of the three terms we follow:
"MSE" is the summed squared difference, "WD" of one row reduces to the L2 norm of the
difference, and TV is squared. The thesis's own words (an earth mover's distance, absolute
TV differences) are options. See docs/ALGORITHMS.md for every departure.

Why one module over 400 lines: the thesis's loss, restarts and presets (and its config,
each field declared with its default and range) read against the thesis and its code in
one file; its generator is in ``grnn_generator.py``. Shared parts: ``objectives.py``,
``labels.py``, ``loop.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

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
from auditlib.attacks.grnn_restarts import GrnnRestarts
from auditlib.attacks.labels import infer_batch_labels
from auditlib.attacks.loop import run_restarts
from auditlib.attacks.low_rank import LowRankRows, dense
from auditlib.attacks.objectives import (
    RowTargets,
    UpdateMatcher,
    l2_distance,
    total_variation,
    why_not_together,
)
from auditlib.attacks.updates import UpdatesMatcher
from auditlib.attacks.updates_loop import run_updates
from auditlib.config import check_ranges, param
from auditlib.errors import AttackUnsupportedError
from auditlib.models.keylock import key_lock_modules
from auditlib.threat import AttackerKnowledge, Observation

# Thesis Sec. 3.3.1: TV weight 1e-3 for LeNet, 1e-6 for ResNet-18.
TV_LENET, TV_RESNET = 1e-3, 1e-6


@dataclass(frozen=True)
class GrnnConfig:
    lr: float = param(
        1e-4,
        "RMSprop step size on the generator's weights (thesis: 1e-4)",
        low=0,
        low_open=True,
        high=1,
    )
    momentum: float = param(0.99, "RMSprop momentum (thesis: 0.99)", low=0, high=1, high_open=True)
    tv: float | None = param(
        None,
        "weight alpha of the total-variation term; empty: the thesis's weight for the model "
        "(1e-6 with BatchNorm layers, as its ResNet-18; 1e-3 otherwise, as its LeNet)",
        low=0,
        high=10,
    )
    tv_form: Literal["squared", "absolute"] = param(
        "squared",
        "total variation of squared differences (the public code) or absolute ones (the "
        "thesis's text)",
    )
    wasserstein: Literal["l2-norm", "sorted"] = param(
        "l2-norm",
        "the WD term: the L2 norm of the update difference (the public code) or the 1-D "
        "Wasserstein distance between the two updates' value distributions (the thesis's text)",
    )
    latent_dim: int = param(128, "length of the fixed latent vector per image", low=1, high=4096)
    width: int = param(
        32, "channels of the generator's last block, doubled at each earlier one", low=1, high=256
    )
    generator_init: Literal["default", "normal"] = param(
        "default",
        "generator weights: PyTorch's initialisation (what the public code runs) or N(0, 0.02)",
    )
    fit: Literal["crop", "resize"] = param(
        "crop",
        "generated square images to the model's input size: centre crop or area resize",
    )
    labels: Literal["auto", "joint", "known", "inferred"] = param(
        "auto",
        "labels: the generator's label branch (joint, the thesis), known to the server, or "
        "inferred from the last layer's update; auto: known if the server knows them, else joint",
    )
    label_rule: Literal["auto", "distinct", "counts", "bias-counts"] = param(
        "auto",
        "batch label rule with labels=inferred: distinct (the most negative class scores, no "
        "repeats), counts (FedLeak's estimate), bias-counts (from the bias update); auto: "
        "distinct while the batch fits in the classes, else counts",
    )
    restarts: int = param(
        1,
        "random starts (each a fresh generator and latent); the one with the lowest gradient "
        "distance is kept (raced under the audit preset)",
        low=1,
        high=64,
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
        "trace and compile the generators' step with torch.compile (a CUDA graph on a GPU): "
        "faster steps where kernels are small, after seconds to minutes of compiling per "
        "number of running starts; the starts advance together, and several updates one "
        "after another",
        identity=False,  # the same algorithm: a stored eager run stands for a compiled one
    )
    # The eager step recorded as a CUDA graph after its first steps (attacks.captured).
    captured: bool | None = param(None, CAPTURED_HELP, identity=False)  # the same algorithm

    def __post_init__(self) -> None:
        check_ranges(self)
        one_way_of_stepping(self)


# --- Loss (thesis Eq. 3.4, code definitions) --------------------------------------------


def squared_tv(images: torch.Tensor) -> torch.Tensor:
    """The public code's TVLoss: 2 (mean squared vertical + horizontal differences) / B."""
    _, channels, height, width = images.shape
    dh = (images[:, :, 1:, :] - images[:, :, :-1, :]).pow(2).sum() / (
        channels * (height - 1) * width
    )
    dw = (images[:, :, :, 1:] - images[:, :, :, :-1]).pow(2).sum() / (
        channels * height * (width - 1)
    )
    return 2 * (dh + dw) / images.shape[0]


def sorted_wasserstein(
    candidate: Sequence[torch.Tensor], target: Sequence[torch.Tensor]
) -> torch.Tensor:
    """1-D W1 between the value distributions of the two flattened updates."""
    return sorted_wasserstein_rows([t.unsqueeze(0) for t in candidate], target)[0]


def sorted_wasserstein_rows(
    updates: Sequence[torch.Tensor | LowRankRows], target: Sequence[torch.Tensor]
) -> torch.Tensor:
    """:func:`sorted_wasserstein` of each of R stacked updates: against the one target, or
    (``RowTargets``: updates together) each row against its own."""
    rows = dense(updates)
    a = torch.cat([u.reshape(u.shape[0], -1) for u in rows], 1).sort(dim=1).values
    if isinstance(target, RowTargets):
        b = torch.cat([t.reshape(t.shape[0], -1) for t in target], 1).sort(dim=1).values
    else:
        b = torch.cat([t.reshape(-1) for t in target]).sort().values
    return (a - b).abs().mean(1)


def tv_weight(knowledge: AttackerKnowledge, config: GrnnConfig) -> float:
    """The configured TV weight, or the thesis's for the architecture: 1e-6 for one with
    BatchNorm layers (its ResNet-18), 1e-3 otherwise (its LeNet). A defense's own
    normalisation (FedKL's key-lock) does not count: it changes the model, and the attack's
    settings must not change with it, or a none-vs-FedKL comparison compares two attacks."""
    if config.tv is not None:
        return config.tv
    inserted = {
        id(inner) for _, lock in key_lock_modules(knowledge.model) for inner in lock.modules()
    }
    has_bn = any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and id(m) not in inserted
        for m in knowledge.model.modules()
    )
    return TV_RESNET if has_bn else TV_LENET


class GrnnLoss:
    """Eq. 3.4 on the candidate batch; the terms are returned for the progress events."""

    def __init__(self, observation: Observation, knowledge: AttackerKnowledge, config: GrnnConfig):
        # Checks the names, moves the targets, reads both updates as gradients.
        # Its generator is its image prior: through a noisy defense it takes the release's
        # likelihood and adds no other prior (measured: a TV prior beside the generator cost
        # it 3.7 dB under Gaussian noise, docs/ALGORITHMS.md).
        self.matcher = UpdateMatcher(observation, knowledge, "l2", weighs_prior=False)
        self.knowledge = knowledge
        self.parameters = self.matcher.parameters
        self.config = config
        self.tv = tv_weight(knowledge, config)

    def gradient_terms(
        self, images: torch.Tensor, labels: torch.Tensor, unknowns=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The distance and the Wasserstein term of one candidate (``unknowns``: its row of
        an adaptive attacker's fitted unknowns, else the model's own)."""
        simulated = self.matcher.simulate(images, labels, unknowns)
        # The thesis's summed squares; through a noisy defense the release's likelihood.
        mse = self.matcher.distance(simulated, self.matcher.target)
        if self.config.wasserstein == "sorted":
            wd = sorted_wasserstein(simulated, self.matcher.target)
        else:
            wd = self.row_wasserstein(mse)
        return mse, wd

    def stacked_terms(
        self, rows, images: torch.Tensor, labels: torch.Tensor, unknowns=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`gradient_terms` of R candidates at once (``images`` R x B x C x H x W),
        one value of each per row: ``rows`` is the rows' matcher (``matcher.at``), each row
        against its own update's target; ``unknowns`` the rows' own fitted unknowns."""
        if self.config.wasserstein != "sorted":
            mse = rows.together(images, labels, distance=l2_distance, unknowns=unknowns)
            return mse, self.row_wasserstein(mse)
        # Both terms from the one pass's updates.
        updates = rows.stacked_updates(images, labels, unknowns)
        mse = rows.measured(updates, images, distance=l2_distance)
        return mse, sorted_wasserstein_rows(updates, rows.target)

    def over(self, matcher: UpdatesMatcher | UpdateMatcher) -> GrnnLoss:
        """This loss through another matcher, with the same weights and terms: several
        updates' rows (updates together), each row against its own update's target, or one
        of those updates' own."""
        loss = copy.copy(self)
        loss.matcher = matcher
        return loss

    @staticmethod
    def row_wasserstein(mse: torch.Tensor) -> torch.Tensor:
        """The code's wasserstein_distance of one row: the L2 norm of the difference. The
        clamp keeps the derivative of the square root finite at an exact match."""
        return mse.clamp_min(1e-30).sqrt()

    def smoothness(self, images01: torch.Tensor) -> torch.Tensor:
        if self.config.tv_form == "absolute":
            return total_variation(images01)
        return squared_tv(images01)


# --- Labels -----------------------------------------------------------------------------


def resolve_labels(
    observation: Observation, knowledge: AttackerKnowledge, config: GrnnConfig
) -> tuple[torch.Tensor | None, dict[str, Any]]:
    """Fixed class ids (known or inferred) or None for the label branch (the thesis)."""
    strategy = config.labels
    if strategy == "auto":
        strategy = "known" if knowledge.labels is not None else "joint"
    if strategy == "known":
        if knowledge.labels is None:
            raise AttackUnsupportedError(
                "labels=known needs a scenario in which the server knows the labels (--labels-known)"
            )
        return knowledge.labels.clone().long(), {"rule": "known to the server (threat model)"}
    if strategy == "inferred":
        return infer_batch_labels(observation, knowledge, config.label_rule)
    return None, {"rule": "GRNN label branch (argmax of softmax(FC(v)))"}


# --- Attack -----------------------------------------------------------------------------


def run_grnn(
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: GrnnConfig,
    control: RunControl,
    seed: int,
) -> Iterator[ProgressEvent]:
    config, how = stepping("grnn", config, knowledge, why_not_compiled(knowledge))
    fixed_labels, inference = resolve_labels(observation, knowledge, config)
    loss = GrnnLoss(observation, knowledge, config)  # checks the observation at the call

    def make(generators, clock):
        # An adaptive attacker's unknowns live in the loss's matcher: one of its own per group.
        own = GrnnLoss(observation, knowledge, config) if loss.matcher.unknowns else loss
        restarts = GrnnRestarts(generators, knowledge, config, own, fixed_labels)
        if stepped(config):
            restarts.traced(knowledge.device, config.captured)
            how.made(restarts.compiled)
        return restarts

    # A compiled or captured step is the stacked one: the starts advance together.
    together = stepped(config) or (config.together and why_not_together(knowledge) is None)
    events = run_restarts(
        make, config.restarts, together, control, seed, "gradient_distance", inference
    )
    return how.told(held(traced_model(knowledge), events) if stepped(config) else events)


def run_grnn_updates(observations, knowledges, config, control, seeds):
    """GRNN on several updates together (``AttackInfo.run_updates``): update u's restarts
    are rows u R .. u R + R - 1 of one stacked set of generators, each matching update u's
    target (``attacks.updates.UpdatesMatcher``) with update u's own labels where they are
    fixed (known or inferred; the label branch is each generator's own)."""
    read = [resolve_labels(o, k, config) for o, k in zip(observations, knowledges, strict=True)]
    fixed = [labels for labels, _ in read]
    restarts = config.restarts
    owners = [u for u in range(len(observations)) for _ in range(restarts)]
    losses = [GrnnLoss(o, k, config) for o, k in zip(observations, knowledges, strict=True)]
    loss = losses[0].over(UpdatesMatcher([each.matcher for each in losses], owners))
    # Every update resolves its labels the same way (the same threat model): all or none fixed.
    rows = None if fixed[0] is None else torch.stack([fixed[u] for u in owners])

    def make(generators, clock):
        return GrnnRestarts(generators, knowledges[0], config, loss, rows, fixed_rows=True)

    inferences = [inference for _, inference in read]
    return run_updates(make, restarts, control, seeds, "gradient_distance", inferences)


# Rand2AI/GRNN GRNN.py; tv empty = 1e-3 on LeNet, 1e-6 on ResNet-18 (Sec. 3.3.1).
_GRNN_PAPER = {
    "lr": 1e-4,
    "momentum": 0.99,
    "tv": None,
    "tv_form": "squared",
    "wasserstein": "l2-norm",
    "latent_dim": 128,
    "labels": "auto",
    "restarts": 1,
}

register(
    AttackInfo(
        name="grnn",
        summary=(
            "GRNN (Ren et al. 2022): a generator (images + soft labels) trained with RMSprop "
            "so its update matches the observed one (L2 + WD + TV)."
        ),
        config_type=GrnnConfig,
        run=run_grnn,
        run_updates=run_grnn_updates,
        why_updates_apart=apart_when_compiled("grnn"),
        # No no_cpu_gain since 2026-12-01: 16 updates together in 34.4 s against 47.3 s
        # apart on the CPU (0.88x before the race's dropped rows were cut from the step,
        # docs/PERFORMANCE.md, "Updates together").
        presets={
            "paper": _GRNN_PAPER,
            # The thesis's words rather than the code: W1 between gradient values, absolute TV.
            "thesis-text": {"wasserstein": "sorted", "tv_form": "absolute"},
            # The FedKL chapter's re-runs of GRNN (Rand2AI/FedKL GRNN_test.py): latent 1024,
            # TV 1e-6 for every model (20 000 iterations there).
            "fedkl": {"latent_dim": 1024, "tv": 1e-6},
        },
        # The thesis gives no count; the public GRNN.py runs 1000 iterations.
        audit=AuditPreset(
            {**_GRNN_PAPER, "restarts": 4},
            iterations=300,
            why="the public GRNN settings (RMSprop lr 1e-4, TV by architecture) with 4 raced starts of the generator",
        ),
        paper_iterations=1000,
        weighs_prior=False,  # its generator is its prior: the likelihood alone under noise
    )
)
