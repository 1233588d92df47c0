"""The dashboard processes that run audits (the ``instances`` table) and the runs each owns.

Why: a process must fail only runs whose process is gone. Failing every unfinished run at
start-up, as the first release did, failed the live runs of another dashboard on the same
store (a second replica, a rolling restart). Each process registers here, beats every few
seconds, and records itself on every run it starts (``runs.instance``); who is gone is
decided by ``engine.instance``, which reads these rows. Reads and writes go through the
Store's own sessions, so they keep its transaction rules.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update

from auditlib.store.convert import utcnow
from auditlib.store.models import Instance, Run
from auditlib.store.records import FAILED, UNFINISHED
from auditlib.store.store import Store


@dataclass(frozen=True)
class InstanceRecord:
    id: str
    host: str  # the host name and its pid namespace: where ``pid`` means this process
    pid: int
    process_start: str  # the process's start time in clock ticks (a reused pid differs)
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None


def _record(row: Instance) -> InstanceRecord:
    return InstanceRecord(
        row.id,
        row.host,
        row.pid,
        row.process_start,
        row.started_at,
        row.heartbeat_at,
        row.stopped_at,
    )


class Instances:
    """The instances table of ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def register(self, instance_id: str, host: str, pid: int, process_start: str) -> None:
        now = utcnow()
        with self.store._session(write=True) as s:
            s.add(
                Instance(
                    id=instance_id,
                    host=host[:200],
                    pid=pid,
                    process_start=process_start[:32],
                    started_at=now,
                    heartbeat_at=now,
                    stopped_at=None,
                )
            )

    def beat(self, instance_id: str) -> None:
        """This instance is alive now (raises while the store does not answer)."""
        with self.store._session(write=True) as s:
            s.execute(
                update(Instance).where(Instance.id == instance_id).values(heartbeat_at=utcnow())
            )

    def running(self) -> list[InstanceRecord]:
        """Every instance not recorded as stopped, oldest first."""
        query = select(Instance).where(Instance.stopped_at.is_(None)).order_by(Instance.started_at)
        with self.store._session() as s:
            return [_record(row) for row in s.scalars(query)]

    def get(self, instance_id: str) -> InstanceRecord | None:
        with self.store._session() as s:
            row = s.get(Instance, instance_id)
            return None if row is None else _record(row)

    def stop(self, instance_ids: list[str]) -> None:
        """Record these instances as stopped (their runs are failed by ``fail_runs``)."""
        if not instance_ids:
            return
        with self.store._session(write=True) as s:
            s.execute(
                update(Instance)
                .where(Instance.id.in_(instance_ids), Instance.stopped_at.is_(None))
                .values(stopped_at=utcnow())
            )

    def fail_runs(self, reasons: Mapping[str | None, str]) -> Counter[str | None]:
        """Fail the unfinished runs of each instance in ``reasons`` (None: the runs recorded
        with no instance) with its reason, in one transaction; how many, by owner."""
        failed: Counter[str | None] = Counter()
        if not reasons:
            return failed
        now = utcnow()
        with self.store._session(write=True) as s:
            for instance_id, reason in reasons.items():
                owned = (
                    Run.instance.is_(None) if instance_id is None else Run.instance == instance_id
                )
                unfinished = Run.status.in_(sorted(UNFINISHED))
                owners = list(s.scalars(select(Run.owner).where(owned, unfinished)))
                s.execute(
                    update(Run)
                    .where(owned, unfinished)
                    .values(status=FAILED, error=reason, finished_at=now)
                    .execution_options(synchronize_session=False)
                )
                failed.update(owners)
        return failed

    def cancel_requested(self, instance_id: str) -> list[str]:
        """The unfinished runs of this instance whose Cancel was asked (on any instance)."""
        query = select(Run.id).where(
            Run.instance == instance_id,
            Run.status.in_(sorted(UNFINISHED)),
            Run.cancel_requested.is_(True),
        )
        with self.store._session() as s:
            return list(s.scalars(query))
