"""The metric catalogue: each reported number's key, label, unit, format, direction and
definition, written once and read by the pages, the PDF and the Method page.

``METRIC_DEFINITION`` is the one-paragraph definition recorded in every result.json.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from auditlib.metrics.risk import RECOVERED_RULE

NOT_AVAILABLE = "n/a"
RECOVERED_PSNR_DB = (
    20.0  # FedLeak's "Very High" floor: the share at or above it is the success rate
)

METRIC_DEFINITION = (
    "images de-normalised with the batch mean/std and clamped to [0,1]; reconstructions matched "
    "to originals by the Hungarian algorithm on MSE; PSNR = 10 log10(1/MSE) per image (data range 1, "
    "capped at 100 dB); SSIM Gaussian window 11, sigma 1.5, data range 1 (scikit-image); LPIPS "
    "(lpips package, normalize=True) AlexNet and VGG; label accuracy order-free (multiset)"
)


@dataclass(frozen=True)
class MetricInfo:
    """One reported number."""

    key: str  # as in Scores.mean(key) / the utility record; also the column name
    label: str  # a table's heading, without the unit
    unit: str  # "dB", "%" (a share shown as a percentage) or "" (a plain number)
    format: str  # Python format spec of the value as stored (".0%" for a share)
    direction: Literal["higher leaks", "lower leaks", "higher is better", "lower is more private"]
    definition: str  # one sentence, as the PDF and the Method page print it

    @property
    def heading(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit and self.unit != "%" else self.label

    def text(self, value: Any) -> str:
        """``value`` in this metric's format; "n/a" for None or a non-finite number."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return NOT_AVAILABLE
        if not math.isfinite(value):
            return NOT_AVAILABLE
        if self.format == "e":
            return short_number(value)
        return format(value, self.format)


def short_number(value: float) -> str:
    """3 significant digits, tiny or large numbers as 2.06e-5 or 1.98e11 (one form, never
    2.09e+03): what the "e" format of the catalogue prints."""
    plain = value == 0 or 1e-3 <= abs(value) < 1e3
    text = f"{value:.3g}" if plain else f"{value:.2e}"
    if "e" in text:  # also .3g's own exponent where rounding reaches 1000 (999.7 -> 1e+03)
        mantissa, exponent = text.split("e")
        return f"{mantissa}e{int(exponent)}"
    return text


# Above this an epsilon bounds nothing an auditor can use: e^10 is about 22,000, the factor by
# which the guarantee lets an attacker's odds about one example grow.
MEANINGFUL_EPSILON = 10.0
EPSILON_NOTE = (
    f"an ε above {MEANINGFUL_EPSILON:g} gives no meaningful formal guarantee (the bound lets "
    f"an attacker's odds about one example grow by a factor of up to e^ε, already about "
    f"{math.exp(MEANINGFUL_EPSILON):,.0f} at ε = {MEANINGFUL_EPSILON:g})"
)


def epsilon_note(values: Iterable[float | None]) -> str | None:
    """``EPSILON_NOTE`` where some of ``values`` is an ε above ``MEANINGFUL_EPSILON``; else None."""
    big = [v for v in values if isinstance(v, int | float) and v > MEANINGFUL_EPSILON]
    return EPSILON_NOTE if big else None


RECONSTRUCTION_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        "psnr",
        "PSNR",
        "dB",
        ".2f",
        "higher leaks",
        "peak signal-to-noise ratio, 10·log10(1/MSE) between a private image and its "
        "reconstruction, pixel values in [0, 1], capped at 100 dB",
    ),
    MetricInfo(
        "ssim",
        "SSIM",
        "",
        ".3f",
        "higher leaks",
        "structural similarity (up to 1), Gaussian window 11, σ 1.5, data range 1",
    ),
    MetricInfo(
        "lpips",
        "LPIPS (AlexNet)",
        "",
        ".3f",
        "lower leaks",
        "learned perceptual distance on AlexNet features, 0 = identical",
    ),
    MetricInfo(
        "lpips_vgg",
        "LPIPS (VGG)",
        "",
        ".3f",
        "lower leaks",
        "learned perceptual distance on VGG-16 features, 0 = identical",
    ),
    MetricInfo(
        "mse", "MSE", "", ".4g", "lower leaks", "mean squared pixel error, pixels in [0, 1]"
    ),
    MetricInfo(
        "label_accuracy",
        "Label accuracy",
        "%",
        ".0%",
        "higher leaks",
        "share of the private labels the attacker recovered (order-free)",
    ),
    MetricInfo(
        "rdlv",
        "RDLV",
        "",
        ".3f",
        "higher leaks",
        "relative data leakage value, (SSIM(x, x̂) − SSIM(x, prior)) / SSIM(x, prior) with the "
        "data's mean image as the prior; above 0 the reconstruction reveals more than a guess "
        "from the data's average does",
    ),
)

RECOVERED = MetricInfo(
    "recovered",
    f"Recovered ≥{RECOVERED_PSNR_DB:g} dB",
    "%",
    ".0%",
    "higher leaks",
    f"share of the batch's images at or above {RECOVERED_PSNR_DB:g} dB PSNR (the attack's "
    f"success rate); the verdict counts images recovered beyond the best guess: {RECOVERED_RULE}",
)

UTILITY_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        "accuracy",
        "Accuracy",
        "%",
        ".1%",
        "higher is better",
        "of the model trained with FedAvg under the defense, on held-out data",
    ),
    MetricInfo(
        "macro_f1",
        "Macro F1",
        "",
        ".3f",
        "higher is better",
        "the mean over classes of F1 of the model trained under the defense, on held-out data",
    ),
    MetricInfo(
        "accuracy_without_key",
        "Accuracy w/o key",
        "%",
        ".1%",
        "higher is better",
        "FedKL's trained model used without its client's key",
    ),
    MetricInfo(
        "epsilon",
        "ε",
        "",
        "e",
        "lower is more private",
        "the differential-privacy bound (with δ) the defense's accountant states for the "
        f"client's update; {EPSILON_NOTE}",
    ),
)

CATALOGUE: dict[str, MetricInfo] = {
    m.key: m for m in (*RECONSTRUCTION_METRICS, RECOVERED, *UTILITY_METRICS)
}


def metric(key: str) -> MetricInfo:
    return CATALOGUE[key]
