"""Runs on Ray, persisted as they go (engine.runs.RunManager with a SQLite store; one run
also with a PostgreSQL store)."""

from __future__ import annotations

import dataclasses
import time

import pytest
from postgres_server import BACKENDS

from auditlib.attacks import ATTACKS
from auditlib.engine import ray_backend
from auditlib.engine.fair_share import MOST_RUNS, FairShareLimits
from auditlib.engine.identity import run_identity
from auditlib.engine.runs import RunManager
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from auditlib.store import Store


def spec(iterations=20, attack="dlg", max_seconds=None, defense="none", defense_params=None):
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 32, 32), init="uniform")),
        data=DataSpec("samples", "photographs", batch_size=1),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of(attack),
        defense=ComponentSpec.of(defense, defense_params),
        budget=Budget(iterations, max_seconds=max_seconds),
    )


@pytest.fixture(scope="module")
def ray_instance():
    ray_backend.ensure_ray()
    yield


@pytest.fixture
def store(request, tmp_path):
    """A SQLite store; a test parametrised over BACKENDS (indirect) gets each backend."""
    url = f"sqlite:///{tmp_path}/runs.db"
    if getattr(request, "param", "sqlite") == "postgresql":
        url = request.getfixturevalue("postgres_url")
    with Store(url) as store:
        yield store


# These tests start their runs without an owner (one shared owner): only the workers limit
# them, not a user's share (tests/test_fair_share.py).
UNLIMITED = FairShareLimits(max_running=MOST_RUNS, max_queued=MOST_RUNS)


@pytest.fixture
def manager(ray_instance, store):
    manager = RunManager(store, emit_every=2, image_every=4, lpips_nets=(), limits=UNLIMITED)
    yield manager
    for run_id in manager.active_runs():
        manager.cancel(run_id)
    manager.wait_all(60)


@pytest.mark.parametrize("store", BACKENDS, indirect=True)  # one real run on PostgreSQL too
def test_a_run_streams_into_the_store_and_completes(manager, store):
    run_id = manager.start(spec(20), title="dlg on lenet")
    assert store.get_run(run_id).status in {"queued", "running"}
    assert manager.wait(run_id, 180)
    record = store.get_run(run_id)
    assert record.status == "completed", record.error
    assert record.title == "dlg on lenet"
    assert record.iterations == 20 and record.psnr_mean is not None
    events = store.events(run_id)
    assert [e.step for e in events][-1] == 20 and len(events) >= 10
    for kind in ("originals", "live", "reconstruction"):
        assert store.image(run_id, kind).png.startswith(b"\x89PNG")
    assert record.result.metrics.psnr_mean == record.psnr_mean
    assert record.spec_id == run_identity(spec(20))


def test_several_runs_execute_at_once(manager, store):
    first = manager.start(spec(30))
    second = manager.start(spec(30, attack="ig"))
    assert set(manager.active_runs()) >= {first, second} or manager.wait(first, 0)
    assert manager.wait(first, 180) and manager.wait(second, 180)
    assert {store.get_run(first).status, store.get_run(second).status} == {"completed"}


def test_the_cancel_board_lives_on_when_a_handle_to_it_is_dropped(ray_instance):
    """A handle found by name does not keep a Ray actor alive, only the one that made it:
    a board made by one manager died with it, and the next manager's cancels then came
    only from ray.cancel, without the run's result (seen in a full suite, in
    tests/test_ray_cluster.py's cancel). The board is held once per Ray connection."""
    import gc

    import ray

    made = ray_backend.cancel_board()
    found = ray_backend.cancel_board()
    assert found is made  # one handle, held by ray_backend, not one per manager
    del made
    gc.collect()
    time.sleep(1)  # where a dropped handle was the board's last owner, the board ends here
    found.cancel.remote("a run")
    assert ray.get(found.is_cancelled.remote("a run"), timeout=60)
    found.forget.remote("a run")


def test_cancel_stops_the_run_within_seconds_and_keeps_its_result(manager, store):
    run_id = manager.start(spec(1_000_000, attack="ig"))
    deadline = time.monotonic() + 120
    while store.latest_event(run_id) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    asked = time.monotonic()
    manager.cancel(run_id)
    assert manager.wait(run_id, 30)
    assert time.monotonic() - asked < 5
    record = store.get_run(run_id)
    assert record.status == "cancelled"
    assert record.cancel_requested
    assert record.result.stop_reason == "cancelled"  # cooperative: metrics of what it had


def test_a_time_budget_marks_the_run_timed_out(manager, store):
    run_id = manager.start(spec(1_000_000, attack="ig", max_seconds=1.0))
    assert manager.wait(run_id, 120)
    assert store.get_run(run_id).status == "timed_out"


def test_an_error_in_the_worker_marks_the_run_failed_with_the_reason(manager, store):
    broken = RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 32, 32))),
        data=DataSpec("folder", "/nonexistent/images"),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(5),
    )
    run_id = manager.start(broken)
    assert manager.wait(run_id, 120)
    record = store.get_run(run_id)
    assert record.status == "failed"
    assert "/nonexistent/images" in record.error


def test_bad_parameters_are_refused_before_anything_is_recorded(manager, store):
    with pytest.raises(AuditInputError, match="sigma"):
        manager.start(spec(defense="dp-gaussian", defense_params={"sigma": "-1"}))
    assert store.list_runs() == []


