"""What the store hands back: frozen, plain-Python records, detached from any session.

Callers (Streamlit pages polling from several threads, the report, the run manager) get
values, never ORM objects, so nothing they hold can lazy-load from a closed session or be
mutated into the database by accident. The vocabulary of statuses and kinds lives here
too, as plain strings, because the dashboard shows them and JSON carries them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from auditlib.result import AuditSummary

# Run statuses. QUEUED -> RUNNING -> one of FINISHED; QUEUED may also go straight to a
# finished status (cancelled before it started, or failed to start).
QUEUED = "queued"
RUNNING = "running"
COMPLETED = "completed"
CANCELLED = "cancelled"
TIMED_OUT = "timed_out"
FAILED = "failed"
UNFINISHED: frozenset[str] = frozenset({QUEUED, RUNNING})
FINISHED: frozenset[str] = frozenset({COMPLETED, CANCELLED, TIMED_OUT, FAILED})
STATUSES: frozenset[str] = UNFINISHED | FINISHED

# Uploaded assets: a folder of images, a model file (weights or a trusted archive), an
# observed update's bundle (a zip of its files, auditlib.observed.upload), or the file of a
# model class of the user's own code ("code", where an admin allows trusted code).
ASSET_KINDS: frozenset[str] = frozenset(
    {"images", "model", "observed", "code", "text", "text-model"}
)  # text: a text audit's sequences; text-model: a file of its model folder

# Batches: several runs of one scenario and attack, under several defenses (a comparison)
# or over a grid of a defense's strength (a sweep).
BATCH_KINDS: frozenset[str] = frozenset({"comparison", "sweep", "sample"})

# Run images: "live" is the reconstruction as it converges (only the latest is kept, it is
# overwritten every few steps); "originals" and "reconstruction" are written once per run.
LIVE = "live"
ORIGINALS = "originals"
RECONSTRUCTION = "reconstruction"
IMAGE_KINDS: frozenset[str] = frozenset({LIVE, ORIGINALS, RECONSTRUCTION})


@dataclass(frozen=True)
class AssetInfo:
    """An uploaded file without its bytes: what a listing needs, cheap to load."""

    sha256: str
    kind: str
    name: str
    size: int
    meta: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class AssetRecord(AssetInfo):
    """An uploaded file with its bytes (``Store.get_asset``)."""

    data: bytes


@dataclass(frozen=True)
class RunRecord:
    """One audit run: its spec, state, timestamps, summary and headline metrics.

    The headline metrics are copies of values inside ``summary`` (the attacker-selected
    result and the timing), kept as columns so a listing of many runs need not parse
    every summary; ``None`` where the run has no such value (unfinished, failed, or the
    metric was unavailable, e.g. LPIPS without its weights).
    """

    id: str
    spec_id: str
    title: str
    status: str
    spec: dict[str, Any]
    summary: dict[str, Any] | None
    error: str | None
    cancel_requested: bool
    worker: str
    stage: str | None  # what a running run does after its attack (its utility training)
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    psnr_mean: float | None
    ssim_mean: float | None
    lpips_mean: float | None
    label_accuracy: float | None
    iterations: int | None
    seconds: float | None
    owner: str | None = None  # the user who started it; None: recorded before sign-in
    instance: str | None = None  # the dashboard process running it (None: none recorded)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @cached_property
    def result(self) -> AuditSummary | None:
        """The summary, typed (any stored shape, ``AuditSummary.from_json``); None while the
        run has none."""
        return None if not self.summary else AuditSummary.from_json(self.summary)


@dataclass(frozen=True)
class EventRecord:
    """One progress event; ``seq`` counts 0, 1, 2... per run so pollers can ask for news.

    A loss that was NaN or infinite (a diverging attack) is ``None``: JSON has no NaN.
    """

    seq: int
    step: int
    total: int
    elapsed_s: float
    losses: dict[str, float | None]
    created_at: datetime


@dataclass(frozen=True)
class ImageRecord:
    """A PNG of a run: the live reconstruction, the originals or the final reconstruction."""

    step: int
    kind: str
    png: bytes
    created_at: datetime


@dataclass(frozen=True)
class BatchRecord:
    """A comparison or sweep: ``definition["members"]`` lists its run specs (see
    ``auditlib.engine.batches``); their runs are looked up by spec id."""

    id: str
    kind: str
    title: str
    definition: dict[str, Any]
    created_at: datetime
    owner: str | None = None  # the user who made it; None: recorded before sign-in
