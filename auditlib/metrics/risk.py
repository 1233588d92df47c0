"""The leakage verdict of a run: a level from PSNR, the share of images recovered, RDLV.

- Level: FedLeak's bands (Fan et al., USENIX Security 2025, Sec. 5.4): Very High >= 20 dB
  ("nearly all of a client's data can be reconstructed semantically"), High 15-20 ("most of
  it"), Medium 10-15 ("a small portion"), Low below 10 dB (the paper: nothing meaningful).
  A run's level comes from its mean PSNR over the matched images, the paper's statistic;
  each image also gets its own level.
- Success rate: the share of matched images whose metric passes a threshold, over a range
  of thresholds (the curves of the GRNN thesis, Fig. 3.5): PSNR >= t, SSIM >= t, MSE <= t.
- RDLV (Hatamizadeh et al., TMI 2023, as the Shadow paper uses it, Eq. 19):
  (SSIM(x, x_hat) - SSIM(x, prior)) / SSIM(x, prior), prior = the data's mean image; above 0
  the reconstruction reveals more than the template does. Computed per matched pair (the
  Hungarian matching of every other metric, not the authors' best match over all of a
  client's images). The audit passes the data source's mean image as the prior
  (``engine.audit.data_prior``); where there is none the scores say why.
"""

from __future__ import annotations

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
    "Low": "no meaningful image content was recovered",
}
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
    baseline = image_metrics.ssim(prior, original)
    if baseline <= 0:
        return None
    return (image_metrics.ssim(reconstruction, original) - baseline) / baseline


def risk_summary(per_image: Sequence[dict], psnr_mean: float) -> dict:
    """The run's verdict from its scored images (each with ``psnr``, maybe ``ssim``)."""
    for image in per_image:
        image["leakage_level"] = leakage_level(image["psnr"])
    level = leakage_level(psnr_mean)
    summary = {
        "level": level,
        "meaning": LEVEL_MEANING[level],
        "basis": "mean PSNR over the matched images; FedLeak's bands (>= 20 / 15-20 / 10-15 / "
        "< 10 dB)",
        "images_per_level": {
            name: sum(1 for i in per_image if i["leakage_level"] == name) for name, _ in LEVELS
        },
        "psnr_success_rate": success_rate([i["psnr"] for i in per_image], PSNR_THRESHOLDS),
    }
    if all("ssim" in i for i in per_image):
        summary["ssim_success_rate"] = success_rate([i["ssim"] for i in per_image], SSIM_THRESHOLDS)
    return summary
