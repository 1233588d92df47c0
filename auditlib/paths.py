"""Where the product keeps its files: one data folder for the database, the users file and
the uploads it stores (below every package, so the store and the users file agree on it)."""

from __future__ import annotations

import os
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """``$AUDIT_DATA_DIR``, else ``<repo root>/data``; created if missing."""
    configured = os.environ.get("AUDIT_DATA_DIR", "").strip()
    path = Path(configured).expanduser() if configured else _REPO_ROOT / "data"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()
