"""The two defenses of the DLM paper (Sec. 5.4), which act on the uploaded model weights.

``dlm-dp``: after local training, each layer W_l of the new weights is clipped to an L2
norm of at most C (Eq. 12; no clipping when ``clip`` is None, the paper gives no C), then
noise of variance ``variance`` is added to every entry (Eq. 13, Gaussian or Laplacian; the
paper's sweep is 1e-1 to 1e-5 and it recommends 1e-4) and the sum is divided by the group
size L (1 by default: one client). Eq. 13 writes the variance as sigma^2 C^2; it is given
directly here so the knob is the quantity the paper's figures sweep.

``dlm-sparsify``: the weights whose magnitude is below the ``ratio`` quantile of the whole
model's weights are set to zero (the paper sweeps 0-60 % and recommends more than 50 % for
its MLP; on LeNet even 1 % stops DLM+).

Both act on weights, so they need a protocol under which the client trains locally (FedAvg);
the update handed back is the defended weights minus the weights the server sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from auditlib.config import check_ranges, param
from auditlib.defenses.base import (
    ClientContext,
    DefenseInfo,
    copied,
    register,
    require_context,
    visible_survivors,
)
from auditlib.defenses.dp_noise import noise_like
from auditlib.errors import AuditInputError
from auditlib.likelihoods import GaussianLikelihood, LaplaceLikelihood
from auditlib.threat import KnownDefense


def _weights(update, context: ClientContext | None, name: str) -> tuple[torch.Tensor, ...]:
    context = require_context(context, name)
    if context.protocol.algorithm != "fedavg":
        raise AuditInputError(
            f"defense {name} acts on the weights a client uploads after local training; "
            "choose the FedAvg protocol"
        )
    return tuple(p + d for p, d in zip(context.parameters.values(), update, strict=True))


def _as_update(weights, context: ClientContext) -> tuple[torch.Tensor, ...]:
    return tuple(w - p for w, p in zip(weights, context.parameters.values(), strict=True))


@dataclass(frozen=True)
class WeightNoiseConfig:
    variance: float = param(
        1e-4,
        "variance of the noise added to every weight (paper: 1e-1 to 1e-5, 1e-4 recommended)",
        low=0,
        high=1e3,
    )
    noise: Literal["gaussian", "laplace"] = param(
        "gaussian", "distribution of the noise (Eq. 13): Gaussian or Laplacian"
    )
    clip: float | None = param(
        None,
        "L2 norm each layer's weights are clipped to before the noise (Eq. 12); empty: no clip "
        "(the paper gives no C)",
        low=0,
        low_open=True,
    )
    group_size: int = param(
        1, "L, the noised weights are divided by it (1: one client)", low=1, high=10_000
    )

    def __post_init__(self) -> None:
        check_ranges(self)


class WeightNoise:
    def __init__(self, config: WeightNoiseConfig) -> None:
        self.config = config

    def apply(self, update, generator, context=None):
        c = self.config
        weights = _weights(update, context, "dlm-dp")
        out = []
        for w in weights:
            if c.clip is not None:  # Eq. 12: W / max(1, ||W||_2 / C), per layer
                w = w / max(1.0, float(torch.linalg.vector_norm(w)) / c.clip)
            # Laplace(0, b) has variance 2 b^2.
            scale = math.sqrt(c.variance if c.noise == "gaussian" else c.variance / 2)
            draw = noise_like(w, generator, c.noise, scale)
            out.append((w + draw) / c.group_size)
        return _as_update(out, require_context(context, "dlm-dp"))

    def known_to_attacker(self, observation, weights):
        c = self.config
        # The noise on each weight, divided by the group size as the weights are.
        std = math.sqrt(c.variance) / c.group_size
        noise = (
            GaussianLikelihood(std)
            if c.noise == "gaussian"
            else LaplaceLikelihood(std / math.sqrt(2))
        )
        if std == 0:  # no noise to weigh: knowing it changes nothing
            return KnownDefense("dlm-dp", "knows no noise was added (variance 0)")
        return KnownDefense(
            "dlm-dp",
            f"knows {noise.describe()} was added to the uploaded weights: minimises its "
            "negative log-likelihood (plus the image prior it weighs, for an attack that has "
            "one); the per-layer clip is not modelled",
            noise=noise,
        )

    def privacy_report(self) -> dict[str, Any]:
        return {
            "epsilon": None,
            "epsilon_unavailable_reason": "the DLM paper adds noise to the weights themselves "
            "with no bound on one client's contribution to them and no accountant; use "
            "dp-gaussian with clip=C for an (epsilon, delta) guarantee",
            "noise_std": math.sqrt(self.config.variance),
        }


@dataclass(frozen=True)
class WeightSparsityConfig:
    ratio: float = param(
        0.5,
        "fraction of the model's weights set to zero, the smallest in magnitude over the whole "
        "model (paper: 0-60 %)",
        low=0,
        high=1,
        high_open=True,
    )

    def __post_init__(self) -> None:
        check_ranges(self)


class WeightSparsification:
    def __init__(self, config: WeightSparsityConfig) -> None:
        self.config = config

    def apply(self, update, generator, context=None):
        weights = _weights(update, context, "dlm-sparsify")
        flat = torch.cat([w.reshape(-1) for w in weights])
        zeroed = int(self.config.ratio * flat.numel() + 0.5)
        if zeroed == 0:
            return copied(update)
        # Exactly `zeroed` weights, the smallest in magnitude (topk is exact where ties are).
        mask = torch.ones_like(flat, dtype=torch.bool)
        mask[torch.topk(flat.abs(), zeroed, largest=False, sorted=False).indices] = False
        kept = torch.where(mask, flat, torch.zeros_like(flat))
        pieces = torch.split(kept, [w.numel() for w in weights])
        sparse = tuple(p.view_as(w) for p, w in zip(pieces, weights, strict=True))
        return _as_update(sparse, require_context(context, "dlm-sparsify"))

    def known_to_attacker(self, observation, weights):
        return KnownDefense(
            "dlm-sparsify",
            "knows the uploaded weights were sparsified: compares only the weights that "
            "survived (the zeroed ones are visible as exact zeros)",
            mask=visible_survivors(observation),
        )

    def privacy_report(self) -> dict[str, Any]:
        return {
            "epsilon": None,
            "epsilon_unavailable_reason": "sparsification gives no formal DP guarantee",
        }


register(
    DefenseInfo(
        "dlm-dp",
        "DLM paper: clip each layer of the uploaded weights (optional) and add Gaussian or "
        "Laplacian noise of the given variance to them.",
        WeightNoiseConfig,
        WeightNoise,
        strength="variance",
    )
)
register(
    DefenseInfo(
        "dlm-sparsify",
        "DLM paper: zero the `ratio` fraction of the uploaded model weights smallest in "
        "magnitude (one quantile over the whole model).",
        WeightSparsityConfig,
        WeightSparsification,
        strength="ratio",
    )
)
