"""Update-matching objectives and image priors shared by the optimisation attacks."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from auditlib.attacks.low_rank import (
    FactoredLayers,
    LowRankRows,
    dense,
    factored_layers,
    fedsgd_factored,
)
from auditlib.client.update import (
    Recording,
    client_update,
    difference_per_gradient,
    read_as_gradient,
    recorded_client_update,
)
from auditlib.likelihoods import Likelihood, image_prior_nats
from auditlib.threat import AttackerKnowledge, KnownDefense, Observation


def backward_to(loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
    """``loss.backward()`` into the optimiser's variables only. The objective's graph also
    reaches the model's weights (the simulated update is a function of them), so a plain
    backward builds their gradient too in the double backward, for nothing: measured, a
    fifth of an IG step on ResNet-18 (docs/PERFORMANCE.md, "Beside breaching")."""
    loss.backward(inputs=[p for group in optimizer.param_groups for p in group["params"]])


def flat_like(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``x`` as one vector, or as R rows where it has one more (leading) dimension than the
    target's ``t``: R restarts' updates, stacked (``UpdateMatcher.together``)."""
    return x.reshape(*x.shape[: x.dim() - t.dim()], -1)


class RowTargets(tuple):
    """Target tensors with a leading row dimension: row r of the stacked candidate is
    measured against row r, its own update's target (updates together,
    ``attacks.updates``), in one call rather than one call per update."""


