"""Deleting a run's rows and the uploads no run uses, inside a transaction the Store holds.

These functions take the Store's open session and never open one of their own, so the
Store's rules (one session and one transaction a method) still hold; ``Store.delete_run``,
``delete_asset``, ``release_asset`` and ``delete_older_than`` share them.
"""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, defer

from auditlib.store.models import Asset, AssetOwner, Run, RunAsset, RunEvent, RunImage
from auditlib.store.records import AssetInfo
from auditlib.store.rows import asset_info


def delete_unused_asset(s: Session, sha256: str, owner: str | None = None) -> AssetInfo | None:
    """Delete the upload unless a run uses it or a user other than ``owner`` (the owner
    of the run just deleted) holds a claim to it; then only ``owner``'s claim goes."""
    if s.scalar(select(RunAsset.sha256).where(RunAsset.sha256 == sha256).limit(1)):
        return None
    claims = set(s.scalars(select(AssetOwner.owner).where(AssetOwner.sha256 == sha256)))
    if claims - {owner}:
        s.execute(delete(AssetOwner).where(AssetOwner.sha256 == sha256, AssetOwner.owner == owner))
        return None
    row = s.get(Asset, sha256, options=[defer(Asset.data)])
    if row is None:
        return None
    info = asset_info(row)
    s.execute(delete(AssetOwner).where(AssetOwner.sha256 == sha256))
    s.execute(delete(Asset).where(Asset.sha256 == sha256))
    return info


def delete_run_rows(s: Session, run_id: str) -> None:
    """The run with its upload links, events and images (the uploads themselves stay)."""
    s.execute(delete(RunAsset).where(RunAsset.run_id == run_id))
    s.execute(delete(RunEvent).where(RunEvent.run_id == run_id))
    s.execute(delete(RunImage).where(RunImage.run_id == run_id))
    s.execute(delete(Run).where(Run.id == run_id))
