"""The sha256 of a file's bytes, read in chunks: how a result names the files it audited
(the CLI's data, a text audit's model folder and text), below every package that does."""

from __future__ import annotations

import hashlib
from pathlib import Path

from auditlib.errors import AuditInputError


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise AuditInputError(f"cannot read {path}: {exc.strerror}") from exc
    return digest.hexdigest()
