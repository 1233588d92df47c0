"""Per-image similarity between a reconstruction and its original, on [0, 1] pixels.

Inputs are H x W x C float arrays already de-normalised and clamped to [0, 1]
(:func:`auditlib.metrics.prepare.to_unit_range`).
"""

from __future__ import annotations

import math

import numpy as np
from skimage.metrics import structural_similarity

PSNR_CAP_DB = 100.0  # an exact copy has MSE 0 and infinite PSNR; reported as this cap
SSIM_WINDOW = 11
SSIM_SIGMA = 1.5


def mse(reconstruction: np.ndarray, original: np.ndarray) -> float:
    return float(np.mean((reconstruction.astype(np.float64) - original.astype(np.float64)) ** 2))


def psnr_from_mse(value: float) -> float:
    """10 log10(1 / MSE): PSNR for data range 1, capped at ``PSNR_CAP_DB``."""
    if value <= 10 ** (-PSNR_CAP_DB / 10):
        return PSNR_CAP_DB
    return 10.0 * math.log10(1.0 / value)


def psnr(reconstruction: np.ndarray, original: np.ndarray) -> float:
    return psnr_from_mse(mse(reconstruction, original))


def ssim_unavailable_reason(height: int, width: int) -> str | None:
    if min(height, width) < SSIM_WINDOW:
        return f"SSIM needs images of at least {SSIM_WINDOW}x{SSIM_WINDOW} pixels (its Gaussian window)"
    return None


def ssim(reconstruction: np.ndarray, original: np.ndarray) -> float:
    """Gaussian-window SSIM (Wang et al. 2004): window 11, sigma 1.5, data range 1.

    scikit-image with ``gaussian_weights=True, sigma=1.5, use_sample_covariance=False``
    is the reference implementation's setting; colour images average the channel SSIMs.
    """
    channel_axis = -1 if original.shape[-1] > 1 else None
    a = reconstruction if channel_axis is not None else reconstruction[..., 0]
    b = original if channel_axis is not None else original[..., 0]
    return float(
        structural_similarity(
            b.astype(np.float64),
            a.astype(np.float64),
            data_range=1.0,
            gaussian_weights=True,
            sigma=SSIM_SIGMA,
            use_sample_covariance=False,
            channel_axis=channel_axis,
        )
    )
