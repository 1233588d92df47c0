"""Persistence of audit runs (SQLAlchemy 2; a SQLite file by default, any URL by setting).

One writer per run (the dashboard's consumer thread) and many readers (Streamlit pages
polling) share a :class:`Store`. See ``store.py`` for the rules it enforces, ``engine.py``
for the connection settings and why, ``schema.py`` for versioning and migrations.
"""

from auditlib.store.engine import data_dir, default_database_url
from auditlib.store.records import (
    ASSET_KINDS,
    BATCH_KINDS,
    CANCELLED,
    COMPLETED,
    FAILED,
    FINISHED,
    IMAGE_KINDS,
    LIVE,
    ORIGINALS,
    QUEUED,
    RECONSTRUCTION,
    RUNNING,
    STATUSES,
    TIMED_OUT,
    UNFINISHED,
    AssetInfo,
    AssetRecord,
    BatchRecord,
    EventRecord,
    ImageRecord,
    RunRecord,
)
from auditlib.store.schema import MIGRATIONS, SCHEMA_VERSION
from auditlib.store.store import RunFinishedError, Store, UnknownRunError

__all__ = [
    "ASSET_KINDS",
    "BATCH_KINDS",
    "CANCELLED",
    "COMPLETED",
    "FAILED",
    "FINISHED",
    "IMAGE_KINDS",
    "LIVE",
    "MIGRATIONS",
    "ORIGINALS",
    "QUEUED",
    "RECONSTRUCTION",
    "RUNNING",
    "SCHEMA_VERSION",
    "STATUSES",
    "TIMED_OUT",
    "UNFINISHED",
    "AssetInfo",
    "AssetRecord",
    "BatchRecord",
    "EventRecord",
    "ImageRecord",
    "RunFinishedError",
    "RunRecord",
    "Store",
    "UnknownRunError",
    "data_dir",
    "default_database_url",
]
