"""Fair share of the workers between users (issue 51, item 4): per-user running and queued
limits, the longest time budget, and a queue that takes the users in turn.

The real RunManager on the session's Ray instance, with one slot (runs go to Ray one at a
time) so the order is the queue's alone. A run that must hold its slot is an IG attack of a
million steps, cancelled at the end; the others are a few DLG steps on LeNet (seconds).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import pytest

from auditlib.access import AccessDenied, Principal
from auditlib.engine import ray_backend
from auditlib.engine.controls import start_with_control
from auditlib.engine.fair_share import FairQueue, FairShareLimits, WaitReason
from auditlib.engine.runs import RunManager
from auditlib.engine.user_runs import UserRuns
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec
from auditlib.spec import (
    Budget,
    ComponentSpec,
    DataSpec,
    ModelRef,
    RunSpec,
    ScenarioSpec,
    UtilitySpec,
)
from auditlib.store import Store

IN_TURN = "(other users' runs are taken in turn with yours)"


def spec(iterations: int = 3, attack: str = "dlg", **budget) -> RunSpec:
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 32, 32), init="uniform")),
        data=DataSpec("samples", "photographs", batch_size=1),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of(attack),
        defense=ComponentSpec.of("none"),
        budget=Budget(iterations, **budget),
    )


def long_spec() -> RunSpec:
    """Holds its slot until it is cancelled."""
    return spec(1_000_000, attack="ig")


@pytest.fixture
def store(tmp_path):
    with Store(f"sqlite:///{tmp_path}/runs.db") as store:
        yield store


@pytest.fixture
def make_manager(ray_session, store):
    """A RunManager with one slot (unless told) and the given limits; its runs are
    cancelled at the end."""
    made = []

    def make(slots: int = 1, **limits) -> RunManager:
        manager = RunManager(
            store,
            emit_every=2,
            image_every=4,
            lpips_nets=(),
            limits=FairShareLimits(**limits),
            slots=slots,
        )
        made.append(manager)
        return manager

    yield make
    for manager in made:
        for run_id in manager.active_runs():
            manager.cancel(run_id)
        manager.wait_all(60)


@pytest.fixture
def submitted(monkeypatch) -> list[str]:
    """The run ids handed to Ray, in order (the real submission, logged)."""
    log: list[str] = []
    submit, together = ray_backend.submit, ray_backend.submit_together

    def logged(spec, assets, run_id, board, settings):
        log.append(run_id)
        return submit(spec, assets, run_id, board, settings)

    def logged_together(specs, assets, group_id, board, settings):
        log.append(group_id)
        return together(specs, assets, group_id, board, settings)

    monkeypatch.setattr(ray_backend, "submit", logged)
    monkeypatch.setattr(ray_backend, "submit_together", logged_together)
    return log


# --- (1) one user's Starts: a running run, a full queue, then a refusal in one line ---------


def test_one_user_fills_her_queue_and_the_next_start_is_refused_in_one_line(
    make_manager, store, submitted
):
    manager = make_manager(max_running=1, max_queued=4)
    first = manager.start(long_spec(), owner="alice")
    queued = [manager.start(spec(), owner="alice") for _ in range(4)]
    with pytest.raises(AuditInputError) as refused:
        manager.start(spec(), owner="alice")
    assert str(refused.value) == (
        "you have 1 run running and 4 queued, the most this service allows one user "
        "(AUDIT_USER_MAX_QUEUED=4); wait for one to finish or cancel one"
    )
    assert len(store.list_runs()) == 5  # the refused Start recorded nothing
    assert submitted == [first]  # the queued ones wait in the manager, not in Ray
    assert [store.get_run(r).status for r in queued] == ["queued"] * 4


def test_a_run_and_its_control_are_one_start_admitted_whole_or_refused_whole(make_manager, store):
    manager = make_manager(max_running=1, max_queued=2)
    alice = UserRuns.of(manager, Principal("alice"))
    alice.start(long_spec())
    alice.start(spec(4))  # one queued: room for one more Start
    defended = dataclasses.replace(
        spec(), defense=ComponentSpec.of("dp-gaussian", {"sigma": "0.01"})
    )
    with alice.one_start():
        run_id, control_id = start_with_control(alice, defended)
    assert control_id is not None  # both recorded: the queue now holds 3, one over
    assert {store.get_run(r).status for r in (run_id, control_id)} == {"queued"}
    before = len(store.list_runs())
    with pytest.raises(AuditInputError, match="1 run running and 3 queued"), alice.one_start():
        start_with_control(alice, dataclasses.replace(defended, seed=1))
    assert len(store.list_runs()) == before  # neither the control nor the run


# --- (2) another user's run goes before the first user's queue ------------------------------


def test_a_second_users_run_is_dispatched_before_the_first_users_queued_runs(
    make_manager, store, submitted
):
    manager = make_manager(max_running=1, max_queued=2)
    alice_running = manager.start(long_spec(), owner="alice")
    alice_queued = [manager.start(spec(), owner="alice") for _ in range(2)]
    with pytest.raises(AuditInputError, match="AUDIT_USER_MAX_QUEUED=2"):
        manager.start(spec(), owner="alice")
    bob = manager.start(spec(), owner="bob")  # after alice's queue is full
    manager.cancel(alice_running)  # her run ends: the slot goes to bob, not to her queue
    for run_id in [alice_running, bob, *alice_queued]:
        assert manager.wait(run_id, 180)
    assert submitted == [alice_running, bob, *alice_queued]
    began = [store.get_run(r).started_at for r in [bob, *alice_queued]]
    assert began == sorted(began)
    assert [store.get_run(r).status for r in [bob, *alice_queued]] == ["completed"] * 3


def test_the_queue_takes_the_owner_with_fewest_running_then_the_one_served_least_recently():
    """The policy alone (no Ray): slots free one at a time."""
    queue: FairQueue[str] = FairQueue(FairShareLimits(max_running=2, max_queued=10), slots=1)
    for name in ("a1", "a2", "a3"):
        queue.add("alice", name, [name], name)
    queue.add("bob", "b1", ["b1"], "b1")
    queue.add("carol", "c1", ["c1"], "c1")
    order = []
    for _ in range(5):
        [taken] = queue.take()
        order.append(taken)
        queue.finished(taken)  # it ends before the next slot frees
    # Nobody runs anything between picks: each pick goes to whoever was served least
    # recently, so the users take turns from the oldest Start on.
    assert order == ["a1", "b1", "c1", "a2", "a3"]

    queue = FairQueue(FairShareLimits(max_running=2, max_queued=10), slots=3)
    queue.add("alice", "a1", ["a1"], "a1")
    queue.add("alice", "a2", ["a2"], "a2")
    queue.add("alice", "a3", ["a3"], "a3")
    queue.add("bob", "b1", ["b1"], "b1")
    assert queue.take() == ["a1", "b1", "a2"]  # never more than 2 of alice's at once
    queue.finished("b1")
    assert queue.take() == []  # a free slot, but alice runs as many as one user may


# --- (3) the longest time budget ----------------------------------------------------------


def test_a_time_budget_over_a_day_is_refused_by_the_library():
    with pytest.raises(AuditInputError) as refused:
        Budget(5, max_seconds=86_401)
    assert str(refused.value) == (
        "time budget must be > 0 s and at most 86,400 s (a day), got 86401 s"
    )
    assert Budget(5, max_seconds=86_400).max_seconds == 86_400


def test_a_time_budget_over_the_services_limit_is_refused_before_anything_is_recorded(
    make_manager, store
):
    manager = make_manager(max_run_seconds=60)
    with pytest.raises(AuditInputError) as refused:
        manager.start(spec(max_seconds=61), owner="alice")
    assert str(refused.value) == (
        "a time budget of 61 s is more than this service allows one run "
        "(AUDIT_MAX_RUN_SECONDS=60); choose at most 60 s"
    )
    with pytest.raises(AuditInputError, match="utility training's time budget of 300 s"):
        manager.start(dataclasses.replace(spec(max_seconds=60), utility=UtilitySpec()))
    assert store.list_runs() == []


def test_the_limits_are_read_from_the_environment_and_bad_values_are_refused(monkeypatch):
    for name in ("AUDIT_USER_MAX_RUNNING", "AUDIT_USER_MAX_QUEUED", "AUDIT_MAX_RUN_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    assert FairShareLimits.from_environment() == FairShareLimits(2, 4, 3600)
    monkeypatch.setenv("AUDIT_USER_MAX_RUNNING", "3")
    monkeypatch.setenv("AUDIT_USER_MAX_QUEUED", "10")
    monkeypatch.setenv("AUDIT_MAX_RUN_SECONDS", "900")
    assert FairShareLimits.from_environment() == FairShareLimits(3, 10, 900)
    for name, value, expected in (
        ("AUDIT_USER_MAX_RUNNING", "0", "expected a whole number from 1 to 1000 (unset: 2)"),
        ("AUDIT_USER_MAX_QUEUED", "four", "expected a whole number from 1 to 1000 (unset: 4)"),
        ("AUDIT_MAX_RUN_SECONDS", "100000", "expected a number of seconds from 1 to 86,400"),
    ):
        monkeypatch.setenv(name, value)
        with pytest.raises(AuditInputError) as refused:
            FairShareLimits.from_environment()
        assert str(refused.value).startswith(f"{name}={value!r}: {expected}"), refused.value
        monkeypatch.delenv(name)


# --- (4) a queued run cancelled before it is submitted ----------------------------------------


def test_a_queued_run_cancelled_before_dispatch_ends_cancelled_and_never_reaches_ray(
    make_manager, store, submitted
):
    manager = make_manager(max_running=1, max_queued=4)
    running = manager.start(long_spec(), owner="alice")
    queued = manager.start(spec(), owner="alice")
    asked = time.monotonic()
    manager.cancel(queued)
    assert manager.wait(queued, 0) and not manager.is_active(queued)  # at once
    assert time.monotonic() - asked < 1
    record = store.get_run(queued)
    assert record.status == "cancelled" and record.cancel_requested
    assert record.started_at is None and "never ran" in record.error
    manager.cancel(running)
    assert manager.wait(running, 60)
    assert submitted == [running]  # the cancelled run never went to Ray


def test_cancelling_one_queued_update_of_a_sample_together_cancels_them_all(
    make_manager, store, submitted
):
    from auditlib.engine.sample import update_specs

    manager = make_manager(max_running=1, max_queued=4)
    running = manager.start(long_spec(), owner="alice")
    updates = manager.start_together(update_specs(spec(), 2), owner="alice")
    manager.cancel(updates[1])
    assert [store.get_run(r).status for r in updates] == ["cancelled", "cancelled"]
    assert submitted == [running]


# --- (5) why a queued run waits --------------------------------------------------------------


def test_a_queued_run_says_why_it_waits(make_manager, store):
    manager = make_manager(max_running=1, max_queued=4)
    alice = UserRuns.of(manager, Principal("alice"))
    bob = UserRuns.of(manager, Principal("bob"))
    alice.start(long_spec())
    alice_waits = alice.start(spec())
    bob_first, bob_second = bob.start(spec()), bob.start(spec())
    assert alice.waiting_reason(alice_waits) == WaitReason(
        "your_limit",
        1,
        0,
        "waiting: you have 1 run running, the most one user may run at once "
        "(AUDIT_USER_MAX_RUNNING=1); it starts when one of them ends",
    )
    assert bob.waiting_reason(bob_first) == WaitReason(
        "no_free_worker", 0, 0, f"waiting for a free worker: no run ahead of it {IN_TURN}"
    )
    # Bob's first, then alice's (she was served before bob's second), then his second.
    second = bob.waiting_reason(bob_second)
    assert second.kind == "no_free_worker" and second.ahead == 2
    assert second.words == f"waiting for a free worker: 2 runs ahead of it {IN_TURN}"
    with pytest.raises(AccessDenied):
        bob.waiting_reason(alice_waits)  # another user's run is not his to ask about


def test_a_sample_together_is_one_running_run_of_its_owner(make_manager, store):
    """Updates that advance together take one slot and count as one running run."""
    from auditlib.engine.sample import update_specs

    manager = make_manager(slots=2, max_running=1, max_queued=4)  # a slot stays free
    updates = manager.start_together(update_specs(long_spec(), 2), owner="alice")
    waits = manager.start(spec(), owner="alice")
    reason = manager.waiting_reason(waits)
    assert reason.kind == "your_limit" and "you have 1 run running" in reason.words
    assert {store.get_run(r).status for r in updates} <= {"queued", "running"}


# --- the Attack lab: the refusal and the reason, as a signed-in user sees them ----------------

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def lab_limits(monkeypatch):
    """One run at a time and one queued per user, read when the page's manager is made."""
    monkeypatch.setenv("AUDIT_USER_MAX_RUNNING", "1")
    monkeypatch.setenv("AUDIT_USER_MAX_QUEUED", "1")


def test_the_lab_says_why_a_run_waits_and_why_a_start_is_refused(lab_limits, dashboard_store):
    from streamlit.testing.v1 import AppTest

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from dashboard.navigation import LAB

    store, _ = dashboard_store
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["authentication_status"] = True
    at.session_state["username"] = "alice"
    at.run()
    at.switch_page(LAB.path).run()
    at.number_input(key="iterations.dlg.audit").set_value(100_000)
    at.button(key="start").click().run()  # runs: alice's one at a time
    first = at.query_params["run"]
    at.button(key="start").click().run()  # queued behind it
    waiting = at.query_params["run"]
    assert waiting != first and store.get_run(waiting).status == "queued"
    [bar] = at.get("progress")
    assert bar.proto.text == (
        "waiting: you have 1 run running, the most one user may run at once "
        "(AUDIT_USER_MAX_RUNNING=1); it starts when one of them ends"
    )
    at.button(key="start").click().run()  # her queue is full
    assert not at.exception
    assert [e.value for e in at.error] == [
        "Not started: you have 1 run running and 1 queued, the most this service allows one "
        "user (AUDIT_USER_MAX_QUEUED=1); wait for one to finish or cancel one"
    ]
    assert len(store.list_runs()) == 2
