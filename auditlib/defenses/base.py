"""Defense contract and registry.

A defense transforms the update before it leaves the client. Each one declares its
parameters as a frozen dataclass (validated on construction) and reports what it can say
about privacy (for DP: epsilon, or why epsilon is unavailable).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from auditlib.config import build_config, config_dict
from auditlib.errors import AuditInputError


class Defense(Protocol):
    def apply(
        self, update: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> tuple[torch.Tensor, ...]:
        """Return the defended update (new tensors; the input is not modified)."""
        ...

    def privacy_report(self) -> dict[str, Any]:
        """What the defense guarantees, e.g. {"epsilon": 2.3, "delta": 1e-5}."""
        ...


@dataclass(frozen=True)
class DefenseInfo:
    name: str
    summary: str
    config_type: type
    factory: Callable[[Any], Defense]


DEFENSES: dict[str, DefenseInfo] = {}


def register(info: DefenseInfo) -> None:
    DEFENSES[info.name] = info


def build_defense(name: str, params: Mapping[str, Any] | None = None) -> tuple[Defense, dict]:
    """The defense registered as ``name`` with ``params``; also its effective settings."""
    info = DEFENSES.get(name)
    if info is None:
        raise AuditInputError(f"unknown defense {name!r}; available: {', '.join(sorted(DEFENSES))}")
    config = build_config(info.config_type, params, f"defense {name}")
    return info.factory(config), config_dict(config)


def global_norm(update: tuple[torch.Tensor, ...], order: float = 2.0) -> torch.Tensor:
    """Norm of the whole update seen as one flat vector."""
    return torch.linalg.vector_norm(torch.cat([t.reshape(-1) for t in update]), ord=order)


def clip_update(update: tuple[torch.Tensor, ...], bound: float, order: float = 2.0):
    """Scale the whole update down so its ``order``-norm is at most ``bound``."""
    norm = global_norm(update, order)
    factor = torch.clamp(bound / (norm + 1e-12), max=1.0)
    return tuple(t * factor for t in update)


@dataclass(frozen=True)
class NoDefenseConfig:
    pass


class NoDefense:
    def __init__(self, config: NoDefenseConfig) -> None:
        self.config = config

    def apply(self, update, generator):
        return tuple(t.clone() for t in update)

    def privacy_report(self) -> dict[str, Any]:
        return {}


register(
    DefenseInfo(
        "none", "No defense: the update leaves the client as computed.", NoDefenseConfig, NoDefense
    )
)
