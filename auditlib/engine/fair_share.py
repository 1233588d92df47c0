"""Fair share of the run workers between users: how many runs one user may have running and
queued, the longest time budget a run may ask for, and which queued run goes next.

The run manager (``engine.runs``) keeps the runs it admitted in a :class:`FairQueue` and
submits one to Ray only when a worker slot is free, so one user's many Starts do not hold
everyone else's runs behind them. The queue is policy only (no Ray, no store, no lock): the
manager calls it under its own lock.

What counts: a "task" is what takes one slot, a run or a sample's updates advancing
together (one Ray task for several run records). The running limit counts tasks (the
updates together are one run of their owner); the queued limit counts run records. Runs
started without an owner (tests, the library) are one shared owner's.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from auditlib.errors import AuditInputError
from auditlib.spec import MAX_TIME_BUDGET_S, RunSpec
from auditlib.words import count_of

MAX_RUNNING_ENV = "AUDIT_USER_MAX_RUNNING"
MAX_QUEUED_ENV = "AUDIT_USER_MAX_QUEUED"
MAX_SECONDS_ENV = "AUDIT_MAX_RUN_SECONDS"
# A shared service's defaults: two runs at a time and four waiting per user, an hour each.
DEFAULT_MAX_RUNNING = 2
DEFAULT_MAX_QUEUED = 4
DEFAULT_MAX_RUN_SECONDS = 3600.0
MOST_RUNS = 1000  # the largest per-user count the settings accept

SHARED_OWNER = ""  # the owner of runs started without one

T = TypeVar("T")


def _count_setting(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MOST_RUNS:
        raise AuditInputError(
            f"{name}={text!r}: expected a whole number from 1 to {MOST_RUNS} (unset: {default})"
        )
    return value


def _seconds_setting(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 1 <= value <= MAX_TIME_BUDGET_S):
        raise AuditInputError(
            f"{name}={text!r}: expected a number of seconds from 1 to {MAX_TIME_BUDGET_S:,} "
            f"(unset: {default:g})"
        )
    return value


@dataclass(frozen=True)
class FairShareLimits:
    """What one user may ask of the service (an operator's settings)."""

    max_running: int = DEFAULT_MAX_RUNNING  # tasks running at once, per user
    max_queued: int = DEFAULT_MAX_QUEUED  # run records waiting for a slot, per user
    max_run_seconds: float = DEFAULT_MAX_RUN_SECONDS  # a run's time budget, at most

    def __post_init__(self) -> None:
        if not (1 <= self.max_running <= MOST_RUNS and 1 <= self.max_queued <= MOST_RUNS):
            raise AuditInputError(
                f"per-user limits must be from 1 to {MOST_RUNS}, got {self.max_running} "
                f"running and {self.max_queued} queued"
            )
        if not 1 <= self.max_run_seconds <= MAX_TIME_BUDGET_S:
            raise AuditInputError(
                f"the longest time budget must be from 1 to {MAX_TIME_BUDGET_S:,} s, got "
                f"{self.max_run_seconds:g}"
            )

    @classmethod
    def from_environment(cls) -> FairShareLimits:
        """``AUDIT_USER_MAX_RUNNING``, ``AUDIT_USER_MAX_QUEUED``, ``AUDIT_MAX_RUN_SECONDS``;
        a value out of range is refused, so a typo never means "no limit"."""
        return cls(
            _count_setting(MAX_RUNNING_ENV, DEFAULT_MAX_RUNNING),
            _count_setting(MAX_QUEUED_ENV, DEFAULT_MAX_QUEUED),
            _seconds_setting(MAX_SECONDS_ENV, DEFAULT_MAX_RUN_SECONDS),
        )

    def check_budget(self, spec: RunSpec) -> None:
        """Refuse a run whose attack or utility training may take longer than this
        service allows one run (``AUDIT_MAX_RUN_SECONDS``)."""
        limit = self.max_run_seconds
        asked = [("time budget", spec.budget.max_seconds)]
        if spec.utility is not None:
            asked.append(("utility training's time budget", spec.utility.seconds))
        for what, seconds in asked:
            if seconds is not None and seconds > limit:
                raise AuditInputError(
                    f"a {what} of {seconds:g} s is more than this service allows one run "
                    f"({MAX_SECONDS_ENV}={limit:g}); choose at most {limit:g} s"
                )


WaitKind = Literal["your_limit", "no_free_worker", "starting"]


@dataclass(frozen=True)
class WaitReason:
    """Why a queued run has not started: its owner runs as many as one user may
    ("your_limit"), every worker is busy ("no_free_worker": ``ahead`` tasks go before it),
    or it was handed to Ray and waits for its worker to start ("starting")."""

    kind: WaitKind
    running: int  # the owner's tasks running
    ahead: int  # tasks the queue takes before this one (no_free_worker)
    words: str  # one line for the owner


@dataclass
class _Waiting(Generic[T]):
    owner: str
    key: str
    run_ids: tuple[str, ...]
    seq: int  # admission order
    item: T


@dataclass
class FairQueue(Generic[T]):
    """Admitted tasks in admission order, and who runs what. Not thread-safe: the run
    manager calls it under its lock. ``slots`` (tasks Ray runs at once) is set once Ray
    is up; until then nothing is taken."""

    limits: FairShareLimits
    slots: int | None = None
    _waiting: list[_Waiting[T]] = field(default_factory=list)
    _running: dict[str, str] = field(default_factory=dict)  # task key -> owner
    _last_served: dict[str, int] = field(default_factory=dict)  # owner -> tick
    _seq: itertools.count = field(default_factory=itertools.count)

    # ------------------------------------------------------------------ counts

    def running_tasks(self, owner: str) -> int:
        return sum(1 for o in self._running.values() if o == owner)

    def queued_runs(self, owner: str) -> int:
        return sum(len(w.run_ids) for w in self._waiting if w.owner == owner)

    def is_waiting(self, key: str) -> bool:
        return any(w.key == key for w in self._waiting)

    # ------------------------------------------------------------------ admission

    def check_room(self, owner: str) -> None:
        """Refuse a Start while ``owner`` has as many runs queued as one user may."""
        queued = self.queued_runs(owner)
        if queued >= self.limits.max_queued:
            running = self.running_tasks(owner)
            raise AuditInputError(
                f"you have {count_of(running, 'run')} running and {queued} queued, the most "
                f"this service allows one user ({MAX_QUEUED_ENV}={self.limits.max_queued}); "
                "wait for one to finish or cancel one"
            )

    def add(self, owner: str, key: str, run_ids: Iterable[str], item: T) -> None:
        self._waiting.append(_Waiting(owner, key, tuple(run_ids), next(self._seq), item))

    # ------------------------------------------------------------------ dispatch

    def _rank(self, owner: str, running: dict[str, int], served: dict[str, int]):
        """Fewest running first; then the owner served least recently (never: first);
        then the one whose oldest queued task came first."""
        oldest = min(w.seq for w in self._waiting if w.owner == owner)
        return running.get(owner, 0), served.get(owner, -1), oldest

    def take(self) -> list[T]:
        """The tasks to submit now, in order, marked running: while a slot is free, the
        first queued task of the owner ranked first among those under the running limit."""
        chosen: list[T] = []
        while self.slots is not None and len(self._running) < self.slots:
            running = {o: self.running_tasks(o) for o in {w.owner for w in self._waiting}}
            eligible = [o for o, n in running.items() if n < self.limits.max_running]
            if not eligible:
                break
            owner = min(eligible, key=lambda o: self._rank(o, running, self._last_served))
            entry = next(w for w in self._waiting if w.owner == owner)
            self._waiting.remove(entry)
            self._running[entry.key] = owner
            self._last_served[owner] = next(self._seq)
            chosen.append(entry.item)
        return chosen

    def finished(self, key: str) -> None:
        """A submitted task ended: its slot is free."""
        self._running.pop(key, None)

    def withdraw(self, key: str) -> T | None:
        """Take a queued task out (cancelled before it was submitted); None when it is not
        queued (submitted already, or unknown)."""
        for entry in self._waiting:
            if entry.key == key:
                self._waiting.remove(entry)
                return entry.item
        return None

    # ------------------------------------------------------------------ why it waits

    def _order(self) -> list[str]:
        """The queued tasks' keys in the order the queue would take them if slots freed one
        at a time and nothing running ended (the running limit aside)."""
        running = {o: self.running_tasks(o) for o in {w.owner for w in self._waiting}}
        served = dict(self._last_served)
        waiting = list(self._waiting)
        order = []
        tick = itertools.count(max(served.values(), default=0) + 1)
        while waiting:

            def rank(owner: str) -> tuple[int, int, int]:
                oldest = min(w.seq for w in waiting if w.owner == owner)
                return running[owner], served.get(owner, -1), oldest

            owner = min({w.owner for w in waiting}, key=rank)
            entry = next(w for w in waiting if w.owner == owner)
            waiting.remove(entry)
            running[owner] += 1
            served[owner] = next(tick)
            order.append(entry.key)
        return order

    def reason(self, key: str) -> WaitReason | None:
        """Why task ``key`` has not started; None when the queue does not hold it."""
        owner = self._running.get(key)
        if owner is not None:
            return WaitReason(
                "starting",
                self.running_tasks(owner),
                0,
                "handed to a worker: waiting for it to start",
            )
        entry = next((w for w in self._waiting if w.key == key), None)
        if entry is None:
            return None
        running = self.running_tasks(entry.owner)
        limit = self.limits.max_running
        if running >= limit:
            return WaitReason(
                "your_limit",
                running,
                0,
                f"waiting: you have {count_of(running, 'run')} running, the most one user may "
                f"run at once ({MAX_RUNNING_ENV}={limit}); it starts when one of them ends",
            )
        ahead = self._order().index(key)
        runs_ahead = "no run" if ahead == 0 else count_of(ahead, "run")
        return WaitReason(
            "no_free_worker",
            running,
            ahead,
            f"waiting for a free worker: {runs_ahead} ahead of it (other users' runs are "
            "taken in turn with yours)",
        )
