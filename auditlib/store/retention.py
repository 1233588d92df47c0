"""How long the store keeps what it holds: ``AUDIT_RETENTION_DAYS`` (unset: until deleted).

Expiry deletes finished runs that ended more than that many days ago, with their events and
images, then the comparisons and sweeps made that long ago, then the uploads made that long
ago that no remaining run uses (whoever uploaded them). Unfinished runs are never expired.
The run manager expires at start and before each run it starts; the PDF report states the
setting, so a reader knows where the data lives and for how long.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta
from typing import NamedTuple

from auditlib.errors import AuditInputError
from auditlib.store.convert import utcnow
from auditlib.store.engine import describe
from auditlib.store.records import AssetInfo
from auditlib.store.store import Store

RETENTION_ENV = "AUDIT_RETENTION_DAYS"


def retention_days() -> float | None:
    """The configured retention in days, or None (keep until deleted). A value that is not a
    positive number is refused, so a typo never means "keep forever" or "delete all"."""
    text = os.environ.get(RETENTION_ENV, "").strip()
    if not text:
        return None
    try:
        days = float(text)
    except ValueError:
        days = math.nan
    if not math.isfinite(days) or days <= 0:
        raise AuditInputError(
            f"{RETENTION_ENV}={text!r}: expected a positive number of days (unset: keep runs "
            "until they are deleted)"
        )
    return days


class Expired(NamedTuple):
    runs: int
    batches: int
    uploads: tuple[AssetInfo, ...]


def expire(store: Store, days: float | None = None) -> Expired:
    """Delete what is older than ``days`` (default: the setting); nothing without one."""
    days = retention_days() if days is None else days
    if days is None:
        return Expired(0, 0, ())
    cutoff = utcnow() - timedelta(days=days)
    return Expired(*store.delete_older_than(cutoff))


def where_and_how_long(store: Store) -> str:
    """Where the audit's data lives and for how long, in words for the report."""
    days = retention_days()
    kept = (
        f"kept {days:g} days after a run ends, then deleted with its images and the uploads "
        "no other run uses"
        if days is not None
        else "kept until its owner or an admin deletes it (no retention period is set)"
    )
    return f"Runs, images and uploads are stored in {describe(store.url)}; {kept}."
