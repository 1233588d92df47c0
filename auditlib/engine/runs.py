"""Audit runs on Ray, persisted as they go: the dashboard's one entry point for execution.

For each run one consumer thread on the dashboard's side drains the task's message stream
and writes it to the store, so remote workers need no database access and the page reads
progress from the store by polling. Several runs may execute at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
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
        plan_attacks(
            spec.attack, spec.budget.iterations, server=spec.scenario.server
        )  # one attack, or every applicable one
        build_defense(spec.defense.name, spec.defense.params_dict())
        check_model_trains(spec)  # a BatchNorm model that cannot train on one image
        ray_backend.ensure_ray(self.ray_address)
        ray_backend.require_device(spec, self.ray_address)
        expire(self.store)
        run_id = self.store.create_run(spec.to_dict(), run_identity(spec), title, owner=owner)
        with self._lock:
            if self._board is None:
                self._board = ray_backend.cancel_board()
            board = self._board
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

    def _consume(self, run_id: str, generator, board) -> None:
        store = self.store
        finished = False
        stage = None  # what the worker last said it does after the attack
        try:
            for ref in generator:
                message = from_wire(ray.get(ref))
                if isinstance(message, StartMessage):
                    store.mark_running(run_id)
                    store.add_image(run_id, 0, "originals", message.png)
                elif isinstance(message, EventMessage):
                    store.add_event(
                        run_id, message.step, message.total, message.elapsed, message.losses
                    )
                elif isinstance(message, FrameMessage):
                    store.add_image(run_id, message.step, "live", message.png)
                elif isinstance(message, UtilityMessage):
                    stage = message.stage()
                    store.set_stage(run_id, stage)
                elif isinstance(message, ResultMessage):
                    iterations = message.summary.timing.iterations
                    store.add_image(run_id, iterations, "reconstruction", message.png)
                    store.finish(run_id, message.status, summary=message.summary)
                    finished = True
                elif isinstance(message, ErrorMessage):
                    status = "cancelled" if message.cancelled else "failed"
                    store.finish(run_id, status, error=message.message)
                    finished = True
        except TaskCancelledError:
            where = (
                f"during its {stage}, after the attack had finished; the attack's result was "
                "lost with the worker"
                if stage
                else "before the attack could finish"
            )
            store.finish(run_id, "cancelled", error=f"stopped by ray.cancel {where}")
            finished = True
        except RayError as exc:  # worker crash, node loss, task error
            store.finish(run_id, "failed", error=f"{type(exc).__name__}: {exc}")
            finished = True
        except Exception as exc:  # the store failed; record what we can
            if not finished:
                try:
                    store.finish(run_id, "failed", error=f"{type(exc).__name__}: {exc}")
                    finished = True
                except Exception:
                    pass
        finally:
            if not finished:
                record = store.get_run(run_id)
                if record is not None and record.finished_at is None:
                    store.finish(run_id, "failed", error="the worker ended without a result")
            with self._lock:
                self._refs.pop(run_id, None)
                self._threads.pop(run_id, None)
            with contextlib.suppress(Exception):  # the board is only bookkeeping
                board.forget.remote(run_id)

    def cancel(self, run_id: str) -> None:
        """Ask the run to stop: at once through the cancel board, by force if it lingers."""
        self.store.request_cancel(run_id)
        with self._lock:
            generator = self._refs.get(run_id)
        if generator is None:
            return
        self._board.cancel.remote(run_id)

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
