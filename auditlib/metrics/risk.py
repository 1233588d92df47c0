"""What one run recovered beyond a guess: per image and for the batch, with a level.

- Beyond the guess: an image counts as recovered when its reconstruction shows more than the
  best guess that uses no update (``metrics.baseline``) and is no worse than it where it
  matters. In structure: SSIM ``SSIM_MARGIN`` above the guess's, with PSNR no more than
  ``MARGIN_DB`` below it (a colour or brightness shift; GRNN's ``chelsea`` at the paper
  preset: 16.7 dB against the mean colour's 17.2 dB, SSIM 0.72 against 0.19, a recognisable
  cat). In pixels: PSNR ``MARGIN_DB`` above the guess's and at least FedLeak's lowest band
  (10 dB), with SSIM no lower than the guess's: a pixel gain with less structure than a flat
  guess is the image's brightness, not its content (FedLeak's batch of 16 at 16x16:
  ``hubble_deep_field`` 10.7 dB against 9.1 dB, SSIM 0.13 against 0.20, a dark noise field).
  SSIM alone is not enough either: at 16x16 its 11x11 window sees little more than the
  centre's coarse layout, and FedLeak's noise fields reach SSIM 0.40-0.57 against the
  guesses' 0.06-0.13 while 1.5-5 dB behind them in PSNR. The batch is beyond the guess when
  its means are, by the same test.
- Level: FedLeak's bands (Fan et al., USENIX Security 2025, Sec. 5.4): Very High >= 20 dB
  ("nearly all of a client's data can be reconstructed semantically"), High 15-20 ("most of
  it"), Medium 10-15 ("a small portion"). A recovered image gets the band of its PSNR. The
  batch gets the band of its mean PSNR (the paper's statistic) when the batch as a whole is
  beyond the guess, and Medium ("a small portion") when only some of its images are; a run
  that recovered nothing gets no level at all: whether that says anything about a defense
  is the verdict's question (``metrics.verdict``), never a "Low" by itself.
- Nothing shown (held): an image shows nothing of itself only when its reconstruction is
  below the best guess by a stated margin in both measures, PSNR ``HELD_MARGIN_DB`` and SSIM
  ``HELD_SSIM_MARGIN`` under the guess's (or SSIM under ``HELD_SSIM_FLOOR``, no structure at
  all, and no higher than the guess's). Between "recovered" and "nothing shown" lies a
  reconstruction that is no better than the guess yet not clearly worse (pruning at 0.999
  against GRNN's twin: 10.18 dB / SSIM 0.179 against the guess's 11.56 dB / 0.141): the
  verdict calls that Inconclusive, never "defense held".
- Labels: a label recovered when the attacker did not know it is a disclosure when the count
  of correct labels is beyond chance, a one-sided binomial test at ``LABEL_ALPHA``
  (:func:`labels_beyond_chance`).
- Success rate: the share of matched images whose metric passes a threshold, over a range
  of thresholds (the curves of the GRNN thesis, Fig. 3.5): PSNR >= t, SSIM >= t, MSE <= t.
- RDLV (Hatamizadeh et al., TMI 2023, as the Shadow paper uses it, Eq. 19):
  (SSIM(x, x_hat) - SSIM(x, prior)) / SSIM(x, prior), prior = the data's mean image; above 0
  the reconstruction reveals more than the template does. Computed per matched pair (the
  Hungarian matching of every other metric, not the authors' best match over all of a
  client's images). The audit passes the data source's mean image as the prior
  (``engine.victim.data_prior``); where there is none the scores say why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from auditlib.metrics import image as image_metrics

LEVELS: tuple[tuple[str, float], ...] = (
    ("Very High", 20.0),
    ("High", 15.0),
    ("Medium", 10.0),
    ("Low", float("-inf")),
)
LEVEL_MEANING = {
    "Very High": "nearly all of the client's images can be reconstructed recognisably",
    "High": "most of the client's images can be reconstructed recognisably",
    "Medium": "a small portion of the client's images can be reconstructed",
    "Low": "these attacks, the one that knows the defense included, which broke the "
    "undefended update at the same budget, showed nothing beyond a guess under the defense",
}
MARGIN_DB = 1.0  # PSNR gain over the best guess that counts as recovered pixels
SSIM_MARGIN = 0.1  # SSIM gain over the best guess that counts as recovered structure
RECOVERED_FLOOR_DB = 10.0  # FedLeak's lowest band: below it nothing meaningful is visible
# "Nothing shown": below the best guess by these margins in both measures (the verdict's
# "defense held" needs every image so). Chosen from benchmarks/results/defenses.json
# (docs/METRICS.md): the held runs beside a leaking control sit 4-7 dB and 0.08-0.14 SSIM
# under the astronaut's guess (11.56 dB / 0.141); pruning at 0.999 (10.18 / 0.179) does not.
HELD_MARGIN_DB = 1.0
HELD_SSIM_MARGIN = 0.05
# ... or, where the guess itself has little structure (a small or textured image against a
# flat guess), SSIM no higher than the guess's and at most this: no structure at all. Noise
# reconstructions in the benchmarks reach -0.013 to 0.036 (verdicts.json dlg rows 3, 6, 12,
# 13, 33; defenses.json privacy rows 15, 21, 24); the lab's 32 px astronaut under DLG with
# Gaussian noise scores 0.019 against a guess of 0.040.
HELD_SSIM_FLOOR = 0.05
# Labels: beyond chance when P(X >= k | B, 1/C) < LABEL_ALPHA (one-sided binomial test).
LABEL_ALPHA = 0.01
RECOVERED_RULE = (
    f"an image counts as recovered when its reconstruction beats the best guess without the "
    f"update (per image) in structure, SSIM {SSIM_MARGIN:g} above the guess's with PSNR at most "
    f"{MARGIN_DB:g} dB below it, or in pixels, PSNR {MARGIN_DB:g} dB above the guess's and at "
    f"least {RECOVERED_FLOOR_DB:g} dB with SSIM no lower than the guess's"
)
HELD_RULE = (
    f"an image shows nothing of itself when its reconstruction is at least {HELD_MARGIN_DB:g} dB "
    f"below the best guess's PSNR and at least {HELD_SSIM_MARGIN:g} below its SSIM, or at most "
    f"{HELD_SSIM_FLOOR:g} (no structure) and no higher than the guess's (PSNR alone where SSIM "
    "is unavailable)"
)
LABEL_RULE = (
    "labels the attacker did not know count as recovered beyond chance when k correct of B, "
    f"against a chance of 1/C per label, has a one-sided binomial p-value below {LABEL_ALPHA:g}"
)
PSNR_THRESHOLDS = (10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0)
SSIM_THRESHOLDS = (0.2, 0.4, 0.6, 0.8, 0.9)


def leakage_level(psnr_db: float) -> str:
    """FedLeak's band for a PSNR in dB."""
    return next(name for name, floor in LEVELS if psnr_db >= floor)


