"""Gradient pruning (Zhu et al. 2019, Sec. 5.2): zero the smallest-magnitude entries.

``ratio`` is the fraction of entries set to zero. ``scope="layer"`` (default) prunes each
parameter tensor at its own quantile, as GradAttack's GradPrune does; ``scope="global"``
uses one threshold over the whole update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from auditlib.config import check_ranges, param
from auditlib.defenses.base import DefenseInfo, register, visible_survivors
from auditlib.threat import KnownDefense


@dataclass(frozen=True)
class PruningConfig:
    ratio: float = param(
        0.9,
        "fraction of the update's entries set to zero, the smallest in magnitude",
        low=0,
        high=1,
        high_open=True,
    )
    scope: Literal["layer", "global"] = param(
        "layer",
        "prune each parameter tensor at its own quantile (GradAttack), or the whole update "
        "at one threshold",
    )

    def __post_init__(self) -> None:
        check_ranges(self)


def _keep_count(numel: int, ratio: float) -> int:
    return numel - int(ratio * numel + 0.5)  # half-up rounding of the zeroed count


def prune_smallest(flat: torch.Tensor, ratio: float) -> torch.Tensor:
    """``flat`` with its round(ratio * n) smallest-magnitude entries set to zero."""
    keep = _keep_count(flat.numel(), ratio)
    if keep >= flat.numel():
        return flat.clone()
    mask = torch.zeros_like(flat, dtype=torch.bool)
    if keep > 0:
        # topk keeps exactly `keep` entries even when magnitudes tie (a quantile would not).
        mask[torch.topk(flat.abs(), keep, sorted=False).indices] = True
    return torch.where(mask, flat, torch.zeros_like(flat))


class GradientPruning:
    def __init__(self, config: PruningConfig) -> None:
        self.config = config

    def apply(self, update, generator, context=None):
        if self.config.scope == "layer":
            return tuple(
                prune_smallest(t.reshape(-1), self.config.ratio).view_as(t) for t in update
            )
        flat = prune_smallest(torch.cat([t.reshape(-1) for t in update]), self.config.ratio)
        pieces = torch.split(flat, [t.numel() for t in update])
        return tuple(p.view_as(t) for p, t in zip(pieces, update, strict=True))

    def known_to_attacker(self, observation, weights):
        return KnownDefense(
            "prune",
            "knows the update was pruned: compares only the coordinates that survived (the "
            "pruned ones are visible as exact zeros), on its candidate's update as on the "
            "observed one (Huang et al., NeurIPS 2021)",
            mask=visible_survivors(observation),
        )

    def privacy_report(self) -> dict[str, Any]:
        return {
            "epsilon": None,
            "epsilon_unavailable_reason": "pruning gives no formal DP guarantee",
        }


register(
    DefenseInfo(
        "prune",
        "Zero the smallest `ratio` fraction of update entries by magnitude (per layer or global).",
        PruningConfig,
        GradientPruning,
        strength="ratio",
    )
)
