"""Audits on a Ray cluster the dashboard did not start (issue 20, item 3).

A head and a second worker node are started with ``ray start`` on 127.0.0.1, from a
temporary folder and with an environment in which ``auditlib`` is not importable, so the
workers can run an audit only with the package that ``ray_backend`` ships as the job's
runtime_env (``py_modules``). The dashboard's engine (``RunManager``) joins the cluster
through ``AUDIT_RAY_ADDRESS`` and runs an audit of uploaded images and weights to
completion, cancels one, and sees one whose worker is killed end ``failed`` with the reason.

Addresses: Ray binds its servers to 127.0.0.1 only on a node whose address is literally
127.0.0.1, and on Linux it rewrites the literal names ``127.0.0.1`` and ``localhost``, in
``--node-ip-address``, ``--address`` and ``ray.init(address=...)``, into this machine's
outward address (so that other machines can reach the node). So the head runs with
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (Ray's single-machine mode: its address stays
127.0.0.1), and the worker node and the dashboard reach it as ``LOCALHOST:<port>``, which
resolves to 127.0.0.1 (/etc/hosts) without being rewritten; the worker node then takes
the address it reaches the head from, 127.0.0.1. The last test checks every TCP socket of
the cluster's processes (listening or connected) while it runs. Checked by hand with
``ss -tnpa`` too, every 2 s through a run of this module (Ray 2.60, the minimal install of
requirements.txt): the GCS (the ``--port``), each raylet's two gRPC ports, each
runtime-env agent and the workers' gRPC ports (idle, warm-up, cancel board, audit) listen
on 127.0.0.1 only, and every connection among them is 127.0.0.1 to 127.0.0.1; the minimal
install starts no dashboard (``--include-dashboard=false``), no Ray Client server and no
dashboard-agent HTTP or metrics port. Without these two measures the same cluster listens
on every interface (``*:<port>``).

The nodes are never stopped with ``ray stop``: it matches Ray's processes by name on the
whole machine and would stop every other Ray instance there (another test session's
included). Each node runs as ``ray start --block`` instead, whose processes share its fate
(Ray starts them with PR_SET_PDEATHSIG, and it stops them itself on SIGTERM); the fixture
ends those two processes by pid, then any of their descendants still alive.

Why one file over 400 lines: its tests share one cluster (a module-scoped fixture; each
cluster costs seconds to start) and the /proc helpers that start, inspect and stop it by
pid; split, each part would start a cluster of its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

from auditlib.data import images_zip, load_image_folder
from auditlib.engine import ray_backend
from auditlib.engine import runs as runs_module
from auditlib.engine.runs import RunManager
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from auditlib.store import Store
from auditlib.store.convert import assets_in_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "assets" / "example-images"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


# --- processes, by pid, from /proc ---------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
    return int(fields[1]), int(fields[19])


def _descendants(*roots: int) -> list[tuple[int, int]]:
    """Every live descendant of ``roots`` as (pid, start time): the start time tells a
    process from a later one that reuses its pid."""
    children: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children[stat[0]].append((int(entry), stat[1]))
    found, todo = [], list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child[0])
    return found


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _alive(pid: int, started: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[1] == started


def _kill_if_same(pid: int, started: int) -> None:
    if _alive(pid, started):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _tcp_sockets() -> dict[int, tuple[str, int, str, str]]:
    """inode -> (local address, local port, remote address, state) of every TCP socket, IPv4
    and IPv6 (state ``0A``: listening)."""
    sockets = {}
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            local, remote, state, inode = parts[1], parts[2], parts[3], int(parts[9])
            port = int(local.split(":")[1], 16)
            sockets[inode] = (_address(local, family), port, _address(remote, family), state)
    return sockets


def _address(hex_address: str, family: int) -> str:
    """``0100007F:1A0B`` -> ``127.0.0.1`` (the kernel writes each 32-bit word in host order)."""
    host = bytes.fromhex(hex_address.split(":")[0])
    words = b"".join(host[i : i + 4][::-1] for i in range(0, len(host), 4))
    return socket.inet_ntop(family, words)


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


# --- the cluster --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _editable_blind(folder: Path) -> Path:
    """A folder that, first on a node's path, hides this checkout's editable install (the
    ``make setup`` venv's ``pip install -e .``): a do-nothing module of the name of each of
    its path finders, which its ``.pth`` file imports at start-up. The nodes then stand for
    a machine with the pinned requirements and not this package."""
    import site

    folder.mkdir(parents=True, exist_ok=True)
    for packages in site.getsitepackages():
        for finder in Path(packages).glob("__editable___auditlib*_finder.py"):
            (folder / finder.name).write_text("def install():\n    pass\n")
    return folder


def _node_env(blind: Path | None = None) -> dict[str, str]:
    """This environment without the project on PYTHONPATH (nor, with ``blind``, its
    editable install) and without any Ray address."""
    env = {k: v for k, v in os.environ.items() if k not in {"RAY_ADDRESS", "AUDIT_RAY_ADDRESS"}}
    kept = [
        p
        for p in env.pop("PYTHONPATH", "").split(os.pathsep)
        if p and not Path(p).resolve().is_relative_to(ROOT)
    ]
    if blind is not None:
        kept.insert(0, str(blind))
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    return env


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
PR_SET_PDEATHSIG = 1


def _end_with_this_process() -> None:
    """In the child, before exec: SIGTERM when the process that started it ends, so a test
    process that dies without its teardown leaves no cluster behind."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _ray_has_a_token() -> bool:
    """Whether Ray finds an authentication token here (RAY_AUTH_TOKEN, ~/.ray/auth_token):
    a head started with one requires it, and a joining node sends it only with
    RAY_AUTH_MODE=token."""
    try:
        from ray._raylet import AuthenticationTokenLoader

        return AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)
    except ImportError:
        return bool(os.environ.get("RAY_AUTH_TOKEN")) or (Path.home() / ".ray/auth_token").exists()


