"""Specification of the one restart loop (attacks.loop) and of restarts that advance together."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch
from test_attacks import lenet_spec, release_for, resnet20_spec
from test_attacks import run_attack as run_named

from auditlib.attacks import build_attack_config, get_attack
from auditlib.attacks.base import RunControl, optimisers_ready
from auditlib.attacks.loop import (
    PLAN,
    READ_BACK_EVERY,
    HalvingPlan,
    ReadLosses,
    StepInterrupted,
    read_losses,
    run_restarts,
    start_seed,
)
from auditlib.attacks.objectives import DISTANCES, UpdateMatcher, why_not_together
from auditlib.attacks.restarts import run_attack
from auditlib.client.protocol import ClientProtocol
from auditlib.engine.attack_phase import plan_attacks
from auditlib.spec import ComponentSpec


class Descent:
    """Restarts whose objective is fixed by their generator's first draw, over the step."""

    def __init__(self, generators, clock, nan_at=None, interrupt_at=None):
        self.start = [float(torch.rand((), generator=g)) for g in generators]
        self.step_count = 0
        self.nan_at = nan_at or {}  # position -> step at which its objective stops being finite
        self.interrupt_at = interrupt_at

    def step(self, alive):
        self.step_count += 1
        if self.step_count == self.interrupt_at:
            raise StepInterrupted("time budget")
        values = [
            math.nan if self.nan_at.get(p) == self.step_count else self.start[p] / self.step_count
            for p in alive
        ]
        return {"objective": torch.tensor(values)}

    def frame(self, position):
        return torch.full((1, 1, 2, 2), float(position)), None

    def candidate(self, position):
        return (
            torch.full((1, 1, 2, 2), float(position)),
            None,
            self.start[position] / max(self.step_count, 1),
        )


def run(restarts, together, control, **descent):
    events = list(
        run_restarts(
            lambda generators, clock: Descent(generators, clock, **descent),
            restarts,
            together,
            control,
            seed=7,
            loss_name="objective",
            label_inference=None,
        )
    )
    return events[:-1], events[-1].final


def test_every_restart_runs_the_budget_and_the_pick_is_the_lowest_objective():
    for together in (False, True):
        events, final = run(4, together, RunControl(10, emit_every=5))
        assert [c.restart for c in final.candidates] == [0, 1, 2, 3]
        assert all(c.steps == 10 and c.stop_reason == "completed" for c in final.candidates)
        assert final.steps == 40 and final.stop_reason == "completed"
        assert final.selected.loss == min(c.loss for c in final.candidates)
        steps = [e.step for e in events]
        assert steps == sorted(steps) and steps[-1] == 40


def test_restarts_together_stream_one_frame_per_step_the_leaders():
    events, final = run(3, True, RunControl(4, emit_every=1, image_every=2))
    stepped = [e for e in events if e.losses]
    assert len(stepped) == 3 * 4  # every restart's losses at every emitted step
    framed = [e for e in stepped if e.images is not None]
    assert len(framed) == 2  # steps 2 and 4, one frame each
    leader = min(final.candidates, key=lambda c: c.loss).restart
    assert {e.restart for e in framed} == {leader}


def test_restarts_draw_the_same_starts_together_or_apart():
    _, apart = run(3, False, RunControl(2))
    _, together = run(3, True, RunControl(2))
    assert [c.loss for c in apart.candidates] == [c.loss for c in together.candidates]
    stream = torch.Generator().manual_seed(7)  # one stream, drawn in restart order
    draws = [float(torch.rand((), generator=stream)) for _ in range(3)]
    assert [c.loss for c in apart.candidates] == pytest.approx([d / 2 for d in draws])


def test_raced_restarts_draw_from_seeds_of_their_own():
    _, final = run(4, True, RunControl(100, emit_every=1, race=PLAN))
    for candidate in final.candidates:
        seed = start_seed(7, candidate.restart)
        first = float(torch.rand((), generator=torch.Generator().manual_seed(seed)))
        assert candidate.loss == pytest.approx(first / candidate.steps)


