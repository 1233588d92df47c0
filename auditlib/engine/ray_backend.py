"""Ray execution: an audit runs as a Ray streaming-generator task.

With no address, ``ray.init()`` starts an embedded local instance (the default); with
``AUDIT_RAY_ADDRESS`` (or an explicit address) the dashboard joins an existing cluster and
runs on its workers, a CUDA run asking for one GPU (``num_gpus=1``). Joining a cluster, the
dashboard ships this ``auditlib`` package to the workers itself, as the job's runtime_env
``py_modules`` (:func:`cluster_runtime_env`): a worker node needs the pinned requirements
(torch, ...) on the same Python, not this package. The task yields the plain messages of
:mod:`auditlib.engine.stream`; workers never touch the database.

Cancellation is cooperative first: the dashboard marks the run on a small named actor
(the cancel board), a watcher thread in the task asks the board, and the running attack
reads the watcher's flag between steps, so it stops with the
reconstruction it has and its metrics. ``ray.cancel`` remains the hard stop.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import ray

from auditlib.engine.ray_files import private_temp_dir, private_token
from auditlib.errors import AuditInputError
from auditlib.spec import RunSpec

BOARD_NAME = "auditlib-cancel-board"
CANCEL_POLL_S = 0.25
HARD_CANCEL_AFTER_S = 10.0  # cooperative cancellation first; ray.cancel if it has not ended
_init_lock = threading.Lock()
_board_lock = threading.Lock()
_board: tuple[tuple[str, str], Any] | None = None  # (its Ray connection, the handle that made it)


def cpus_per_run() -> int:
    """CPUs (and so torch threads) each audit asks Ray for: ``AUDIT_RAY_CPUS_PER_RUN``, 1."""
    return max(1, int(os.environ.get("AUDIT_RAY_CPUS_PER_RUN", "1")))


def local_cpus() -> int | None:
    """CPUs the embedded Ray offers (``AUDIT_RAY_NUM_CPUS``; unset: the machine's count).

    With one CPU per run this is how many runs of a comparison or sweep execute at once.
    """
    value = os.environ.get("AUDIT_RAY_NUM_CPUS")
    if not value:
        return None
    try:
        cpus = int(value)
    except ValueError:
        raise RuntimeError(f"AUDIT_RAY_NUM_CPUS must be a whole number, got {value!r}") from None
    if cpus < 1:
        raise RuntimeError(f"AUDIT_RAY_NUM_CPUS must be >= 1, got {cpus}")
    return cpus


def ray_address() -> str | None:
    return os.environ.get("AUDIT_RAY_ADDRESS") or None


# Set on every worker: no usage statistics, and Ray's crash handler (a worker's stack on a
# fault), which the dashboard's own process goes without (app.py: it would take SIGTERM).
WORKER_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "0"}

# Left behind when the package is shipped to a cluster: byte code (each worker compiles its
# own, for its own Python).
SHIP_EXCLUDES = ("__pycache__", "*.pyc")


def package_dir() -> str:
    """The folder of the ``auditlib`` package this process imports (the one shipped)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cluster_runtime_env() -> dict[str, Any]:
    """The runtime_env of the dashboard's job on a cluster: Ray zips ``auditlib`` once, puts
    it in the cluster's GCS, and every node unpacks it and puts it on its workers' path, so a
    worker started by ``ray start`` anywhere imports the dashboard's own code."""
    return {
        "py_modules": [package_dir()],
        "excludes": list(SHIP_EXCLUDES),
        "env_vars": dict(WORKER_ENV),
    }


# Ray's local processes (GCS, raylet) are started with PR_SET_PDEATHSIG: Linux kills them
# when the *thread* that started them ends. Streamlit runs each script run in a thread that
# ends with the run, so ray.init runs in a keeper thread that then waits for ever (a daemon
# thread: it does not keep the process alive).
_ready = threading.Event()
_errors: list[BaseException] = []
_keeper: threading.Thread | None = None


def _keep_ray(address: str | None) -> None:
    try:
        address = address or ray_address()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        private_token()
        if address:
            ray.init(address=address, log_to_driver=False, runtime_env=cluster_runtime_env())
        else:
            # Workers import auditlib from this checkout; the dashboard is their only driver.
            root = os.path.dirname(package_dir())
            ray.init(
                num_cpus=local_cpus(),
                include_dashboard=False,
                log_to_driver=False,
                _temp_dir=private_temp_dir(),  # the service user's own, 0700
                runtime_env={"env_vars": {"PYTHONPATH": root, **WORKER_ENV}},
            )
    except BaseException as exc:  # handed to the callers of ensure_ray
        _errors.append(exc)
        _ready.set()
        return
    _ready.set()
    # A worker that has imported torch and auditlib before the first audit: that audit then
    # shows its first frame in about a second instead of after a cold start.
    warm_up.remote()
    threading.Event().wait()


def start_ray(address: str | None = None) -> None:
    """Start (or join) Ray in the background, once per process; returns at once."""
    global _keeper
    with _init_lock:
        if ray.is_initialized() or (_keeper is not None and not _ready.is_set()):
            return  # running, or being started
        _ready.clear()
        _errors.clear()  # a later call retries after a failure or a ray.shutdown()
        _keeper = threading.Thread(
            target=_keep_ray, args=(address,), daemon=True, name="ray-keeper"
        )
        _keeper.start()


def ensure_ray(address: str | None = None, timeout: float = 120.0) -> None:
    """Connect to Ray once per process: a local instance, or the cluster at ``address``."""
    if ray.is_initialized():
        return
    start_ray(address)
    if not _ready.wait(timeout):
        raise RuntimeError(f"Ray did not start within {timeout:.0f} s")
    if _errors:
        raise RuntimeError(f"Ray could not start: {_errors[0]}") from _errors[0]


def gpus_offered() -> int | None:
    """The GPUs Ray offers runs (this machine's instance, or the cluster's workers); None
    while Ray is not up yet (it starts in the background)."""
    if not ray.is_initialized():
        return None
    return int(ray.cluster_resources().get("GPU", 0))


def offered_device() -> str:
    """The device a new run (image or text) is offered: cuda where Ray offers a GPU, else
    cpu (also while Ray is still starting)."""
    return "cuda" if gpus_offered() else "cpu"


def require_device(device: str, address: str | None = None) -> None:
    """Refuse a CUDA run (an image or a text audit) at once where Ray has no GPU to give
    it (the task would wait for a GPU worker forever)."""
    if not device.startswith("cuda"):
        return
    gpus = ray.cluster_resources().get("GPU", 0)
    if gpus < 1:
        where = f"the Ray cluster at {address}" if address else "this machine's Ray instance"
        raise AuditInputError(
            f"device {device!r} needs a GPU, and {where} has none; choose cpu, or set "
            "AUDIT_RAY_ADDRESS to a cluster with GPU workers"
        )


@ray.remote(num_cpus=0)
class CancelBoard:
    """Run ids whose cancellation was requested."""

    def __init__(self) -> None:
        self.cancelled: set[str] = set()

    def cancel(self, run_id: str) -> None:
        self.cancelled.add(run_id)

    def is_cancelled(self, run_id: str) -> bool:
        return run_id in self.cancelled

    def forget(self, run_id: str) -> None:
        self.cancelled.discard(run_id)


@ray.remote(num_cpus=1, max_retries=0)
def warm_up() -> bool:
    """Pay a worker's imports before the first audit (torch and auditlib, about 3 s of a
    core) and the default sample set's decoding (0.2 s more the first run waited for before
    its first word: 0.30 s from submission to the start message, 0.12 s on a worker that had
    decoded it, 0.05 s for the runs after). Not torch.optim's lazy import of torch._dynamo (2-3 s more), which a run
    pays after its start message (``engine.audit._prepare``): paid here it kept the warm-up
    busy past a Start clicked soon after the first page view, whose run then waited for a
    cold worker (the sixteen-image browser test alone: over 3 s to the worker's first word,
    3 of 3; 1.1 to 2.1 s without it)."""
    import auditlib.engine.stream  # noqa: F401
    from auditlib.data import DEFAULT_SAMPLE_SET, decode_ahead

    decode_ahead(DEFAULT_SAMPLE_SET)
    return True


def cancel_board():
    """The named cancel board of this Ray connection, made once and held here for as long
    as the connection lasts. A handle found by name does not keep an actor alive, only the
    handle that made it does: a board made by one run manager died with it under another
    manager's runs (seen in the test suite, one manager per test), which ray.cancel then
    stopped without their result."""
    global _board
    context = ray.get_runtime_context()
    connection = (context.gcs_address, context.namespace)  # a new one at each ray.init
    with _board_lock:
        if _board is None or _board[0] != connection:
            _board = (connection, CancelBoard.options(name=BOARD_NAME, get_if_exists=True).remote())
        return _board[1]


class CancelWatch:
    """Whether the board says a run was cancelled, asked from a watcher thread, never from
    the task's own thread: a task whose main thread blocks in ray.get lends its CPU back to
    Ray, which then starts another queued run beside it (measured: a sweep on one worker ran
    two runs at once while the attack asked the board between steps)."""

    def __init__(self, board, run_id: str) -> None:
        self.cancelled = threading.Event()
        self.finished = threading.Event()
        self._board, self._run_id = board, run_id
        threading.Thread(target=self._watch, daemon=True, name=f"cancel-watch-{run_id[:8]}").start()

    def _watch(self) -> None:
        while not self.finished.wait(CANCEL_POLL_S):
            try:
                if ray.get(self._board.is_cancelled.remote(self._run_id)):
                    self.cancelled.set()
                    return
            except Exception:  # the board is bookkeeping; a lost board cancels nothing
                return


def _audit_task(
    spec: RunSpec, assets: Mapping[str, bytes], run_id: str, board, settings: dict[str, Any]
):
    from auditlib.engine.stream import audit_messages

    watch = CancelWatch(board, run_id)
    try:
        yield from audit_messages(spec, assets, is_cancelled=watch.cancelled.is_set, **settings)
    finally:
        watch.finished.set()


def _together_task(
    specs: list[RunSpec],
    assets: Mapping[str, bytes],
    group_id: str,
    board,
    settings: dict[str, Any],
):
    """A sample's updates as one task (``engine.stream.together_messages``): (update, wire
    message) pairs. They advance as one computation, so cancelling the group (its id on the
    board) stops every update."""
    from auditlib.engine.stream import together_messages

    watch = CancelWatch(board, group_id)
    try:
        yield from together_messages(specs, assets, is_cancelled=watch.cancelled.is_set, **settings)
    finally:
        watch.finished.set()


audit_task = ray.remote(num_returns="streaming", max_retries=0)(_audit_task)
together_task = ray.remote(num_returns="streaming", max_retries=0)(_together_task)


def task_options(device: str) -> dict[str, Any]:
    """A run's Ray resources: its CPUs, and one GPU for a CUDA run (image or text)."""
    # Ray gives a task's worker as many torch threads (OMP_NUM_THREADS) as CPUs it asked for.
    options: dict[str, Any] = {"num_cpus": cpus_per_run()}
    if device.startswith("cuda"):
        options["num_gpus"] = 1
    return options


def submit(
    spec: RunSpec, assets: Mapping[str, bytes], run_id: str, board, settings: dict[str, Any]
):
    """Start the task; returns its ObjectRefGenerator."""
    task = audit_task.options(**task_options(spec.device))
    return task.remote(spec, dict(assets), run_id, board, settings)


def submit_together(
    specs: list[RunSpec],
    assets: Mapping[str, bytes],
    group_id: str,
    board,
    settings: dict[str, Any],
):
    """Start a sample's updates as one task (one run's resources: its batched computation
    is one worker's); returns its ObjectRefGenerator of (update, wire message)."""
    task = together_task.options(**task_options(specs[0].device))
    return task.remote(list(specs), dict(assets), group_id, board, settings)
