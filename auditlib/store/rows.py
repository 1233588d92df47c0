"""ORM rows to the frozen records the Store returns (``records.py``), one function a table.

Every read of the Store ends here, inside its session, so a record never holds a lazy row
that would load after the session closed.
"""

from __future__ import annotations

from auditlib.store.models import Asset, AssetOwner, Batch, Run, RunEvent, RunImage
from auditlib.store.records import AssetInfo, BatchRecord, EventRecord, ImageRecord, RunRecord


def asset_info(row: Asset, claim: AssetOwner | None = None) -> AssetInfo:
    """The upload as stored, or as ``claim``'s uploader gave it (their name, details and
    time) where the claim holds them."""
    name, meta, when = row.name, row.meta, row.created_at
    if claim is not None and claim.name is not None:
        name, meta, when = claim.name, claim.meta or {}, claim.claimed_at or when
    return AssetInfo(row.sha256, row.kind, name, row.size, dict(meta), when)


def run_record(row: Run) -> RunRecord:
    return RunRecord(
        id=row.id,
        spec_id=row.spec_id,
        title=row.title,
        status=row.status,
        spec=dict(row.spec),
        summary=None if row.summary is None else dict(row.summary),
        error=row.error,
        cancel_requested=bool(row.cancel_requested),
        worker=row.worker,
        stage=row.stage,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        psnr_mean=row.psnr_mean,
        ssim_mean=row.ssim_mean,
        lpips_mean=row.lpips_mean,
        label_accuracy=row.label_accuracy,
        iterations=row.iterations,
        seconds=row.seconds,
        owner=row.owner,
        instance=row.instance,
    )


def batch_record(row: Batch) -> BatchRecord:
    return BatchRecord(row.id, row.kind, row.title, dict(row.definition), row.created_at, row.owner)


def event_record(row: RunEvent) -> EventRecord:
    return EventRecord(
        row.seq, row.step, row.total, row.elapsed_s, dict(row.losses), row.created_at
    )


def image_record(row: RunImage) -> ImageRecord:
    return ImageRecord(row.step, row.kind, bytes(row.png), row.created_at)
