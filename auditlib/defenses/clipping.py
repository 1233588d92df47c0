"""Gradient clipping ("GC", the baseline of the Shadow-defense paper, Table 3).

``mode="norm"`` (default) scales the whole update down to an L2 norm of at most ``bound``
(bound 4, the setting of GGL and Censor that the Shadow digest anchors on); ``mode="value"``
clamps every entry to [-bound, bound] instead, the other reading of "clip the largest
gradients to a threshold". Clipping alone adds no noise, so it gives no DP guarantee.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from auditlib.config import check_ranges, param
from auditlib.defenses.base import DefenseInfo, clip_update, register
from auditlib.threat import KnownDefense


@dataclass(frozen=True)
class ClippingConfig:
    bound: float = param(
        4.0,
        "the bound: the update's L2 norm (norm) or each entry's magnitude (value)",
        low=0,
        low_open=True,
        high=1e6,
    )
    mode: Literal["norm", "value"] = param(
        "norm",
        "scale the whole update down to L2 norm bound, or clamp every entry to [-bound, bound]",
    )

    def __post_init__(self) -> None:
        check_ranges(self)


class GradientClipping:
    def __init__(self, config: ClippingConfig) -> None:
        self.config = config

    def apply(self, update, generator, context=None):
        if self.config.mode == "norm":
            return clip_update(update, self.config.bound, 2.0)
        return tuple(torch.clamp(t, -self.config.bound, self.config.bound) for t in update)

    def known_to_attacker(self, observation, weights):
        c = self.config
        how = "its whole-update L2 norm" if c.mode == "norm" else "each entry"
        return KnownDefense(
            "clip",
            f"knows the update was clipped ({how} to {c.bound:g}): clips its candidate's "
            "update the same way before comparing",
            transform=lambda update: self.apply(update, None),
            rescales=c.mode == "norm",
        )

    def privacy_report(self) -> dict[str, Any]:
        return {
            "epsilon": None,
            "epsilon_unavailable_reason": "clipping bounds the update but adds no noise: no "
            "DP guarantee (combine with dp-gaussian clip=C for one)",
        }


register(
    DefenseInfo(
        "clip",
        "Clip the update: whole-update L2 norm to `bound` (mode norm) or each entry to "
        "[-bound, bound] (mode value).",
        ClippingConfig,
        GradientClipping,
        strength="bound",
    )
)
