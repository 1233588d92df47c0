"""Where the product keeps its files: one data folder for the database, the users file and
the uploads it stores (below every package, so the store and the users file agree on it)."""

from __future__ import annotations

import os
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]


def assets_dir() -> Path:
    """The checkout's ``assets/``: files the product ships (the demo tokenizers)."""
    return _REPO_ROOT / "assets"


def data_dir() -> Path:
    """``$AUDIT_DATA_DIR``, else ``<repo root>/data``; created if missing, and kept private
    (0700: it holds every user's images, weights and reconstructions)."""
    configured = os.environ.get("AUDIT_DATA_DIR", "").strip()
    path = Path(configured).expanduser() if configured else _REPO_ROOT / "data"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    private(path, 0o700)
    return path.resolve()


def private(path: Path, mode: int) -> None:
    """``path`` readable by its owner only (``mode``: 0700 for a folder, 0600 for a file),
    where this process owns it and it is more open than that (another user's file is left
    as it is: changing it is not this process's to do)."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return
    if status.st_uid == os.getuid() and status.st_mode & 0o077:
        path.chmod(mode)
