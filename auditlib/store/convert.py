"""Small value conversions shared by the store: JSON cleaning, headline metrics, time.

Kept apart from the Store class so they can be tested and reused (the report reads the
same headline numbers) without a database.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from auditlib.result import AuditSummary
from auditlib.result_json import summary_json


def utcnow() -> datetime:
    """Timezone-aware UTC now: every timestamp in the store is aware and in UTC."""
    return datetime.now(UTC)


def plain_json(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` as plain JSON data: NaN/inf -> None, tuples -> lists, odd objects -> str.

    Goes through the same writer as result.json so the database and the file agree, and
    so a value that would not survive a JSON round trip fails here, not in the driver.
    """
    result = json.loads(summary_json(value))
    if not isinstance(result, dict):  # pragma: no cover - summary_json of a Mapping
        raise ValueError("expected a JSON object")
    return result


def assets_in_spec(spec: Mapping[str, Any]) -> set[str]:
    """The sha256 of every upload a run spec (as stored) names: its weights, its own model
    class's file, its images and an observed update's bundle."""
    found: set[str] = set()
    model, data = spec.get("model") or {}, spec.get("data") or {}
    scenario = spec.get("scenario") or {}
    observed = scenario.get("observed") if isinstance(scenario, Mapping) else None
    if (
        isinstance(observed, Mapping)
        and observed.get("source") == "asset"
        and isinstance(observed.get("location"), str)
    ):
        found.add(observed["location"])
    for key in ("weights_asset", "code_asset"):  # weights, an own model class's file
        if isinstance(model, Mapping) and isinstance(model.get(key), str):
            found.add(model[key])
    is_upload = isinstance(data, Mapping) and data.get("source") == "asset"
    if is_upload and isinstance(data.get("location"), str):
        found.add(data["location"])
    return found


def check_choice(value: str, valid: Iterable[str], what: str) -> str:
    """``value`` if it is one of ``valid``; otherwise a ValueError naming the valid ones."""
    choices = sorted(valid)
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(choices)}")
    return value


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite int or float (not a bool); else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def headline_metrics(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """The listing columns taken from a stored summary (any shape ``AuditSummary`` reads):
    the attacker-selected metrics and the timing; None where absent or not finite."""
    if not summary:
        return dict.fromkeys(HEADLINE_COLUMNS)
    result = AuditSummary.from_json(summary)
    iterations = finite_number(result.timing.iterations)
    metrics = result.metrics  # None: an observed update audited without its images (unscored)
    return {
        "psnr_mean": None if metrics is None else finite_number(metrics.mean("psnr")),
        "ssim_mean": None if metrics is None else finite_number(metrics.mean("ssim")),
        "lpips_mean": None if metrics is None else finite_number(metrics.mean("lpips")),
        "label_accuracy": None if metrics is None else finite_number(metrics.label_accuracy),
        "iterations": None if iterations is None else int(iterations),
        "seconds": finite_number(result.timing.seconds),
    }


HEADLINE_COLUMNS = (
    "psnr_mean",
    "ssim_mean",
    "lpips_mean",
    "label_accuracy",
    "iterations",
    "seconds",
)
