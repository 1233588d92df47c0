"""Text audits on Ray, persisted as they go: the dashboard's Text page starts them here.

Why not ``engine.runs.RunManager``: its runs are ``RunSpec``s through and through (their
identity, budget, device and defense checks, the image stream's messages, the ``runs``
table every other page reads as image audits). A text run is one Ray streaming task of
its own (:func:`text_task`) that yields plain JSON messages (``event``: a ``TextEvent``'s
stage, attack, texts and note; ``result``: result.json, ``stopped`` where a Cancel cut it
short; ``cancelled``: stopped before any attack ran; ``error``), drained by one
consumer thread into the ``text_runs`` table (``store.text_runs``) as the image runs'
consumer does; workers never touch the database. Ray places the task when one of its CPUs
is free (one CPU a run, ``ray_backend.cpus_per_run``), and each user has at most
``AUDIT_USER_MAX_RUNNING`` + ``AUDIT_USER_MAX_QUEUED`` text runs unfinished.

Cancellation is cooperative first, as for the image runs (``ray_backend``'s cancel board
and watcher): the running attack reads the request between its steps and returns what it
had, nothing after it starts, and the run ends cancelled with that much scored and a
verdict that claims only what was measured. A task that has not stopped
``HARD_CANCEL_AFTER_S`` later is stopped with ``ray.cancel`` (nothing scored then).
A run whose dashboard process is gone (stopped, or never recorded) is failed when the
next manager starts, with the reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import ray
from ray.exceptions import RayError, TaskCancelledError

from auditlib.attacks.text import TEXT_ATTACKS
from auditlib.defenses import build_defense
from auditlib.engine import ray_backend
from auditlib.engine.device import check_device_name
from auditlib.engine.fair_share import FairShareLimits
from auditlib.engine.text_audit import TEXT_DEFENSES, TextAuditSpec
from auditlib.errors import AuditInputError
from auditlib.models.text import MODEL_FILES, PRESETS
from auditlib.store import CANCELLED, COMPLETED, FAILED, RunFinishedError, Store, UnknownRunError
from auditlib.store.instances import Instances
from auditlib.store.text_runs import TextRunStore

OWN_MODEL = "own"  # TextAuditSpec.model of a run on the auditor's uploaded folder
LIVE_EVERY_S = 0.5  # the least time between two stored "progress" events of one run
GONE_REASON = (
    "the dashboard process running this text audit stopped while it was in progress; "
    "start it again to get a result"
)
CANCEL_REASON = (
    "cancelled: the task did not stop between two steps in time, so it was stopped; "
    "nothing was scored"
)
STOPPED_REASON = "cancelled: what the attacks had recovered by then is scored"
NOTHING_RAN_REASON = "cancelled before any attack ran: nothing was scored"
_LOG = logging.getLogger("auditlib.text_runs")


@dataclass(frozen=True)
class TextUploads:
    """The bytes a run needs beside its spec: the model folder's three files (None: a
    preset) and the auditor's text file (None: the demo text), with its name."""

    model_files: Mapping[str, bytes] | None = None
    text_name: str | None = None
    text_bytes: bytes | None = None

    def digests(self) -> dict[str, str]:
        """The sha256 of each upload by its role (a model file's name, or "text"): the keys
        the store holds them under, and ``TextAuditResult.inputs`` of the run."""
        files = self.model_files or {}
        found = {n: hashlib.sha256(files[n]).hexdigest() for n in MODEL_FILES if n in files}
        if self.text_bytes is not None:
            found["text"] = hashlib.sha256(self.text_bytes).hexdigest()
        return found


UPLOADS_KEY = "uploads"  # the stored spec's {role: sha256} of the run's uploads


def stored_text_spec(stored: Mapping[str, Any]) -> TextAuditSpec:
    """The spec of a stored run (its ``uploads`` aside)."""
    spec = {k: v for k, v in stored.items() if k != UPLOADS_KEY}
    return TextAuditSpec(**{**spec, "attacks": tuple(spec["attacks"])})