def test_a_diverged_restart_stops_alone_and_the_others_go_on():
    _, final = run(3, True, RunControl(10), nan_at={1: 4})
    reasons = {c.restart: (c.stop_reason, c.steps) for c in final.candidates}
    assert reasons == {0: ("completed", 10), 1: ("diverged", 4), 2: ("completed", 10)}
    assert final.stop_reason == "completed"


def test_losses_are_read_back_at_events_and_every_few_steps_not_at_every_step(monkeypatch):
    from auditlib.attacks import loop

    reads = []

    def counted(pending, positions):
        reads.append([step for step, _ in pending])
        return read_losses(pending, positions)

    monkeypatch.setattr(loop, "read_losses", counted)
    events, _ = run(2, True, RunControl(100, emit_every=10))
    assert [e.step for e in events if e.losses][-2:] == [200, 200]  # both at the last step
    # Step 1 (the first event), then every event's step: 11 reads for 100 steps.
    assert [r[-1] for r in reads] == [1, *range(10, 101, 10)]
    assert sum(len(r) for r in reads) == 100  # every step read once
    reads.clear()
    _, quiet = run(2, True, RunControl(100, emit_every=10**9))
    assert [len(r) for r in reads] == [1, 32, 32, 32, 3]  # at least every READ_BACK_EVERY
    assert READ_BACK_EVERY == 32
    assert [c.steps for c in quiet.candidates] == [100, 100]


def test_a_restart_found_diverged_at_a_read_is_dropped_at_the_step_it_diverged():
    _, final = run(3, True, RunControl(100, emit_every=10**9), nan_at={1: 4, 2: 40})
    reasons = {c.restart: (c.stop_reason, c.steps) for c in final.candidates}
    assert reasons == {0: ("completed", 100), 1: ("diverged", 4), 2: ("diverged", 40)}
    assert final.steps == 100 + 4 + 40  # the steps it took after diverging are not counted


def test_read_losses_gives_each_running_restarts_objective_or_its_first_broken_step():
    pending = [
        (5, {"objective": torch.tensor([1.0, 2.0, 3.0]), "other": torch.zeros(3)}),
        (6, {"objective": torch.tensor([0.5, math.inf, math.nan])}),
        (7, {"objective": torch.tensor([0.25, 1.0, math.nan])}),
    ]
    read = read_losses(pending, [4, 0, 9])
    assert read.objective == {4: 0.25}
    assert read.diverged == {0: 6, 9: 6}
    assert read_losses([], [1]) == ReadLosses({}, {})


def test_a_race_drops_the_worse_half_at_each_rung():
    control = RunControl(100, emit_every=1, race=PLAN)
    _, final = run(8, True, control)
    dropped = [c for c in final.candidates if c.stop_reason.startswith("dropped")]
    assert len(dropped) == 7  # 8 -> 4 -> 2 -> 1 at 3, 10 and 25 steps
    kept = next(c for c in final.candidates if c.stop_reason == "completed")
    assert kept.steps == 100 and kept is final.selected
    assert final.steps == PLAN.planned_steps(8, 100)


def test_a_race_keeps_the_restart_with_the_lowest_objective_to_the_end():
    for together in (False, True):
        _, final = run(8, together, RunControl(100, emit_every=1, race=PLAN))
        winner = min(final.candidates, key=lambda c: c.loss)
        assert [c.restart for c in final.candidates if c.steps == 100] == [winner.restart]
        assert final.selected is winner and final.stop_reason == "completed"


def test_rungs_fall_on_event_steps():
    assert HalvingPlan((0.03, 0.1, 0.25)).rung_steps(300, every=10) == [10, 30, 80]
    assert (
        HalvingPlan((0.03, 0.1, 0.25)).planned_steps(8, 300, every=10)
        == 8 * 10 + 4 * 20 + 2 * 50 + 220
    )


def test_start_zero_is_the_single_run_of_the_same_seed():
    assert start_seed(7, 0) == 7 and start_seed(7, 1) != 7


