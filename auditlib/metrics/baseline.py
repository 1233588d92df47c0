"""What a server gets without the update: guesses scored like a reconstruction.

A PSNR means nothing alone: a flat grey image scores 15.9 dB on the batch of 16 smooth
photographs of docs/REPRODUCTION.md, above FedLeak's reconstruction of it. Every result
therefore scores the guesses that use no update with the same metrics, and the verdict
counts only what an attack recovers beyond the best of them (``metrics.risk``).

The guesses need nothing a server lacks: mid-grey, and, where the data source gives a
mean image (``engine.victim.data_prior``: public knowledge of the data's distribution,
more than an eavesdropper has), that mean image and its flat mean colour, and, where the
server holds public data (a malicious server's prior or calibration set), each public
set's mean image and its flat mean colour. Every image of
a batch gets the same guess, so the Hungarian matching is the identity. The best guess is
taken per image with the ground truth: the baseline is as strong as any guess could be,
so "beyond the guess" is a strict test.

Beside the guesses, each image's **best flat image** (:func:`flat_bar`): a flat image tells
nothing of an image but its colour, so no flat image may count as recovered (a refused
model's flat grey beat the mid-grey guess by over 1 dB on dark crops). Per channel, the flat
value with the lowest error is the image's own mean colour (the best flat image in PSNR);
SSIM's best flat value is elsewhere (a dark background's: a crop of black sky and a bright
edge scores SSIM 0.64 against a flat black, 0.07 against its mean colour), so it is found
on a grid of flat values. Both use the image itself, which no server has: they are a bar a
reconstruction must clear to count as recovered (``metrics.risk.beyond_flat``), never the
guess a reconstruction is held against (a stronger guess would make "held" easier).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.ndimage import gaussian_filter

from auditlib.metrics import image as image_metrics

GREY = "grey"
MEAN_IMAGE = "data mean image"
MEAN_COLOUR = "data mean colour"
PUBLIC_MEAN_IMAGE = "public data mean image"
PUBLIC_MEAN_COLOUR = "public data mean colour"
FLAT = "the image's best flat image"
# The flat values SSIM's best flat image is searched over, per channel: a coarse grid, then
# a fine one around its best (steps 0.05, then 0.005).
FLAT_GRID = np.linspace(0.0, 1.0, 21)
FLAT_FINE = np.linspace(-0.05, 0.05, 21)


@dataclass(frozen=True)
class GuessScore:
    """One guess's scores over the batch (per image, in the originals' order)."""

    name: str
    psnr: tuple[float, ...]
    ssim: tuple[float, ...] | None  # None where SSIM is unavailable (images under 11 px)
    # A bar, not a guess: the image's best flat images (``flat_bar``), which use the image
    # itself; a reconstruction must clear it to count as recovered, never held against it.
    bar: bool = False


def guesses(
    shape: tuple[int, int, int],
    prior: np.ndarray | None,
    public: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The guesses (H x W x C in [0, 1]) for images of ``shape``; ``public``: the mean
    image of each public set the server holds, by the set's name."""
    out = {GREY: np.full(shape, 0.5)}
    if prior is not None:
        out[MEAN_IMAGE] = np.asarray(prior, dtype=np.float64)
        out[MEAN_COLOUR] = np.broadcast_to(prior.mean(axis=(0, 1)), shape).copy()
    for name, mean in (public or {}).items():
        out[f"{PUBLIC_MEAN_IMAGE} ({name})"] = np.asarray(mean, dtype=np.float64)
        out[f"{PUBLIC_MEAN_COLOUR} ({name})"] = np.broadcast_to(
            mean.mean(axis=(0, 1)), shape
        ).copy()
    return out