def success_rate(
    values: Sequence[float], thresholds: Sequence[float], higher_is_better: bool = True
) -> list[dict[str, float]]:
    """The share of ``values`` passing each threshold (>= t, or <= t for an error metric)."""
    array = np.asarray(values, dtype=np.float64)
    passed = (lambda t: array >= t) if higher_is_better else (lambda t: array <= t)
    return [{"threshold": float(t), "rate": float(passed(t).mean())} for t in thresholds]


def rdlv(reconstruction: np.ndarray, original: np.ndarray, prior: np.ndarray) -> float | None:
    """Relative data leakage value of one pair (H x W x C in [0, 1]); None when the prior
    is as dissimilar as it can be (SSIM <= 0), where the ratio means nothing."""
    return rdlv_of(
        image_metrics.ssim(reconstruction, original), image_metrics.ssim(prior, original)
    )


def rdlv_of(ssim: float, prior_ssim: float) -> float | None:
    """RDLV from the reconstruction's and the prior's SSIM to the original."""
    if prior_ssim <= 0:
        return None
    return (ssim - prior_ssim) / prior_ssim


def beyond(psnr: float, ssim: float | None, guess_psnr: float, guess_ssim: float | None) -> bool:
    """Whether a reconstruction (or a batch's means) shows more than the best guess: in
    structure (SSIM by its margin, pixels at most the margin behind) or in pixels (PSNR by
    the margin, past the lowest band, structure no worse). Without SSIM, pixels alone."""
    if ssim is None or guess_ssim is None:
        return psnr >= max(guess_psnr + MARGIN_DB, RECOVERED_FLOOR_DB)
    by_structure = ssim >= guess_ssim + SSIM_MARGIN and psnr >= guess_psnr - MARGIN_DB
    by_pixels = psnr >= max(guess_psnr + MARGIN_DB, RECOVERED_FLOOR_DB) and ssim >= guess_ssim
    return by_structure or by_pixels


