"""Additive noise on the shared update, with optional norm clipping (DP-style).

Gaussian: each coordinate gets N(0, sigma^2), the convention of DLG (Zhu et al. 2019,
Sec. 5: "variance 1e-2" = sigma 0.1) and of the GRNN thesis (Table 3.16). With an L2 clip
bound C on the whole update the release is a Gaussian mechanism; epsilon comes from Opacus's
RDP accountant, composed over ``rounds`` releases.

Which epsilon depends on what counts as neighbouring data, and it is said beside the
figure (``neighbours``):

- ``replace-one`` (default): the client's local data with one example replaced (or
  added, or removed). The whole update is clipped, not each example's gradient, so the
  two clipped updates can be any two points of the C-ball: the L2 sensitivity is 2C and
  the noise multiplier sigma / (2C). This is the guarantee a client's locally noised
  update gives against the server that sees it.
- ``client-present``: this client's update present or absent (replaced by nothing), as
  central DP-FedAvg (McMahan et al. 2018) accounts a sum over many clients: sensitivity C,
  noise multiplier sigma / C. For one client's update seen alone it is not a guarantee about
  the client's examples; it is offered to compare with papers that report it.

Amplification by subsampling (``sample_rate`` < 1) holds only when the party that draws
the sample is trusted and keeps it secret from the adversary; in cross-device FL the server
picks the clients, and the server is the adversary here. It is applied only with
``trusted_sampler=true`` and refused otherwise.

The clip bound is 30 by default (see ``DEFAULT_CLIP``), so the default reports an epsilon;
``clip=none`` removes it (DLG's noise alone, as its paper and our reproductions use), and
then the sensitivity is unbounded and epsilon is reported unavailable.

Laplace: each coordinate gets Laplace(0, b) (variance 2 b^2). With an L1 clip bound C the
release is the Laplace mechanism: L1 sensitivity 2C under ``replace-one`` (C under
``client-present``), epsilon = sensitivity / b per round (pure DP, basic composition over
rounds). Opacus has no Laplace accountant; this closed form is the textbook one.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import torch

from auditlib.config import check_ranges, param, require
from auditlib.defenses.base import DefenseInfo, clip_update, register
from auditlib.likelihoods import GaussianLikelihood, LaplaceLikelihood, Likelihood
from auditlib.threat import KnownDefense


def noise_like(
    t: torch.Tensor, generator: torch.Generator, kind: str, scale: float
) -> torch.Tensor:
    # Drawn on the CPU generator so a seed gives the same noise on every device.
    if kind == "gaussian":
        noise = torch.randn(t.shape, generator=generator, dtype=torch.float64)
    else:
        # u in (-0.5, 0.5): the open interval keeps log1p(-2|u|) finite.
        u = (torch.rand(t.shape, generator=generator, dtype=torch.float64) - 0.5).clamp(
            -0.5 + 1e-16, 0.5 - 1e-16
        )
        noise = -torch.sign(u) * torch.log1p(-2 * u.abs())
    return (noise * scale).to(device=t.device, dtype=t.dtype)


# Default L2 clip bound C of dp-gaussian: just above the update the lab's default victim
# sends. FedSGD gradients of the default LeNet (3x32x32, DLG's uniform init, seed 0) on one
# bundled photograph have L2 norms 26.3-29.5 with 10 classes (median 27.3, all 17
# photographs) and 23.2-25.8 with 100 classes; 4 photographs give 16-18. So C = 30 leaves
# the default release exactly the DLG paper's noisy gradient (the clip does not bind, and
# the attack figures are those without a clip) while bounding the sensitivity, which is what
# gives the default an epsilon. Bigger updates (other models, FedAvg weight changes) are
# scaled down to 30. ``clip=none`` removes the bound (no epsilon).
DEFAULT_CLIP = 30.0


Neighbours = Literal["replace-one", "client-present"]
# How far apart two neighbouring clipped updates can be, in units of the clip bound.
SENSITIVITY_IN_CLIPS = {"replace-one": 2.0, "client-present": 1.0}
NEIGHBOURS_TEXT = {
    "replace-one": "neighbours: the client's data with one example replaced (sensitivity 2 x clip)",
    "client-present": "neighbours: this client's update present or absent, as central "
    "DP-FedAvg counts (sensitivity 1 x clip); not a guarantee about the client's examples "
    "against a server that sees its update alone",
}


def _check_sampling(sample_rate: float, trusted_sampler: bool) -> None:
    require(0 < sample_rate <= 1, f"sample_rate must be in (0, 1], got {sample_rate}")
    require(
        sample_rate == 1 or trusted_sampler,
        f"sample_rate {sample_rate:g} lowers epsilon only when the sample is drawn by a "
        "trusted party and kept from the server; here the server picks the clients and is "
        "the adversary. Set trusted_sampler=true if that holds, or leave sample_rate at 1",
    )


def _known_noise(
    name: str, noise: Likelihood, scale: float, clip: float | None, order: float, std: float
) -> KnownDefense:
    """The adaptive attacker of a noise defense: the same clip on its candidate, and the
    posterior-mode objective, the noise's negative log-likelihood plus a fixed
    total-variation image prior weighed in the same nats (``auditlib.likelihoods``); at scale 0 there is no noise to
    weigh (the clip alone, or nothing). ``std``: the noise's standard deviation per entry.
    A norm clip of either order multiplies the whole update by one positive number
    (``rescales``)."""
    norm = "L2" if order == 2.0 else "L1"
    clipped = clip is not None
    clip_norm = clip if order == 2.0 else None
    if scale == 0:
        return KnownDefense(
            name,
            "knows no noise was added (scale 0)"
            + (
                f" after clipping to {norm} norm {clip:g}: clips its candidate the same way"
                if clipped
                else ""
            ),
            transform=None if clip is None else lambda update: clip_update(update, clip, order),
            rescales=clipped,
            clip_norm=clip_norm,
        )
    return KnownDefense(
        name,
        f"knows {noise.describe()} was added"
        + (f" after clipping to {norm} norm {clip:g}" if clipped else "")
        + ": "
        + ("clips its candidate's update the same way and " if clipped else "")
        + "minimises the noise's negative log-likelihood plus the image prior weighed by the "
        "known scale (the posterior mode under a fixed total-variation image prior, "
        "Balunovic et al.'s Bayesian attacker: not Bayes-optimal, as that prior is not the "
        "images' true distribution); one release per audit, so independent "
        "draws from several rounds are not averaged",
        transform=None if clip is None else lambda update: clip_update(update, clip, order),
        rescales=clipped,
        noise=noise,
        entry_noise_std=std,
        clip_norm=clip_norm,
    )


@dataclass(frozen=True)
class GaussianNoiseConfig:
    sigma: float = param(
        0.1, "standard deviation of the Gaussian noise added to every entry", low=0, high=1e3
    )
    clip: float | None = param(
        DEFAULT_CLIP,
        "L2 norm the whole update is scaled down to before the noise; empty: no clip (and no "
        "epsilon)",
        low=0,
        low_open=True,
    )
    delta: float = param(
        1e-5,
        "delta of the (epsilon, delta) guarantee",
        low=0,
        low_open=True,
        high=1,
        high_open=True,
    )
    rounds: int = param(1, "rounds of release the accountant composes (RDP)", low=1, high=100_000)
    neighbours: Neighbours = param(
        "replace-one",
        "what epsilon protects: the client's data with one example replaced (sensitivity "
        "2 x clip), or its update present or absent, as central DP-FedAvg counts (1 x clip)",
    )
    sample_rate: float = param(
        1.0,
        "probability a client takes part in a round, for amplification by subsampling; "
        "below 1 only with trusted_sampler",
        low=0,
        low_open=True,
        high=1,
    )
    trusted_sampler: bool = param(
        False,
        "the clients of a round are drawn by a trusted party and kept from the server (the "
        "premise of sample_rate < 1)",
    )

    def __post_init__(self) -> None:
        check_ranges(self)
        _check_sampling(self.sample_rate, self.trusted_sampler)


class GaussianNoise:
    def __init__(self, config: GaussianNoiseConfig) -> None:
        self.config = config

    def apply(self, update, generator, context=None):
        if self.config.clip is not None:
            update = clip_update(update, self.config.clip, 2.0)
        return tuple(t + noise_like(t, generator, "gaussian", self.config.sigma) for t in update)

    def known_to_attacker(self, observation, weights):
        c = self.config
        return _known_noise(
            "dp-gaussian", GaussianLikelihood(c.sigma), c.sigma, c.clip, 2.0, c.sigma
        )

    def privacy_report(self) -> dict[str, Any]:
        c = self.config
        if c.clip is None:
            return {
                "epsilon": None,
                "epsilon_unavailable_reason": "no clip bound: the update's sensitivity is "
                "unbounded, so no (epsilon, delta) guarantee holds; set clip=C",
            }
        if c.sigma == 0:
            return {
                "epsilon": None,
                "epsilon_unavailable_reason": "sigma=0 adds no noise: epsilon is infinite",
            }
        from opacus.accountants import RDPAccountant

        accountant = RDPAccountant()
        multiplier = c.sigma / (SENSITIVITY_IN_CLIPS[c.neighbours] * c.clip)
        accountant.history = [(multiplier, c.sample_rate, c.rounds)]
        with warnings.catch_warnings():
            # At tiny noise multipliers (the default sigma 0.1 at clip 30) the best RDP order
            # is the smallest Opacus tries and it warns; the epsilon is still a valid (if
            # loose) upper bound, and it is enormous either way.
            warnings.filterwarnings("ignore", message="Optimal order is the smallest alpha")
            value = float(accountant.get_epsilon(delta=c.delta))
        return {
            "epsilon": value,
            "delta": c.delta,
            "noise_multiplier": multiplier,
            "accountant": "opacus RDPAccountant",
            "unit": "this client's update, per round",
            "neighbours": NEIGHBOURS_TEXT[c.neighbours],
            "sampling": (
                f"amplified by a trusted sampler at rate {c.sample_rate:g}"
                if c.sample_rate < 1
                else "no amplification by subsampling (the server picks the clients)"
            ),
        }


@dataclass(frozen=True)
class LaplaceNoiseConfig:
    scale: float = param(0.1, "scale b of the Laplace noise added to every entry", low=0, high=1e3)
    clip: float | None = param(
        None,
        "L1 norm the whole update is scaled down to before the noise; empty: no clip (and no "
        "epsilon)",
        low=0,
        low_open=True,
    )
    rounds: int = param(1, "rounds of release composed (basic composition)", low=1, high=100_000)
    neighbours: Neighbours = param(
        "replace-one",
        "what epsilon protects: the client's data with one example replaced (sensitivity "
        "2 x clip), or its update present or absent, as central DP-FedAvg counts (1 x clip)",
    )

    def __post_init__(self) -> None:
        check_ranges(self)


class LaplaceNoise:
    def __init__(self, config: LaplaceNoiseConfig) -> None:
        self.config = config

    def apply(self, update, generator, context=None):
        if self.config.clip is not None:
            update = clip_update(update, self.config.clip, 1.0)
        return tuple(t + noise_like(t, generator, "laplace", self.config.scale) for t in update)

    def known_to_attacker(self, observation, weights):
        c = self.config
        # Laplace(0, b) has standard deviation b sqrt(2).
        std = c.scale * math.sqrt(2)
        return _known_noise("dp-laplace", LaplaceLikelihood(c.scale), c.scale, c.clip, 1.0, std)

    def privacy_report(self) -> dict[str, Any]:
        c = self.config
        if c.clip is None:
            return {
                "epsilon": None,
                "epsilon_unavailable_reason": "no L1 clip bound: the update's sensitivity is "
                "unbounded, so no epsilon guarantee holds; set clip=C",
            }
        if c.scale == 0:
            return {
                "epsilon": None,
                "epsilon_unavailable_reason": "scale=0 adds no noise: epsilon is infinite",
            }
        sensitivity = SENSITIVITY_IN_CLIPS[c.neighbours] * c.clip
        return {
            "epsilon": c.rounds * sensitivity / c.scale,
            "delta": 0.0,
            "accountant": "Laplace mechanism, L1 sensitivity / scale, basic composition",
            "unit": "this client's update, per round",
            "neighbours": NEIGHBOURS_TEXT[c.neighbours],
        }


register(
    DefenseInfo(
        "dp-gaussian",
        "Gaussian noise N(0, sigma^2) on every coordinate of the update after L2 clipping "
        f"(clip {DEFAULT_CLIP:g} by default, none to turn it off).",
        GaussianNoiseConfig,
        GaussianNoise,
        strength="sigma",
    )
)
register(
    DefenseInfo(
        "dp-laplace",
        "Laplace noise of scale b on every coordinate of the update, optional L1 clipping.",
        LaplaceNoiseConfig,
        LaplaceNoise,
        strength="scale",
    )
)
