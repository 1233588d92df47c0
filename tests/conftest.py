"""Fixtures for the dashboard's tests: one Ray instance per session, a fresh store per test.

Starting Ray costs seconds, so the UI tests share one local instance; tests that do not ask
for these fixtures never start it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest

# The throw-away PostgreSQL server's fixtures (postgres_server, postgres_url, and
# database_url: a SQLite and a PostgreSQL database in turn), for any test module.
from postgres_server import database_url, postgres_server, postgres_url  # noqa: F401

# Torch's OpenMP threads wait passively, not spinning: on 2 cores shared with the servers,
# Ray workers and browsers the tests start, spinning threads starve them (a 20-step DLG audit
# under load: 21 s passive, over 120 s spinning). Read when torch loads (no import above
# loads it); children inherit it. The thread count and the work's split are unchanged.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# cuBLAS gives the same bits on several streams only with a fixed workspace (read when its
# first handle is made): the CUDA tests that compare runs at once with runs in turn ask for
# CUDA's deterministic kernels (test_attacks_at_once.reproducible_cuda). No effect on a CPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# Ray starts its workers at nice 15 (its default; the product keeps it, docs/PERFORMANCE.md),
# below pytest and the servers at nice 0. In the suite the other pytest worker is a CPU-bound
# neighbour no dashboard has: beside it a cold worker's imports (then 8 s of a core, idle)
# took over 60 s (CI, stop 83). The suite's Ray workers, and those of the servers and clusters it
# starts (they inherit this), run at nice 0 (the shutdown test here: 22 s before, 11 s
# after, in a whole run); on an idle machine that changes nothing.
os.environ.setdefault("RAY_worker_niceness", "0")

RESULTS = Path(__file__).parent / "fixtures" / "results"


# pytest's log capture attaches its handlers to every logger that does not propagate, torch's
# structured-trace log among them, and torch builds that log's records (graphs and guards as
# text) whenever it has a handler: every compile in the suite built records no one reads
# (within the noise of tests/test_compiled_step.py's time here, 152-157 s against 157-174 s)
# and a failing test's report carried thousands of empty DEBUG lines (CI, 2026-12-01).
# Innermost (trylast), so it runs once the capture is attached.
def _detach_capture_from_torch_trace() -> None:
    trace = logging.getLogger("torch.__trace")
    for handler in list(trace.handlers):
        if type(handler).__module__.startswith("_pytest"):
            trace.removeHandler(handler)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_setup(item):
    _detach_capture_from_torch_trace()
    return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item):
    _detach_capture_from_torch_trace()
    return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item):
    _detach_capture_from_torch_trace()
    return (yield)


def write_png(path: Path, seed: int, size: int = 32) -> None:
    """A PNG of random pixels, the same for the same seed."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)


@pytest.fixture
def image_dir(tmp_path: Path) -> Path:
    """A folder of two 32 px PNGs with their labels.csv (classes 3 and 7): the CLI's input."""
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(2):
        write_png(folder / f"img{i}.png", i)
    (folder / "labels.csv").write_text("filename,label\nimg0.png,3\nimg1.png,7\n")
    return folder


@pytest.fixture
def stored_summary():
    """A real audit result, as result.json held it before verdicts (schema 1), typed: for
    tests that need a finished run in a store without running an audit."""
    from auditlib.result import AuditSummary

    return AuditSummary.from_json(json.loads((RESULTS / "result_9555ea9_parent.json").read_text()))


# Users of the dashboard's tests (name -> role, password); the users file is written once
# per session (bcrypt costs a fraction of a second per password) and every test points
# AUDIT_USERS_FILE at it.
USERS = {
    "alice": ("auditor", "alice-password"),
    "bob": ("auditor", "bob-password"),
    "root": ("admin", "root-password"),
}


@pytest.fixture(scope="session")
def users_path(tmp_path_factory) -> Path:
    from auditlib.access.users import add_user

    path = tmp_path_factory.mktemp("users") / "users.yaml"
    for name, (role, password) in USERS.items():
        add_user(name, password, role, path=path)
    return path


@pytest.fixture(autouse=True)
def _users_file(users_path, monkeypatch):
    monkeypatch.setenv("AUDIT_USERS_FILE", str(users_path))


@pytest.fixture(autouse=True)
def _scan_components_once():
    """AppTest's first run of each instance scans every installed distribution's metadata
    for Streamlit components (0.3-0.7 s here, 66 times in test_app.py alone). What is
    installed does not change during a session: once Streamlit is loaded, the scan runs
    once and each AppTest registers the same manifests as before. (A browser test's server
    scans for itself.)"""
    scanner = sys.modules.get("streamlit.components.v2.manifest_scanner")
    if scanner is not None and not getattr(scanner.scan_component_manifests, "once", False):
        scan = scanner.scan_component_manifests
        found: list = []

        def scan_once(*args, **kwargs):
            if not found:
                found.append(scan(*args, **kwargs))
            return list(found[0])

        scan_once.once = True
        scanner.scan_component_manifests = scan_once


