"""ORM tables of the store (SQLAlchemy 2 typed declarative mapping).

Portable types only, so the same tables live in SQLite (the default) and PostgreSQL (a
cluster): JSON (JSONB on PostgreSQL), LargeBinary blobs for PNGs and uploads, and
timestamps through :class:`UTCDateTime`, because SQLite has no timezone-aware type and
would otherwise hand back naive datetimes.

Changing any table here means bumping ``schema.SCHEMA_VERSION`` and registering a
migration in ``schema.MIGRATIONS``; an existing database is never re-created.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on every backend.

    SQLite stores the wall time without an offset, so values are converted to UTC and
    stored naive there, and read back as UTC. PostgreSQL gets ``timestamptz``.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the store keeps aware UTC times")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType = JSON().with_variant(JSONB(), "postgresql")


class Base(DeclarativeBase):
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute
        datetime: UTCDateTime(),
        dict[str, Any]: JSONType,
        bytes: LargeBinary(),
    }


class SchemaInfo(Base):
    """One row (id 1): the schema version this database was written with."""

    __tablename__ = "schema_info"

    id: Mapped[int] = mapped_column(primary_key=True)
    version: Mapped[int]
    created_at: Mapped[datetime]


class Asset(Base):
    """An uploaded file, keyed by the sha256 of its bytes so re-uploads are free."""

    __tablename__ = "assets"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), index=True)
    name: Mapped[str] = mapped_column(String(255))
    size: Mapped[int]
    meta: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    data: Mapped[bytes]


class Run(Base):
    """One audit run. Headline metrics are denormalised copies of the summary's values."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_created_at", "created_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    spec_id: Mapped[str] = mapped_column(String(64), index=True)
    title: Mapped[str] = mapped_column(String(200), default="")
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]]
    summary: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    worker: Mapped[str] = mapped_column(String(200), default="")
    stage: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    psnr_mean: Mapped[float | None]
    ssim_mean: Mapped[float | None]
    lpips_mean: Mapped[float | None]
    label_accuracy: Mapped[float | None]
    iterations: Mapped[int | None]
    seconds: Mapped[float | None]
    owner: Mapped[str | None] = mapped_column(String(64), index=True)  # None: before sign-in
    # The dashboard process running it (``Instance.id``); None: recorded before instances
    # were, or by the CLI, which runs in the foreground and owns nothing afterwards.
    instance: Mapped[str | None] = mapped_column(String(32), index=True)


class Instance(Base):
    """A dashboard process that runs audits. Its runs are its alone: another process fails
    them only once this one is gone (its pid ended, its heartbeat stopped, or it stopped)."""

    __tablename__ = "instances"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))  # the host name and its pid namespace
    pid: Mapped[int]
    process_start: Mapped[str] = mapped_column(String(32))  # tells a reused pid apart
    started_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime]
    stopped_at: Mapped[datetime | None]


class AssetOwner(Base):
    """A user who uploaded the asset (schema 5). Assets are keyed by their bytes, so two
    users who upload the same file share one row and each holds a claim to it."""

    __tablename__ = "asset_owners"

    sha256: Mapped[str] = mapped_column(
        ForeignKey("assets.sha256", ondelete="CASCADE"), primary_key=True
    )
    owner: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)
    # The uploader's own file name, details and time for the shared bytes (schema 6): the
    # second uploader of a file must not see the first one's file or class names, nor when
    # the file first came. None on claims migrated from schema 5 (the asset row's then).
    name: Mapped[str | None] = mapped_column(String(255))
    meta: Mapped[dict[str, Any] | None]
    claimed_at: Mapped[datetime | None]


class RunAsset(Base):
    """An upload a run uses (its weights, its images): an upload no run uses any more is
    deleted with the last run that used it."""

    __tablename__ = "run_assets"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)


class RunEvent(Base):
    """A progress event; ``seq`` is 0, 1, 2... within its run (unique per run)."""

    __tablename__ = "run_events"
    __table_args__ = (UniqueConstraint("run_id", "seq", name="uq_run_events_run_seq"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    seq: Mapped[int]
    step: Mapped[int]
    total: Mapped[int]
    elapsed_s: Mapped[float]
    losses: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class RunImage(Base):
    """A PNG of a run; the latest row of a (run, kind) is the current one."""

    __tablename__ = "run_images"
    __table_args__ = (Index("ix_run_images_run_kind", "run_id", "kind", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int]
    kind: Mapped[str] = mapped_column(String(16))
    png: Mapped[bytes]
    created_at: Mapped[datetime]


class Batch(Base):
    """A comparison or a sweep: a named set of run specs (its members).

    Members are found among the runs by spec id, not linked by run id, so a member that an
    earlier run (of any batch, or a single audit) already computed is not computed again.
    """

    __tablename__ = "batches"
    __table_args__ = (Index("ix_batches_created_at", "created_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    title: Mapped[str] = mapped_column(String(200), default="")
    definition: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    owner: Mapped[str | None] = mapped_column(String(64), index=True)  # None: before sign-in


class TextRun(Base):
    """A text model's audit (schema 8; ``store/text_runs.py``): its own table, as a text
    audit's spec, progress and result share no column with an image run's. ``live`` is the
    latest progress (the best sequences so far); ``result`` the result.json of
    ``text_result_json``."""

    __tablename__ = "text_runs"
    __table_args__ = (Index("ix_text_runs_created_at", "created_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    title: Mapped[str] = mapped_column(String(200), default="")
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]]
    live: Mapped[dict[str, Any] | None]
    result: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    owner: Mapped[str | None] = mapped_column(String(64), index=True)
    instance: Mapped[str | None] = mapped_column(String(32), index=True)


class TextRunAsset(Base):
    """An upload a text run uses (schema 9): its model folder's files, its text file. As
    for ``run_assets``, an upload a run names is not deleted while the run is stored, and
    it goes with the last run that used it."""

    __tablename__ = "text_run_assets"

    run_id: Mapped[str] = mapped_column(
        ForeignKey("text_runs.id", ondelete="CASCADE"), primary_key=True
    )
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)
