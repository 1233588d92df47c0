"""DLM's and DLM+'s objective (``dlm.py``): the dummy batch's descent at the global weights
against the observed one, scaled by the tuning factor gamma (DLM) or normalised (DLM+), for
one start or several together (one ``torch.func.vmap`` pass, a gamma each)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from auditlib.attacks.objectives import (
    DISTANCES,
    ThroughDefense,
    restart_buffers,
)
from auditlib.client.update import client_update
from auditlib.errors import AttackUnsupportedError
from auditlib.threat import AttackerKnowledge, Observation

Tensors = tuple[torch.Tensor, ...]


def update_scale(tensors: Sequence[torch.Tensor], norm: str, starts: bool = False) -> torch.Tensor:
    """The scalar DLM+ divides a whole update by (Eq. 8, or the public code's layer mean);
    with ``starts``, one per start of updates stacked along a leading dimension."""
    if starts:  # R stacked updates: one scale per start, over all but the first dimension
        if norm == "frobenius":
            return torch.sqrt(sum(t.reshape(t.shape[0], -1).pow(2).sum(-1) for t in tensors))
        norms = [torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=-1) for t in tensors]
        return torch.stack(norms).mean(0)
    if norm == "frobenius":
        return torch.sqrt(sum(t.pow(2).sum() for t in tensors))
    return torch.stack([torch.linalg.vector_norm(t) for t in tensors]).mean()


def per_start(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """One value per start, shaped to multiply ``like`` (stacked along its first dimension)."""
    return values.reshape(-1, *([1] * (like.dim() - 1)))


def normalised(tensors: Sequence[torch.Tensor], norm: str, starts: bool = False) -> Tensors:
    scale = update_scale(tensors, norm, starts) + 1e-12
    if starts:
        return tuple(t / per_start(scale, t) for t in tensors)
    return tuple(t / scale for t in tensors)


def observed_descent(observation: Observation, knowledge: AttackerKnowledge) -> Tensors:
    """W - W' from the observation: alpha times the client's (summed) gradient.

    No learning rate is divided out: DLM learns its scale, DLM+ normalises it away. A FedSGD
    gradient is the descent of one step with alpha = 1.
    """
    parameters = knowledge.parameters()
    if tuple(parameters) != observation.parameter_names:
        raise AttackUnsupportedError(
            "the observation's parameters do not match the server's model parameters"
        )
    device = knowledge.device
    tensors = tuple(t.detach().to(device) for t in observation.tensors)
    if observation.kind == "gradient":
        return tensors
    if observation.kind == "weight_delta":
        return tuple(-t for t in tensors)
    if observation.kind == "weights":
        return tuple(p.detach() - t for p, t in zip(parameters.values(), tensors, strict=True))
    raise AttackUnsupportedError(
        f"DLM reads gradients, weight differences or weights, not {observation.kind!r}"
    )


class ModelLeakageObjective:
    """DLM's or DLM+'s distance between the dummy batch's descent and the observed one."""

    # What it fits besides its images: nothing a defense hides (DLM does not adapt to it).
    unknowns: tuple[torch.Tensor, ...] = ()

    def __init__(
        self,
        observation: Observation,
        knowledge: AttackerKnowledge,
        config: Any,  # dlm.py's DlmConfig, or DlmPlusConfig (the one with a ``norm``)
    ) -> None:
        self.knowledge = knowledge
        self.parameters = knowledge.parameters()
        self.plus = hasattr(config, "norm")  # DLM+ normalises both sides (Eq. 8)
        self.norm = config.norm if self.plus else "frobenius"
        self.gamma_on = "update" if self.plus else config.gamma_on
        self.simulate = config.simulate
        protocol = knowledge.protocol
        if config.simulate == "client" and protocol.observation_kind != observation.kind:
            raise AttackUnsupportedError(
                f"simulate=client needs the protocol's observation ({protocol.observation_kind}) "
                f"to match the one received ({observation.kind})"
            )
        # The paper's dummy gradient: one gradient of the whole dummy batch at W, whatever
        # local schedule the client ran (the same client_update, in its FedSGD form).
        self.gradient_protocol = dataclasses.replace(protocol, algorithm="fedsgd")
        # An adaptive attacker compares only what the defense left (its visible survivors)
        # and with the defense's noise likelihood; the identity for the plain attacker.
        self.view = ThroughDefense(knowledge)
        self.metric = DISTANCES[self.view.distance("l2")]
        target = self.view.masked(observed_descent(observation, knowledge))
        if not float(update_scale(target, "frobenius")) > 0:
            raise AttackUnsupportedError("the observed update is zero; there is nothing to match")
        self.target = normalised(target, self.norm) if self.plus else target
        self.gamma_nominal = self._nominal_gamma()
        self.nominal_target = tuple(t * self.gamma_nominal for t in self.target)
        self.zeros = tuple(torch.zeros_like(t) for t in self.target)

    def _nominal_gamma(self) -> float:
        protocol = self.knowledge.protocol
        if protocol.algorithm == "fedsgd":
            return 1.0
        steps = 1 if self.simulate == "client" else protocol.steps_for(self.knowledge.batch_size)
        return 1.0 / (protocol.local_lr * steps)

    def nominal_gamma(self) -> float:
        """gamma that makes gamma * (W - W') the dummy descent if the nominal lr were true."""
        return self.gamma_nominal

    def dummy_descent(
        self, images: torch.Tensor, labels: torch.Tensor, buffers: dict | None = None
    ) -> Tensors:
        """The dummy batch's gradient at W (paper), or its unrolled descent / nominal lr.
        ``buffers``: the model's buffers of one start (under ``torch.func.vmap``)."""
        protocol = self.knowledge.protocol
        if self.simulate == "gradient" or protocol.algorithm == "fedsgd":
            return client_update(
                self.knowledge.model,
                self.parameters,
                images,
                labels,
                self.gradient_protocol,
                differentiable=True,
                buffers=buffers,
            )
        update = client_update(
            self.knowledge.model,
            self.parameters,
            images,
            labels,
            protocol,
            differentiable=True,
            buffers=buffers,
        )
        if protocol.shared == "weights":
            update = tuple(w - p for w, p in zip(update, self.parameters.values(), strict=True))
        # Divided by the nominal lr so that gamma keeps the paper's meaning (1 / alpha).
        return tuple(-d / protocol.local_lr for d in update)

    def distance(
        self, descent: Sequence[torch.Tensor], gamma: torch.Tensor | None, starts: bool = False
    ) -> torch.Tensor:
        """The distance of one descent, or with ``starts`` of R descents stacked along a
        leading dimension (``gamma`` then one factor per start), one value per start."""
        descent = self.view.masked(descent)
        if self.plus:
            return self.metric(normalised(descent, self.norm, starts), self.target)
        if gamma is None:
            raise ValueError("DLM's distance needs the tuning factor gamma")
        if self.gamma_on == "dummy":
            # Both sides times the nominal gamma (a constant): the objective then has a
            # gradient's magnitude, not lr^2 times it, which L-BFGS's absolute tolerances need.
            scale = self.nominal_gamma() / gamma
            if starts:
                return self.metric(
                    tuple(d * per_start(scale, d) for d in descent), self.nominal_target
                )
            return self.metric(tuple(d * scale for d in descent), self.nominal_target)
        if starts:  # each start's own gamma * target: measured as the residual against zero
            residual = tuple(
                d - per_start(gamma, d) * t for d, t in zip(descent, self.target, strict=True)
            )
            return self.metric(residual, self.zeros)
        return self.metric(descent, tuple(gamma * t for t in self.target))

    def together(
        self, images: torch.Tensor, labels: torch.Tensor, gamma: torch.Tensor | None
    ) -> torch.Tensor:
        """The distance of each of R starts at once (``images`` R x B x C x H x W, ``labels``
        R x B x classes or B shared, ``gamma`` R or None): the R dummy descents by
        ``torch.func.vmap``, as ``UpdateMatcher.together`` computes updates, then the
        distance on them stacked. Each value is what :meth:`__call__` gives that start alone,
        up to float summation order."""
        return self.measured(self.stacked_updates(images, labels), images, gamma)

    def stacked_updates(self, images: torch.Tensor, labels: torch.Tensor) -> Tensors:
        """The R dummy descents, stacked, by one ``vmap`` pass (:meth:`together`'s first
        half; ``attacks.updates`` measures each update's rows against its own target)."""
        buffers = restart_buffers(self.knowledge.model, images.shape[0])
        label_dim = 0 if labels.dim() > (1 if labels.dtype == torch.long else 2) else None
        return torch.func.vmap(self.dummy_descent, in_dims=(0, label_dim, 0))(
            images, labels, buffers
        )

    def measured(
        self, descents: Sequence[torch.Tensor], images: torch.Tensor, gamma: torch.Tensor | None
    ) -> torch.Tensor:
        """Each of R stacked descents' distance to this objective's target (``images`` is
        unused: DLM weighs no image prior)."""
        return self.distance(descents, gamma, starts=True)

    def at(self, rows: Sequence[int]) -> ModelLeakageObjective:
        """The objective of these rows (starts): this one (see ``UpdateMatcher.at``)."""
        return self

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, gamma: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.distance(self.dummy_descent(images, labels), gamma)


# --- Labels --------------------------------------------------------------------------------
