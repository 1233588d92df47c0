"""Defense contract and registry.

A defense transforms the update before it leaves the client. Each one declares its
parameters as a frozen dataclass (validated on construction) and reports what it can say
about privacy (for DP: epsilon, or why epsilon is unavailable). Defenses that need more
than the update (the model, the private batch, the weights it started from: Soteria,
OUTPOST, the DLM weight defenses) read it from the :class:`ClientContext`, which holds only
what the client itself has; the server never sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from auditlib.client.protocol import ClientProtocol
from auditlib.config import build_config, config_dict
from auditlib.errors import AuditInputError
from auditlib.threat import KnownDefense, Observation


@dataclass(frozen=True, eq=False)
class ClientContext:
    """What the client holds when it defends its update.

    ``parameters`` are the weights the server sent, by name, in the order of the update's
    tensors; ``model`` is the client's module at those weights (a defense that runs it must
    leave its parameters and buffers as it found them); ``images``/``labels`` the private
    batch in model space; ``round`` counts the client's updates so far (OUTPOST decays with it).
    """

    model: nn.Module
    parameters: Mapping[str, torch.Tensor]
    images: torch.Tensor
    labels: torch.Tensor
    protocol: ClientProtocol
    round: int = 0


@dataclass(frozen=True, eq=False)
class ModelChange:
    """What a defense that changes the model (FedKL) makes of the global model.

    ``client`` is the model the client trains (with its private parts); ``server`` is the
    model the server holds, as it would hand it to an attacker: the same architecture, the
    private parts as the server can know them, frozen (``requires_grad`` off) so no attack
    expects their gradients. ``private`` names the client's parameters and buffers that
    never leave it (left out of the upload, of aggregation and of the observation).
    """

    client: nn.Module
    server: nn.Module
    private: frozenset[str]
    notes: tuple[str, ...] = ()


def model_change(
    defense: Defense, model: nn.Module, input_shape: tuple[int, int, int], seed: int
) -> ModelChange | None:
    """The defense's change to ``model`` (which it modifies in place), or None."""
    change = getattr(defense, "change_model", None)
    return None if change is None else change(model, input_shape, seed)


def require_context(context: ClientContext | None, defense: str) -> ClientContext:
    if context is None:
        raise AuditInputError(
            f"defense {defense} needs the client's model and batch (a ClientContext); it "
            "cannot act on a bare update"
        )
    return context


class Defense(Protocol):
    def apply(
        self,
        update: tuple[torch.Tensor, ...],
        generator: torch.Generator,
        context: ClientContext | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Return the defended update (new tensors; the input is not modified).

        ``update`` is the gradient (FedSGD) or the weight difference (FedAvg), whatever the
        protocol shares; a defense that acts on the weights adds ``context.parameters``.
        """
        ...

    def privacy_report(self) -> dict[str, Any]:
        """What the defense guarantees, e.g. {"epsilon": 2.3, "delta": 1e-5}."""
        ...

    # A defense may also offer ``known_to_attacker(observation, weights)`` (the weights the
    # server sent, by name) ``-> KnownDefense | None``:
    # what an adaptive attacker, who knows its mechanism and public parameters (from the
    # config, never from the instance's secrets), does about it (``auditlib.threat``).


@dataclass(frozen=True)
class DefenseInfo:
    name: str
    summary: str
    config_type: type
    factory: Callable[[Any], Defense]
    # The config field a utility-privacy sweep varies (noise scale, pruned share, bits...).
    strength: str | None = None


DEFENSES: dict[str, DefenseInfo] = {}


def register(info: DefenseInfo) -> None:
    DEFENSES[info.name] = info


def build_defense_config(name: str, params: Mapping[str, Any] | None = None):
    """Config of defense ``name`` from ``params`` (checked), and its effective settings."""
    info = DEFENSES.get(name)
    if info is None:
        raise AuditInputError(f"unknown defense {name!r}; available: {', '.join(sorted(DEFENSES))}")
    config = build_config(info.config_type, params, f"defense {name}")
    return config, config_dict(config)


def build_defense(name: str, params: Mapping[str, Any] | None = None) -> tuple[Defense, dict]:
    """The defense registered as ``name`` with ``params``; also its effective settings."""
    config, settings = build_defense_config(name, params)
    return DEFENSES[name].factory(config), settings


def copied(update: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The update unchanged, as new tensors (what a defense returns when it leaves it as is)."""
    return tuple(t.clone() for t in update)


def global_norm(update: tuple[torch.Tensor, ...], order: float = 2.0) -> torch.Tensor:
    """Norm of the whole update seen as one flat vector."""
    return torch.linalg.vector_norm(torch.cat([t.reshape(-1) for t in update]), ord=order)


def clip_update(update: tuple[torch.Tensor, ...], bound: float, order: float = 2.0):
    """Scale the whole update down so its ``order``-norm is at most ``bound``."""
    norm = global_norm(update, order)
    factor = torch.clamp(bound / (norm + 1e-12), max=1.0)
    return tuple(t * factor for t in update)


Tensors = tuple[torch.Tensor, ...]


def known_defense(
    defense: object, observation: Observation, weights: Mapping[str, torch.Tensor]
) -> KnownDefense | None:
    """The adaptive attacker's knowledge of ``defense``, given the observation and the
    weights the server sent; None where none is offered."""
    offer = getattr(defense, "known_to_attacker", None)
    return None if offer is None else offer(observation, weights)


def visible_survivors(observation: Observation) -> Tensors:
    """1.0 where the observation is not exactly zero: a pruned coordinate shows as a 0."""
    return tuple((t != 0).to(t.dtype) for t in observation.tensors)


def straight_through(function: Callable[[Tensors], Tensors]) -> Callable[[Tensors], Tensors]:
    """``function`` on a candidate's update, back-propagated as the identity (the
    straight-through estimator of Bengio et al. 2013), for a quantiser whose own derivative
    is zero almost everywhere."""

    def transform(update: Tensors) -> Tensors:
        released = function(tuple(u.detach() for u in update))
        return tuple(u + (r - u).detach() for u, r in zip(update, released, strict=True))

    return transform


@dataclass(frozen=True)
class NoDefenseConfig:
    pass


class NoDefense:
    def __init__(self, config: NoDefenseConfig) -> None:
        self.config = config

    def apply(self, update, generator, context=None):
        return copied(update)

    def privacy_report(self) -> dict[str, Any]:
        return {}


register(
    DefenseInfo(
        "none", "No defense: the update leaves the client as computed.", NoDefenseConfig, NoDefense
    )
)