def test_a_race_shares_one_time_budget():
    class Slow(Descent):
        def step(self, alive):
            time.sleep(0.01)
            return super().step(alive)

    optimisers_ready()  # a process's one-off import, paid outside any budget by design
    began = time.perf_counter()
    events = list(
        run_restarts(
            lambda generators, clock: Slow(generators, clock),
            4,
            False,
            RunControl(10_000, max_seconds=0.5, emit_every=5, race=PLAN),
            seed=7,
            loss_name="objective",
            label_inference=None,
        )
    )
    final = events[-1].final
    assert time.perf_counter() - began < 1.5
    assert final.stop_reason == "time budget" and len(final.candidates) == 4
    assert all(math.isfinite(c.loss) for c in final.candidates)


def test_a_cancelled_race_says_so():
    calls = {"n": 0}

    def cancelled() -> bool:
        calls["n"] += 1
        return calls["n"] > 50

    _, final = run(4, False, RunControl(1000, emit_every=1, is_cancelled=cancelled, race=PLAN))
    assert final.stop_reason == "cancelled"
    assert all(
        c.stop_reason in {"cancelled", "completed"} or c.stop_reason.startswith("dropped")
        for c in final.candidates
    )


def test_the_audit_preset_races_and_the_paper_preset_does_not():
    _, _, release = release_for(lenet_spec("ig"))
    info = get_attack("ig")
    finals = {}
    for preset in ("audit", "paper"):
        config, _ = build_attack_config("ig", {"restarts": 4}, preset)
        control = RunControl(40, emit_every=1)
        events = list(
            run_attack(info, release.observation, release.knowledge, config, control, 0, preset)
        )
        finals[preset] = events[-1].final
    assert sum(c.stop_reason.startswith("dropped") for c in finals["audit"].candidates) == 3
    assert all(c.steps == 40 for c in finals["paper"].candidates)


@pytest.mark.parametrize(
    ("preset", "every", "expected"),
    [
        ("audit", 1, 4 * 2 + 2 * 2 + 1 * 6 + 1 * 30),  # rungs at 2, 4 and 10 of 40 steps
        ("audit", 5, 4 * 5 + 2 * 5 + 1 * 30),  # on the event grid: rungs at 5 and 10
        ("paper", 5, 4 * 40),  # one after another, each to the end
    ],
)
def test_the_planned_steps_are_the_steps_a_run_takes(preset, every, expected):
    """The engine's plan (plan_attacks, through attacks.restarts.planned_steps) is the total
    the restart loop announces in every event, and the steps a completed run takes."""
    _, _, release = release_for(lenet_spec("ig"))
    (planned,) = plan_attacks(ComponentSpec.of("ig", {"restarts": 4}, preset), 40, every)
    assert planned.planned_steps == expected
    events = list(
        run_attack(
            get_attack("ig"),
            release.observation,
            release.knowledge,
            planned.config,
            RunControl(40, emit_every=every),
            0,
            preset,
        )
    )
    final = events[-1].final
    assert final.stop_reason == "completed"
    assert {e.total_steps for e in events} == {expected}
    assert final.steps == expected


def test_an_interrupted_step_ends_the_run_with_its_reason():
    _, final = run(2, True, RunControl(10), interrupt_at=3)
    assert {c.stop_reason for c in final.candidates} == {"time budget"}
    assert all(c.steps == 2 for c in final.candidates)
    assert final.stop_reason == "time budget"


def test_cancellation_stops_every_restart():
    _, final = run(3, False, RunControl(10, is_cancelled=lambda: True))
    assert final.stop_reason == "cancelled"
    assert [c.stop_reason for c in final.candidates] == ["cancelled"]  # later ones never ran


def test_ig_restarts_together_end_where_they_end_apart():
    """R = 3 restarts of IG on LeNet, advanced together by vmap, against one after the
    other: same seeds, each restart's own objective; equal to float tolerance after 3 steps."""
    _, _, release = release_for(lenet_spec("ig"))
    finals = [
        run_named("ig", release, 3, params={"restarts": 3, "together": together, "signed": False})[
            1
        ]
        for together in (False, True)
    ]
    for apart, together in zip(*(f.candidates for f in finals), strict=True):
        assert together.restart == apart.restart and together.steps == apart.steps == 3
        assert together.loss == pytest.approx(apart.loss, rel=1e-5)
        torch.testing.assert_close(together.images, apart.images, rtol=0, atol=1e-5)
        assert torch.equal(together.labels, apart.labels)