def nothing_shown(
    psnr: float, ssim: float | None, guess_psnr: float, guess_ssim: float | None
) -> bool:
    """Whether a reconstruction shows nothing of its image: below the best guess by
    ``HELD_MARGIN_DB`` in PSNR, and in SSIM by ``HELD_SSIM_MARGIN`` or, with no more than the
    guess's, under ``HELD_SSIM_FLOOR`` (no structure at all); PSNR alone without SSIM.
    Neither this nor :func:`beyond`: between the guess and the recovered line."""
    below_pixels = psnr <= guess_psnr - HELD_MARGIN_DB
    if ssim is None or guess_ssim is None:
        return below_pixels
    no_structure = ssim <= min(guess_ssim, HELD_SSIM_FLOOR)
    return below_pixels and (ssim <= guess_ssim - HELD_SSIM_MARGIN or no_structure)


def label_p_value(correct: int, batch: int, chance: float) -> float:
    """P(X >= correct) for X ~ Binomial(batch, chance): how often guessing does as well."""
    if correct <= 0:
        return 1.0
    return float(
        sum(
            math.comb(batch, j) * chance**j * (1.0 - chance) ** (batch - j)
            for j in range(correct, batch + 1)
        )
    )


def labels_beyond_chance(correct: int, batch: int, num_classes: int) -> bool:
    """Whether ``correct`` of ``batch`` labels is beyond guessing one of ``num_classes``:
    the one-sided binomial p-value below ``LABEL_ALPHA``. One correct label of 10 classes is
    not (p = 0.1); one of 1000 is (p = 0.001)."""
    if batch <= 0 or num_classes <= 1:
        return False
    return label_p_value(correct, batch, 1.0 / num_classes) < LABEL_ALPHA


def recovered_level(psnr: float) -> str:
    """The level of a recovered image (or batch): FedLeak's band of its PSNR, at least
    Medium (recovered in structure below the lowest band is still a portion recovered)."""
    return leakage_level(max(psnr, RECOVERED_FLOOR_DB))


def _mean(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else float(np.mean(values))


def risk_summary(per_image: Sequence[dict], best_guess: Sequence[dict]) -> dict:
    """What the run recovered, from its scored images (each with ``psnr``, maybe ``ssim``)
    and the best guess per image (``metrics.baseline.best_guess_per_image``)."""
    for image, guess in zip(per_image, best_guess, strict=True):
        image["guess_psnr"] = guess["psnr"]
        image["guess_ssim"] = guess["ssim"]
        image["best_guess"] = guess["guess"]
        image["beyond_guess"] = beyond(
            image["psnr"], image.get("ssim"), guess["psnr"], guess["ssim"]
        )
        image["nothing_shown"] = not image["beyond_guess"] and nothing_shown(
            image["psnr"], image.get("ssim"), guess["psnr"], guess["ssim"]
        )
        image["leakage_level"] = recovered_level(image["psnr"]) if image["beyond_guess"] else None
    recovered = sum(1 for i in per_image if i["beyond_guess"])
    held = sum(1 for i in per_image if i["nothing_shown"])
    psnr_mean = float(np.mean([i["psnr"] for i in per_image]))
    ssim_mean = _mean([i.get("ssim") for i in per_image])
    guess_psnr = float(np.mean([g["psnr"] for g in best_guess]))
    guess_ssim = _mean([g["ssim"] for g in best_guess])
    # The batch's means are judged only where some image was recovered (its means could beat
    # the guesses' means with no image doing so); otherwise nothing was recovered.
    batch_beyond = recovered > 0 and beyond(psnr_mean, ssim_mean, guess_psnr, guess_ssim)
    # A batch that is not beyond the guess as a whole, with some images that are: a portion.
    level = recovered_level(psnr_mean) if batch_beyond else ("Medium" if recovered else None)
    summary = {
        "level": level,
        "meaning": LEVEL_MEANING[level] if level else "nothing beyond the best guess was recovered",
        "basis": f"{RECOVERED_RULE}; the batch's level is FedLeak's band of its mean PSNR when "
        "the batch's means beat the guesses' means the same way, Medium when only some images do",
        "images_recovered": recovered,
        "images_held": held,
        "held_basis": HELD_RULE,
        "batch_size": len(per_image),
        "batch_beyond_guess": batch_beyond,
        "psnr_mean": psnr_mean,
        "ssim_mean": ssim_mean,
        "guess_psnr_mean": guess_psnr,
        "guess_ssim_mean": guess_ssim,
        "images_per_level": {
            name: sum(1 for i in per_image if i["leakage_level"] == name) for name, _ in LEVELS[:3]
        },
        "psnr_success_rate": success_rate([i["psnr"] for i in per_image], PSNR_THRESHOLDS),
    }
    if all("ssim" in i for i in per_image):
        summary["ssim_success_rate"] = success_rate([i["ssim"] for i in per_image], SSIM_THRESHOLDS)
    return summary