def uploads_by_digest(
    digests: Mapping[str, str], text_name: str | None, read: Callable[[str], bytes | None]
) -> TextUploads:
    """The uploads named by their sha256 (``{role: sha256}``, a role being a model file's name
    or "text", the text file called ``text_name``), read back with ``read`` (the bytes, or None
    where the reader may not see or no longer has them). AuditInputError names a file gone."""
    files: dict[str, bytes] = {}
    for role, sha in digests.items():
        data = read(sha)
        if data is None:
            name = text_name if role == "text" and text_name else role
            raise AuditInputError(f"{name} is no longer stored; upload it again")
        files[role] = data
    text = files.pop("text", None)
    return TextUploads(files or None, text_name if text is not None else None, text)


def stored_uploads(stored: Mapping[str, Any], read: Callable[[str], bytes | None]) -> TextUploads:
    """The uploads of a stored run, read back by their sha256 (``uploads_by_digest``), to run
    it again. AuditInputError says which file is missing."""
    digests = stored.get(UPLOADS_KEY) or {}
    wanted = list(MODEL_FILES) if stored.get("model") == OWN_MODEL else []
    if stored.get("text_file") is not None:
        wanted.append("text")
    unrecorded = [role for role in wanted if role not in digests]
    if unrecorded:
        raise AuditInputError(
            f"this run was recorded without the hash of its {unrecorded[0]}, so it cannot be "
            "run again from the store; upload the file and start it from the form"
        )
    return uploads_by_digest({r: digests[r] for r in wanted}, stored.get("text_file"), read)


def check_text_spec(spec: TextAuditSpec, uploads: TextUploads) -> None:
    """What a start checks before anything is recorded (AuditInputError otherwise)."""
    if spec.model == OWN_MODEL:
        files = uploads.model_files or {}
        missing = [name for name in MODEL_FILES if name not in files]
        if missing:
            raise AuditInputError(f"your model folder lacks {', '.join(missing)}")
    elif spec.model not in PRESETS:
        raise AuditInputError(f"text model {spec.model!r}; expected one of {', '.join(PRESETS)}")
    if (spec.text_file is None) != (uploads.text_bytes is None):
        raise AuditInputError("a text file was named without its bytes, or given unnamed")
    if not spec.attacks:
        raise AuditInputError("choose at least one text attack")
    unknown = [a for a in spec.attacks if a not in TEXT_ATTACKS]
    if unknown:
        raise AuditInputError(
            f"text attack {unknown[0]!r}; expected one of {', '.join(TEXT_ATTACKS)}"
        )
    if spec.preset not in ("strongest", "paper"):
        raise AuditInputError(f"attack preset {spec.preset!r}; expected strongest or paper")
    if spec.defense not in TEXT_DEFENSES:
        raise AuditInputError(
            f"defense {spec.defense!r} on a text model; expected one of {', '.join(TEXT_DEFENSES)}"
        )
    build_defense(spec.defense, spec.defense_params)  # refuses a bad parameter
    check_device_name(spec.device)


# ------------------------------------------------------------------------------ the worker


def _local_spec(spec: TextAuditSpec, uploads: TextUploads, folder) -> TextAuditSpec:
    """The spec with the uploads written to ``folder`` (the worker's private temp dir)."""
    from pathlib import Path

    folder = Path(folder)
    if uploads.model_files is not None:
        model_dir = folder / "uploaded-folder"  # the result's words: "the auditor's model in ..."
        model_dir.mkdir()
        for name in MODEL_FILES:
            (model_dir / name).write_bytes(uploads.model_files[name])
        spec = replace(spec, model=str(model_dir))
    if uploads.text_bytes is not None:
        name = Path(uploads.text_name or "text.txt").name  # its suffix says .txt or .csv
        path = folder / name
        path.write_bytes(uploads.text_bytes)
        spec = replace(spec, text_file=str(path))
    return spec