class Node:
    """One ``ray start --block`` process and its log."""

    def __init__(self, name: str, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = cwd / f"{name}.log"
        ray_cli = Path(sys.executable).with_name("ray")
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [str(ray_cli), "start", "--block", *args],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_end_with_this_process,
            )

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def wait_started(self) -> str | None:
        """None once Ray says the node runs; else why not."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return f"`ray start` ({self.name}) exited with {self.process.returncode}:\n{self.tail()}"
            if "block forever" in self.tail():
                return None
            time.sleep(0.25)
        return f"`ray start` ({self.name}) did not start within {START_TIMEOUT_S:.0f} s:\n{self.tail()}"

    def stop(self) -> None:
        """SIGTERM (Ray stops the node's processes), SIGKILL if it lingers, then every
        descendant still alive; each wait bounded."""
        left = _descendants(self.process.pid)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        deadline = time.monotonic() + 5  # Ray's own shutdown of them, first
        while time.monotonic() < deadline and any(_alive(p, s) for p, s in left):
            time.sleep(0.1)
        for pid, started in left:
            _kill_if_same(pid, started)


@pytest.fixture(scope="module")
def cluster():
    """A head and a worker node on 127.0.0.1 (one CPU each) that cannot import auditlib,
    with ``AUDIT_RAY_ADDRESS`` pointing at the head and this process's Ray joined to it."""
    import ray

    if not sys.platform.startswith("linux"):
        pytest.skip("the cluster fixture reads /proc")
    if not Path(sys.executable).with_name("ray").exists():
        pytest.skip(f"no `ray` command beside {sys.executable}")
    # Short: Ray's unix sockets live under it (session_*/sockets/...), and a socket's path
    # must stay under 108 bytes.
    temp = Path(tempfile.mkdtemp(prefix="arc", dir="/tmp"))
    workdir = temp / "cwd"
    workdir.mkdir()
    env = _node_env(_editable_blind(temp / "blind"))
    probe = subprocess.run(
        [sys.executable, "-c", "import auditlib"], cwd=workdir, env=env, capture_output=True
    )
    assert probe.returncode != 0 and b"No module named 'auditlib'" in probe.stderr, (
        "auditlib must not be importable where the nodes run"
    )

    port = _free_port()
    common = [
        "--num-cpus=1",
        "--num-gpus=0",
        "--object-store-memory=100000000",
        "--disable-usage-stats",
        f"--temp-dir={temp / 'ray'}",
    ]
    head_only = ["--node-ip-address=127.0.0.1", "--include-dashboard=false"]
    address = f"LOCALHOST:{port}"  # see the module's docstring
    if "RAY_AUTH_MODE" not in env and _ray_has_a_token():
        # A head started where there is a token requires it (Ray's default); the nodes and
        # the dashboard joining by address send it only when told (README, Ray cluster).
        env["RAY_AUTH_MODE"] = "token"
    nodes: list[Node] = []
    monkeypatch = pytest.MonkeyPatch()
    try:
        head = Node(
            "head",
            ["--head", f"--port={port}", *head_only, *common],
            workdir,
            env | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},  # a worker node may not have it
        )
        nodes.append(head)
        if (why := head.wait_started()) is not None:
            pytest.skip(f"ray start cannot start a head here: {why}")
        worker = Node("worker", [f"--address={address}", *common], workdir, env)
        nodes.append(worker)
        if (why := worker.wait_started()) is not None:
            pytest.skip(f"ray start cannot start a worker node here: {why}")

        # The dashboard's engine joins it: AUDIT_RAY_ADDRESS, and no Ray left from earlier
        # tests (ensure_ray returns at once while one is initialised).
        if ray.is_initialized():
            ray.shutdown()
        monkeypatch.setenv("AUDIT_RAY_ADDRESS", address)
        if "RAY_AUTH_MODE" in env:
            # What a dashboard started with RAY_AUTH_MODE=token has; Ray reads its settings
            # once per process, so they are read again (as Ray does enabling it itself).
            from ray._raylet import Config

            monkeypatch.setenv("RAY_AUTH_MODE", env["RAY_AUTH_MODE"])
            Config.initialize("")
        # Ray puts the driver's working directory first on its workers' sys.path; from
        # this checkout the workers (on this same machine) would import auditlib from it.
        # A dashboard on another machine than its workers has no such path there.
        here = os.getcwd()
        os.chdir(workdir)
        try:
            ray_backend.ensure_ray(timeout=START_TIMEOUT_S)
        finally:
            os.chdir(here)
        deadline = time.monotonic() + START_TIMEOUT_S
        while sum(n["Alive"] for n in ray.nodes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.25)
        assert sum(n["Alive"] for n in ray.nodes()) == 2, ray.nodes()
        yield {"temp": temp, "nodes": nodes, "port": port}
    finally:
        if ray.is_initialized():
            ray.shutdown()
        monkeypatch.undo()
        for node in reversed(nodes):
            node.stop()
        subprocess.run(["rm", "-rf", str(temp)], check=False, timeout=60)


