"""What an adaptive attacker knows of a defense's randomness: the release's likelihood.

A defense that adds noise or rounds at random releases y ~ p(y | u), u the update the client
computed. The adaptive attacker under such a defense takes the attack of Balunovic et
al.'s Bayesian framework ("Bayesian framework for gradient leakage", ICLR 2022): it
minimises the negative log posterior of the data x behind u(x),

    -log p(y | u(x)) - log p(x)

both in nats, so the image prior's weight is set by the noise's known scale: the more
noise, the more the prior decides. Its result is a posterior mode (MAP) under a fixed
total-variation image prior (:func:`image_prior_nats`), found by a local optimiser from
random starts: Bayes-optimal only were that prior the images' true distribution and the
mode the loss's minimiser, which neither is; it is called the posterior-mode attacker. Each likelihood here gives the first term for a
candidate update (``nll``); :func:`image_prior_nats` gives the second.

Updates are one tensor per parameter in the client's own units (what the defense acted on:
a gradient for FedSGD, a weight difference for FedAvg); attacks compare readings as a
gradient, so ``nll`` takes ``unit``, the client's update per unit of that reading
(``client.update.difference_per_gradient``). Each also takes R candidates stacked along a
leading dimension (restarts that advance together): one value per candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

Tensors = tuple[torch.Tensor, ...]

# The image prior: neighbouring pixels differ by a Laplace-distributed amount (the total
# variation prior of Balunovic et al.'s Bayesian attacks), of scale b = E|x_i - x_j|, here in
# [0, 1] pixel units. Measured on the 17 bundled photographs: median 0.036 at 32 px, 0.035
# at 64 px, 0.024 at 224 px; 0.04 stands for natural photographs at an audit's sizes. A
# fixed public figure, never fitted on the audited batch.
NEIGHBOUR_DIFFERENCE = 0.04


class Likelihood(Protocol):
    """The negative log-likelihood of an observed release given a candidate update."""

    # The shape of the likelihood as a plain distance ("l2", "l1") for an attack without an
    # image prior to weigh (its maximum-likelihood twin); None where no distance is it.
    distance: str | None
    # Whether ``nll`` takes R candidates stacked along a leading dimension.
    stacked: bool

    def nll(self, candidate: Sequence[torch.Tensor], target: Sequence[torch.Tensor], unit: float):
        """-log p(target | candidate) up to a constant, in nats; both read as gradients."""

    def describe(self) -> str:
        """In words, for the threat card."""


def _summed(candidate, target, per_entry) -> torch.Tensor:
    """The sum of ``per_entry(c - t)`` over every entry of every tensor: one value, or one
    per restart where the candidates are stacked along a leading dimension."""
    total = candidate[0].new_zeros(())
    for c, t in zip(candidate, target, strict=True):
        rows = c.reshape(*c.shape[: c.dim() - t.dim()], -1)
        total = total + per_entry(rows - t.reshape(-1)).sum(-1)
    return total


def _absolute(d: torch.Tensor) -> torch.Tensor:
    """|d|; in a traced step (``attacks.compiled``) as max(d, -d), the same values and
    derivatives (0 at 0 as abs's): torch 2.14 fails to trace abs's derivative on stacked
    candidates' updates (a real tensor meets its fake ones: "Please convert all Tensors to
    FakeTensors first")."""
    return torch.maximum(d, -d) if torch.compiler.is_compiling() else d.abs()


@dataclass(frozen=True)
class GaussianLikelihood:
    """Independent N(0, sigma^2) on every entry: sum (y - u)^2 / (2 sigma^2)."""

    sigma: float
    distance: str | None = "l2"
    stacked: bool = True

    def nll(self, candidate, target, unit):
        return _summed(candidate, target, torch.square) * (unit * unit / (2 * self.sigma**2))

    def describe(self) -> str:
        return f"Gaussian noise of standard deviation {self.sigma:g}"


@dataclass(frozen=True)
class LaplaceLikelihood:
    """Independent Laplace(0, b) on every entry: sum |y - u| / b."""

    scale: float
    distance: str | None = "l1"
    stacked: bool = True

    def nll(self, candidate, target, unit):
        return _summed(candidate, target, _absolute) * (abs(unit) / self.scale)

    def describe(self) -> str:
        return f"Laplace noise of scale {self.scale:g}"


def image_prior_nats(images: torch.Tensor, pixel_std: float) -> torch.Tensor:
    """-log p(x) up to a constant under the Laplace prior on neighbour differences, for a
    batch B x C x H x W in model space (or R x B x C x H x W: one value per restart);
    ``pixel_std`` is the mean of the normalisation's stds (model space per [0, 1] unit)."""
    scale = NEIGHBOUR_DIFFERENCE / pixel_std
    batch = (-4, -3, -2, -1)
    dx = (images[..., :, 1:] - images[..., :, :-1]).abs().sum(dim=batch)
    dy = (images[..., 1:, :] - images[..., :-1, :]).abs().sum(dim=batch)
    return (dx + dy) / scale


@dataclass(frozen=True, eq=False)
class ModelledGaussian:
    """A release the defense shapes from the update itself: y ~ N(m(u), s(u)^2) entry by
    entry, where ``model`` gives the mean m and the per-entry standard deviation s from the
    candidate (OUTPOST: pruned by the candidate's own magnitudes, noised where the
    candidate's own Fisher information is largest, exact elsewhere). ``model`` takes and
    returns updates in the client's units and decides from the candidate's values alone."""

    model: object  # Callable[[Tensors], tuple[Tensors, Tensors]]
    words: str
    distance: str | None = None
    stacked: bool = True

    def nll(self, candidate, target, unit):
        """One value, or one per restart where the candidates are stacked along a leading
        dimension: each candidate's release modelled from its own values (by
        ``torch.func.vmap``, the same pruning and ranking as alone)."""
        if candidate[0].dim() > target[0].dim():
            return torch.func.vmap(lambda *one: self.nll(one, target, unit))(*candidate)
        mean, std = self.model(tuple(c * unit for c in candidate))
        total = candidate[0].new_zeros(())
        for m, s, t in zip(mean, std, target, strict=True):
            total = total + ((t * unit - m) / s).pow(2).sum() / 2
        return total

    def describe(self) -> str:
        return self.words


# QSGD: an entry's rounding has variance p(1 - p) <= 1/4 of a step^2; the bucket norms and
# the signs leave the client exactly, which a gradient method takes as a tight Gaussian
# (0.1 of a step) rather than as a hard constraint.
EXACT_STEPS = 0.1
# The finest step the attacker reads a bucket at, as a fraction of the release's coarsest
# step. A bucket of a class the model all but rules out (softmax 1e-10) has a step of 1e-13
# where the coarsest is 0.1: read exactly, its terms outweigh the rest by 1e24, and every
# start of DLG's twin left float32's finite numbers within 16 steps. Floored, those buckets
# weigh at most 100 times the coarsest: a likelihood of a slightly noisier release, whose
# mode the twin reaches (docs/ALGORITHMS.md, "The QSGD twin's floor").
STEP_FLOOR = 0.1


@dataclass(frozen=True, eq=False)
class QsgdLikelihood:
    """QSGD's release (Alistarh et al. 2017) read as the attacker reads it: per bucket of
    ``bucket`` entries, the norm n (sent exactly), every sign (exact where the level is not
    0), and the level k_i = round_stochastic(|u_i| s / n) of each entry. In units of the
    bucket's step n / s the entry u_i / step has mean k_i's and variance at most 1/4, so

        2 sum (k_i - a_i)^2 + (norm and sign terms at 0.1 of a step),  a_i = u_i s / n,

    with each bucket's own step: the variance differs by coordinate, unlike plain L2. A
    bucket whose step is finer than ``STEP_FLOOR`` of the coarsest is read at that floor."""

    levels: int
    bucket: tuple[int, ...]  # per tensor: entries per bucket
    steps: Tensors  # per tensor: (buckets, 1), the step n / s of each bucket
    released: Tensors  # per tensor: (buckets, bucket) the released levels k (signed)
    # per tensor: (buckets, 1), the unit each bucket is read in: its step, or the floor
    # (``STEP_FLOOR`` of the coarsest step) where its step is finer
    units: Tensors
    distance: str | None = None
    stacked: bool = True

    @classmethod
    def read(
        cls,
        observed: Sequence[torch.Tensor],
        levels: int,
        bucket: int,
        floor: float | None = None,
    ) -> QsgdLikelihood:
        """From the release; ``floor``: the finest step read, a fraction of the coarsest
        (None: ``STEP_FLOOR``; 0: every bucket at its own step, the exact likelihood)."""
        floor = STEP_FLOOR if floor is None else floor
        sizes, steps, released = [], [], []
        for t in observed:
            rows, size = _buckets(t.detach(), bucket)
            step = _step_of(rows, levels)
            sizes.append(size)
            steps.append(step)
            released.append(torch.round(rows / step))
        finest = floor * max(float(s.max()) for s in steps)
        units = tuple(s.clamp_min(finest) for s in steps)
        return cls(levels, tuple(sizes), tuple(steps), tuple(released), units)

    def nll(self, candidate, target, unit):
        """One value, or one per restart where the candidates are stacked along a leading
        dimension (``target`` has each tensor's own shape: what leads it is the restarts).
        Each bucket in its reading unit: the released levels and the norm (s steps) in it."""
        exact = 1 / (2 * EXACT_STEPS**2)
        total = candidate[0].new_zeros(())
        tensors = zip(
            candidate, target, self.bucket, self.steps, self.released, self.units, strict=True
        )
        for c, t, size, step, k, read_in in tensors:
            lead = c.shape[: c.dim() - t.dim()]
            a = _buckets(c * unit, size, lead)[0] / read_in  # (*lead, buckets, bucket)
            in_units = step / read_in  # the step in reading units: 1 where read at its own
            total = total + 2 * (k * in_units - a).pow(2).sum((-2, -1))
            norm = torch.linalg.vector_norm(a, dim=-1)
            nonzero = (k != 0).any(dim=1)
            target_norm = self.levels * in_units.squeeze(1) * nonzero  # s steps, in units
            total = total + exact * (norm - target_norm).pow(2).sum(-1)
            total = total + exact * torch.relu(-torch.sign(k) * a).pow(2).sum((-2, -1))
        return total

    def describe(self) -> str:
        return (
            f"QSGD with {self.levels} levels: the bucket norms and signs it releases exactly, "
            "each entry's rounding with its bucket's own step (read no finer than "
            f"{STEP_FLOOR:g} of the coarsest step)"
        )


def _buckets(t: torch.Tensor, bucket: int, lead: tuple[int, ...] = ()) -> tuple[torch.Tensor, int]:
    """``t`` flat, zero-padded and cut into rows of ``bucket`` entries (QSGD's layout); with
    ``lead``, the leading dimensions of stacked candidates, each flattened on its own."""
    flat = t.reshape(*lead, -1)
    entries = flat.shape[-1]
    size = bucket if 0 < bucket < entries else entries
    padded = torch.nn.functional.pad(flat, (0, -entries % size))
    return padded.view(*lead, -1, size), size


def _step_of(rows: torch.Tensor, levels: int) -> torch.Tensor:
    """Each bucket's step n / s, read off its released values: every entry is a whole
    number k_i of steps, at most ``levels`` (s). The release carries no norm, so the steps
    that make every entry whole (the smallest magnitude over j = 1, 2, ..., s) are the
    candidates; where the levels share a factor several are (one dominant entry released as
    n: k = 3 at step n/3, or k = 1 at step n). QSGD's levels are unbiased roundings of
    a_i = s |u_i| / n, whose norm is s exactly, so the candidate whose levels' norm is
    nearest s is taken (ties: the largest step). A larger step leaves levels whose norm
    falls short of s only if the entries released as 0 carried the rest of the norm, each
    below one step, and all rounded down: at least s^2 - ||a_nonzero||^2 of expected
    up-roundings missed. A bucket of zeros gets the tensor's smallest step (its norm was
    0: no entry can move)."""
    magnitude = rows.abs()
    smallest = torch.where(magnitude > 0, magnitude, torch.inf).min(dim=1, keepdim=True).values
    step = torch.full_like(smallest, torch.nan)
    miss = torch.full_like(smallest, torch.inf)  # | ||k|| - s | of the step taken so far
    for j in range(1, levels + 1):
        trial = smallest / j
        ratio = magnitude / trial
        whole = ((ratio - ratio.round()).abs() <= 1e-3 * ratio.clamp_min(1)).all(dim=1)
        fits = (whole & (ratio.max(dim=1).values <= levels + 1e-3)).unsqueeze(1)
        off = (torch.linalg.vector_norm(ratio.round(), dim=1, keepdim=True) - levels).abs()
        better = fits & (off < miss - 1e-6)
        step = torch.where(better, trial, step)
        miss = torch.where(better, off, miss)
    known = torch.isfinite(step)
    fallback = step[known].min() if bool(known.any()) else torch.ones(())
    return torch.where(known, step, fallback)