def test_cuda_where_ray_has_no_gpu_is_refused_at_once(manager, store):
    import dataclasses

    import ray

    if ray.cluster_resources().get("GPU", 0) >= 1:
        pytest.skip("this Ray instance has a GPU")
    started = time.monotonic()
    with pytest.raises(AuditInputError, match=r"needs a GPU.*choose cpu"):
        manager.start(dataclasses.replace(spec(), device="cuda"))
    assert time.monotonic() - started < 5 and store.list_runs() == []


def test_runs_left_running_by_a_dead_dashboard_are_marked_failed(ray_instance, store):
    orphan = store.create_run(spec().to_dict(), spec().identity())
    store.mark_running(orphan)
    manager = RunManager(store)
    assert manager.orphans_failed == 1
    record = store.get_run(orphan)
    assert record.status == "failed" and "dashboard stopped" in record.error


def test_a_worker_that_dies_leaves_its_run_failed_not_running(ray_instance, store):
    from ray.exceptions import WorkerCrashedError

    class CrashingStream:
        def __iter__(self):
            raise WorkerCrashedError()

    class Board:
        class forget:  # mimics an actor method handle
            @staticmethod
            def remote(run_id):
                return None

    manager = RunManager(store)
    run_id = store.create_run(spec().to_dict(), spec().identity())
    manager._consume(run_id, CrashingStream(), Board())
    record = store.get_run(run_id)
    assert record.status == "failed"
    assert "WorkerCrashedError" in record.error


def test_runs_never_outnumber_the_cpus_ray_has(manager, store):
    """Queued runs wait for a CPU: a run polling for cancellation must not lend its CPU
    back to Ray (which a blocking ray.get on the task's thread does), or Ray starts more
    runs than there are CPUs and every one of them slows down."""
    import ray

    cpus = int(ray.cluster_resources()["CPU"])
    run_ids = [manager.start(spec(15 + i)) for i in range(cpus + 2)]  # each still seconds long
    for run_id in run_ids:
        assert manager.wait(run_id, 300)
    timings = [store.get_run(r).result.timing for r in run_ids]
    moments = sorted([(t.began_unix, 1) for t in timings] + [(t.ended_unix, -1) for t in timings])
    running = most = 0
    for _, change in moments:
        running += change
        most = max(most, running)
    assert most <= cpus // ray_backend.cpus_per_run()


# --- a sample's updates as one task (issue 34) -----------------------------------------------


def test_a_samples_updates_run_together_as_one_task_each_its_own_run(manager, store):
    """Two updates of a sample start as one Ray task; each is its own run in the store, with
    its own events, images and result, the attack's time shared between them."""
    from auditlib.engine.sample import update_specs

    updates = update_specs(spec(6), 2)
    run_ids = manager.start_together(updates, titles=["update 1", "update 2"])
    assert len(run_ids) == 2 and len(set(run_ids)) == 2
    assert all(manager.wait(r, 180) for r in run_ids)
    records = [store.get_run(r) for r in run_ids]
    assert [r.status for r in records] == ["completed", "completed"], [r.error for r in records]
    assert [r.title for r in records] == ["update 1", "update 2"]
    assert [r.spec_id for r in records] == [run_identity(u) for u in updates]
    for run_id in run_ids:
        assert [e.step for e in store.events(run_id)][-1] == 6
        for kind in ("originals", "live", "reconstruction"):
            assert store.image(run_id, kind).png.startswith(b"\x89PNG")
    first, second = (r.result for r in records)
    assert first.timing.seconds == second.timing.seconds  # one joint attack, halved
    assert first.victim.data.names != second.victim.data.names  # each its own photograph


def test_cancelling_one_update_of_a_sample_together_stops_them_all(manager, store):
    from auditlib.engine.sample import update_specs

    run_ids = manager.start_together(update_specs(spec(1_000_000, attack="ig"), 2))
    deadline = time.monotonic() + 120
    while store.latest_event(run_ids[1]) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    manager.cancel(run_ids[1])
    assert all(manager.wait(r, 30) for r in run_ids)
    for run_id in run_ids:
        record = store.get_run(run_id)
        assert record.status == "cancelled" and record.cancel_requested
        assert record.result.stop_reason == "cancelled"


def test_runs_that_cannot_advance_together_are_refused_before_anything_is_recorded(
    manager, store, monkeypatch
):
    from auditlib.engine.sample import update_specs

    with pytest.raises(AuditInputError, match="cannot advance together: one update"):
        manager.start_together([spec(6)])
    malicious = dataclasses.replace(
        spec(6, attack="rtf"), scenario=ScenarioSpec(server="malicious")
    )  # the malicious server's attacks: no batched form across updates yet
    with pytest.raises(AuditInputError, match="rtf has no batched form across updates"):
        manager.start_together(update_specs(malicious, 2))
    # An attack measured slower together on a CPU (none is now) is refused as such.
    slower = "grnn's updates together are slower on a CPU, as measured"
    monkeypatch.setitem(ATTACKS, "grnn", dataclasses.replace(ATTACKS["grnn"], no_cpu_gain=slower))
    with pytest.raises(AuditInputError, match=slower):
        manager.start_together(update_specs(spec(6, attack="grnn"), 2))
    assert store.list_runs() == []