@pytest.fixture
def store(tmp_path):
    with Store(f"sqlite:///{tmp_path}/runs.db") as store:
        yield store


@pytest.fixture
def manager(cluster, store):
    manager = RunManager(store, emit_every=2, image_every=4, lpips_nets=())
    yield manager
    for run_id in manager.active_runs():
        manager.cancel(run_id)
    manager.wait_all(60)


def _uploads(store: Store) -> tuple[str, str]:
    """Images and weights stored as the dashboard's Setup page stores uploads; their sha256."""
    import safetensors.torch

    from auditlib.models import build_model

    images = store.put_asset("images", "uploaded.zip", images_zip(load_image_folder(EXAMPLES)))
    model = build_model(ModelSpec("lenet", 10, (3, 32, 32), init="uniform", seed=3))
    weights = safetensors.torch.save({k: v.contiguous() for k, v in model.state_dict().items()})
    return images, store.put_asset("model", "mine.safetensors", weights)


def _spec(images: str, weights: str, iterations: int, attack: str = "dlg") -> RunSpec:
    return RunSpec(
        model=ModelRef(
            ModelSpec("lenet", 10, (3, 32, 32)), weights_asset=weights, content_sha256=weights
        ),
        data=DataSpec("asset", images, batch_size=1),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of(attack),
        defense=ComponentSpec.of("none"),
        budget=Budget(iterations),
    )


def _start(manager: RunManager, store: Store, spec: RunSpec, title: str) -> str:
    """Start as the dashboard does: the uploads the spec names, read back from the store."""
    assets = {sha: store.get_asset(sha).data for sha in assets_in_spec(spec.to_dict())}
    return manager.start(spec, assets, title=title)


