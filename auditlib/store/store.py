"""The Store: every read and write of audit runs, assets, events and images.

Each method is one short session and one transaction (``with Session() as s,
s.begin():``) and returns frozen records, so a Store is safe to share between the
dashboard's threads: the run manager's consumer thread writes a run while Streamlit
pages poll it. Writes go through a separate sessionmaker whose transactions start with
BEGIN IMMEDIATE on SQLite (see ``engine.py``).

Rules the methods enforce, so every caller gets them without repeating them:
- a finished run is immutable: ``finish``, ``mark_running``, ``add_event`` and
  ``add_image`` on it raise :class:`RunFinishedError`; ``request_cancel`` is a no-op;
- writes to an unknown (or deleted) run raise :class:`UnknownRunError`, which tells a
  consumer whose run was deleted to stop;
- JSON columns hold plain JSON: NaN and infinities become null.

Why one class of over 500 lines: the rules above hold because every read and write is a
method of one class over one pair of sessionmakers; split across classes, a new method
could open its own session and skip them. The class is in sections (assets, run writes,
run reads, batches). What needs no session of its own lives apart: records, conversions,
rows to records, the deletions done inside a method's transaction and the view scoped to
one user (``records.py``, ``convert.py``, ``rows.py``, ``deletion.py``, ``scoped.py``).
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer, sessionmaker

from auditlib.errors import AuditInputError
from auditlib.result import AuditSummary
from auditlib.store import schema
from auditlib.store.convert import (
    assets_in_spec,
    check_choice,
    headline_metrics,
    plain_json,
    utcnow,
)
from auditlib.store.deletion import (
    delete_run_rows,
    delete_text_run_rows,
    delete_unused_asset,
    runs_using,
    unused_uploads_before,
)
from auditlib.store.engine import WRITE_OPTION, acquire, default_database_url, describe, release
from auditlib.store.models import (
    Asset,
    AssetOwner,
    Batch,
    Run,
    RunAsset,
    RunEvent,
    RunImage,
    TextRun,
)
from auditlib.store.records import (
    ASSET_KINDS,
    BATCH_KINDS,
    COMPLETED,
    FINISHED,
    IMAGE_KINDS,
    LIVE,
    QUEUED,
    RUNNING,
    STATUSES,
    TIMED_OUT,
    AssetInfo,
    AssetRecord,
    BatchRecord,
    EventRecord,
    ImageRecord,
    RunRecord,
)
from auditlib.store.rows import asset_info, batch_record, event_record, image_record, run_record

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class UnknownRunError(ValueError):
    """No run with that id (never created, or deleted)."""


class RunFinishedError(ValueError):
    """The run already has a final status and cannot change any more."""


_RANK = {COMPLETED: 0, TIMED_OUT: 1}  # which run stands for a spec: one with scores first


class Store:
    """Persistence of audit runs in any SQLAlchemy database (a SQLite file by default).

    Opening checks the schema version (creating the tables in an empty database,
    migrating an older one, refusing a newer or foreign one with AuditInputError). Stores
    on the same URL share one engine; :meth:`close` releases it (the last one disposes
    it). Also a context manager.
    """

    def __init__(self, url: str | None = None) -> None:
        self.url: str = url if url is not None else default_database_url()
        self._shared = acquire(self.url)
        try:
            schema.ensure_schema(self._shared)
        except BaseException:
            release(self._shared)
            raise
        engine = self._shared.engine
        self._reader = sessionmaker(engine, expire_on_commit=False)
        self._writer = sessionmaker(
            engine.execution_options(**{WRITE_OPTION: True}), expire_on_commit=False
        )
        self._closed = False

    def __repr__(self) -> str:
        return f"Store({describe(self.url)!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the engine (the last Store on the URL disposes it); idempotent."""
        if not self._closed:
            self._closed = True
            release(self._shared)

    @contextmanager
    def _session(self, *, write: bool = False) -> Iterator[Session]:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        lock = self._shared.lock if self._shared.lock is not None else nullcontext()
        factory = self._writer if write else self._reader
        with lock, factory() as session, session.begin():
            yield session

    # ---------------------------------------------------------------- assets

    def put_asset(
        self,
        kind: str,
        name: str,
        data: bytes,
        meta: Mapping[str, Any] | None = None,
        *,
        owner: str | None = None,
    ) -> str:
        """Store an upload; returns its sha256 hex. The same bytes again reuse the first row
        (its kind, name and meta are kept), so re-uploading costs nothing; ``owner`` gains a
        claim to it either way, which holds the name and meta they gave (their view of it:
        ``owner=`` on the reads)."""
        check_choice(kind, ASSET_KINDS, "asset kind")
        data = bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        clean_meta = plain_json(meta or {})
        try:
            with self._session(write=True) as s:
                if s.get(Asset, digest, options=[defer(Asset.data)]) is not None:
                    self._claim(s, digest, owner, name, clean_meta)
                    return digest
                s.add(
                    Asset(
                        sha256=digest,
                        kind=kind,
                        name=name[:255],
                        size=len(data),
                        meta=clean_meta,
                        created_at=utcnow(),
                        data=data,
                    )
                )
                s.flush()  # the asset row first: asset_owners refers to it
                self._claim(s, digest, owner, name, clean_meta)
        except IntegrityError:  # a concurrent upload of the same bytes won the race
            if self.get_asset_info(digest) is None:
                raise
            with self._session(write=True) as s:
                self._claim(s, digest, owner, name, clean_meta)
        return digest

    @staticmethod
    def _claim(s: Session, sha256: str, owner: str | None, name: str, meta: dict[str, Any]) -> None:
        """``owner``'s claim, with what they called the file and said of it this time."""
        if owner is None:
            return
        claim = s.get(AssetOwner, (sha256, owner))
        if claim is None:
            s.add(
                AssetOwner(
                    sha256=sha256, owner=owner, name=name[:255], meta=meta, claimed_at=utcnow()
                )
            )
        else:
            claim.name, claim.meta = name[:255], meta

    def asset_owners(self, sha256: str) -> set[str]:
        """The users who uploaded ``sha256`` (empty for an upload from before sign-in)."""
        with self._session() as s:
            return set(s.scalars(select(AssetOwner.owner).where(AssetOwner.sha256 == sha256)))

    def get_asset(self, sha256: str, *, owner: str | None = None) -> AssetRecord | None:
        """An asset with its bytes; with ``owner``, named as that uploader named it."""
        with self._session() as s:
            row = s.get(Asset, sha256)
            if row is None:
                return None
            info = asset_info(row, self._claim_of(s, sha256, owner))
            return AssetRecord(**vars(info), data=bytes(row.data))

    def get_asset_info(self, sha256: str, *, owner: str | None = None) -> AssetInfo | None:
        """An asset without its bytes; with ``owner``, as that uploader named it."""
        with self._session() as s:
            row = s.get(Asset, sha256, options=[defer(Asset.data)])
            return None if row is None else asset_info(row, self._claim_of(s, sha256, owner))

    @staticmethod
    def _claim_of(s: Session, sha256: str, owner: str | None) -> AssetOwner | None:
        return None if owner is None else s.get(AssetOwner, (sha256, owner))

    def list_assets(self, kind: str | None = None, *, owner: str | None = None) -> list[AssetInfo]:
        """Assets newest first, WITHOUT their bytes (AssetInfo; ``get_asset`` loads them);
        with ``owner``, only the uploads that user holds a claim to, as they named them,
        newest claim first."""
        checked = None if kind is None else check_choice(kind, ASSET_KINDS, "asset kind")
        kinds = [] if checked is None else [Asset.kind == checked]
        with self._session() as s:
            if owner is None:
                query = select(Asset).options(defer(Asset.data)).where(*kinds)
                query = query.order_by(Asset.created_at.desc(), Asset.sha256)
                return [asset_info(row) for row in s.scalars(query)]
            newest = func.coalesce(AssetOwner.claimed_at, Asset.created_at).desc()
            claimed = select(Asset, AssetOwner).options(defer(Asset.data)).join(AssetOwner)
            claimed = claimed.where(AssetOwner.owner == owner, *kinds)
            claimed = claimed.order_by(newest, Asset.sha256)
            return [asset_info(row, claim) for row, claim in s.execute(claimed)]

    # ---------------------------------------------------------------- runs: writes

    def create_run(
        self,
        spec: Mapping[str, Any],
        spec_id: str,
        title: str = "",
        *,
        owner: str | None = None,
        instance: str | None = None,
    ) -> str:
        """A new queued run of ``owner`` (None only outside the dashboard: the CLI's own
        databases and tests), run by the dashboard process ``instance``
        (``store.instances``); returns its id (uuid4 hex)."""
        run_id = uuid.uuid4().hex
        clean_spec = plain_json(spec)
        with self._session(write=True) as s:
            s.add(
                Run(
                    id=run_id,
                    spec_id=spec_id,
                    title=title[:200],
                    status=QUEUED,
                    spec=clean_spec,
                    summary=None,
                    error=None,
                    cancel_requested=False,
                    worker="",
                    created_at=utcnow(),
                    owner=owner,
                    instance=instance,
                )
            )
            s.flush()  # the run row first: run_assets refers to it
            for sha in sorted(assets_in_spec(clean_spec)):
                s.add(RunAsset(run_id=run_id, sha256=sha))
        return run_id

    @staticmethod
    def _open_run(s: Session, run_id: str) -> Run:
        """The run row, which must exist and not be finished."""
        run = s.get(Run, run_id)
        if run is None:
            raise UnknownRunError(f"no run {run_id!r}")
        if run.status in FINISHED:
            raise RunFinishedError(f"run {run_id} is already {run.status}; it cannot change")
        return run

    def mark_running(self, run_id: str, worker: str = "") -> None:
        """Queued -> running (``started_at`` now); again on a running run only updates the
        worker, so a retried call is harmless."""
        with self._session(write=True) as s:
            run = self._open_run(s, run_id)
            if run.status == QUEUED:
                run.status = RUNNING
                run.started_at = utcnow()
            run.worker = worker[:200]

    def add_event(
        self,
        run_id: str,
        step: int,
        total: int,
        elapsed_s: float,
        losses: Mapping[str, float],
    ) -> None:
        """Append a progress event; its ``seq`` is one more than the run's previous one."""
        if step < 0 or total < 0:
            raise ValueError(f"step and total must be >= 0, got {step} and {total}")
        if not math.isfinite(elapsed_s) or elapsed_s < 0:
            raise ValueError(f"elapsed_s must be a finite number >= 0, got {elapsed_s}")
        clean_losses = plain_json({str(k): v for k, v in losses.items()})
        with self._session(write=True) as s:
            self._open_run(s, run_id)
            last = s.scalar(select(func.max(RunEvent.seq)).where(RunEvent.run_id == run_id))
            s.add(
                RunEvent(
                    run_id=run_id,
                    seq=0 if last is None else last + 1,
                    step=int(step),
                    total=int(total),
                    elapsed_s=float(elapsed_s),
                    losses=clean_losses,
                    created_at=utcnow(),
                )
            )

    def set_stage(self, run_id: str, stage: str) -> None:
        """Say what the running run does now, once its attack's events have ended (the
        utility training's round); shown beside its progress."""
        with self._session(write=True) as s:
            self._open_run(s, run_id).stage = stage[:200]

    def add_image(self, run_id: str, step: int, kind: str, png: bytes) -> None:
        """Store a PNG. A "live" image replaces the run's previous one (bounded storage);
        "originals" and "reconstruction" are kept (``image`` returns the latest)."""
        check_choice(kind, IMAGE_KINDS, "image kind")
        png = bytes(png)
        if not png.startswith(PNG_SIGNATURE):
            raise ValueError(f"{kind} image of run {run_id} is not PNG data")
        with self._session(write=True) as s:
            self._open_run(s, run_id)
            if kind == LIVE:
                s.execute(delete(RunImage).where(RunImage.run_id == run_id, RunImage.kind == LIVE))
            s.add(RunImage(run_id=run_id, step=int(step), kind=kind, png=png, created_at=utcnow()))

    def finish(
        self,
        run_id: str,
        status: str,
        summary: AuditSummary | None = None,
        error: str | None = None,
    ) -> None:
        """Give the run its final status, summary (as JSON, NaN -> null) and headline columns.

        Raises RunFinishedError when it is already finished: a second, different ending
        (say "completed" after "cancelled") is a bug in the caller, not something to hide.
        """
        check_choice(status, FINISHED, "final status")
        clean = None if summary is None else plain_json(summary.to_json())
        with self._session(write=True) as s:
            run = self._open_run(s, run_id)
            run.status = status
            run.finished_at = utcnow()
            run.summary = clean
            run.error = error
            for column, value in headline_metrics(clean).items():
                setattr(run, column, value)

    def request_cancel(self, run_id: str) -> None:
        """Ask for the run to stop (the run manager acts on it); a no-op once finished."""
        with self._session(write=True) as s:
            run = s.get(Run, run_id)
            if run is None:
                raise UnknownRunError(f"no run {run_id!r}")
            if run.status not in FINISHED:
                run.cancel_requested = True

    def delete_run(self, run_id: str) -> list[AssetInfo]:
        """Delete the run with its events and images, and the uploads (weights, images) that
        no other run uses; returns those uploads. An unknown id is a no-op.

        A writer still attached to a deleted run gets UnknownRunError on its next write.
        """
        with self._session(write=True) as s:
            owner = s.scalar(select(Run.owner).where(Run.id == run_id))
            used = list(s.scalars(select(RunAsset.sha256).where(RunAsset.run_id == run_id)))
            delete_run_rows(s, run_id)
            return [info for sha in used if (info := delete_unused_asset(s, sha, owner))]

    def runs_using_asset(self, sha256: str, *, owner: str | None = None) -> int:
        """How many stored runs, image and text (of ``owner``, if given), use the upload."""
        with self._session() as s:
            return runs_using(s, sha256, owner)

    def delete_asset(self, sha256: str) -> AssetInfo | None:
        """Delete the upload ``sha256`` when no run uses it; returns what was deleted (None
        when it is unknown). Raises AuditInputError while runs use it: they name it, and
        their results would no longer say what was audited."""
        with self._session(write=True) as s:
            users = runs_using(s, sha256)
            if users:
                raise AuditInputError(
                    f"the upload {sha256[:12]}... is used by {users} stored run(s); delete "
                    "those runs first (the upload goes with the last of them)"
                )
            s.execute(delete(AssetOwner).where(AssetOwner.sha256 == sha256))
            return delete_unused_asset(s, sha256)

    def release_asset(self, sha256: str, owner: str) -> AssetInfo | None:
        """``owner`` gives up their upload: their claim goes, and the bytes with it when no
        other user holds a claim and no run uses them; returns what was deleted. Raises
        AuditInputError while runs of ``owner`` use it (their results name it)."""
        with self._session(write=True) as s:
            mine = runs_using(s, sha256, owner)
            if mine:
                raise AuditInputError(
                    f"the upload {sha256[:12]}... is used by {mine} of your stored run(s); "
                    "delete those runs first (the upload goes with the last of them)"
                )
            s.execute(
                delete(AssetOwner).where(AssetOwner.sha256 == sha256, AssetOwner.owner == owner)
            )
            return delete_unused_asset(s, sha256)

    def delete_older_than(self, cutoff: datetime) -> tuple[int, int, tuple[AssetInfo, ...]]:
        """Retention: delete finished runs, image and text, that ended before ``cutoff``,
        batches made before it, then uploads made before it that no remaining run uses;
        returns the counts (runs of both kinds together) and the uploads deleted.
        Unfinished runs stay."""
        with self._session(write=True) as s:
            old = list(
                s.scalars(
                    select(Run.id).where(Run.status.in_(sorted(FINISHED)), Run.finished_at < cutoff)
                )
            )
            for run_id in old:
                delete_run_rows(s, run_id)
            old_text = list(
                s.scalars(
                    select(TextRun.id).where(
                        TextRun.status.in_(sorted(FINISHED)), TextRun.finished_at < cutoff
                    )
                )
            )
            for run_id in old_text:
                delete_text_run_rows(s, run_id)
            batches = cast(
                CursorResult[Any], s.execute(delete(Batch).where(Batch.created_at < cutoff))
            )
            uploads = []
            for sha in unused_uploads_before(s, cutoff):
                s.execute(delete(AssetOwner).where(AssetOwner.sha256 == sha))
                if (info := delete_unused_asset(s, sha)) is not None:
                    uploads.append(info)
            return len(old) + len(old_text), int(batches.rowcount or 0), tuple(uploads)

    # ---------------------------------------------------------------- runs: reads

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._session() as s:
            row = s.get(Run, run_id)
            return None if row is None else run_record(row)

    def list_runs(
        self,
        limit: int = 200,
        status: str | None = None,
        *,
        spec_id: str | None = None,
        owner: str | None = None,
    ) -> list[RunRecord]:
        """Runs newest first; optionally only one status, only runs of one spec id (to
        find earlier results of the very same configuration), or only one user's."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        query = select(Run)
        if owner is not None:
            query = query.where(Run.owner == owner)
        if status is not None:
            query = query.where(Run.status == check_choice(status, STATUSES, "status"))
        if spec_id is not None:
            query = query.where(Run.spec_id == spec_id)
        query = query.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit)
        with self._session() as s:
            return [run_record(row) for row in s.scalars(query)]

    def events(self, run_id: str, after_seq: int = -1) -> list[EventRecord]:
        """The run's events with ``seq > after_seq``, in order (poll with the last seq)."""
        query = (
            select(RunEvent)
            .where(RunEvent.run_id == run_id, RunEvent.seq > after_seq)
            .order_by(RunEvent.seq)
        )
        with self._session() as s:
            return [event_record(row) for row in s.scalars(query)]

    def latest_event(self, run_id: str) -> EventRecord | None:
        query = (
            select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.seq.desc()).limit(1)
        )
        with self._session() as s:
            row = s.scalars(query).first()
            return None if row is None else event_record(row)

    def image(self, run_id: str, kind: str) -> ImageRecord | None:
        """The latest image of that kind, or None."""
        check_choice(kind, IMAGE_KINDS, "image kind")
        query = (
            select(RunImage)
            .where(RunImage.run_id == run_id, RunImage.kind == kind)
            .order_by(RunImage.id.desc())
            .limit(1)
        )
        with self._session() as s:
            row = s.scalars(query).first()
            return None if row is None else image_record(row)

    # ---------------------------------------------------------------- batches

    def create_batch(
        self,
        kind: str,
        title: str,
        definition: Mapping[str, Any],
        *,
        owner: str | None = None,
    ) -> str:
        """Record a comparison or sweep of ``owner``; returns its id (uuid4 hex)."""
        check_choice(kind, BATCH_KINDS, "batch kind")
        batch_id = uuid.uuid4().hex
        with self._session(write=True) as s:
            s.add(
                Batch(
                    id=batch_id,
                    kind=kind,
                    title=title[:200],
                    definition=plain_json(definition),
                    created_at=utcnow(),
                    owner=owner,
                )
            )
        return batch_id

    def get_batch(self, batch_id: str) -> BatchRecord | None:
        with self._session() as s:
            row = s.get(Batch, batch_id)
            return None if row is None else batch_record(row)

    def list_batches(
        self, kind: str | None = None, limit: int = 200, *, owner: str | None = None
    ) -> list[BatchRecord]:
        """Batches newest first; optionally only comparisons or only sweeps, or one user's."""
        query = select(Batch)
        if owner is not None:
            query = query.where(Batch.owner == owner)
        if kind is not None:
            query = query.where(Batch.kind == check_choice(kind, BATCH_KINDS, "batch kind"))
        query = query.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(limit)
        with self._session() as s:
            return [batch_record(row) for row in s.scalars(query)]

    def delete_batch(self, batch_id: str) -> None:
        """Forget the batch; its runs stay (they are ordinary runs, perhaps shared)."""
        with self._session(write=True) as s:
            s.execute(delete(Batch).where(Batch.id == batch_id))

    def runs_for_specs(
        self, spec_ids: Iterable[str], *, owner: str | None = None
    ) -> dict[str, RunRecord]:
        """For each spec id, the run that stands for it: the newest completed one, else the
        newest stopped by its time budget (it has scores), else the newest of any status;
        spec ids with no run are absent. With ``owner``, only that user's runs count (one
        user's comparison never stands on another's runs)."""
        wanted = sorted(set(spec_ids))
        if not wanted:
            return {}
        query = select(Run).where(Run.spec_id.in_(wanted))
        if owner is not None:
            query = query.where(Run.owner == owner)
        query = query.order_by(Run.created_at.desc(), Run.id.desc())
        best: dict[str, RunRecord] = {}
        with self._session() as s:
            for row in s.scalars(query):
                held = best.get(row.spec_id)
                if held is None or _RANK.get(row.status, 2) < _RANK.get(held.status, 2):
                    best[row.spec_id] = run_record(row)
        return best
