"""Specification of the audit preset's restart race (successive halving by the attack's loss)."""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from auditlib.attacks.base import Candidate, Clock, ProgressEvent, RunControl, final_event
from auditlib.attacks.restarts import PLAN, HalvingPlan, run_halving, start_seed


@dataclasses.dataclass(frozen=True)
class FakeConfig:
    restarts: int = 1


def loss_of(seed: int) -> float:
    return (seed % 1000) / 1000.0  # each start's loss is fixed by its seed


def fake_attack(observation, knowledge, config, control, seed, step_seconds=0.0):
    """An attack whose every start descends from its seed's loss (lower is better)."""
    assert config.restarts == 1
    clock = Clock(control)
    base = loss_of(seed)
    steps, stop = 0, "completed"
    for step in range(1, control.max_steps + 1):
        reason = clock.stop_reason()
        if reason is not None:
            stop = reason
            break
        time.sleep(step_seconds)
        steps = step
        if step % control.emit_every == 0:
            yield ProgressEvent(step, control.max_steps, clock.elapsed, {"objective": base / step})
    images = torch.full((1, 1, 2, 2), float(seed % 7))
    candidate = Candidate(images, None, base / max(steps, 1), 0, steps, stop)
    yield final_event(
        [candidate], stop, steps, control.max_steps, clock, {"rule": "x"}, "objective"
    )


def race(starts: int, control: RunControl, attack=fake_attack):
    events = list(run_halving(attack, None, None, FakeConfig(starts), control, seed=7))
    return events[:-1], events[-1].final


def test_the_race_keeps_the_better_half_at_each_rung_and_picks_the_lowest_loss():
    events, final = race(8, RunControl(max_steps=100, emit_every=1))
    assert final.stop_reason == "completed"
    losses = {c.restart: loss_of(start_seed(7, c.restart)) for c in final.candidates}
    winner = min(losses, key=losses.get)
    assert final.selected.restart == winner
    full = [c for c in final.candidates if c.steps == 100]
    assert [c.restart for c in full] == [winner]  # only one start runs to the end
    dropped = [c for c in final.candidates if c.stop_reason.startswith("dropped")]
    assert len(dropped) == 7
    # Steps: 8 starts to 3, 4 to 10, 2 to 25, 1 to 100 (each dropped start may take one more).
    assert final.steps <= PLAN.planned_steps(8, 100) + 7
    assert events[-1].step <= final.steps and all(
        e.total_steps == PLAN.planned_steps(8, 100) for e in events
    )


def test_start_zero_is_the_single_run_of_the_same_seed():
    assert start_seed(7, 0) == 7 and start_seed(7, 1) != 7


def test_the_race_shares_one_time_budget():
    slow = lambda *a: fake_attack(*a, step_seconds=0.01)  # noqa: E731
    began = time.perf_counter()
    _, final = race(4, RunControl(max_steps=10_000, max_seconds=0.5, emit_every=5), slow)
    assert time.perf_counter() - began < 1.5
    assert final.stop_reason == "time budget"
    assert all(math.isfinite(c.loss) for c in final.candidates)


def test_a_cancelled_race_says_so():
    flag = {"n": 0}

    def cancelled() -> bool:
        flag["n"] += 1
        return flag["n"] > 50

    _, final = race(4, RunControl(max_steps=1000, emit_every=1, is_cancelled=cancelled))
    assert final.stop_reason == "cancelled"


def test_rungs_fall_on_event_steps():
    assert HalvingPlan((0.03, 0.1, 0.25)).rung_steps(300, every=10) == [10, 30, 80]
    assert (
        HalvingPlan((0.03, 0.1, 0.25)).planned_steps(8, 300, every=10)
        == 8 * 10 + 4 * 20 + 2 * 50 + 220
    )
