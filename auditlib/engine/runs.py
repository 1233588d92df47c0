"""Audit runs on Ray, persisted as they go: the dashboard's one entry point for execution.

For each run one consumer thread on the dashboard's side drains the task's message stream
and writes it to the store, so remote workers need no database access and the page reads
progress from the store by polling. Several runs may execute at once.

Runs share the workers fairly (``engine.fair_share``): a Start records its run "queued" and
puts it in the manager's own queue; a run is submitted to Ray only when a slot is free (the
cluster's CPUs over ``ray_backend.cpus_per_run``), taking the users in turn, each with at
most ``AUDIT_USER_MAX_RUNNING`` running. A queued run cancelled before it is submitted ends
"cancelled" without reaching Ray.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayError, TaskCancelledError

from auditlib.defenses import build_defense
from auditlib.engine import ray_backend
from auditlib.engine.attack_phase import plan_attacks
from auditlib.engine.endings import Ending, Endings, store_unavailable
from auditlib.engine.fair_share import SHARED_OWNER, FairQueue, FairShareLimits, WaitReason
from auditlib.engine.identity import run_identity
from auditlib.engine.instance import InstanceKeeper
from auditlib.engine.isolation import isolated_in_dashboard
from auditlib.engine.messages import (
    ErrorMessage,
    EventMessage,
    FrameMessage,
    ResultMessage,
    StartMessage,
    UtilityMessage,
    from_wire,
)
from auditlib.engine.preflight import check_model_trains
from auditlib.engine.together import why_sample_apart
from auditlib.errors import AuditInputError
from auditlib.metrics import LPIPS_NETS
from auditlib.spec import RunSpec
from auditlib.store import CANCELLED, FAILED, RunFinishedError, Store, UnknownRunError
from auditlib.store.retention import expire

HARD_CANCEL_AFTER_S = ray_backend.HARD_CANCEL_AFTER_S
SHUTDOWN_REASON = (
    "the dashboard was stopped while this run was in progress (its server shut down); "
    "start it again to get a result"
)
_LOG = logging.getLogger("auditlib.runs")


@dataclass(eq=False)  # one task is one object: held in sets and dicts by identity
class _Task:
    """What one Ray task runs: one run, or a sample's updates together (``paired``: the
    stream yields (update, message) pairs). ``submit`` hands it to Ray with the cancel
    board and returns the message stream; ``done`` is set once every run of it ended."""

    key: str  # its name on the cancel board: the run id, or "together-<first run id>"
    owner: str
    recorders: dict[int, _Recorder]
    submit: Callable[[Any], Any]
    paired: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def run_ids(self) -> tuple[str, ...]:
        return tuple(r.run_id for r in self.recorders.values())


def ray_slots() -> int:
    """Runs the Ray cluster executes at once: its CPUs over each run's, at least 1."""
    cpus = int(ray.cluster_resources().get("CPU", 0))
    return max(1, cpus // ray_backend.cpus_per_run())


class RunManager:
    def __init__(
        self,
        store: Store,
        *,
        ray_address: str | None = None,
        emit_every: int = 10,
        image_every: int = 50,
        lpips_nets: tuple[str, ...] = LPIPS_NETS,
        limits: FairShareLimits | None = None,
        slots: int | None = None,
    ) -> None:
        """``limits``: None reads the service's settings from the environment
        (``FairShareLimits.from_environment``); ``slots``: runs submitted to Ray at once,
        None: what the cluster has CPUs for (read once Ray is up)."""
        self.store = store
        self.ray_address = ray_address
        self.settings = {
            "emit_every": emit_every,
            "image_every": image_every,
            "lpips_nets": lpips_nets,
        }
        self.limits = limits or FairShareLimits.from_environment()
        self._lock = threading.Lock()
        self._queue: FairQueue[_Task] = FairQueue(self.limits, slots)
        self._tasks: dict[str, _Task] = {}  # every admitted run not yet ended, by run id
        self._cancel_asked: set[str] = set()  # tasks cancelled while being submitted
        self._click = threading.local()  # the owner of the Start this thread is in
        self._refs: dict[str, Any] = {}  # the message stream of each submitted run
        self._board = None  # the cancel board actor (ray_backend keeps it alive)
        self._stopping = False  # shutdown has ended this process's runs: write nothing more
        # Runs are this process's (its instance id on each); the runs of a process that is
        # gone are failed now and on every heartbeat, and never another live one's.
        self.endings = Endings(store)
        self.keeper = InstanceKeeper(store, on_beat=self._on_beat)
        self.keeper.start()
        self.expired = expire(store)  # AUDIT_RETENTION_DAYS: what has been kept long enough
        # Ray starts (about 4 s) and warms a worker in the background, so the first Start
        # does not wait for either; start() waits for it.
        ray_backend.start_ray(ray_address)

    @property
    def orphans_failed(self) -> int:
        """Runs this process failed because the process running them was gone, everyone's."""
        return sum(self.keeper.failed.values())

    def orphans_failed_of(self, owner: str | None) -> int:
        """Those of them that were ``owner``'s."""
        return self.keeper.failed.get(owner, 0)

    def start(
        self,
        spec: RunSpec,
        assets: Mapping[str, bytes] | None = None,
        title: str = "",
        *,
        owner: str | None = None,
    ) -> str:
        """Validate ``spec``, record the run as ``owner``'s and queue it; returns the run id.
        The dashboard starts runs through ``engine.user_runs.UserRuns``, which names the owner.

        Parameter errors and a full queue (``AUDIT_USER_MAX_QUEUED``) surface here as
        AuditInputError, before anything is recorded.
        """
        # A model class of the user's own code, where the admin allows it: its own process.
        settings = {**self.settings, "isolated": self._admit(spec)}

        def task_of(run_ids: list[str]) -> _Task:
            (run_id,) = run_ids
            return _Task(
                run_id,
                owner or SHARED_OWNER,
                {0: _Recorder(self.store, run_id, self.endings)},
                lambda board: ray_backend.submit(spec, assets or {}, run_id, board, settings),
            )

        return self._admitted(owner, [spec], [title], task_of)[0]

    def default_device(self) -> str:
        """The device a new run is offered (``ray_backend.offered_device``)."""
        return ray_backend.offered_device()

    def _admit(self, spec: RunSpec) -> bool:
        """What a start checks before anything is recorded (parameter errors as
        AuditInputError), then Ray ready for it and the store's expired runs gone; whether
        it runs in a process of its own (``isolation.isolated_in_dashboard``)."""
        isolated = isolated_in_dashboard(spec)  # refused where the user's code may not run
        self.limits.check_budget(spec)  # AUDIT_MAX_RUN_SECONDS
        plan_attacks(
            spec.attack, spec.budget.iterations, server=spec.scenario.server
        )  # one attack, or every applicable one
        build_defense(spec.defense.name, spec.defense.params_dict())
        check_model_trains(spec)  # a BatchNorm model that cannot train on one image
        ray_backend.ensure_ray(self.ray_address)
        ray_backend.require_device(spec.device, self.ray_address)
        expire(self.store)
        return isolated

    def _admitted(
        self,
        owner: str | None,
        specs: Sequence[RunSpec],
        titles: Sequence[str],
        task_of: Callable[[list[str]], _Task],
    ) -> list[str]:
        """Record the runs of one task and queue it, unless the owner's queue is full (the
        check and the queueing under one lock, so two tabs cannot both pass it); then
        submit what the free slots allow."""
        key = owner or SHARED_OWNER
        with self._lock:
            if self._queue.slots is None:
                self._queue.slots = ray_slots()  # Ray is up: _admit waited for it
            if getattr(self._click, "checked", None) != key:  # once per Start (one_start)
                self._queue.check_room(key)
                if getattr(self._click, "owner", None) == key:
                    self._click.checked = key
            run_ids = [
                self.store.create_run(
                    spec.to_dict(), run_identity(spec), title, owner=owner, instance=self.keeper.id
                )
                for spec, title in zip(specs, titles, strict=True)
            ]
            task = task_of(run_ids)
            for run_id in run_ids:
                self._tasks[run_id] = task
            self._queue.add(key, task.key, run_ids, task)
        self._dispatch()
        return run_ids

    @contextlib.contextmanager
    def one_start(self, owner: str | None = None) -> Iterator[None]:
        """The runs started inside (on this thread, as ``owner``) are one Start: the queued
        limit is checked at the first of them only, so a run with its control, or a batch's
        runs, is admitted whole or refused before anything is recorded."""
        if getattr(self._click, "owner", None) is not None:  # nested: the outer Start
            yield
            return
        self._click.owner, self._click.checked = owner or SHARED_OWNER, None
        try:
            yield
        finally:
            self._click.owner = self._click.checked = None

    def _dispatch(self) -> None:
        """Submit queued tasks while a slot is free; the fair queue says which."""
        while True:
            with self._lock:
                chosen = self._queue.take()
            if not chosen:
                return
            for task in chosen:
                self._submit(task)

    def _submit(self, task: _Task) -> None:
        try:
            board = self._cancel_board()
            generator = task.submit(board)
        except Exception as exc:  # Ray refused the task: its runs end here, not queued for ever
            for recorder in task.recorders.values():
                recorder.end(FAILED, f"could not be handed to Ray: {type(exc).__name__}: {exc}")
            self._ended(task.key, task.run_ids)
            return
        thread = threading.Thread(
            target=self._drain,
            args=(task.recorders, generator, board, task.key),
            kwargs={"paired": task.paired},
            daemon=True,
            name=f"audit-{task.key[:17]}",
        )
        with self._lock:
            for run_id in task.run_ids:
                self._refs[run_id] = generator
            cancelled = task.key in self._cancel_asked
        thread.start()
        if cancelled:  # cancelled between the queue's choice and now
            self._stop(task.key, task.run_ids[0])

    def _cancel_board(self):
        """The cancel board actor, asked for on first use (``ray_backend.cancel_board``)."""
        with self._lock:
            if self._board is None:
                self._board = ray_backend.cancel_board()
            return self._board

    def _consume(self, run_id: str, generator, board) -> None:
        recorder = _Recorder(self.store, run_id, self.endings)
        self._drain({0: recorder}, generator, board, run_id, paired=False)

    def _drain(
        self, recorders: dict[int, _Recorder], generator, board, key: str, *, paired: bool
    ) -> None:
        """Write a task's message stream to its runs (one, or a group's by update) until it
        ends; whatever ends it, every run is left with its true ending (kept through a store
        outage by ``self.endings``), the task is cancelled if it still computes for no one,
        and the next queued run goes."""
        abandoned = True  # the stream did not end on its own: its task may still compute
        try:
            for ref in generator:
                value = ray.get(ref)
                u, wire = value if paired else (0, value)
                recorders[u].record(from_wire(wire))
                if all(r.finished for r in recorders.values()):
                    break  # the task's last message, or every run deleted or ended elsewhere
            else:
                abandoned = False  # the stream ended: so did its task
            if abandoned:  # left early: only a run deleted or ended elsewhere leaves work
                abandoned = any(r.gone for r in recorders.values())
        except TaskCancelledError:
            abandoned = False
            for recorder in recorders.values():
                where = (
                    f"during its {recorder.stage}, after the attack had finished; the "
                    "attack's result was lost with the worker"
                    if recorder.stage
                    else "before the attack could finish"
                )
                recorder.end(CANCELLED, f"stopped by ray.cancel {where}")
        except RayError as exc:  # worker crash, node loss, task error
            abandoned = False
            for recorder in recorders.values():
                recorder.end(FAILED, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a bug of ours: said, and the task stopped below
            _LOG.exception("the consumer of task %s failed", key)
            for recorder in recorders.values():
                recorder.end(FAILED, f"its progress could not be recorded ({type(exc).__name__})")
        finally:
            try:
                if abandoned and not self._stopping:
                    self._abandon(generator, key)
                for recorder in recorders.values():
                    if not recorder.finished and not self._stopping:
                        recorder.end(FAILED, "the worker ended without a result")
                with contextlib.suppress(Exception):  # the board is only bookkeeping
                    board.forget.remote(key)
            finally:  # the slot is free whatever the store did
                self._ended(key, tuple(r.run_id for r in recorders.values()))

    @staticmethod
    def _abandon(generator, key: str) -> None:
        """No one drains the task any more: stop it, so it does not hold a worker for the
        rest of its budget."""
        try:
            ray.cancel(generator, force=True)
            _LOG.warning("task %s was cancelled: no one records its messages any more", key)
        except Exception as exc:
            _LOG.warning("task %s could not be cancelled (%s)", key, exc)

    def _ended(self, key: str, run_ids: tuple[str, ...]) -> None:
        """Task ``key`` is over: forget it, free its slot, wake its waiters, start the next."""
        with self._lock:
            self._queue.finished(key)
            self._cancel_asked.discard(key)
            tasks = {self._tasks.pop(run_id, None) for run_id in run_ids}
            for run_id in run_ids:
                self._refs.pop(run_id, None)
        for task in tasks - {None}:
            task.done.set()
        self._dispatch()

    def start_together(
        self,
        specs: Sequence[RunSpec],
        assets: Mapping[str, bytes] | None = None,
        titles: Sequence[str] = (),
        *,
        owner: str | None = None,
    ) -> list[str]:
        """Start a sample's updates (``engine.sample.update_specs``, which
        ``engine.together.why_sample_apart`` lets advance together) as one task: one run
        record per update, as ``start`` would make, each written from its own messages of
        the one stream. Cancelling any of them cancels all: they are one computation. They
        take one slot and count as one running run of their owner (and as their number of
        runs while queued)."""
        why = why_sample_apart(specs)
        if why is not None:
            raise AuditInputError(f"these runs cannot advance together: {why}")
        self._admit(specs[0])  # they differ only in their images
        titles = list(titles) or [""] * len(specs)

        def task_of(run_ids: list[str]) -> _Task:
            group = f"together-{run_ids[0]}"
            return _Task(
                group,
                owner or SHARED_OWNER,
                {
                    u: _Recorder(self.store, run_id, self.endings)
                    for u, run_id in enumerate(run_ids)
                },
                lambda board: ray_backend.submit_together(
                    list(specs), assets or {}, group, board, self.settings
                ),
                paired=True,
            )

        return self._admitted(owner, specs, titles, task_of)

    def cancel(self, run_id: str) -> None:
        """Ask the run to stop: at once through the cancel board, by force if it lingers.
        A run of updates together stops with all of them (one computation). A run still in
        the queue ends cancelled at once; Ray never sees it. A run another live process
        runs is asked through the store (that process acts on its next beat); one no
        process runs any more ends cancelled here. Works while the store is down (the
        request is then not recorded, the run stops all the same)."""
        with self._lock:
            task = self._tasks.get(run_id)
            withdrawn = None if task is None else self._queue.withdraw(task.key)
            generator = self._refs.get(run_id)
            if task is not None and withdrawn is None and generator is None:
                self._cancel_asked.add(task.key)  # being submitted: _submit stops it
            members = task.run_ids if task is not None else (run_id,)
        for member in members:  # recorded first: the run's record says it was asked
            try:
                self.store.request_cancel(member)
            except Exception as exc:
                if not store_unavailable(exc):
                    raise
                _LOG.warning("the cancel of run %s is not recorded: the store is down", member)
        if withdrawn is not None:
            for recorder in withdrawn.recorders.values():
                recorder.end(CANCELLED, "cancelled while it waited in the queue; it never ran")
            self._ended(withdrawn.key, withdrawn.run_ids)
        elif generator is not None:
            self._stop(task.key if task is not None else run_id, run_id)
        if task is None and not self.endings.holds(run_id):
            self._cancel_unheld(run_id)

    def _cancel_unheld(self, run_id: str) -> None:
        """A run this process does not hold: end it cancelled when no live process runs it
        (its consumer is gone); another live process's run is left to that process."""
        record = self.store.get_run(run_id)
        if record is None or record.finished:
            return
        if record.instance != self.keeper.id and record.instance is not None:
            owner = self.keeper.instances.get(record.instance)
            if owner is not None and owner.stopped_at is None:
                return  # that process cancels it on its next beat (``_on_beat``)
        with contextlib.suppress(RunFinishedError, UnknownRunError):
            self.store.finish(
                run_id, CANCELLED, error="cancelled; no dashboard process was running it any more"
            )

    def _on_beat(self) -> None:
        """On each heartbeat the store took: endings kept through an outage written, and the
        Cancels asked on other processes for runs this one runs acted on."""
        self.endings.retry()
        for run_id in self.keeper.instances.cancel_requested(self.keeper.id):
            with self._lock:
                task = self._tasks.get(run_id)
                asked = task is not None and task.key in self._cancel_asked
            if not asked and not self.endings.holds(run_id):
                self.cancel(run_id)

    def shutdown(self, reason: str = SHUTDOWN_REASON) -> None:
        """This process stops: every run it holds ends failed with ``reason`` (one write),
        then its Ray tasks are cancelled, so nothing computes for a consumer that is gone
        and no run is left "running" for the next start to find."""
        self._stopping = True
        self.keeper.stop(reason)
        with self._lock:
            generators = list(self._refs.values())
        for generator in generators:
            with contextlib.suppress(Exception):
                ray.cancel(generator, force=True)

    def _stop(self, key: str, run_id: str) -> None:
        """Cancel task ``key`` through the board; ray.cancel if it lingers."""
        with self._lock:
            self._cancel_asked.add(key)
        self._board.cancel.remote(key)

        def hard_cancel() -> None:
            with self._lock:
                still = self._refs.get(run_id)
            if still is not None:
                ray.cancel(still)

        timer = threading.Timer(HARD_CANCEL_AFTER_S, hard_cancel)
        timer.daemon = True
        timer.start()

    def waiting_reason(self, run_id: str) -> WaitReason | None:
        """Why run ``run_id`` has not started (its owner's limit, no free worker, or its
        worker starting); None for a run this manager is not holding back."""
        with self._lock:
            task = self._tasks.get(run_id)
            reason = None if task is None else self._queue.reason(task.key)
        if reason is not None and reason.kind == "starting":
            record = self.store.get_run(run_id)  # the worker says when it has started
            if record is None or record.status != "queued":
                return None
        return reason

    def owner_of(self, run_id: str) -> str | None:
        """The owner of a run this process holds (None: not held, or started with none)."""
        with self._lock:
            task = self._tasks.get(run_id)
        return None if task is None or task.owner == SHARED_OWNER else task.owner

    def is_active(self, run_id: str) -> bool:
        """Queued or running in this manager."""
        with self._lock:
            return run_id in self._tasks

    def active_runs(self) -> list[str]:
        with self._lock:
            return list(self._tasks)

    def wait(self, run_id: str, timeout: float | None = None) -> bool:
        """Block until the run has ended (queued ones too); True if it has."""
        with self._lock:
            task = self._tasks.get(run_id)
        return True if task is None else task.done.wait(timeout)

    def wait_all(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for run_id in self.active_runs():
            self.wait(run_id, max(0.0, deadline - time.monotonic()))


class _Recorder:
    """Writes one run's messages to the store as they come, and ends it once. Progress the
    store cannot take (down, full) is dropped, and the run goes on; its ending is never
    dropped (``Endings``). A run deleted or ended elsewhere is finished here: its messages
    are for no one."""

    def __init__(self, store: Store, run_id: str, endings: Endings) -> None:
        self.store = store
        self.run_id = run_id
        self.endings = endings
        self.finished = False
        self.gone = False  # deleted, or ended by a Cancel or another process meanwhile
        self.stage: str | None = None  # what the worker last said it does after the attack
        self._originals: bytes | None = None  # kept for the ending while not stored
        self._dropped = 0  # progress writes the store did not take

    def record(self, message) -> None:
        if self.finished:
            return
        if isinstance(message, ResultMessage):
            iterations = message.summary.timing.iterations
            self._end(
                Ending(
                    self.run_id,
                    message.status,
                    summary=message.summary,
                    reconstruction=(iterations, message.png),
                    originals=self._originals,
                )
            )
        elif isinstance(message, ErrorMessage):
            status = CANCELLED if message.cancelled else FAILED
            self._end(Ending(self.run_id, status, error=message.message))
        else:
            try:
                self._progress(message)
            except (RunFinishedError, UnknownRunError):
                self.finished = self.gone = True
            except Exception as exc:
                if not store_unavailable(exc):
                    raise
                self._dropped += 1
                if self._dropped == 1:
                    _LOG.warning(
                        "run %s: the store does not take its progress (%s)", self.run_id, exc
                    )

    def _progress(self, message) -> None:
        store, run_id = self.store, self.run_id
        if isinstance(message, StartMessage):
            self._originals = message.png  # until stored: the ending writes it otherwise
            store.mark_running(run_id)
            store.add_image(run_id, 0, "originals", message.png)
            self._originals = None
        elif isinstance(message, EventMessage):
            store.add_event(run_id, message.step, message.total, message.elapsed, message.losses)
        elif isinstance(message, FrameMessage):
            store.add_image(run_id, message.step, "live", message.png)
        elif isinstance(message, UtilityMessage):
            self.stage = message.stage()
            store.set_stage(run_id, self.stage)

    def _end(self, ending: Ending) -> None:
        self.finished = True
        self.endings.write(ending)

    def end(self, status: str, error: str) -> None:
        """Finish the run with ``error`` unless it has finished."""
        if not self.finished:
            self._end(Ending(self.run_id, status, error=error, originals=self._originals))
