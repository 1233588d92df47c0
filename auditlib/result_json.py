"""result.json: an audit summary as strict JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such floats become null ."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def summary_json(summary: Mapping[str, Any]) -> str:
    """result.json: the run's summary as strict JSON (unknown objects as strings)."""
    return json.dumps(_finite(summary), indent=2, default=str, allow_nan=False) + "\n"
