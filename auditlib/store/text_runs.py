"""Text models' audits in the store (the ``text_runs`` table, schema 8): the raw reads and
writes (:class:`TextRunStore`) and one user's view of them (:class:`UserTextRuns`).

A text run is not a row of ``runs``: its spec (``engine.text_audit.TextAuditSpec``), its
progress (the best sequences so far) and its result (``text_result_json``) share no column
with an image run's, and every page that lists runs reads those as image audits. The rules
are the ``runs`` table's: one short transaction per method through the Store's own
sessions, a finished run is immutable (:class:`~auditlib.store.RunFinishedError`), an
unknown one raises :class:`~auditlib.store.UnknownRunError`, JSON is plain JSON.
Private text (the auditor's sequences, what was recovered) is in ``live`` and ``result``:
the user's view refuses another user's run with ``AccessDenied`` (an admin sees all, as
for images). The uploads a run uses (its model folder, its text file) are linked to it
(``text_run_assets``, schema 9) as an image run's are: kept while it is stored, deleted
with the last run that used them, and by retention with the run (``Store.delete_older_than``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select

from auditlib.access import Principal
from auditlib.store.convert import check_choice, plain_json, utcnow
from auditlib.store.deletion import delete_text_run_rows, delete_unused_asset
from auditlib.store.models import TextRun, TextRunAsset
from auditlib.store.records import FINISHED, QUEUED, RUNNING, UNFINISHED, AssetInfo
from auditlib.store.store import RunFinishedError, Store, UnknownRunError


@dataclass(frozen=True)
class TextRunRecord:
    id: str
    title: str
    status: str
    spec: dict[str, Any]
    live: dict[str, Any] | None  # {"stage", "attack", "texts", "note"} of the latest event
    result: dict[str, Any] | None  # result.json (``text_result_read.read_text_result``)
    error: str | None
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    owner: str | None
    instance: str | None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


def _record(row: TextRun) -> TextRunRecord:
    return TextRunRecord(
        row.id, row.title, row.status, dict(row.spec),
        None if row.live is None else dict(row.live),
        None if row.result is None else dict(row.result),
        row.error, bool(row.cancel_requested), row.created_at, row.started_at,
        row.finished_at, row.owner, row.instance,
    )  # fmt: skip


class TextRunStore:
    """The text runs of ``store``'s database."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _open(self, s, run_id: str) -> TextRun:
        row = s.get(TextRun, run_id)
        if row is None:
            raise UnknownRunError(f"no text run {run_id!r}")
        if row.status in FINISHED:
            raise RunFinishedError(f"text run {run_id} is already {row.status}; it cannot change")
        return row

    def create(
        self,
        spec: Mapping[str, Any],
        title: str = "",
        *,
        owner: str | None,
        instance: str | None = None,
        assets: Iterable[str] = (),
    ) -> str:
        """Record a queued run; ``assets``: the sha256 of the uploads it uses (kept while
        it is stored)."""
        run_id = uuid.uuid4().hex
        with self.store._session(write=True) as s:
            s.add(
                TextRun(
                    id=run_id, title=title[:200], status=QUEUED, spec=plain_json(spec),
                    live=None, result=None, error=None, cancel_requested=False,
                    created_at=utcnow(), owner=owner, instance=instance,
                )
            )  # fmt: skip
            s.flush()  # the run row first: text_run_assets refers to it
            for sha in sorted(set(assets)):
                s.add(TextRunAsset(run_id=run_id, sha256=sha))
        return run_id

    def assets(self, run_id: str) -> list[str]:
        """The sha256 of the uploads the run uses."""
        query = select(TextRunAsset.sha256).where(TextRunAsset.run_id == run_id)
        with self.store._session() as s:
            return sorted(s.scalars(query))

    def progress(self, run_id: str, live: Mapping[str, Any]) -> None:
        """The latest event (queued -> running at the first)."""
        with self.store._session(write=True) as s:
            row = self._open(s, run_id)
            if row.status == QUEUED:
                row.status, row.started_at = RUNNING, utcnow()
            row.live = plain_json(live)

    def finish(
        self,
        run_id: str,
        status: str,
        result: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        check_choice(status, FINISHED, "final status")
        with self.store._session(write=True) as s:
            row = self._open(s, run_id)
            row.status, row.finished_at, row.error = status, utcnow(), error
            row.result = None if result is None else plain_json(result)

    def request_cancel(self, run_id: str) -> None:
        with self.store._session(write=True) as s:
            row = s.get(TextRun, run_id)
            if row is None:
                raise UnknownRunError(f"no text run {run_id!r}")
            if row.status not in FINISHED:
                row.cancel_requested = True

    def get(self, run_id: str) -> TextRunRecord | None:
        with self.store._session() as s:
            row = s.get(TextRun, run_id)
            return None if row is None else _record(row)

    def list(self, limit: int = 200, *, owner: str | None = None) -> list[TextRunRecord]:
        """Newest first; ``owner``'s alone, or everyone's for None."""
        query = select(TextRun).order_by(TextRun.created_at.desc()).limit(limit)
        if owner is not None:
            query = query.where(TextRun.owner == owner)
        with self.store._session() as s:
            return [_record(row) for row in s.scalars(query)]

    def unfinished(self) -> list[TextRunRecord]:
        query = select(TextRun).where(TextRun.status.in_(sorted(UNFINISHED)))
        with self.store._session() as s:
            return [_record(row) for row in s.scalars(query)]

    def delete(self, run_id: str) -> list[AssetInfo]:
        """Delete the run, and the uploads it used that no other run uses (or only the
        run owner's claim, where another user holds one); returns the uploads deleted. An
        unknown id is a no-op; a writer still attached gets UnknownRunError next."""
        with self.store._session(write=True) as s:
            owner = s.scalar(select(TextRun.owner).where(TextRun.id == run_id))
            used = delete_text_run_rows(s, run_id)
            return [info for sha in used if (info := delete_unused_asset(s, sha, owner))]


class UserTextRuns:
    """The text runs ``principal`` may see: their own (an admin: everyone's)."""

    def __init__(self, runs: TextRunStore, principal: Principal) -> None:
        self.raw = runs
        self.principal = principal

    def get(self, run_id: str) -> TextRunRecord | None:
        record = self.raw.get(run_id)
        if record is not None and not self.principal.may_see(record.owner):
            raise self.principal.refuse(f"text run {run_id}", record.owner)
        return record

    def list(self, limit: int = 200) -> list[TextRunRecord]:
        owner = None if self.principal.is_admin else self.principal.username
        return self.raw.list(limit, owner=owner)

    def delete(self, run_id: str) -> list[AssetInfo]:
        if self.get(run_id) is None:
            return []
        return self.raw.delete(run_id)
