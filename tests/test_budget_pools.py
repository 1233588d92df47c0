"""A defended run's attacks and their adaptive twins each get the run's time budget: the
plain attack has the budget it has in the undefended control (the same attack at the same
budget, which the verdict compares with), and the twin a budget of its own."""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import replace

import torch

from auditlib.attacks import ATTACKS, RunControl
from auditlib.attacks.base import AttackInfo, AuditPreset
from auditlib.attacks.loop import PLAN, run_restarts, total_steps
from auditlib.attacks.restarts import AUDIT_PRESET, _affordable, run_attack, run_attack_updates
from auditlib.attacks.updates_loop import run_updates
from auditlib.engine.attack_phase import (
    BUDGET_SPENT,
    AttackCall,
    AttackRun,
    PlannedAttack,
    attack_call,
    plan_attacks,
    runs_ahead,
)
from auditlib.engine.audit import run_audit
from auditlib.engine.twins import with_adaptive
from auditlib.spec import Budget, ComponentSpec
from tests.test_attacks import lenet_spec, release_for

BUDGET_S = 2.0


def test_the_twin_gets_a_budget_of_its_own_and_the_plain_attack_the_controls():
    defended = dataclasses.replace(
        lenet_spec("ig", defense=ComponentSpec.of("dp-gaussian", {"sigma": "0.1"})),
        budget=Budget(iterations=1_000_000, max_seconds=BUDGET_S),
    )
    result = run_audit(defended, lpips_nets=())
    plain, twin = result.summary.attacks
    assert not plain.skipped and not twin.skipped, (plain.skipped, twin.skipped)
    assert plain.stop_reason == twin.stop_reason == "time budget"
    # Each ran for about the whole budget (not half of it each): the run took about twice.
    assert result.summary.timing.seconds >= 1.6 * BUDGET_S, result.summary.timing.seconds
    assert plain.steps > 0 and twin.steps > 0


# --- The budget divided among the attacks that will run (issue 50, item 8) ---------------


@functools.cache
def _lenet_release():
    return release_for(lenet_spec())[2]


def _planned(*names: str) -> list[PlannedAttack]:
    return [plan_attacks(ComponentSpec.of(n), 10)[0] for n in names]


def _share(index: int, planned: list[PlannedAttack], spent: float = 0.0, late: tuple = ()) -> float:
    """The seconds ``attack_call`` gives ``planned[index]`` of a 30 s budget of which the
    pool spent ``spent`` and the attacks before it ran ``late`` past their shares; no attack
    runs (the call is only built)."""
    release = _lenet_release()
    control = RunControl(max_steps=10, max_seconds=30.0)
    call = attack_call(
        index,
        planned,
        lambda p: release,
        control,
        0,
        {},
        {False: spent, True: 0.0},
        {False: list(late), True: []},
    )
    assert isinstance(call, AttackCall), call
    return call.control.max_seconds


def test_attacks_that_will_be_skipped_take_no_share_of_the_budget():
    # Under FedSGD DLM and DLM+ do not apply (they attack FedAvg's weights): an attack
    # before them gets all that is left, not a third of it that would be lost.
    planned = _planned("dlg", "dlm", "dlm+")
    assert ATTACKS["dlm"].why_not_applicable(
        _lenet_release().observation, _lenet_release().knowledge
    )
    assert runs_ahead(0, planned, lambda p: _lenet_release()) == 1
    assert _share(0, planned) == 30.0
    # Skipped ones in the middle take none either; the ones that run share equally.
    planned = _planned("dlg", "dlm", "ig", "dlm+")
    assert _share(0, planned) == 15.0
    # What an attack left unused passes to those after it: 12 s spent, 18 s for the last.
    assert _share(2, planned, spent=12.0) == 18.0
    # The last to run holds back what those before it ran past their shares on average (the
    # clock stops an attack between evaluations), at most half of what is left.
    assert _share(2, planned, spent=12.0, late=(3.0, 5.0)) == 14.0
    assert _share(2, planned, spent=12.0, late=(100.0,)) == 9.0
    assert _share(0, planned, late=(3.0,)) == 15.0  # not the last: its overrun passes on
    # A pool whose budget is spent skips the attack and says so.
    release = _lenet_release()
    skipped = attack_call(
        0,
        planned,
        lambda p: release,
        RunControl(max_steps=10, max_seconds=30.0),
        0,
        {},
        {False: 30.0, True: 0.0},
    )
    assert isinstance(skipped, AttackRun) and skipped.skipped == BUDGET_SPENT