def score_guesses(
    originals: np.ndarray,
    prior: np.ndarray | None,
    public: Mapping[str, np.ndarray] | None = None,
) -> tuple[GuessScore, ...]:
    """Each guess scored against every original (B x H x W x C in [0, 1]), and last the
    originals' best flat images (``flat_bar``)."""
    height, width = originals.shape[1:3]
    with_ssim = image_metrics.ssim_unavailable_reason(height, width) is None
    scores = []
    for name, guess in guesses(originals.shape[1:], prior, public).items():
        psnr = tuple(image_metrics.psnr(guess, x) for x in originals)
        ssim = tuple(image_metrics.ssim(guess, x) for x in originals) if with_ssim else None
        scores.append(GuessScore(name, psnr, ssim))
    return (*scores, flat_bar(originals))


def flat_bar(originals: np.ndarray) -> GuessScore:
    """Each original's (B x H x W x C in [0, 1]) best flat images, as a bar (``FLAT``): its own
    mean colour (the flat image with the lowest error, hence the best PSNR of any flat image)
    and, where SSIM is available, the better SSIM of its mean colour and of the flat image
    best in SSIM."""
    height, width = originals.shape[1:3]
    with_ssim = image_metrics.ssim_unavailable_reason(height, width) is None
    psnr, ssim = [], []
    for x in originals:
        colour = np.broadcast_to(x.mean(axis=(0, 1)), x.shape)
        psnr.append(image_metrics.psnr(colour, x))
        if with_ssim:
            best = np.broadcast_to(_ssim_best_flat(x), x.shape)
            ssim.append(max(image_metrics.ssim(colour, x), image_metrics.ssim(best, x)))
    return GuessScore(FLAT, tuple(psnr), tuple(ssim) if with_ssim else None, bar=True)


def _ssim_best_flat(original: np.ndarray) -> np.ndarray:
    """Per channel, the flat value with the highest SSIM to ``original`` (``FLAT_GRID``,
    then ``FLAT_FINE`` around its best).

    SSIM of a flat image c against x is, per window, (2 ux c + C1) C2 / ((ux^2 + c^2 + C1)
    (vx + C2)) (its own variance and covariance are 0): x's local means and variances,
    filtered once as ``metrics.image.ssim`` does, score every c of the grid at once. The
    value found is then scored by ``metrics.image.ssim`` itself."""
    c1, c2 = 0.01**2, 0.03**2
    pad = (image_metrics.SSIM_WINDOW - 1) // 2

    def local(a: np.ndarray) -> np.ndarray:
        blurred = gaussian_filter(a, sigma=image_metrics.SSIM_SIGMA, truncate=3.5)
        return blurred[pad:-pad, pad:-pad].reshape(-1)

    def best(grid: np.ndarray, mean: np.ndarray, weight: np.ndarray) -> float:
        c = grid[:, None]
        score = ((2 * mean * c + c1) / (mean * mean + c * c + c1) * weight).mean(axis=1)
        return float(grid[int(score.argmax())])

    values = []
    for channel in np.moveaxis(original.astype(np.float64), -1, 0):
        mean = local(channel)
        weight = c2 / ((local(channel * channel) - mean * mean) + c2)  # C2 / (vx + C2)
        coarse = best(FLAT_GRID, mean, weight)
        values.append(best(np.clip(coarse + FLAT_FINE, 0.0, 1.0), mean, weight))
    return np.asarray(values)


def best_guess_per_image(scores: tuple[GuessScore, ...]) -> list[dict]:
    """Per image: the best guess's PSNR and SSIM (each the best over the guesses) and the
    guess with the best PSNR; where ``scores`` holds the flat bar, the image's best flat
    images beside them (``flat_psnr``, ``flat_ssim``)."""
    flat = next((s for s in scores if s.bar), None)
    scores = tuple(s for s in scores if not s.bar)
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
        if flat is not None:
            out[-1]["flat_psnr"] = flat.psnr[i]
            out[-1]["flat_ssim"] = None if flat.ssim is None else flat.ssim[i]
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
            if not s.bar
        ],
    }
