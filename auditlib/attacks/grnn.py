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
from torch.func import functional_call

from auditlib.attacks.base import (
    AttackInfo,
    AuditPreset,
    ProgressEvent,
    RunControl,
    register,
    snapshot,
)
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
from auditlib.attacks.grnn_generator import build_generator, fit_to_input
from auditlib.attacks.labels import infer_batch_labels
from auditlib.attacks.loop import run_restarts
from auditlib.attacks.objectives import (
    UpdateMatcher,
    backward_to,
    l2_distance,
    total_variation,
    unknown_rows,
    why_not_together,
)
from auditlib.attacks.row_index import FirstBroken, RowIndex, full_rows, keep_rows
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
    a = torch.cat([t.reshape(-1) for t in candidate]).sort().values
    b = torch.cat([t.reshape(-1) for t in target]).sort().values
    return (a - b).abs().mean()


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
        self.target = self.matcher.target
        self.config = config
        self.tv = tv_weight(knowledge, config)

    def gradient_terms(
        self, images: torch.Tensor, labels: torch.Tensor, unknowns=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The distance and the Wasserstein term of one candidate (``unknowns``: its row of
        an adaptive attacker's fitted unknowns, else the model's own)."""
        simulated = self.matcher.simulate(images, labels, unknowns)
        # The thesis's summed squares; through a noisy defense the release's likelihood.
        mse = self.matcher.distance(simulated, self.target)
        if self.config.wasserstein == "sorted":
            wd = sorted_wasserstein(simulated, self.target)
        else:
            wd = self.row_wasserstein(mse)
        return mse, wd

    def over(self, matcher: UpdatesMatcher) -> GrnnLoss:
        """This loss with several updates' rows to match (updates together): the same
        weights and terms, each row against its own update's target."""
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
    config, how = stepping("grnn", config, knowledge, _why_not_compiled(knowledge, config))
    fixed_labels, inference = resolve_labels(observation, knowledge, config)
    loss = GrnnLoss(observation, knowledge, config)  # checks the observation at the call

    def make(generators, clock):
        # An adaptive attacker's unknowns live in the loss's matcher: one of its own per group.
        own = GrnnLoss(observation, knowledge, config) if loss.matcher.unknowns else loss
        restarts = _Restarts(generators, knowledge, config, own, fixed_labels)
        if stepped(config):
            restarts.traced(knowledge.device, config.captured)
            how.made(restarts.compiled)
        return restarts

    # A compiled or captured step is the stacked one: the starts advance together.
    together = stepped(config) or (config.together and _why_apart(knowledge, config) is None)
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
        return _Restarts(generators, knowledges[0], config, loss, rows, fixed_rows=True)

    inferences = [inference for _, inference in read]
    return run_updates(make, restarts, control, seeds, "gradient_distance", inferences)


def _why_updates_apart(config: GrnnConfig, raced: bool = False) -> str | None:
    if config.wasserstein == "sorted":
        return "the sorted Wasserstein term is computed one restart at a time"
    return None


def _why_apart(knowledge: AttackerKnowledge, config: GrnnConfig) -> str | None:
    return _why_updates_apart(config) or why_not_together(knowledge)


def _why_not_compiled(knowledge: AttackerKnowledge, config: GrnnConfig) -> str | None:
    """Why GRNN's step cannot be traced here: the traced step is the stacked one."""
    return _why_updates_apart(config) or why_not_compiled(knowledge)


class _Restarts:
    """GRNN's restarts: each a generator of its own (fresh weights, a fixed latent) trained
    with RMSprop; several advance together as one stacked set of generator weights."""

    def __init__(
        self, generators, knowledge, config, loss: GrnnLoss, fixed_labels, fixed_rows=False
    ) -> None:
        self.knowledge = knowledge
        self.config = config
        self.loss = loss
        # Updates together: a row per start (its update's labels), else one set for all.
        self.fixed_rows = fixed_rows and fixed_labels is not None
        nets, latents = [], []
        for generator in generators:  # per restart: its generator's weights, then its latent
            nets.append(build_generator(knowledge, config, generator))
            shape = (knowledge.batch_size, config.latent_dim)
            latents.append(torch.randn(shape, generator=generator).to(knowledge.device))
        self.latent = torch.stack(latents)
        self.fixed = None if fixed_labels is None else fixed_labels.to(knowledge.device)
        loss.matcher.restart()
        self.compiled: CompiledGradient | CapturedGradient | None = None
        if len(nets) == 1 and not stepped(config):  # a traced step is the stacked one
            self.net, self.weights, self.buffers = nets[0], None, None
            variables = list(self.net.parameters())
        else:  # stacked weights: one leaf per parameter, a slice per restart
            self.weights, self.buffers = torch.func.stack_module_state(nets)
            self.net = copy.deepcopy(nets[0]).to("meta")
            variables = list(self.weights.values())
        # An adaptive attacker's unknown model parameters train with the generator: a row per
        # start where the generators are stacked, else the model's own.
        self.unknowns = unknown_rows(loss.matcher, len(nets) if self.weights is not None else 1)
        unknowns = loss.matcher.unknowns if self.unknowns is None else self.unknowns.leaves
        self.optimizer = torch.optim.RMSprop(
            [*variables, *unknowns], lr=config.lr, momentum=config.momentum
        )
        self.shown: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # last frame, by position
        self._index = RowIndex(knowledge.device)  # the running rows, made once per set
        # The starts (positions) whose rows the stacked tensors hold, in order: those still
        # running once some stopped (:meth:`_compact`).
        self.held = list(range(len(nets)))
        # Its images (and its own labels) at the step its objective stopped being finite.
        self.first_broken = FirstBroken(len(nets), knowledge.device)

    def _one(self, weights, buffers, latent):
        """One restart's images in [0, 1], in model space, and its labels."""
        _, height, width = self.knowledge.input_shape
        if weights is None:
            images01, soft = self.net(latent)
        else:
            images01, soft = functional_call(self.net, (weights, buffers), (latent,))
        images01 = fit_to_input(images01, height, width, self.config.fit)
        return images01, self.knowledge.normalization.normalize(images01), soft

    def generate(self, positions):
        """Images in [0, 1], the same in model space and the labels fed to the client, one
        slice per position (fixed labels: one per row where each row has its own, else the
        set all rows share)."""
        if self.weights is None:
            images01, images, soft = self._one(None, None, self.latent[0])
            return (
                images01.unsqueeze(0),
                images.unsqueeze(0),
                self._labels(soft.unsqueeze(0), positions),
            )
        # Every row held running (in order, as the loop keeps them): the stacked tensors as
        # they are. Else index_select, not w[index], whose backward (an accumulating
        # index_put) took 35 % of a step of 8 starts on LeNet (CPU); index_select's is an
        # index_add.
        rows = self._rows(positions)
        if len(rows) == 1:  # one row runs: its slices through the net, without vmap
            (row,) = rows
            weights = {n: w[row] for n, w in self.weights.items()}
            buffers = {n: b[row] for n, b in self.buffers.items()}
            images01, images, soft = self._one(weights, buffers, self.latent[row])
            return images01[None], images[None], self._labels(soft[None], positions)
        index = self._index(rows)
        if len(rows) == len(self.held):
            weights, buffers, latent = self.weights, self.buffers, self.latent
        else:
            weights = {n: w.index_select(0, index) for n, w in self.weights.items()}
            buffers = {n: b.index_select(0, index) for n, b in self.buffers.items()}
            latent = self.latent.index_select(0, index)
        images01, images, soft = torch.func.vmap(self._one)(weights, buffers, latent)
        return images01, images, self._labels(soft, positions)

    def _rows(self, positions) -> list[int]:
        """The rows of the stacked tensors that hold these starts."""
        return [self.held.index(position) for position in positions]

    def _compact(self, alive) -> None:
        """Keep only the running starts' rows: the stacked weights, their RMSprop state and
        the unknowns' rows (``row_index.keep_rows``), buffers and latents, so that a step
        no longer updates the generators of starts a race dropped (measured: RMSprop over
        all 4 rows of the audit preset's race was a third of GRNN's step on LeNet, CPU,
        where a lone start ran 270 of the 350 steps)."""
        index = self._index(self._rows(alive))
        cut = keep_rows(self.optimizer, index)
        self.weights = {n: cut[id(w)] for n, w in self.weights.items()}
        self.buffers = {n: b.index_select(0, index) for n, b in self.buffers.items()}
        self.latent = self.latent.index_select(0, index)
        if self.unknowns is not None:
            self.unknowns.leaves = tuple(cut[id(leaf)] for leaf in self.unknowns.leaves)
        self.held = list(alive)

    def _labels(self, soft: torch.Tensor, positions) -> torch.Tensor:
        if self.fixed is None:
            return soft
        return self.fixed.index_select(0, self._index(positions)) if self.fixed_rows else self.fixed

    def _row(self, labels: torch.Tensor, index: int) -> torch.Tensor:
        """One restart's labels: its soft labels, or the fixed ones all restarts share."""
        return labels[index] if self.fixed is None or self.fixed_rows else labels

    def _terms(self, images, labels, alive):
        if images.shape[0] == 1 and not isinstance(self.loss.matcher, UpdatesMatcher):
            own = None if self.unknowns is None else self.unknowns.row(self._rows(alive)[0])
            mse, wd = self.loss.gradient_terms(images[0], self._row(labels, 0), own)
            return mse.unsqueeze(0), wd.unsqueeze(0)
        own = {}
        if self.unknowns is not None:  # each row through its own unknowns
            index = self._index(self._rows(alive))
            own["unknowns"] = self.unknowns.rows(lambda leaf: leaf.index_select(0, index))
        mse = self.loss.matcher.at(alive).together(images, labels, distance=l2_distance, **own)
        return mse, self.loss.row_wasserstein(mse)  # wasserstein=sorted runs apart

    def traced(self, device: torch.device, captured: bool = False) -> None:
        """Step by the traced objective from now on, compiled (``attacks.compiled``) or
        recorded as a CUDA graph (``attacks.captured``): the stacked generators' images,
        labels and terms, and the objective's gradient to their weights; one update's (such
        a run attacks updates one after another)."""
        loss, names = self.loss, list(self.weights)
        loss.matcher.factored = False  # a trace cannot register the factored form's hooks

        def terms(*inputs: torch.Tensor):
            weights = dict(zip(names, inputs[: len(names)], strict=True))
            buffers = dict(zip(self.buffers, inputs[len(names) : -1], strict=True))
            images01, images, soft = torch.func.vmap(self._one)(weights, buffers, inputs[-1])
            labels = soft if self.fixed is None else self.fixed
            mse = loss.matcher.together(images, labels, distance=l2_distance)
            wd = loss.row_wasserstein(mse)
            tv = torch.func.vmap(loss.smoothness)(images01)
            objective = mse + wd + loss.tv * tv
            # A broken restart's objective is left out of the step, as in the eager one.
            kept = torch.where(torch.isfinite(objective), objective, 0.0)
            parts = {"objective": objective, "gradient_distance": mse, "wasserstein": wd}
            return kept, parts | {"tv": tv, "images": images, "labels": labels}

        gradient = CapturedGradient if captured else CompiledGradient
        self.compiled = gradient(terms, device)

    def _traced_step(self, alive):
        index = self._index(alive)
        rows = [w.index_select(0, index) for w in self.weights.values()]
        given = [b.index_select(0, index) for b in self.buffers.values()]
        grads, _, named = self.compiled(*rows, given=(*given, self.latent.index_select(0, index)))
        for weight, grad in zip(self.weights.values(), grads, strict=True):
            weight.grad = full_rows(weight, index, grad)
        self.optimizer.step()
        return named

    def step(self, alive):
        if self.compiled is not None:
            named = self._traced_step(alive)
            images, labels, objective = named.pop("images"), named.pop("labels"), named["objective"]
            self._keep(alive, images, labels, torch.isfinite(objective))
            return named
        if self.weights is not None and len(alive) < len(self.held):
            self._compact(alive)
        self.optimizer.zero_grad()
        images01, images, labels = self.generate(alive)
        mse, wd = self._terms(images, labels, alive)
        tv = torch.func.vmap(self.loss.smoothness)(images01)
        objective = mse + wd + self.loss.tv * tv
        finite = torch.isfinite(objective.detach())
        self._keep(alive, images, labels, finite)
        # A broken restart's objective is left out of the step (the loop drops it at its next
        # read of the losses); chosen on the device, not read back at every step.
        kept = torch.where(finite, objective, torch.zeros_like(objective))
        backward_to(kept.sum(), self.optimizer)
        self.optimizer.step()
        return {
            "objective": objective.detach(),
            "gradient_distance": mse.detach(),
            "wasserstein": wd.detach(),
            "tv": tv.detach(),
        }

    def _keep(self, alive, images, labels, finite) -> None:
        """The frames (the output each step was taken from) and, for a restart whose
        objective stopped being finite, its images and own labels at that step."""
        for index, position in enumerate(alive):
            self.shown[position] = (images[index].detach(), self._row(labels, index).detach())
        own_labels = (labels,) if self.fixed is None or self.fixed_rows else ()
        self.first_broken.keep(self._index(alive), finite, images, *own_labels)

    def _hard(self, labels: torch.Tensor) -> torch.Tensor:
        return (labels if self.fixed is not None else labels.argmax(-1)).cpu()

    def frame(self, position):
        # The frame is the output the last step was taken from (one forward per step).
        if position not in self.shown:
            with torch.no_grad():
                _, images, labels = self.generate([position])
            self.shown[position] = (images[0], self._row(labels, 0))
        images, labels = self.shown[position]
        return snapshot(images), self._hard(labels)

    def candidate(self, position):
        """The generator's output after its last step, scored by the gradient terms of
        Eq. 3.4 (MSE + WD; the TV prior is not part of the score)."""
        kept = self.first_broken.at(position)
        if kept is not None:
            images, *own_labels = kept
            labels = own_labels[0] if own_labels else self.fixed
        else:
            with torch.no_grad():
                _, images, labels = self.generate([position])
            images, labels = images[0], self._row(labels, 0)
        with torch.enable_grad():
            if isinstance(self.loss.matcher, UpdatesMatcher):  # its own update's target
                mse = self.loss.matcher.at([position])(images.detach(), labels.detach())
                wd = self.loss.row_wasserstein(mse)
            else:  # through its own row of the unknowns, where it fits some
                own = (
                    None if self.unknowns is None else self.unknowns.row(self._rows([position])[0])
                )
                mse, wd = self.loss.gradient_terms(images.detach(), labels.detach(), own)
        return snapshot(images), self._hard(labels), float((mse + wd).detach())


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
        why_updates_apart=apart_when_compiled("grnn", _why_updates_apart),
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