def test_the_twins_pool_counts_only_twins_that_run():
    # Under Gaussian noise DLG's twin runs (the likelihood plus the image prior) and DLM's
    # does not apply (FedSGD): the twins' pool counts DLG's twin alone, the plain pool DLG.
    defended = release_for(
        lenet_spec(), defense="dp-gaussian", defense_params={"sigma": 0.01, "clip": None}
    )[2]
    planned = with_adaptive(_planned("dlg", "dlm"))  # dlg, dlg twin, dlm, dlm twin
    assert [p.adaptive for p in planned] == [False, True, False, True]
    assert runs_ahead(0, planned, lambda p: defended) == 1
    assert runs_ahead(1, planned, lambda p: defended) == 1


# --- More steps under a time budget never plan a weaker attack (issue 50, item 8) -------

PACE_S = 0.001  # seconds one step of the stub's starts takes
REFERENCE = 20  # the stub's preset: steps per start


@dataclasses.dataclass(frozen=True)
class _StubConfig:
    restarts: int = 4


class _Scheduled:
    """Starts of an attack whose step-size schedule is spread over its planned steps (as
    Inverting Gradients' drops are): its objective reaches its floor only once a start has
    taken every planned step; ``1 - steps / horizon`` on the way, restart r 0.01 r above."""

    def __init__(self, starts: int, horizon: int) -> None:
        self.horizon = horizon
        self.steps = [0] * starts

    def _loss(self, position: int) -> float:
        return 1 - self.steps[position] / self.horizon + 0.01 * position

    def step(self, alive):
        time.sleep(PACE_S)
        for position in alive:
            self.steps[position] += 1
        return {"loss": torch.tensor([self._loss(p) for p in alive])}

    def frame(self, position):
        return torch.zeros(1, 1, 2, 2), None

    def candidate(self, position):
        return torch.zeros(1, 1, 2, 2), None, self._loss(position)


def _stub_attack() -> AttackInfo:
    def run(observation, knowledge, config, control, seed):
        def make(generators, clock):
            return _Scheduled(len(generators), control.max_steps)

        return run_restarts(make, config.restarts, True, control, seed, "loss", None)

    def run_together(observations, knowledges, config, control, seeds):
        def make(generators, clock):  # every update's starts as rows of one step
            return _Scheduled(len(generators), control.max_steps)

        inferences = [None] * len(seeds)
        return run_updates(make, config.restarts, control, seeds, "loss", inferences)

    return AttackInfo(
        "stub",
        "a scheduled attack's starts",
        _StubConfig,
        run,
        audit=AuditPreset({"restarts": 4}, REFERENCE, "the test's"),
        run_updates=run_together,
    )


def _pick(steps: int, seconds: float | None, *, planned: bool = True):
    info = _stub_attack()
    control = RunControl(max_steps=steps, max_seconds=seconds, emit_every=1)
    if planned:
        events = list(run_attack(info, None, None, _StubConfig(), control, 0, AUDIT_PRESET))
    else:  # the attack's own run at those steps, raced, without planning from the clock
        events = list(info.run(None, None, _StubConfig(), replace(control, race=PLAN), 0))
    finals = [e.final for e in events if e.final is not None]
    assert len(finals) == 1
    return finals[0]