def test_together_gives_each_restart_its_own_objective_and_gradient_on_a_fedavg_batch():
    """Two local steps, soft labels: the batched objective and its pixel gradient are each
    restart's own (compared at the same point: Adam's first steps are sign-like, so a run's
    end state magnifies float differences where a pixel's gradient is near zero)."""
    protocol = ClientProtocol(algorithm="fedavg", local_steps=2, local_lr=0.05, local_batch_size=1)
    _, _, release = release_for(lenet_spec("ig", batch=2), protocol=protocol)
    _each_rows_own(UpdateMatcher(release.observation, release.knowledge, "cosine"), 1e-5, 1e-4)


def _each_rows_own(matcher: UpdateMatcher, rel: float, grad_rel: float) -> None:
    """Three restarts' objectives and pixel gradients by ``matcher.together`` against each
    restart alone, at the same random point (2 images each, soft labels): to ``rel`` for the
    values and ``grad_rel`` (of the largest entry) for the gradients."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(3, 2, 3, 32, 32, generator=generator).requires_grad_(True)
    labels = torch.softmax(torch.randn(3, 2, 100, generator=generator), dim=-1)
    together = matcher.together(images, labels)
    (batched,) = torch.autograd.grad(together.sum(), images)
    for r in range(3):
        alone = matcher(images[r], labels[r])
        (own,) = torch.autograd.grad(alone, images)
        assert float(together[r].detach()) == pytest.approx(float(alone.detach()), rel=rel)
        torch.testing.assert_close(
            batched[r], own[r], rtol=grad_rel, atol=grad_rel * own.abs().max()
        )


# Each defense whose adaptive attacker transforms its candidate's update as the defense did
# (``KnownDefense.transform``): clipping by norm and by value, DP's clip, and quantisation
# that rounds (half precision, the sign, QSGD to the nearest level); with the tolerance of
# its comparison. The batched update differs from the one alone by float order, which the
# sign and QSGD's rounding can turn into a whole level on an entry at a boundary (a few of
# LeNet's 60 000, and on another CPU's kernels others): those compare to 1 %, which a
# transform taken across rows (a norm or a bucket shared by the restarts) is far from.
TRANSFORMS = [
    ("clip", {"mode": "norm", "bound": 0.5}, 1e-4),
    ("clip", {"mode": "value", "bound": 0.01}, 1e-4),
    ("dp-gaussian", {"clip": 1.0, "sigma": 0.01}, 1e-4),
    ("quantize", {"bits": 16}, 1e-4),
    ("quantize", {"bits": 1}, 1e-2),
    ("quantize", {"bits": 4, "stochastic": False}, 1e-2),
]


@pytest.mark.parametrize(("defense", "params", "rel"), TRANSFORMS)
def test_the_adaptive_attackers_transform_is_each_restarts_own_together(defense, params, rel):
    """The twin's restarts advance together: in the batched pass each row's update is
    transformed as it would be alone, so its objective and pixel gradient are its own."""
    _, _, release = release_for(lenet_spec("ig", batch=2), defense=defense, defense_params=params)
    knowledge = dataclasses.replace(release.knowledge, defense=release.known_defense)
    assert knowledge.defense.transform is not None and why_not_together(knowledge) is None
    _each_rows_own(UpdateMatcher(release.observation, knowledge, "cosine"), rel, 10 * rel)


def test_an_adaptive_twins_restarts_run_together_and_end_where_they_end_apart():
    """IG's twin under clipping, three restarts advanced together against one after another
    (unsigned Adam: the signed step turns rounding near a zero gradient into a full step)."""
    _, _, release = release_for(
        lenet_spec("ig"), defense="clip", defense_params={"mode": "norm", "bound": 0.5}
    )
    release = dataclasses.replace(
        release, knowledge=dataclasses.replace(release.knowledge, defense=release.known_defense)
    )
    finals = [
        run_named("ig", release, 3, params={"restarts": 3, "together": t, "signed": False})[1]
        for t in (False, True)
    ]
    for apart, together in zip(*(f.candidates for f in finals), strict=True):
        assert together.restart == apart.restart and together.steps == apart.steps == 3
        assert together.loss == pytest.approx(apart.loss, rel=1e-4)
        torch.testing.assert_close(together.images, apart.images, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", sorted(DISTANCES))
def test_every_distance_of_stacked_updates_is_each_restarts_own(name):
    """R updates stacked along a leading dimension (how ``together`` measures them, outside
    its vmap) give one value per restart, each the distance of that update alone."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(12, 3, 5, 5), (12,), (100, 768)]
    target = [torch.randn(s, generator=generator) for s in shapes]
    stacked = [torch.randn((4, *s), generator=generator) for s in shapes]
    together = DISTANCES[name](stacked, target)
    assert together.shape == (4,)
    for r in range(4):
        alone = DISTANCES[name]([s[r] for s in stacked], target)
        assert alone.dim() == 0
        assert float(together[r]) == pytest.approx(float(alone), rel=1e-5)