def text_messages(
    spec: TextAuditSpec, uploads: TextUploads, is_cancelled: Callable[[], bool] | None = None
) -> Iterator[dict[str, Any]]:
    """The audit's events as plain JSON messages, then its result (or its error). The
    audit runs on a thread of its own so its events can be yielded as they come;
    ``is_cancelled`` is read between the attacks' steps."""
    import tempfile

    import torch

    from auditlib.engine.text_audit import run_text_audit
    from auditlib.text_result_json import text_result_dict

    torch.set_num_threads(ray_backend.cpus_per_run())
    events: queue.Queue[dict[str, Any] | None] = queue.Queue()
    outcome: dict[str, Any] = {}

    def work(folder: str) -> None:
        try:
            result = run_text_audit(
                _local_spec(spec, uploads, folder),
                lambda e: events.put({"kind": "event", **asdict(e), "texts": list(e.texts)}),
                should_stop=is_cancelled or (lambda: False),
            )
            if result.stopped and not result.runs:
                outcome["message"] = {"kind": "cancelled"}
                return
            data = text_result_dict(result)
            data["spec"] = {**asdict(spec), "attacks": list(spec.attacks)}  # no worker paths
            outcome["message"] = {"kind": "result", "result": data, "stopped": result.stopped}
        except AuditInputError as exc:
            outcome["message"] = {"kind": "error", "message": str(exc)}
        except Exception as exc:  # said in one line; the worker's log has the traceback
            _LOG.exception("a text audit failed")
            outcome["message"] = {"kind": "error", "message": f"{type(exc).__name__}: {exc}"}
        finally:
            events.put(None)

    with tempfile.TemporaryDirectory(prefix="text-audit-") as folder:
        thread = threading.Thread(target=work, args=(folder,), daemon=True, name="text-audit")
        thread.start()
        while (message := events.get()) is not None:
            yield message
        thread.join()
    yield outcome.get("message") or {"kind": "error", "message": "the audit ended without a result"}


def _text_task(spec: dict[str, Any], uploads: TextUploads, run_id: str, board):
    typed = stored_text_spec(spec)
    watch = ray_backend.CancelWatch(board, run_id)
    try:
        yield from text_messages(typed, uploads, is_cancelled=watch.cancelled.is_set)
    finally:
        watch.finished.set()


text_task = ray.remote(num_returns="streaming", max_retries=0)(_text_task)


# ------------------------------------------------------------------------------ the manager


