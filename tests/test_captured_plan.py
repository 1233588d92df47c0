"""Recording by default (``attacks.captured.by_default``, issue 55), checked on the CPU
before it is switched on for CUDA: a plan of every attack (``--attack all``, whose attacks
take no parameters) records each attack's step through the stand-in recording and ends as
the same plan does eagerly; a sample's updates that run together stay on their eager
batched step; ``captured=false`` keeps a step eager."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from test_captured_step import _captured_here

from auditlib.attacks import RunControl, build_attack_config
from auditlib.attacks import captured as captured_step
from auditlib.attacks.base import get_attack
from auditlib.attacks.restarts import why_apart
from auditlib.engine.attack_phase import AttackRun, plan_attacks, run_attacks
from auditlib.reconstruction import EAGER, RECORDED, Stepped
from auditlib.spec import ComponentSpec
from tests.test_attacks import lenet_spec, release_for

# Enough steps for a race's counts of starts to pass their eager steps and be recorded.
STEPS = 10
# Why a run left to itself recorded its step (``Stepped.note``).
CHOSEN = "the run's choice on CUDA; captured=false keeps it eager"


@pytest.fixture
def recording_by_default(monkeypatch):
    """Recording switched on, and this CPU taken for CUDA by its decision: the stand-in
    recording (``test_captured_step.StandIn``) counts what would be CUDA graphs."""
    stand_in = _captured_here(monkeypatch)
    monkeypatch.setattr(captured_step, "BY_DEFAULT_ON_CUDA", True)
    decide = captured_step.by_default
    on_cuda = SimpleNamespace(device=torch.device("cuda"))
    monkeypatch.setattr(
        captured_step, "by_default", lambda config, _, reason: decide(config, on_cuda, reason)
    )
    return stand_in


def _release():
    return release_for(lenet_spec("ig", batch=1))[2]


def _one(planned, release) -> AttackRun:
    outcomes: list[AttackRun] = []
    control = RunControl(STEPS, emit_every=2, image_every=10**9)
    list(run_attacks([planned], lambda p: release, control, 0, outcomes, at_once=False))
    [outcome] = outcomes
    return outcome


def test_every_attack_of_the_plan_records_its_step_and_ends_as_it_ends_eager(
    monkeypatch, recording_by_default
):
    release = _release()
    planned = plan_attacks(ComponentSpec.of("all"), STEPS, every=2)
    assert {p.name for p in planned} == {
        "dlg", "idlg", "ig", "gi", "grnn", "dlm", "dlm+", "fedleak"
    }  # fmt: skip
    # Each alone: then none is left out as the plan on LeNet leaves GI and DLM out (each
    # runs on what it is given), and each one's recordings are counted apart.
    for attack in planned:
        before = recording_by_default.recorded
        captured = _one(attack, release)
        recorded = recording_by_default.recorded
        assert recorded > before, attack.label  # its step recorded
        with monkeypatch.context() as eager_here:
            eager_here.setattr(captured_step, "BY_DEFAULT_ON_CUDA", False)
            eager = _one(attack, release)
        assert recording_by_default.recorded == recorded, attack.label  # none eager
        for outcome in (eager, captured):
            assert outcome.skipped is None, (attack.label, outcome.skipped)
        assert captured.final.steps == eager.final.steps, attack.label
        assert captured.final.stop_reason == eager.final.stop_reason, attack.label
        assert [c.restart for c in captured.final.candidates] == [
            c.restart for c in eager.final.candidates
        ], attack.label
        # The result says how: recorded as the run chose, or eager.
        assert captured.final.stepped == Stepped(RECORDED, CHOSEN), attack.label
        assert eager.final.stepped == Stepped(EAGER), attack.label


def test_a_sample_s_updates_together_stay_on_their_eager_batched_step(recording_by_default):
    """Left to the run, ``captured`` does not keep updates apart (``why_apart``): they run
    together on the eager batched step, which records nothing (a graph holds one update's
    rows); asked for, it does keep them apart."""
    release = _release()
    info = get_attack("ig")
    config, _ = build_attack_config("ig", {"restarts": 2}, "audit")
    knowledges = [release.knowledge, release.knowledge]
    assert config.captured is None and why_apart(info, config, knowledges, "audit") is None
    asked = dataclasses.replace(config, captured=True)
    assert (
        why_apart(info, asked, knowledges, "audit") == "ig traces one update's step (captured=true)"
    )
    control = RunControl(STEPS, emit_every=2, image_every=10**9)
    observations = [release.observation, release.observation]
    events = list(info.run_updates(observations, knowledges, config, control, [0, 1]))
    finals = [e.final for _, e in events if e.final is not None]
    assert {u for u, e in events if e.final is not None} == {0, 1}
    assert recording_by_default.recorded == 0
    assert [f.stepped for f in finals] == [Stepped(EAGER)] * 2


def test_captured_false_keeps_the_step_eager_when_recording_is_the_default(recording_by_default):
    release = _release()
    planned = plan_attacks(ComponentSpec.of("ig", {"captured": "false"}), STEPS, every=2)[0]
    assert _one(planned, release).final.stop_reason == "completed"
    assert recording_by_default.recorded == 0
    planned = plan_attacks(ComponentSpec.of("ig"), STEPS, every=2)[0]
    assert _one(planned, release).final.stop_reason == "completed"
    assert recording_by_default.recorded == 1
