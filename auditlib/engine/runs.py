"""Audit runs on Ray, persisted as they go: the dashboard's one entry point for execution.

For each run one consumer thread on the dashboard's side drains the task's message stream
and writes it to the store, so remote workers need no database access and the page reads
progress from the store by polling. Several runs may execute at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import RayError, TaskCancelledError

from auditlib.defenses import build_defense
from auditlib.engine import ray_backend
from auditlib.engine.attack_phase import plan_attacks
from auditlib.engine.identity import run_identity
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
from auditlib.store import Store
from auditlib.store.retention import expire

HARD_CANCEL_AFTER_S = 10.0  # cooperative cancellation first; ray.cancel if it has not ended


class RunManager:
    def __init__(
        self,
        store: Store,
        *,
        ray_address: str | None = None,
        emit_every: int = 10,
        image_every: int = 50,
        lpips_nets: tuple[str, ...] = LPIPS_NETS,
    ) -> None:
        self.store = store
        self.ray_address = ray_address
        self.settings = {
            "emit_every": emit_every,
            "image_every": image_every,
            "lpips_nets": lpips_nets,
        }
        self._lock = threading.Lock()
        self._refs: dict[str, Any] = {}
        self._threads: dict[str, threading.Thread] = {}
        # A run of updates together: its cancel-board key and every run of the group.
        self._groups: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._board = None  # the cancel board actor; this handle keeps it alive
        # Runs left queued/running by an earlier dashboard process have lost their consumer
        # (and, with the embedded Ray, their worker): they must not stay "running" forever.
        self.orphans_failed = store.fail_unfinished(
            "the dashboard stopped while this run was in progress; its worker is gone"
        )
        self.expired = expire(store)  # AUDIT_RETENTION_DAYS: what has been kept long enough
        # Ray starts (about 4 s) and warms a worker in the background, so the first Start
        # does not wait for either; start() waits for it.
        ray_backend.start_ray(ray_address)

    def start(
        self,
        spec: RunSpec,
        assets: Mapping[str, bytes] | None = None,
        title: str = "",
        *,
        owner: str | None = None,
    ) -> str:
        """Validate ``spec``, record the run as ``owner``'s and start it; returns the run id.
        The dashboard starts runs through ``engine.user_runs.UserRuns``, which names the owner.

        Parameter errors surface here as AuditInputError, before anything is recorded.
        """
        self._admit(spec)
        run_id = self.store.create_run(spec.to_dict(), run_identity(spec), title, owner=owner)
        board = self._cancel_board()
        generator = ray_backend.submit(spec, assets or {}, run_id, board, self.settings)
        thread = threading.Thread(
            target=self._consume,
            args=(run_id, generator, board),
            daemon=True,
            name=f"audit-{run_id[:8]}",
        )
        with self._lock:
            self._refs[run_id] = generator
            self._threads[run_id] = thread
        thread.start()
        return run_id

    def _admit(self, spec: RunSpec) -> None:
        """What a start checks before anything is recorded (parameter errors as
        AuditInputError), then Ray ready for it and the store's expired runs gone."""
        plan_attacks(
            spec.attack, spec.budget.iterations, server=spec.scenario.server
        )  # one attack, or every applicable one
        build_defense(spec.defense.name, spec.defense.params_dict())
        check_model_trains(spec)  # a BatchNorm model that cannot train on one image
        ray_backend.ensure_ray(self.ray_address)
        ray_backend.require_device(spec, self.ray_address)
        expire(self.store)

    def _cancel_board(self):
        """The cancel board actor, made on first use; this manager's handle keeps it alive."""
        with self._lock:
            if self._board is None:
                self._board = ray_backend.cancel_board()
            return self._board

    def _consume(self, run_id: str, generator, board) -> None:
        self._drain({0: _Recorder(self.store, run_id)}, generator, board, run_id, paired=False)

    def _drain(
        self, recorders: dict[int, _Recorder], generator, board, key: str, *, paired: bool
    ) -> None:
        """Write a task's message stream to its runs (one, or a group's by update) until it
        ends; whatever ends it, every run is left finished."""
        try:
            for ref in generator:
                value = ray.get(ref)
                u, wire = value if paired else (0, value)
                recorders[u].record(from_wire(wire))
        except TaskCancelledError:
            for recorder in recorders.values():
                where = (
                    f"during its {recorder.stage}, after the attack had finished; the "
                    "attack's result was lost with the worker"
                    if recorder.stage
                    else "before the attack could finish"
                )
                recorder.end("cancelled", f"stopped by ray.cancel {where}")
        except RayError as exc:  # worker crash, node loss, task error
            for recorder in recorders.values():
                recorder.end("failed", f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # the store failed; record what we can
            for recorder in recorders.values():
                with contextlib.suppress(Exception):
                    recorder.end("failed", f"{type(exc).__name__}: {exc}")
        finally:
            for recorder in recorders.values():
                if not recorder.finished:
                    record = self.store.get_run(recorder.run_id)
                    if record is not None and record.finished_at is None:
                        recorder.end("failed", "the worker ended without a result")
            with self._lock:
                for recorder in recorders.values():
                    self._refs.pop(recorder.run_id, None)
                    self._threads.pop(recorder.run_id, None)
                    self._groups.pop(recorder.run_id, None)
            with contextlib.suppress(Exception):  # the board is only bookkeeping
                board.forget.remote(key)

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
        the one stream. Cancelling any of them cancels all: they are one computation."""
        why = why_sample_apart(specs)
        if why is not None:
            raise AuditInputError(f"these runs cannot advance together: {why}")
        self._admit(specs[0])  # they differ only in their images
        titles = list(titles) or [""] * len(specs)
        run_ids = [
            self.store.create_run(spec.to_dict(), run_identity(spec), title, owner=owner)
            for spec, title in zip(specs, titles, strict=True)
        ]
        group = f"together-{run_ids[0]}"
        board = self._cancel_board()
        generator = ray_backend.submit_together(
            list(specs), assets or {}, group, board, self.settings
        )
        recorders = {u: _Recorder(self.store, run_id) for u, run_id in enumerate(run_ids)}
        thread = threading.Thread(
            target=self._drain,
            args=(recorders, generator, board, group),
            kwargs={"paired": True},
            daemon=True,
            name=f"audit-{group[:17]}",
        )
        with self._lock:
            for run_id in run_ids:
                self._refs[run_id] = generator
                self._threads[run_id] = thread
                self._groups[run_id] = (group, tuple(run_ids))
        thread.start()
        return run_ids

    def cancel(self, run_id: str) -> None:
        """Ask the run to stop: at once through the cancel board, by force if it lingers.
        A run of updates together stops with all of them (one computation)."""
        with self._lock:
            generator = self._refs.get(run_id)
            key, members = self._groups.get(run_id, (run_id, (run_id,)))
        for member in members:
            self.store.request_cancel(member)
        if generator is None:
            return
        self._board.cancel.remote(key)

        def hard_cancel() -> None:
            with self._lock:
                still = self._refs.get(run_id)
            if still is not None:
                ray.cancel(still)

        timer = threading.Timer(HARD_CANCEL_AFTER_S, hard_cancel)
        timer.daemon = True
        timer.start()

    def is_active(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._threads

    def active_runs(self) -> list[str]:
        with self._lock:
            return list(self._threads)

    def wait(self, run_id: str, timeout: float | None = None) -> bool:
        """Block until the run's consumer has finished; True if it has."""
        with self._lock:
            thread = self._threads.get(run_id)
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def wait_all(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for run_id in self.active_runs():
            self.wait(run_id, max(0.0, deadline - time.monotonic()))


class _Recorder:
    """Writes one run's messages to the store as they come, and ends it once."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.finished = False
        self.stage: str | None = None  # what the worker last said it does after the attack

    def record(self, message) -> None:
        store, run_id = self.store, self.run_id
        if isinstance(message, StartMessage):
            store.mark_running(run_id)
            store.add_image(run_id, 0, "originals", message.png)
        elif isinstance(message, EventMessage):
            store.add_event(run_id, message.step, message.total, message.elapsed, message.losses)
        elif isinstance(message, FrameMessage):
            store.add_image(run_id, message.step, "live", message.png)
        elif isinstance(message, UtilityMessage):
            self.stage = message.stage()
            store.set_stage(run_id, self.stage)
        elif isinstance(message, ResultMessage):
            iterations = message.summary.timing.iterations
            store.add_image(run_id, iterations, "reconstruction", message.png)
            store.finish(run_id, message.status, summary=message.summary)
            self.finished = True
        elif isinstance(message, ErrorMessage):
            status = "cancelled" if message.cancelled else "failed"
            store.finish(run_id, status, error=message.message)
            self.finished = True

    def end(self, status: str, error: str) -> None:
        """Finish the run with ``error`` unless it has finished."""
        if not self.finished:
            self.store.finish(self.run_id, status, error=error)
            self.finished = True