def _wait_for_progress(store: Store, run_id: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while store.latest_event(run_id) is None:
        record = store.get_run(run_id)
        assert record.finished_at is None, (record.status, record.error)
        assert time.monotonic() < deadline, "the run showed no progress"
        time.sleep(0.1)


def _where_auditlib():
    """Run on a worker: where its auditlib comes from."""
    import os

    import ray

    import auditlib

    return ray.get_runtime_context().get_node_id(), auditlib.__file__, os.getcwd()


def _ask_every_node() -> tuple[list[str], list[tuple[str, str, str]]]:
    """The alive nodes, and what ``_where_auditlib`` says on each of them."""
    import ray
    from ray import cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # This module is not importable on the workers: the probe travels by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    probe = ray.remote(num_cpus=0)(_where_auditlib)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    on_node = [NodeAffinitySchedulingStrategy(n, soft=False) for n in nodes]
    return nodes, ray.get(
        [probe.options(scheduling_strategy=s).remote() for s in on_node], timeout=120
    )


def test_every_node_imports_auditlib_from_the_shipped_py_module(cluster):
    nodes, answers = _ask_every_node()
    assert len(nodes) == 2 and sorted(a[0] for a in answers) == sorted(nodes)
    session = str(cluster["temp"] / "ray")
    for _, path, cwd in answers:
        # Unpacked by the node from the job's runtime_env, not this checkout.
        assert path.startswith(session) and "py_modules_files" in path, path
        assert not Path(path).resolve().is_relative_to(ROOT), path
        assert not Path(cwd).resolve().is_relative_to(ROOT), cwd


def test_an_audit_of_uploaded_images_and_weights_completes_on_the_cluster(manager, store):
    images, weights = _uploads(store)
    spec = _spec(images, weights, iterations=8)
    run_id = _start(manager, store, spec, "dlg on lenet, on a cluster")
    assert manager.wait(run_id, 180)
    record = store.get_run(run_id)
    assert record.status == "completed", record.error
    assert record.iterations == 8 and record.psnr_mean is not None
    assert record.ssim_mean is not None and record.label_accuracy is not None
    assert record.spec["model"]["weights_asset"] == weights
    assert record.spec["data"]["location"] == images
    for kind in ("originals", "live", "reconstruction"):
        assert store.image(run_id, kind).png.startswith(b"\x89PNG")
    assert record.result.metrics.psnr_mean == record.psnr_mean


def test_cancel_on_the_cluster_ends_the_run_cancelled(manager, store, monkeypatch):
    # The cooperative stop is what is tested: under a loaded machine (the full suite on 2
    # cores) the worker's next look at the cancel board may come after the 10 s fallback,
    # whose ray.cancel then ends the run without its result.
    monkeypatch.setattr(runs_module, "HARD_CANCEL_AFTER_S", 120.0)
    images, weights = _uploads(store)
    run_id = _start(manager, store, _spec(images, weights, 1_000_000, "ig"), "to cancel")
    _wait_for_progress(store, run_id)
    manager.cancel(run_id)
    assert manager.wait(run_id, 60)
    record = store.get_run(run_id)
    assert record.status == "cancelled", record.error
    assert record.result is not None, record.error  # stopped cooperatively, with its result
    assert record.cancel_requested and record.result.stop_reason == "cancelled"


def test_a_worker_killed_mid_run_leaves_the_run_failed_with_the_reason(cluster, manager, store):
    images, weights = _uploads(store)
    run_id = _start(manager, store, _spec(images, weights, 1_000_000, "ig"), "to kill")
    _wait_for_progress(store, run_id)
    roots = [node.process.pid for node in cluster["nodes"]]
    # The worker running the audit names itself after the task (ray::_audit_task).
    running = [
        (pid, started)
        for pid, started in _descendants(*roots)
        if _cmdline(pid).startswith("ray::_audit_task")
    ]
    assert len(running) == 1, [(p, _cmdline(p)) for p, _ in _descendants(*roots)]
    _kill_if_same(*running[0])
    assert manager.wait(run_id, 60)
    record = store.get_run(run_id)
    assert record.status == "failed"
    assert record.error.startswith("WorkerCrashedError: The worker died unexpectedly"), record.error
    # The cluster lives on: the next audit runs.
    again = _start(manager, store, _spec(images, weights, iterations=2), "after the kill")
    assert manager.wait(again, 180)
    assert store.get_run(again).status == "completed", store.get_run(again).error


def test_every_socket_of_the_cluster_is_on_127_0_0_1(cluster):
    _ask_every_node()  # a worker of this job up on every node
    sockets = _tcp_sockets()
    roots = [node.process.pid for node in cluster["nodes"]]
    seen = {}
    for pid in roots + [pid for pid, _ in _descendants(*roots)]:
        for inode in _socket_inodes(pid):
            if inode in sockets:
                seen[inode] = (pid, *sockets[inode])
    listening = {port for _, _, port, _, state in seen.values() if state == "0A"}
    assert cluster["port"] in listening, listening  # the GCS
    loopback = {"127.0.0.1", "::ffff:127.0.0.1"}
    for pid, local, port, remote, state in seen.values():
        where = (pid, _cmdline(pid)[:100], local, port, remote, state)
        assert local in loopback, where
        assert state == "0A" or remote in loopback, where