def test_more_steps_under_a_time_budget_never_plan_a_weaker_attack_than_the_presets():
    budget = 1.0  # the preset's 20 steps take about 0.02 s; 100 000 steps never fit
    preset = _pick(REFERENCE, budget)
    assert preset.stop_reason == "completed"
    # Why: asked for far more steps, the same race stretched over them is cut by the clock
    # with every start short of its schedule's end.
    unplanned = _pick(100_000, budget, planned=False)
    assert unplanned.stop_reason == "time budget"
    assert unplanned.selected.loss > preset.selected.loss + 0.5
    # Planned from the clock: the preset's plan first, then a longer one in the time left;
    # the pick by the attack's own objective is never worse than the preset's plan's.
    more = _pick(100_000, budget)
    assert more.selected.loss <= preset.selected.loss
    assert len(more.candidates) > len(preset.candidates)  # the longer plan ran too
    assert more.stop_reason == "time budget"  # 100 000 steps per start were not run
    assert len({c.restart for c in more.candidates}) == len(more.candidates)
    # Without a time budget nothing is planned from a clock: the steps asked are run.
    assert _pick(60, None).steps == _pick(60, None, planned=False).steps


def test_the_longer_plan_takes_the_most_steps_the_time_left_allows():
    control = RunControl(max_steps=10_000, max_seconds=10.0, emit_every=10, race=PLAN)
    config = _StubConfig()
    longest = [_affordable(config, control, 300, 0.01, left) for left in (3.0, 50.0, 500.0)]
    assert (
        longest[0] is None
    )  # the preset's 4 raced starts of 300 steps take 3.5 s: no more fit in 3
    assert longest[1] < longest[2] <= 10_000  # more time: more steps
    assert total_steps(4, PLAN, longest[1], 10) * 0.01 <= 50.0
    assert total_steps(4, PLAN, longest[1] + 1, 10) * 0.01 > 50.0
    # More steps asked never plan fewer than the clock allows: capped where it binds.
    fewer = _affordable(config, replace(control, max_steps=2_000), 300, 0.01, 500.0)
    assert fewer == min(2_000, longest[2])


UPDATES = 3


def _picks_together(steps: int, seconds: float | None, *, planned: bool = True) -> list:
    """Each of three updates' final reconstruction, their starts advancing together."""
    info = _stub_attack()
    control = RunControl(max_steps=steps, max_seconds=seconds, emit_every=1)
    seeds = list(range(UPDATES))
    if planned:
        none = [None] * UPDATES
        events = run_attack_updates(info, none, none, _StubConfig(), control, seeds, AUDIT_PRESET)
    else:  # the updates' own run at those steps, raced, without planning from the clock
        events = info.run_updates(None, None, _StubConfig(), replace(control, race=PLAN), seeds)
    finals: dict[int, object] = {}
    for u, event in events:
        if event.final is not None:
            assert u not in finals  # one final event per update
            finals[u] = event.final
    assert sorted(finals) == list(range(UPDATES))
    return [finals[u] for u in range(UPDATES)]


def test_updates_together_under_a_time_budget_never_plan_a_weaker_attack_than_the_presets():
    budget = 1.0  # the preset's 20 steps take about 0.02 s; 100 000 steps never fit
    preset = _picks_together(REFERENCE, budget)
    assert all(p.stop_reason == "completed" for p in preset)
    unplanned = _picks_together(100_000, budget, planned=False)
    assert all(
        u.selected.loss > p.selected.loss + 0.5 for u, p in zip(unplanned, preset, strict=True)
    )
    # Planned from the clock as one update alone is: each update's pick, by its own
    # objective, is never worse than its preset plan's, and the longer plan ran for all.
    more = _picks_together(100_000, budget)
    for update, alone in zip(more, preset, strict=True):
        assert update.selected.loss <= alone.selected.loss
        assert len(update.candidates) > len(alone.candidates)
        assert update.stop_reason == "time budget"
        assert len({c.restart for c in update.candidates}) == len(update.candidates)
    assert len({update.steps for update in more}) == 1  # lockstep: one clock, the same steps
    # Without a time budget the steps asked are run, as before.
    run = [u.steps for u in _picks_together(60, None)]
    assert run == [u.steps for u in _picks_together(60, None, planned=False)]
