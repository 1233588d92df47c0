"""The one definition of every reconstruction metric (see docs/METRICS.md)."""

from auditlib.metrics.evaluate import LPIPS_NETS, evaluate, score, to_unit_range
from auditlib.metrics.image import PSNR_CAP_DB, mse, psnr, psnr_from_mse, ssim
from auditlib.metrics.lpips_metric import availability as lpips_availability
from auditlib.metrics.matching import label_accuracy, match

__all__ = [
    "LPIPS_NETS",
    "PSNR_CAP_DB",
    "evaluate",
    "label_accuracy",
    "lpips_availability",
    "match",
    "mse",
    "psnr",
    "psnr_from_mse",
    "score",
    "ssim",
    "to_unit_range",
]
