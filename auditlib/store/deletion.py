"""Deleting a run's rows and the uploads no run uses, inside a transaction the Store holds.

These functions take the Store's open session and never open one of their own, so the
Store's rules (one session and one transaction a method) still hold; ``Store.delete_run``,
``delete_asset``, ``release_asset`` and ``delete_older_than`` share them, as does
``TextRunStore.delete``: an upload is in use while an image run (``run_assets``) or a text
run (``text_run_assets``) names it.
"""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, defer

from auditlib.store.models import (
    Asset,
    AssetOwner,
    Run,
    RunAsset,
    RunEvent,
    RunImage,
    TextRun,
    TextRunAsset,
)
from auditlib.store.records import AssetInfo
from auditlib.store.rows import asset_info


def delete_unused_asset(s: Session, sha256: str, owner: str | None = None) -> AssetInfo | None:
    """Delete the upload unless a run uses it or a user other than ``owner`` (the owner
    of the run just deleted) holds a claim to it; then only ``owner``'s claim goes."""
    if runs_using(s, sha256):
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


def runs_using(s: Session, sha256: str, owner: str | None = None) -> int:
    """How many stored runs, image and text (``owner``'s alone, if given), use the upload."""
    image = select(func.count()).select_from(RunAsset).where(RunAsset.sha256 == sha256)
    text = select(func.count()).select_from(TextRunAsset).where(TextRunAsset.sha256 == sha256)
    if owner is not None:
        image = image.join(Run, Run.id == RunAsset.run_id).where(Run.owner == owner)
        text = text.join(TextRun, TextRun.id == TextRunAsset.run_id).where(TextRun.owner == owner)
    return int(s.scalar(image) or 0) + int(s.scalar(text) or 0)


def unused_uploads_before(s: Session, cutoff) -> list[str]:
    """The uploads stored before ``cutoff`` that no run, image or text, uses."""
    query = select(Asset.sha256).where(
        Asset.created_at < cutoff,
        Asset.sha256.not_in(select(RunAsset.sha256)),
        Asset.sha256.not_in(select(TextRunAsset.sha256)),
    )
    return list(s.scalars(query))


def delete_text_run_rows(s: Session, run_id: str) -> list[str]:
    """The text run with its upload links (the uploads themselves stay); returns the sha256
    of the uploads it used."""
    used = list(s.scalars(select(TextRunAsset.sha256).where(TextRunAsset.run_id == run_id)))
    s.execute(delete(TextRunAsset).where(TextRunAsset.run_id == run_id))
    s.execute(delete(TextRun).where(TextRun.id == run_id))
    return used