def _flat(
    c: torch.Tensor, t: torch.Tensor, rows: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    if rows:
        return c.reshape(c.shape[0], -1), t.reshape(t.shape[0], -1)
    return flat_like(c, t), t.reshape(-1)


def _inner(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Inner product over the last dimension; ``a`` one vector or R rows, ``b`` one vector
    or R rows. ``torch.dot`` for two vectors: one fused reduction (and one in the backward),
    where multiply-then-sum makes a full-size temporary, a seventh of an IG step on
    ResNet-18. R rows at once: a matrix-vector product, or a product and a sum; never
    ``torch.dot`` under ``vmap``, whose batched form is a matrix product of one-column
    matrices, 15-35x slower on LeNet's 76 800 weights (docs/PERFORMANCE.md)."""
    if a.dim() == 1 and b.dim() == 1:
        return torch.dot(a, b)
    if b.dim() == 1:
        return torch.mv(a, b)
    # Row by row: vecdot gives multiply-then-sum's values with a fused backward (4.0 against
    # 6.5 ms forward and backward on 64 rows of LeNet's 76 800 weights, one CPU thread).
    return torch.linalg.vecdot(a, b)


# Each distance takes the candidate update as one tensor per parameter, or R candidates
# stacked along a leading dimension (then one value per restart), and the target's tensors
# (or, as ``RowTargets``, one target per candidate row). Where stacked, a Linear weight's
# entry may be its factors (``low_rank.LowRankRows``): l2, cosine and layer-l2 measure it
# without forming it; any other measure forms it first (``dense``).


def _zero(candidate: Sequence[torch.Tensor | LowRankRows]) -> torch.Tensor:
    first = candidate[0]
    return (first.left if isinstance(first, LowRankRows) else first).new_zeros(())


def l2_distance(candidate: Sequence[torch.Tensor], target: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum of squared differences over all parameters (DLG, Zhu et al. 2019, Eq. 4)."""
    total = _zero(candidate)
    rows = isinstance(target, RowTargets)
    for c, t in zip(candidate, target, strict=True):
        if isinstance(c, LowRankRows):
            total = total + c.squared_distance(t, rows).to(total.dtype)
            continue
        c, t = _flat(c, t, rows)
        difference = c - t
        total = total + _inner(difference, difference)
    return total


def l1_distance(candidate: Sequence[torch.Tensor], target: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum of absolute differences: the negative log-likelihood under Laplace noise."""
    candidate = dense(candidate)
    total = candidate[0].new_zeros(())
    rows = isinstance(target, RowTargets)
    for c, t in zip(candidate, target, strict=True):
        c, t = _flat(c, t, rows)
        total = total + (c - t).abs().sum(-1)
    return total


def cosine_distance(
    candidate: Sequence[torch.Tensor],
    target: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor] | None = None,
) -> torch.Tensor:
    """1 - cosine similarity of the whole updates seen as one vector (IG, Geiping et al. 2020, Eq. 4).

    With 0/1 ``masks`` (shaped like the candidate: one per restart where it is stacked), the
    cosine of the masked candidate and the masked target (FedLeak's partial matching),
    computed as (c m).t and m.t^2, equal for 0/1 masks, so the target stays one vector."""
    dot, c_norm, t_norm = _zero(candidate), _zero(candidate), _zero(candidate)
    rows = isinstance(target, RowTargets)
    if masks is not None:
        candidate = dense(candidate)
    for index, (c, t) in enumerate(zip(candidate, target, strict=True)):
        if isinstance(c, LowRankRows):
            dot = dot + c.inner(t, rows).to(dot.dtype)
            c_norm = c_norm + c.squared_norm().to(dot.dtype)
            t_norm = t_norm + c.target_norm(t).to(dot.dtype)
            continue
        c, t = _flat(c, t, rows)
        if masks is None:
            t_norm = t_norm + _inner(t, t)
        else:
            m = masks[index].reshape(c.shape)
            c = c * m
            t_norm = t_norm + _inner(m, t * t)
        dot = dot + _inner(c, t)
        c_norm = c_norm + _inner(c, c)
    return 1 - dot / (c_norm.sqrt() * t_norm.sqrt() + 1e-12)


def layer_l2_distance(
    candidate: Sequence[torch.Tensor], target: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Sum over parameter tensors of the (unsquared) L2 norm of the difference.

    GradInversion's per-layer gradient distance (Yin et al. 2021, Eq. 4).
    """
    total = _zero(candidate)
    rows = isinstance(target, RowTargets)
    for c, t in zip(candidate, target, strict=True):
        if isinstance(c, LowRankRows):
            # Clamped above 0: sqrt's gradient at an exact match would be infinite.
            total = total + c.squared_distance(t, rows).clamp_min(1e-30).sqrt().to(total.dtype)
            continue
        c, t = _flat(c, t, rows)
        total = total + torch.linalg.vector_norm(c - t, dim=-1)
    return total


# The distances that measure a factored Linear weight without forming it.
_FACTORED_DISTANCES = (l2_distance, cosine_distance, layer_l2_distance)

DISTANCES = {
    "l2": l2_distance,
    "cosine": cosine_distance,
    "layer-l2": layer_l2_distance,
    "l1": l1_distance,
}


def total_variation(images: torch.Tensor) -> torch.Tensor:
    """Anisotropic TV: mean absolute difference of horizontal plus vertical neighbours.

    The form used by Inverting Gradients (inversefed ``TV``). Over a batch B x C x H x W, or
    one value per restart over R x B x C x H x W.
    """
    batch = (-4, -3, -2, -1)
    dx = torch.mean(torch.abs(images[..., :, :-1] - images[..., :, 1:]), dim=batch)
    dy = torch.mean(torch.abs(images[..., :-1, :] - images[..., 1:, :]), dim=batch)
    return dx + dy


def matched_parameters(
    observation: Observation, knowledge: AttackerKnowledge, model: nn.Module | None = None
) -> dict[str, torch.Tensor]:
    """The attacker's trainable parameters (of ``model``, by default the server's copy),
    checked to be those the observation holds."""
    if model is None:
        parameters = knowledge.parameters()
    else:
        names = set(observation.parameter_names)
        parameters = {n: p for n, p in model.named_parameters() if n in names}
    if tuple(parameters) != observation.parameter_names:
        raise ValueError("observation does not match the attacker's model parameters")
    return parameters


class UnknownRows:
    """An adaptive attacker's fitted unknowns (the model parameters a defense hides: FedKL's
    lock) for starts that advance together: one leaf per unknown with a row per start, each
    started at the attacker's guess. ``UpdateMatcher.together`` runs each row's candidate
    through the model with its own row of them, so each start fits its own, as alone."""

    def __init__(self, names: Sequence[str], starts: Sequence[torch.Tensor], count: int):
        self.names = tuple(names)
        self.leaves = tuple(
            s.detach().unsqueeze(0).repeat(count, *([1] * s.dim())).requires_grad_(True)
            for s in starts
        )

    def rows(self, take: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
        """The running starts' rows by parameter name; ``take`` picks a leaf's rows."""
        return {name: take(leaf) for name, leaf in zip(self.names, self.leaves, strict=True)}

    def row(self, start: int) -> dict[str, torch.Tensor]:
        """One start's own, by parameter name (``UpdateMatcher.__call__``: a start that
        runs alone, through plain autograd)."""
        return self.rows(lambda leaf: leaf[start])


def traced_inputs(
    rest: Sequence[torch.Tensor], logits: bool, names: Sequence[str]
) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor] | None]:
    """A traced objective's inputs after the rows' images, in their order: the rows' label
    logits (where fitted), then their rows of the unknowns named ``names`` (None without)."""
    count = 1 if logits else 0
    own = rest[count:]
    return tuple(rest[:count]), (dict(zip(names, own, strict=True)) if names else None)


def unknown_rows(matcher, count: int, *, alone_too: bool = False) -> UnknownRows | None:
    """A row of unknowns per start where ``count`` starts of ``matcher`` advance together
    and its defense hides parameters to fit (None: there are none, or one start fits the
    model's own, :meth:`ThroughDefense.restart`). ``alone_too``: a row for one start as
    well, for a traced step, which differentiates its inputs, not the model's own."""
    if not matcher.unknowns or (count < 2 and not alone_too):
        return None
    return matcher.unknown_rows(count)


class ThroughDefense:
    """An adaptive attacker's view through the defense it knows (``KnownDefense``), on
    updates read as gradients: the candidate's update goes through the defense's
    deterministic part (in the client's own units: gradient or weight difference), and
    candidate and target are compared on the coordinates the defense left intact. With no
    known defense (the plain attacker) both are the identity."""

    def __init__(self, knowledge: AttackerKnowledge) -> None:
        self.known: KnownDefense | None = knowledge.defense
        device = knowledge.device
        known = self.known
        self.mask = (
            None if known is None or known.mask is None else [m.to(device) for m in known.mask]
        )
        self.factor = difference_per_gradient(knowledge.protocol, knowledge.batch_size)
        # The model the candidate runs through: the server's copy, or, where the defense
        # hides some of its parameters (FedKL's lock), a copy of its own with those free.
        self.model = knowledge.model
        self.unknowns: tuple[torch.Tensor, ...] = ()
        if known is not None and known.unknowns is not None:
            self.model = copy.deepcopy(knowledge.model)
            self.unknowns = tuple(known.unknowns(self.model))
        named = {id(p): n for n, p in self.model.named_parameters()}
        self.unknown_names = tuple(named[id(u)] for u in self.unknowns)
        self._start = tuple(u.detach().clone() for u in self.unknowns)

    def restart(self) -> None:
        """The unknown parameters back at the attacker's first guess, for a new restart."""
        with torch.no_grad():
            for unknown, start in zip(self.unknowns, self._start, strict=True):
                unknown.copy_(start)

    def unknown_rows(self, count: int) -> UnknownRows:
        """The unknowns for ``count`` starts that advance together, each row at the
        attacker's first guess."""
        return UnknownRows(self.unknown_names, self._start, count)

    def candidate(self, gradient: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The candidate's update as the defense would release it, then masked."""
        known = self.known
        if known is not None and known.transform is not None:
            released = known.transform(tuple(g * self.factor for g in gradient))
            gradient = tuple(r / self.factor for r in released)
        return self.masked(gradient)

    def masked(self, tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if self.mask is None:
            return tuple(tensors)
        return tuple(t * m for t, m in zip(tensors, self.mask, strict=True))

    def distance(self, own: str) -> str:
        """The distance to use: the known noise's likelihood as a plain distance, where it is
        one (for an attack that weighs no image prior: its maximum-likelihood twin)."""
        known = self.known
        return own if known is None or known.distance is None else known.distance

    @property
    def noise(self) -> Likelihood | None:
        return None if self.known is None else self.known.noise

    @property
    def leaves_update(self) -> bool:
        """Whether the candidate's update reaches the distance as the client computed it:
        no known defense's transform or mask (the parameters a defense hides, FedKL's lock,
        change the model the candidate runs through, not its update)."""
        known = self.known
        return known is None or (known.transform is None and self.mask is None)

    def measure(
        self, own: str
    ) -> Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], torch.Tensor]:
        """The posterior-mode attacker's data term: the release's negative log-likelihood in
        nats where the defense draws at random, else the attack's own distance."""
        noise = self.noise
        if noise is None:
            return DISTANCES[own]
        unit = self.factor
        return lambda candidate, target: noise.nll(candidate, target, unit)

    def prior(self, images: torch.Tensor, pixel_std: float) -> torch.Tensor | float:
        """The image prior's negative log density in nats, weighed against the likelihood
        (0 where there is no noise to weigh it against: the plain attack's objective)."""
        if self.noise is None:
            return 0.0
        return image_prior_nats(images, pixel_std)


class UpdateMatcher:
    """Simulates the client on candidate data and measures the distance to the observation.

    Both updates are read as a gradient of the batch loss (``read_as_gradient``): for FedAvg
    the weight change (or the new weights minus the server's) over -(lr x local steps). The
    objective is then at a gradient's scale whatever the local learning rate, which the
    absolute tolerances of L-BFGS need, and the cosine compares weight changes, never whole
    weight vectors (Geiping et al. 2020 compare updates, Sec. 5). An adaptive attacker
    (``knowledge.defense``) matches through the defense (:class:`ThroughDefense`).
    """

    def __init__(
        self,
        observation: Observation,
        knowledge: AttackerKnowledge,
        distance: str,
        *,
        weighs_prior: bool = True,
    ) -> None:
        self.knowledge = knowledge
        # Whether the posterior-mode twin adds the image prior (an attack whose own
        # parametrisation is its prior, GRNN's generator, takes the likelihood alone).
        self.weighs_prior = weighs_prior
        self.view = ThroughDefense(knowledge)
        self.parameters = matched_parameters(observation, knowledge, self.view.model)
        # What the attack fits besides its images (empty unless the defense hides some).
        self.unknowns = self.view.unknowns
        device = knowledge.device
        observed = tuple(t.to(device) for t in observation.tensors)
        self.target = self.view.masked(
            read_as_gradient(observed, self.parameters, knowledge.protocol, knowledge.batch_size)
        )
        # The attack's distance, or, through a noisy defense, the release's likelihood; with
        # it the image prior weighed in the same nats (zero for the plain attacker).
        self.distance = self.view.measure(distance)
        self._layers: FactoredLayers | None = None  # found at the first stacked call
        # Whether a Linear weight's update may stay factored; a traced step forms it densely
        # (the factors are read through a forward hook, which a trace cannot register).
        self.factored = True
        self.pixel_std = sum(knowledge.normalization.std) / len(knowledge.normalization.std)

    def simulate(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        unknowns: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """The candidate batch's update, read as the target is read (differentiable);
        ``unknowns``: one start's row of the fitted unknowns, for the model's own."""
        simulated = client_update(
            self.view.model,
            self.parameters,
            images,
            labels,
            self.knowledge.protocol,
            differentiable=True,
            replaced=unknowns,
        )
        return self.view.candidate(
            read_as_gradient(simulated, self.parameters, self.knowledge.protocol, images.shape[0])
        )

    def __call__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        unknowns: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        simulated = self.simulate(images, labels, unknowns)
        return self.distance(simulated, self.target) + self.prior(images)

    def prior(self, images: torch.Tensor) -> torch.Tensor | float:
        """The image prior the posterior-mode twin weighs (0 for the plain attacker); images
        B x C x H x W, or R x B x C x H x W for one value per restart."""
        if not self.weighs_prior:
            return 0.0
        return self.view.prior(images, self.pixel_std)

    def restart(self) -> None:
        """A new restart starts the unknown parameters from the attacker's first guess."""
        self.view.restart()

    def unknown_rows(self, count: int) -> UnknownRows:
        """The unknowns for ``count`` starts that advance together, each row at the
        attacker's first guess (:func:`unknown_rows`)."""
        return self.view.unknown_rows(count)

    def together(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        distance=None,
        unknowns: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The distance of each of R restarts at once: ``images`` is R x B x C x H x W,
        ``labels`` R x B (x classes) or B (shared). Each slice's value is exactly what
        :meth:`__call__` gives it alone (its own BatchNorm statistics), up to float summation
        order; the R updates are computed by ``torch.func.vmap`` in one batched pass.
        ``distance`` replaces the matcher's own (GRNN's summed squares) for the plain
        attacker; through a noisy defense the release's likelihood stands. ``unknowns``: the
        rows' own fitted unknowns (``UnknownRows.rows``), where the defense hides some."""
        return self.measured(self.stacked_updates(images, labels, unknowns), images, distance)

    def stacked_updates(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        unknowns: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor | LowRankRows, ...]:
        """The R candidates' updates (``images`` R x B x C x H x W), stacked along a leading
        dimension, by one ``torch.func.vmap`` pass (:meth:`together`'s first half). Where the
        plain attacker matches a FedSGD gradient, a Linear weight's entry is its factors
        (``low_rank.LowRankRows``: the distances need never form it)."""
        return self.recorded_updates(images, labels, None, unknowns)[0]

    def recorded_updates(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        recording: Recording | None,
        unknowns: dict[str, torch.Tensor] | None = None,
    ) -> tuple[tuple[torch.Tensor | LowRankRows, ...], Any]:
        """:meth:`stacked_updates`, and what ``recording`` saw in each row's forward of its
        first local step, stacked by row (``client.update.recorded_client_update``): one
        pass for both, where a second forward would cost another pass through the model."""
        buffers = restart_buffers(self.view.model, images.shape[0])
        if unknowns:  # each row's own, in place of the model's (a buffer of the vmapped call)
            buffers = {**buffers, **unknowns}
        label_dim = 0 if labels.dim() > (1 if labels.dtype == torch.long else 2) else None
        layers = self._factored_layers(images)
        if layers is not None:
            return self._stacked_factored(layers, images, labels, label_dim, buffers, recording)
        protocol = self.knowledge.protocol

        def update_of(x: torch.Tensor, y: torch.Tensor, own: dict):
            simulated, seen = recorded_client_update(
                self.view.model,
                self.parameters,
                x,
                y,
                protocol,
                differentiable=True,
                buffers=own,
                recording=recording,
            )
            gradient = read_as_gradient(simulated, self.parameters, protocol, x.shape[0])
            return self.view.candidate(gradient), seen

        return torch.func.vmap(update_of, in_dims=(0, label_dim, 0))(images, labels, buffers)

    def _factored_layers(self, images: torch.Tensor) -> FactoredLayers | None:
        """The Linear layers to keep factored (found once), or None: only FedSGD's gradient
        is a sum of outer products, and only the attack's own distances measure factors (no
        defense's transform, mask or likelihood; a FedKL twin's, which fits the hidden lock
        as a row of each start's own, measures its updates as the plain attacker does)."""
        if not self.factored:
            return None
        if self.knowledge.protocol.algorithm != "fedsgd" or not self.view.leaves_update:
            return None
        if self.distance not in _FACTORED_DISTANCES:
            return None
        if self._layers is None:
            self._layers = factored_layers(self.view.model, self.parameters, images[0])
        return self._layers if self._layers.modules else None

    def _stacked_factored(
        self,
        layers: FactoredLayers,
        images: torch.Tensor,
        labels: torch.Tensor,
        label_dim: int | None,
        buffers: dict[str, torch.Tensor],
        recording: Recording | None,
    ) -> tuple[tuple[torch.Tensor | LowRankRows, ...], Any]:
        train = self.knowledge.protocol.batchnorm_mode == "train"
        model, parameters = self.view.model, self.parameters

        def update_of(x: torch.Tensor, y: torch.Tensor, own: dict):
            return fedsgd_factored(model, parameters, layers, x, y, own, train, recording)

        free, left, right, seen = torch.func.vmap(update_of, in_dims=(0, label_dim, 0))(
            images, labels, buffers
        )
        factors = {
            n: LowRankRows(a, b) for n, a, b in zip(layers.modules, left, right, strict=True)
        }
        rest = iter(free)
        return tuple(factors[n] if n in factors else next(rest) for n in parameters), seen

    def measured(
        self, updates: Sequence[torch.Tensor], images: torch.Tensor, distance=None
    ) -> torch.Tensor:
        """Each of R stacked updates' distance to this matcher's target, plus the prior
        (:meth:`together`'s second half)."""
        measure = self.distance if distance is None or self.view.noise else distance
        if measure not in _FACTORED_DISTANCES:
            updates = dense(updates)
        # The distance outside the vmap, on the R stacked updates: its inner products are
        # then matrix-vector products, not vmap's batched torch.dot (see _inner).
        return measure(updates, self.target) + self.prior(images)

    def at(self, rows: Sequence[int]) -> UpdateMatcher:
        """The matcher of these rows (starts): this one, whose target every row matches
        (``attacks.updates.UpdatesMatcher`` gives each row its own update's)."""
        return self


def restart_buffers(model: nn.Module, restarts: int) -> dict[str, torch.Tensor]:
    """Each restart's own copy of the model's buffers, stacked for ``vmap`` (BatchNorm in
    train mode updates them, and restarts must not share its statistics)."""
    return {
        name: b.detach().unsqueeze(0).repeat(restarts, *([1] * b.dim()))
        for name, b in model.named_buffers()
    }


def why_not_together(knowledge: AttackerKnowledge) -> str | None:
    """Why restarts cannot advance together through ``UpdateMatcher.together`` (None: they
    can). A known defense's transform of the update (clipping, DP's clip, deterministic
    quantisation: ``ThroughDefense.candidate``) runs inside the batched pass, each row's
    update transformed as it would be alone (``tests/test_loop.py``); the parameters a
    defense hides (FedKL's lock) are fitted as each row's own (:class:`UnknownRows`)."""
    known = knowledge.defense
    if isinstance(knowledge.model, torch.jit.ScriptModule):
        return "a TorchScript model refuses torch.func's batched calls"
    if known is not None and known.noise is not None and not known.noise.stacked:
        return f"{known.name}'s release likelihood is taken one restart at a time"
    # BatchNorm layers on batch statistics batch exactly: under torch.func they normalise by
    # composite operations (client.exact_batchnorm). An exported program's are graph calls.
    if fused_batch_statistics(knowledge.model):
        return (
            "the exported program normalises by batch statistics in torch's fused batch_norm, "
            "whose second derivative torch.func does not take exactly"
        )
    return None


def fused_batch_statistics(model: nn.Module) -> bool:
    """Whether a ``torch.export`` program (its graph fixed at export, in the mode it was
    exported in) calls a fused batch_norm on batch statistics (a training flag set)."""
    for module in model.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            calls = node.op == "call_function" and "batch_norm" in str(node.target)
            if calls and any(arg is True for arg in (*node.args, *node.kwargs.values())):
                return True
    return False


def random_images(knowledge: AttackerKnowledge, generator: torch.Generator) -> torch.Tensor:
    """Standard-normal images in model space, drawn on the CPU so seeds agree across devices."""
    shape = (knowledge.batch_size, *knowledge.input_shape)
    return torch.randn(shape, generator=generator).to(knowledge.device)


def random_label_logits(knowledge: AttackerKnowledge, generator: torch.Generator) -> torch.Tensor:
    shape = (knowledge.batch_size, knowledge.num_classes)
    return torch.randn(shape, generator=generator).to(knowledge.device)