class TextRunManager:
    """Starts text audits on Ray and writes what they say to the store."""

    def __init__(
        self, store: Store, instance: str | None = None, limits: FairShareLimits | None = None
    ) -> None:
        self.runs = TextRunStore(store)
        self.instance = instance
        self.limits = limits or FairShareLimits.from_environment()
        self._lock = threading.Lock()
        self._refs: dict[str, Any] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._board = None  # the cancel board, asked for once Ray is up (ray_backend keeps it)
        self.orphans_failed = self._fail_orphans(Instances(store))

    def _fail_orphans(self, instances: Instances) -> int:
        """Fail the unfinished text runs of dashboard processes that are gone."""
        failed = 0
        for record in self.runs.unfinished():
            if record.instance == self.instance and record.instance is not None:
                continue
            other = None if record.instance is None else instances.get(record.instance)
            if other is None or other.stopped_at is not None:
                with contextlib.suppress(RunFinishedError, UnknownRunError):
                    self.runs.finish(record.id, FAILED, error=GONE_REASON)
                    failed += 1
        return failed

    def start(
        self, spec: TextAuditSpec, uploads: TextUploads, *, owner: str | None, title: str = ""
    ) -> str:
        """Check, record as ``owner``'s and submit; returns the run id."""
        check_text_spec(spec, uploads)
        with self._lock:
            mine = [r for r in self.runs.unfinished() if r.owner == owner]
            most = self.limits.max_running + self.limits.max_queued
            if len(mine) >= most:
                raise AuditInputError(
                    f"you have {len(mine)} text audits unfinished, the most one user may have; "
                    "wait for one to end or cancel one"
                )
        ray_backend.ensure_ray()
        ray_backend.require_device(spec.device, ray_backend.ray_address())
        with self._lock:
            if self._board is None:
                self._board = ray_backend.cancel_board()
            board = self._board
        digests = uploads.digests()
        stored = {**asdict(spec), "attacks": list(spec.attacks), UPLOADS_KEY: digests}
        run_id = self.runs.create(
            stored, title, owner=owner, instance=self.instance, assets=digests.values()
        )
        try:
            options = ray_backend.task_options(spec.device)
            generator = text_task.options(**options).remote(stored, uploads, run_id, board)
        except Exception as exc:
            self.runs.finish(run_id, FAILED, error=f"could not be handed to Ray: {exc}")
            return run_id
        thread = threading.Thread(
            target=self._drain, args=(run_id, generator), daemon=True, name=f"text-{run_id[:8]}"
        )
        with self._lock:
            self._refs[run_id] = generator
            self._threads[run_id] = thread
        thread.start()
        return run_id

    def _drain(self, run_id: str, generator) -> None:
        last_live = 0.0
        try:
            for ref in generator:
                message = ray.get(ref)
                kind = message.get("kind") if isinstance(message, dict) else None
                if kind == "event":
                    now = time.monotonic()
                    if message["stage"] == "progress" and now - last_live < LIVE_EVERY_S:
                        continue
                    last_live = now
                    live = {k: message.get(k) for k in ("stage", "attack", "texts", "note")}
                    self.runs.progress(run_id, live)
                elif kind == "result" and message.get("stopped"):
                    self.runs.finish(
                        run_id, CANCELLED, result=message["result"], error=STOPPED_REASON
                    )
                elif kind == "result":
                    self.runs.finish(run_id, COMPLETED, result=message["result"])
                elif kind == "cancelled":
                    self.runs.finish(run_id, CANCELLED, error=NOTHING_RAN_REASON)
                elif kind == "error":
                    self.runs.finish(run_id, FAILED, error=str(message["message"]))
        except (RunFinishedError, UnknownRunError):
            self._cancel_task(run_id)  # deleted or ended elsewhere: computes for no one
        except TaskCancelledError:
            self._end(run_id, CANCELLED, CANCEL_REASON)
        except RayError as exc:
            self._end(run_id, FAILED, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            _LOG.exception("the consumer of text run %s failed", run_id)
            self._end(run_id, FAILED, f"its progress could not be recorded ({type(exc).__name__})")
        finally:
            self._end(run_id, FAILED, "the worker ended without a result")
            with self._lock:
                self._refs.pop(run_id, None)
                self._threads.pop(run_id, None)

    def _end(self, run_id: str, status: str, error: str) -> None:
        record = self.runs.get(run_id)
        if record is not None and not record.finished:
            if status == FAILED and record.cancel_requested:
                status, error = CANCELLED, CANCEL_REASON
            with contextlib.suppress(RunFinishedError, UnknownRunError):
                self.runs.finish(run_id, status, error=error)

    def _cancel_task(self, run_id: str) -> None:
        with self._lock:
            generator = self._refs.get(run_id)
        if generator is not None:
            with contextlib.suppress(Exception):
                ray.cancel(generator, force=True)

    def cancel(self, run_id: str) -> None:
        """Ask the run to stop between two steps (it ends cancelled with what it had
        scored); stop its task by force if it has not ended ``HARD_CANCEL_AFTER_S`` later."""
        with contextlib.suppress(UnknownRunError):
            self.runs.request_cancel(run_id)
        with self._lock:
            held, board = run_id in self._refs, self._board
        if not held:
            self._end(run_id, CANCELLED, "cancelled; no dashboard process was running it any more")
            return
        with contextlib.suppress(Exception):  # the board is bookkeeping: the timer still acts
            board.cancel.remote(run_id)
        timer = threading.Timer(ray_backend.HARD_CANCEL_AFTER_S, self._cancel_task, (run_id,))
        timer.daemon = True
        timer.start()

    def is_active(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._refs

    def wait(self, run_id: str, timeout: float | None = None) -> bool:
        with self._lock:
            thread = self._threads.get(run_id)
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def shutdown(self) -> None:
        with self._lock:
            ids = list(self._refs)
        for run_id in ids:
            self._end(run_id, FAILED, GONE_REASON)
            self._cancel_task(run_id)
