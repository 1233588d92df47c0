"""Observed updates: an update a client actually sent, audited in place of a simulated
client (docs/OBSERVED.md).

A bundle (``bundle.py``) holds the global weights the round started from, the client's
new weights or their difference, and how it trained (``record.py``: training.json). The
engine builds the model and the server's release from it (``engine.releases``), so the
attacks cannot tell it from a simulated update.

Below the engine: it reads models, the client's protocol, the threat model's types and the
errors, never the attacks, the engine, the store or the report (pyproject.toml's contract).
"""

from auditlib.observed.bundle import (
    CLIENT_FILE,
    DELTA_FILE,
    GLOBAL_FILE,
    ObservedBundle,
    bundle_from_files,
    load_bundle,
    write_bundle,
)
from auditlib.observed.record import FILE as TRAINING_FILE
from auditlib.observed.record import TrainingRecord
from auditlib.observed.upload import bundle_archive, bundle_from_archive, bundle_from_upload

__all__ = [
    "CLIENT_FILE",
    "DELTA_FILE",
    "GLOBAL_FILE",
    "TRAINING_FILE",
    "ObservedBundle",
    "TrainingRecord",
    "bundle_archive",
    "bundle_from_archive",
    "bundle_from_files",
    "bundle_from_upload",
    "load_bundle",
    "write_bundle",
]
