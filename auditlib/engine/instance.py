"""This dashboard process as one instance among those sharing a store.

Each process that runs audits registers itself (``store.instances``), beats every
``AUDIT_HEARTBEAT_S`` seconds, and on each beat reconciles: the unfinished runs of an
instance that is gone are failed with the reason it is known to be gone. An instance is
gone when its process has ended (same host: its pid no longer runs the process that
registered) or, on another host, when its heartbeat is older than
``AUDIT_INSTANCE_STALE_S`` while this one has reached the store all that time (so an
outage of the store itself, which stops every beat, fails nobody). The live runs of another
instance are never touched, and a Cancel asked on any instance reaches the one running the
run through the store (``cancel_requested``), read on each beat.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from auditlib.store import Store
from auditlib.store.convert import utcnow
from auditlib.store.instances import InstanceRecord, Instances

_LOG = logging.getLogger("auditlib.instance")

# Runs recorded before instances were (schema 6 and older) have no instance; none can be
# alive, since an older release refuses the newer schema.
NO_INSTANCE_REASON = "the dashboard stopped while this run was in progress; its worker is gone"


def heartbeat_s() -> float:
    return float(os.environ.get("AUDIT_HEARTBEAT_S", "5"))


def stale_after_s() -> float:
    return float(os.environ.get("AUDIT_INSTANCE_STALE_S", "30"))


def host_key() -> str:
    """Where a pid means one process: the host name and this pid namespace (two containers
    of one pod share a host name, not their pids)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "no-pid-namespace"
    return f"{socket.gethostname()} {namespace}"


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat);
    None when no such process runs (or /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19] if len(fields) > 19 else None


def process_alive(record: InstanceRecord) -> bool | None:
    """Whether the instance's process still runs: True or False on its own host, None
    elsewhere (only its heartbeat can tell)."""
    if record.host != host_key():
        return None
    return process_start(record.pid) == record.process_start


@dataclass(frozen=True)
class Identity:
    id: str
    host: str
    pid: int
    process_start: str

    @classmethod
    def of_this_process(cls) -> Identity:
        pid = os.getpid()
        return cls(uuid.uuid4().hex, host_key(), pid, process_start(pid) or "unknown")


def _host_name(record: InstanceRecord) -> str:
    return record.host.split(" ", 1)[0]


def gone_reasons(
    records: list[InstanceRecord],
    me: str,
    now: datetime,
    store_ok_since: datetime | None,
    stale_after: float,
    alive: Callable[[InstanceRecord], bool | None] = process_alive,
) -> dict[str, str]:
    """The instances among ``records`` that are gone, each with why, in words a run's
    reason can carry. A heartbeat is stale only while this instance has reached the store
    for the whole window (``store_ok_since``): an outage stops every beat."""
    gone = {}
    trusted = store_ok_since is not None and now - store_ok_since >= timedelta(seconds=stale_after)
    for record in records:
        if record.id == me:
            continue
        where = f"{_host_name(record)}, pid {record.pid}"
        running = alive(record)
        if running is False:
            gone[record.id] = (
                f"the dashboard process running it ({where}) ended while it was in progress; "
                "its worker ended with it"
            )
        elif running is None and trusted:
            age = (now - record.heartbeat_at).total_seconds()
            if age > stale_after:
                gone[record.id] = (
                    f"the dashboard process running it ({where}) stopped answering: its last "
                    f"heartbeat was at {record.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC, {age:.0f} s "
                    "before this was found; its worker is gone"
                )
    return gone


class InstanceKeeper:
    """Registers this process, then beats and reconciles on a timer thread. ``on_beat`` is
    called after every beat the store took (the run manager's relayed cancels and its
    endings kept through an outage)."""

    def __init__(self, store: Store, on_beat: Callable[[], None] = lambda: None) -> None:
        self.identity = Identity.of_this_process()
        self.instances = Instances(store)
        self.on_beat = on_beat
        self.failed: Counter[str | None] = Counter()  # runs it failed as orphans, by owner
        self._store_ok_since: datetime | None = None
        self._outage_logged = False
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def id(self) -> str:
        return self.identity.id

    def start(self) -> None:
        """Register, reconcile once now (runs a stopped process left are failed at start-up,
        not at the first page view), then keep beating."""
        i = self.identity
        self.instances.register(i.id, i.host, i.pid, i.process_start)
        self._store_ok_since = utcnow()
        self.reconcile()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="audit-heartbeat")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopped.wait(heartbeat_s()):
            if self.instances.store.closed:  # its owner is done with it (a test's store)
                return
            self.tick()

    def tick(self) -> None:
        """One beat: alive, reconcile, then the manager's part; a store that does not
        answer is logged once per outage and tried again on the next beat."""
        try:
            self.instances.beat(self.id)
        except Exception as exc:
            self._store_ok_since = None
            if not self._outage_logged:
                _LOG.warning("the store does not answer (%s); retrying every beat", exc)
                self._outage_logged = True
            return
        if self._outage_logged:
            _LOG.warning("the store answers again")
            self._outage_logged = False
        if self._store_ok_since is None:
            self._store_ok_since = utcnow()
        try:
            self.reconcile()
            self.on_beat()
        except Exception:  # the next beat tries again
            _LOG.exception("reconciling with the store failed")

    def reconcile(self) -> Counter[str | None]:
        """Fail the unfinished runs of every instance that is gone (and of none); returns
        how many, by owner."""
        with self._lock:
            records = self.instances.running()
            reasons: dict[str | None, str] = {None: NO_INSTANCE_REASON}
            gone = gone_reasons(records, self.id, utcnow(), self._store_ok_since, stale_after_s())
            reasons.update(gone)
            failed = self.instances.fail_runs(reasons)
            self.instances.stop(list(gone))
            if failed:
                _LOG.warning("failed %d run(s) of stopped dashboards", sum(failed.values()))
            self.failed.update(failed)
            return failed

    def stop(self, reason: str) -> None:
        """This process stops: its unfinished runs end failed with ``reason``, and it is
        recorded stopped (a store that does not answer leaves that to the next start-up,
        which finds the process ended)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=heartbeat_s() + 5)
        try:
            self.instances.fail_runs({self.id: reason})
            self.instances.stop([self.id])
        except Exception as exc:
            _LOG.warning("could not record this dashboard's stop (%s); the next start does", exc)