def test_restarts_on_batchnorm_models_advance_together_and_end_where_they_end_apart():
    """BatchNorm on batch statistics batches exactly (tests/test_exact_batchnorm.py), so IG's
    restarts on ResNet-20 in train mode run together and end where they end apart."""
    spec = resnet20_spec("ig")
    _, _, train = release_for(spec)
    assert why_not_together(train.knowledge) is None
    finals = [
        run_named("ig", train, 3, params={"restarts": 2, "together": together})[1]
        for together in (False, True)
    ]
    for apart, together in zip(finals[0].candidates, finals[1].candidates, strict=True):
        assert together.loss == pytest.approx(apart.loss, rel=1e-4)
        torch.testing.assert_close(together.images, apart.images, rtol=0, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
@pytest.mark.parametrize("attack", ["ig", "grnn", "fedleak", "dlg"])
def test_restarts_run_on_cuda_and_end_where_they_end_on_the_cpu(attack):
    # DLG's L-BFGS on a sigmoid LeNet turns the kernels' float order into another path within
    # a few evaluations (measured on an H200): one step of one evaluation for it.
    steps, params = (1, {"lbfgs_max_iter": 1}) if attack == "dlg" else (3, {})
    finals = {}
    for device in ("cpu", "cuda"):
        spec = dataclasses.replace(lenet_spec(attack), device=device)
        _, _, release = release_for(spec)
        finals[device] = run_named(attack, release, steps, params={"restarts": 2, **params})[1]
    for cpu, cuda in zip(finals["cpu"].candidates, finals["cuda"].candidates, strict=True):
        assert cuda.images.device.type == "cpu"  # candidates come back to the CPU
        assert cuda.loss == pytest.approx(cpu.loss, rel=1e-2, abs=1e-6)  # 3 steps: float order


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
@pytest.mark.parametrize(("attack", "params"), [("ig", {}), ("gi", {"noise": 0.0})])
def test_restarts_on_batchnorm_run_on_cuda_and_end_where_they_end_on_the_cpu(attack, params):
    # Train-mode BatchNorm on the batched path normalises by composite operations
    # (client.exact_batchnorm): the same on CUDA. GI's unraced starts batch without noise.
    finals = {}
    for device in ("cpu", "cuda"):
        spec = resnet20_spec(attack, device=device)
        _, _, release = release_for(spec)
        finals[device] = run_named(attack, release, 3, params={"restarts": 2, **params})[1]
    for cpu, cuda in zip(finals["cpu"].candidates, finals["cuda"].candidates, strict=True):
        assert cuda.images.device.type == "cpu"
        assert cuda.loss == pytest.approx(cpu.loss, rel=1e-2, abs=1e-6)
        torch.testing.assert_close(cuda.images, cpu.images, rtol=0, atol=1e-2)