@pytest.fixture(autouse=True)
def _own_main_module():
    """Streamlit's script runner (AppTest's too) installs each script it runs as
    ``sys.modules["__main__"]`` and leaves it there. A later test's spawned process
    (``engine.isolation``) then runs that script again as its main module, which fails for
    an ``AppTest.from_function`` script (its ``__args`` exist only under AppTest): the
    suite on two xdist workers, 2026-12-02. Each test ends with the process's own."""
    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance shared by the whole test session, shut down at its end."""
    import ray

    from auditlib.engine import ray_backend

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray_backend.ensure_ray()
    yield
    ray.shutdown()


@pytest.fixture
def dashboard_store(tmp_path, monkeypatch, ray_session):
    """The dashboard's process-wide Store and RunManager, on a SQLite file under tmp_path.

    ``AUDIT_DATA_DIR`` points at tmp_path before the ``st.cache_resource`` objects are
    created (the caches are cleared first), so every test sees an empty store of its own.
    Yields ``(store, manager)`` as the dashboard's pages see them when alice is signed in
    (``tests/test_app.py`` signs her in); at the end waits for the test's runs and closes
    the store.
    """
    import streamlit as st

    from auditlib.access import Principal
    from auditlib.engine.user_runs import UserRuns
    from dashboard.resources import shared_manager, shared_store

    monkeypatch.setenv("AUDIT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("AUDIT_DATABASE_URL", raising=False)
    st.cache_resource.clear()
    st.cache_data.clear()
    raw, manager = shared_store(), shared_manager()
    alice = UserRuns.of(manager, Principal("alice", USERS["alice"][0]))
    try:
        yield alice.store, alice
    finally:
        for run_id in manager.active_runs():
            manager.cancel(run_id)
        manager.wait_all(60)
        st.cache_resource.clear()
        raw.close()


# Markers, so the inner loop can leave out what is slow to start (``make test-fast``);
# ``make test`` runs everything. ``browser``: a real Streamlit server and Chromium;
# ``ray``: a Ray instance; ``slow``: a test that takes more than about 10 s here
# (listed in SLOW from ``pytest --durations``).
BROWSER_MODULES = {"test_browser.py", "test_make_run.py"}
RAY_FIXTURES = {"ray_session", "dashboard_store", "ray_instance"}
SLOW = {  # from `pytest --durations=70` on this machine (2 cores), over 10 s each
    "tests/test_attacks.py::test_dlg_on_fedavg_weights_does_not_depend_on_the_local_learning_rate",
    "tests/test_fedboosting.py::test_the_server_factors_the_thesis_128_bit_key_and_reads_the_update",
    "tests/test_cli.py::test_a_defended_run_whose_control_leaked_is_a_finding_about_the_defense",
    "tests/test_attacks.py::test_dlg_reaches_30_db_on_a_photograph_within_100_lbfgs_steps",
    "tests/test_attacks.py::test_gaussian_noise_of_sigma_0_1_stops_dlg",
    "tests/test_attacks.py::test_idlg_reconstructs_with_the_inferred_label",
    "tests/test_adaptive.py::test_soteria_holds_against_dlg_but_not_against_dlg_that_knows_it",
    "tests/test_text_dager.py::test_dager_recovers_a_decoder_batch_exactly_with_its_last_tokens",
    "tests/test_text_dager.py::test_noise_breaks_the_exact_check_and_it_says_so",
    "tests/test_text_audit.py::test_noise_gets_its_control_and_the_attacker_that_knows_it",
    "tests/test_text_audit.py::test_an_undefended_leak_is_a_finding_and_a_failed_attack_is_not_safety",
    "tests/test_text_audit.py::test_the_cli_writes_the_result_and_the_texts_side_by_side",
    "tests/test_text_utr.py::test_utr_recovers_text_from_lora_update_well_above_a_random_guess",
    "tests/test_captured_plan.py::test_every_attack_of_the_plan_records_its_step_and_ends_as_it_ends_eager",
    # torch.compile's inductor on the CPU (`--durations=0`, Intel Xeon, 2026-12-02: 9.5-19.8 s)
    "tests/test_compiled_step.py::test_fedleak_compiled_with_one_start_steps_it_stacked_and_a_race_traces_each_count",
    "tests/test_compiled_step.py::test_inverting_gradients_compiled_ends_where_it_ends_eager",
    "tests/test_compiled_step.py::test_a_raced_compiled_run_traces_each_count_of_running_starts",
    "tests/test_compiled_step.py::test_grnn_compiled_ends_where_it_ends_eager",
}


def pytest_configure(config):
    for name, what in (
        ("browser", "starts a real Streamlit server and drives Chromium"),
        ("ray", "starts a Ray instance"),
        ("slow", "takes more than about 10 s on 2 cores"),
        ("postgres", "runs on the session's throw-away PostgreSQL server (skipped without one)"),
    ):
        config.addinivalue_line("markers", f"{name}: {what}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in BROWSER_MODULES:
            item.add_marker(pytest.mark.browser)
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ray)
        if item.nodeid.split("[")[0] in SLOW:
            item.add_marker(pytest.mark.slow)
