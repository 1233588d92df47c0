"""What a server gets without the update: guesses scored like a reconstruction.

A PSNR means nothing alone: a flat grey image scores 15.9 dB on the batch of 16 smooth
photographs of docs/REPRODUCTION.md, above FedLeak's reconstruction of it. Every result
therefore scores the guesses that use no update with the same metrics, and the verdict
counts only what an attack recovers beyond the best of them (``metrics.risk``).

The guesses need nothing a server lacks: mid-grey, and, where the data source gives a
mean image (``engine.victim.data_prior``: public knowledge of the data's distribution,
more than an eavesdropper has), that mean image and its flat mean colour. Every image of
a batch gets the same guess, so the Hungarian matching is the identity. The best guess is
taken per image with the ground truth: the baseline is as strong as any guess could be,
so "beyond the guess" is a strict test.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from auditlib.metrics import image as image_metrics

GREY = "grey"
MEAN_IMAGE = "data mean image"
MEAN_COLOUR = "data mean colour"


@dataclass(frozen=True)
class GuessScore:
    """One guess's scores over the batch (per image, in the originals' order)."""

    name: str
    psnr: tuple[float, ...]
    ssim: tuple[float, ...] | None  # None where SSIM is unavailable (images under 11 px)


def guesses(shape: tuple[int, int, int], prior: np.ndarray | None) -> dict[str, np.ndarray]:
    """The guesses (H x W x C in [0, 1]) for images of ``shape``."""
    out = {GREY: np.full(shape, 0.5)}
    if prior is not None:
        out[MEAN_IMAGE] = np.asarray(prior, dtype=np.float64)
        out[MEAN_COLOUR] = np.broadcast_to(prior.mean(axis=(0, 1)), shape).copy()
    return out


def score_guesses(originals: np.ndarray, prior: np.ndarray | None) -> tuple[GuessScore, ...]:
    """Each guess scored against every original (B x H x W x C in [0, 1])."""
    height, width = originals.shape[1:3]
    with_ssim = image_metrics.ssim_unavailable_reason(height, width) is None
    scores = []
    for name, guess in guesses(originals.shape[1:], prior).items():
        psnr = tuple(image_metrics.psnr(guess, x) for x in originals)
        ssim = tuple(image_metrics.ssim(guess, x) for x in originals) if with_ssim else None
        scores.append(GuessScore(name, psnr, ssim))
    return tuple(scores)


def best_guess_per_image(scores: tuple[GuessScore, ...]) -> list[dict]:
    """Per image: the best guess's PSNR and SSIM (each the best over the guesses) and the
    guess with the best PSNR."""
    out = []
    for i in range(len(scores[0].psnr)):
        by_psnr = max(scores, key=lambda s: s.psnr[i])
        ssims = [s.ssim[i] for s in scores if s.ssim is not None]
        out.append(
            {
                "guess": by_psnr.name,
                "psnr": by_psnr.psnr[i],
                "ssim": max(ssims) if ssims else None,
            }
        )
    return out


def baseline_record(scores: tuple[GuessScore, ...]) -> dict:
    """The guesses' batch means, for result.json."""
    return {
        "guesses": [
            {
                "name": s.name,
                "psnr_mean": float(np.mean(s.psnr)),
                "ssim_mean": float(np.mean(s.ssim)) if s.ssim is not None else None,
            }
            for s in scores
        ],
    }
