"""OUTPOST (Wang, Hugh & Li, IEEE/ACM ToN 2024), as the Plato port implements it.

With probability 1 / (1 + beta * k), k the client's update count (``ClientContext.round``),
the update is perturbed; otherwise it leaves as computed (protection decays as training
goes on, the paper's design). When perturbing:

1. risk of layer l: r_l = min(Var(W_l), 1) over the weights the server sent;
2. empirical Fisher F = g^2 per entry; the phi % of all entries with the largest F are
   the ones at risk (Plato: F above its (100 - phi)-th percentile);
3. per layer, the ``prune_base`` % of entries smallest in |g| are zeroed (Plato: below the
   layer's percentile), and N(0, (r_l * noise_base)^2) is added to the entries at risk.

Shares are exact counts (round(share * n) entries), as for ``prune``, rather than
interpolated percentiles, so ties and tiny layers behave predictably.

Departures (docs/ALGORITHMS.md): Plato perturbs the gradient of each local iteration and
averages F over per-example gradients; one released update here is one "iteration", and F
is taken from the update itself (the client has no per-example gradients under FedAvg).
Plato's ``noise()`` returns its input unchanged (a bug the digest records); the noise is
applied here as described. The digest's two readings of the noise (variance r*noise_base or
standard deviation) are resolved as standard deviation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from auditlib.config import check_ranges, param
from auditlib.defenses.base import (
    DefenseInfo,
    copied,
    register,
    require_context,
    visible_survivors,
)
from auditlib.defenses.pruning import prune_smallest
from auditlib.likelihoods import ModelledGaussian
from auditlib.threat import KnownDefense

# The entries OUTPOST leaves un-noised leave exactly; a gradient method takes that as a
# Gaussian a tenth of the smallest layer's noise wide rather than as a hard constraint.
EXACT_SHARE = 0.1


@dataclass(frozen=True)
class OutpostConfig:
    beta: float = param(
        0.125,
        "decay: the update is perturbed with probability 1 / (1 + beta k), k the client's "
        "update count",
        low=0,
    )
    phi: float = param(
        40.0,
        "percent of all entries, largest in Fisher information, that get noise",
        low=0,
        high=100,
    )
    prune_base: float = param(
        80.0,
        "percent of each layer's entries zeroed, smallest in magnitude",
        low=0,
        high=100,
        high_open=True,
    )
    noise_base: float = param(
        0.8,
        "noise standard deviation on the entries at risk, times the layer's risk min(Var(W), 1)",
        low=0,
    )

    def __post_init__(self) -> None:
        check_ranges(self)


def _largest(values: torch.Tensor, share: float) -> torch.Tensor:
    """Mask of the round(share * n) largest entries (exact where values tie)."""
    flat = values.reshape(-1)
    count = int(share * flat.numel() + 0.5)
    mask = torch.zeros_like(flat, dtype=torch.bool)
    if count:
        mask[torch.topk(flat, count, sorted=False).indices] = True
    return mask.view_as(values)


def _risk(weights: torch.Tensor) -> float:
    """OUTPOST's per-layer risk: the weights' variance, at most 1 (0 for a single value)."""
    return min(float(weights.detach().float().var()) if weights.numel() > 1 else 0.0, 1.0)


class Outpost:
    def __init__(self, config: OutpostConfig) -> None:
        self.config = config

    def perturbs(self, round: int, generator: torch.Generator) -> bool:
        probability = 1.0 / (1.0 + self.config.beta * round)
        return float(torch.rand((), generator=generator, dtype=torch.float64)) < probability

    def apply(self, update, generator, context=None):
        context = require_context(context, "outpost")
        c = self.config
        if not self.perturbs(context.round, generator):
            return copied(update)
        noisy = self.noised_entries(update)
        out = []
        for t, weights, where in zip(update, context.parameters.values(), noisy, strict=True):
            risk = _risk(weights)
            kept = prune_smallest(t.reshape(-1), c.prune_base / 100).view_as(t)
            if risk * c.noise_base > 0:
                noise = torch.randn(t.shape, generator=generator, dtype=torch.float64)
                noise = (noise * risk * c.noise_base).to(device=t.device, dtype=t.dtype)
                kept = torch.where(where.view_as(t), kept + noise, kept)
            out.append(kept)
        return tuple(out)

    def known_to_attacker(self, observation, weights):
        c = self.config
        survivors = visible_survivors(observation)
        zeros = sum(float((1 - m).sum()) for m in survivors)
        total = sum(m.numel() for m in survivors)
        if zeros < 0.1 * (c.prune_base / 100) * total:  # no pruning zeros: not perturbed
            return KnownDefense(
                "outpost",
                "knows OUTPOST perturbs only with a decaying probability, and sees from the "
                "update (no pruning zeros) that it did not this round: compares everything",
            )
        # The noise's standard deviation per tensor is public: the weights' variance (the
        # server sent them) times noise_base. Which entries were pruned and which noised the
        # attacker decides as OUTPOST does, from its candidate's own update.
        sigmas = [_risk(weights[name]) * c.noise_base for name in observation.parameter_names]
        exact = EXACT_SHARE * min((s for s in sigmas if s > 0), default=1.0)
        return KnownDefense(
            "outpost",
            f"knows OUTPOST pruned {c.prune_base:g} % of each layer and noised the "
            f"largest-Fisher {c.phi:g} % with noise of known scale per layer (the weights' "
            "variance times noise_base): prunes and ranks its candidate's update the same "
            "way, matches the entries it would noise by their layer's Gaussian likelihood "
            "(pruned-then-noised ones as pure noise) and the others as exact, plus the image "
            "prior it weighs",
            noise=ModelledGaussian(
                lambda update: self.release_model(update, sigmas, exact),
                f"OUTPOST's pruning and per-layer noise (standard deviations {min(sigmas):.3g}"
                f" to {max(sigmas):.3g})",
            ),
        )

    def noised_entries(self, update: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Where OUTPOST adds noise: the ``phi`` % of all entries largest in empirical Fisher
        information g^2 (flat masks, one per tensor)."""
        fisher = torch.cat([t.detach().reshape(-1) ** 2 for t in update])
        return torch.split(_largest(fisher, self.config.phi / 100), [t.numel() for t in update])

    def release_model(
        self, update: tuple[torch.Tensor, ...], sigmas: list[float], exact: float
    ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """What OUTPOST releases for ``update``, as a mean and a standard deviation per
        entry: pruned as ``apply`` prunes it, noised where its Fisher information is among
        the largest ``phi`` %, exact (to ``exact``) elsewhere. The masks are taken from the
        update's values, not differentiated through."""
        c = self.config
        with torch.no_grad():
            noisy = self.noised_entries(update)
            kept = [
                prune_smallest(t.detach().reshape(-1), c.prune_base / 100).view_as(t) != 0
                for t in update
            ]
        means = tuple(t * k.to(t.dtype) for t, k in zip(update, kept, strict=True))
        stds = tuple(
            torch.where(where.view_as(t), max(sigma, exact), exact).to(t.dtype)
            for t, where, sigma in zip(update, noisy, sigmas, strict=True)
        )
        return means, stds

    def privacy_report(self) -> dict[str, Any]:
        return {
            "epsilon": None,
            "epsilon_unavailable_reason": "OUTPOST's noise is scaled by weight variance, not "
            "calibrated to a sensitivity: no DP guarantee",
        }


register(
    DefenseInfo(
        "outpost",
        "OUTPOST: with decaying probability, prune small entries per layer and add "
        "risk-scaled Gaussian noise to the highest-Fisher entries.",
        OutpostConfig,
        Outpost,
        strength="noise_base",
    )
)
