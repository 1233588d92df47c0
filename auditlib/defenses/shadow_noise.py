"""The Shadow defense's noise map (Jiang, Ma, Yang, MedIA 2025, Eqs. 10-18), as pure functions.

From the shadow reconstruction's squared error E, per image over its C x H x W values:
sharpen S = softmax(E / tau), invert N0 = 1 / S (small error -> large noise), equalise the
histogram of N0 to 256 levels (spreads the noise over every well-reconstructed region instead
of the few best pixels), normalise N = softmax(HE(N0) / tau); keep a momentum of N over rounds;
spare the Grad-CAM++ foreground; scale to the image's peak times sigma_t.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from skimage.exposure import equalize_hist

CamMode = Literal["paper", "code", "off"]
Schedule = Literal["increasing", "constant", "decreasing"]
LEVELS = 256
GREY = (0.299, 0.587, 0.114)  # ITU-R 601 luma, as the authors' equaliser converts colour


def _to_levels(values: torch.Tensor) -> torch.Tensor:
    """Min-max each image's values to [0, 255]."""
    flat = values.flatten(1)
    low = flat.min(dim=1, keepdim=True).values
    high = flat.max(dim=1, keepdim=True).values
    return ((flat - low) / (high - low).clamp(min=1e-12) * (LEVELS - 1)).view_as(values)


def equalize(levels: torch.Tensor) -> torch.Tensor:
    """256-bin histogram equalisation of each image's grey levels, replicated to its channels.

    Colour maps are reduced to grey first (as the authors' code does); scikit-image's
    ``equalize_hist`` maps each level to its cumulative frequency, scaled back to [0, 255].
    """
    channels = levels.shape[1]
    grey = levels[:, 0] if channels == 1 else sum(w * levels[:, c] for c, w in enumerate(GREY))
    out = np.stack([equalize_hist(g, nbins=LEVELS) for g in grey.detach().cpu().double().numpy()])
    equalized = torch.as_tensor(out * (LEVELS - 1), dtype=levels.dtype, device=levels.device)
    return equalized[:, None].expand(-1, channels, -1, -1)


def noise_map(error: torch.Tensor, temperature: float = 20.0, equalized: bool = True):
    """N = softmax(HE(1 / softmax(E / tau)) / tau), per image; positive, each image sums to 1."""
    logits = error.flatten(1) / temperature
    inverse = torch.exp(torch.logsumexp(logits, dim=1, keepdim=True) - logits)  # 1 / softmax
    levels = _to_levels(inverse.view_as(error))
    if equalized:
        levels = equalize(levels)
    return torch.softmax(levels.flatten(1) / temperature, dim=1).view_as(error)


def momentum_map(fresh: torch.Tensor, previous: torch.Tensor | None, weight: float) -> torch.Tensor:
    """M_t = weight * N + (1 - weight) * M_{t-1} (the code's 0.9 on the new map); M_0 = N."""
    return fresh if previous is None else weight * fresh + (1 - weight) * previous


def cam_influence(round: int, rounds: int, low: float = 0.1, high: float = 0.5) -> float:
    """alpha_t = clip(t / T, 0.1, 0.5): the foreground is spared more as training sharpens CAMs."""
    return min(max(round / rounds, low), high)


def spare_foreground(
    noise: torch.Tensor,
    cam: torch.Tensor,
    alpha: float,
    *,
    top: float = 0.3,
    mode: CamMode = "paper",
    temperature: float = 20.0,
) -> torch.Tensor:
    """N' from N and the saliency ``cam`` (B, H, W in [0, 1]) over its top ``top`` share.

    ``paper``: the prose's reading, N' = (N / max N) * (1 - alpha * A), A = the masked CAM
    scaled to peak 1, so the foreground keeps (1 - alpha) of its noise at most.
    ``code``: the authors' release, N' = N - alpha * softmax(mask * CAM / tau) over H x W,
    which at their sizes is close to a uniform offset. ``off``: N unchanged.
    """
    if mode == "off" or alpha == 0:
        return noise
    flat = cam.flatten(1)
    threshold = torch.quantile(flat, 1 - top, dim=1, keepdim=True)
    masked = (flat * (flat >= threshold)).view_as(cam)
    if mode == "code":
        weights = torch.softmax(masked.flatten(1) / temperature, dim=1).view_as(cam)
        return noise - alpha * weights[:, None]
    peak = masked.flatten(1).max(dim=1).values.clamp(min=1e-12).view(-1, 1, 1)
    scaled = noise / noise.flatten(1).max(dim=1).values.view(-1, 1, 1, 1)
    return scaled * (1 - alpha * masked / peak)[:, None]


def amplitude(sigma0: float, round: int, rounds: int, schedule: Schedule) -> float:
    """sigma_t: sigma0 * exp(t / T) (the paper's increasing schedule), constant, or decreasing."""
    exponent = {"increasing": 1.0, "constant": 0.0, "decreasing": -1.0}[schedule]
    return sigma0 * math.exp(exponent * round / rounds)


def perturbation(images: torch.Tensor, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """delta = |max(x) / max(N')| * sigma_t * N' per image (Eqs. 17-18), so the peak of delta is
    sigma_t times the image's peak value; nothing is clamped (as in the authors' code)."""
    image_peak = images.flatten(1).max(dim=1).values.abs()
    noise_peak = noise.flatten(1).max(dim=1).values.abs().clamp(min=1e-12)
    return (image_peak / noise_peak).view(-1, 1, 1, 1) * sigma * noise
