"""Specification of an attack's step recorded as a CUDA graph and replayed (attacks.captured,
issue 55): the first steps at each count of starts run eagerly, the next is recorded once
and replayed with each step's own inputs, and every attack that can record its step ends
where it ends eager.

A CUDA graph needs a GPU. Here the recording is a stand-in that keeps what a graph keeps
(its input buffers and its outputs, rewritten in place at each replay) and reruns the step
at each replay: everything but the graph itself is tested on the CPU, and the CUDA tests
(skipped here, run on a lent GPU by benchmarks/device/issue55.sh) record real graphs."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from test_attacks import lenet_spec, release_for, resnet20_spec
from test_compiled_step import CPU_SCALED, _batchnorm_release, _ends_as_eager_there
from test_host_reads import reads_while
from torch.utils._pytree import tree_flatten

from auditlib.attacks import ATTACKS, RunControl, build_attack_config, get_attack
from auditlib.attacks import captured as captured_step
from auditlib.attacks.captured import WARMUP_STEPS, CapturedGradient
from auditlib.attacks.compiled import traced_model
from auditlib.attacks.objectives import UpdateMatcher, total_variation
from auditlib.client.protocol import ClientProtocol
from auditlib.config import field_info
from auditlib.errors import AttackUnsupportedError, AuditInputError
from auditlib.reconstruction import COMPILED, EAGER, RECORDED, Stepped

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")


class StandIn:
    """A recording on the CPU: the step's outputs at recording, rewritten in place by each
    replay from the buffers the recording read (as a graph's are); counts its recordings."""

    def __init__(self) -> None:
        self.recorded = 0

    def __call__(self, run, stream):
        assert stream is None  # no stream off CUDA
        self.recorded += 1
        outputs = run()

        def replay() -> None:
            for kept, fresh in zip(tree_flatten(outputs)[0], tree_flatten(run())[0], strict=True):
                kept.copy_(fresh)

        return replay, outputs


def _objective_and_rows():
    release = _batchnorm_release(ClientProtocol("fedavg", local_steps=2, local_lr=0.1))
    knowledge = release.knowledge
    matcher = UpdateMatcher(release.observation, knowledge, "cosine")
    matcher.factored = False

    def objective(images):
        distance = matcher.together(images, knowledge.labels)
        return distance + 1e-2 * total_variation(images), {"update_distance": distance}

    generator = torch.Generator().manual_seed(2)
    rows = [torch.randn(3, 2, 3, 8, 8, generator=generator, dtype=torch.float64) for _ in range(5)]
    return knowledge, objective, rows


def _eager_gradient(objective, rows: torch.Tensor):
    images = rows.clone().requires_grad_()
    value, _ = objective(images)
    (gradient,) = torch.autograd.grad(value.sum(), images)
    return value.detach(), gradient


def test_the_first_steps_run_eager_then_one_recording_replays_each_steps_own_inputs():
    knowledge, objective, rows = _objective_and_rows()
    stand_in = StandIn()
    with traced_model(knowledge):
        step = CapturedGradient(objective, knowledge.device, record=stand_in)
        for call, images in enumerate(rows):
            (gradient,), value, losses = step(images)
            assert stand_in.recorded == (0 if call < WARMUP_STEPS else 1)  # recorded once
            expected_value, expected = _eager_gradient(objective, images)
            # Each step's own inputs: a replay that read the recording's would give call
            # WARMUP_STEPS's gradient again.
            torch.testing.assert_close(value, expected_value, rtol=1e-12, atol=0)
            torch.testing.assert_close(gradient, expected, rtol=1e-9, atol=1e-12)
            assert losses["update_distance"].shape == (3,)
        [graph] = step.graphs.values()
        # The values are copies; the gradient is the graph's own, rewritten by the next replay.
        assert value.data_ptr() != graph.outputs[1].data_ptr()
        assert gradient.data_ptr() == graph.outputs[0][0].data_ptr()
        assert all(b.data_ptr() != r.data_ptr() for b, r in zip(graph.inputs, rows, strict=False))


def test_each_count_of_starts_is_recorded_apart_after_its_own_eager_steps():
    knowledge, objective, rows = _objective_and_rows()
    stand_in = StandIn()
    with traced_model(knowledge):
        step = CapturedGradient(objective, knowledge.device, record=stand_in)
        for images in rows[: WARMUP_STEPS + 1]:
            step(images)
        assert stand_in.recorded == 1
        two = rows[-1][:2]  # a race's starts fewer: another shape
        for call in range(WARMUP_STEPS + 2):
            (gradient,), _, _ = step(two)
            assert stand_in.recorded == (1 if call < WARMUP_STEPS else 2)
        torch.testing.assert_close(gradient, _eager_gradient(objective, two)[1], rtol=1e-9, atol=0)
        # The first count's graph is let go (with its memory pool): a race's starts only fall.
        [(shape, _)] = step.graphs.items()
        assert shape[0][0][0] == 2
        # A count that comes back is recorded again at once: it had its eager steps.
        (gradient,), _, _ = step(rows[0])
        assert stand_in.recorded == 3
        torch.testing.assert_close(
            gradient, _eager_gradient(objective, rows[0])[1], rtol=1e-9, atol=0
        )


def _final(attack, release, params, steps, preset="paper"):
    config, _ = build_attack_config(attack, params, preset)
    run = get_attack(attack).run(
        release.observation, release.knowledge, config, RunControl(steps), 0
    )
    return list(run)[-1].final


def _captured_here(monkeypatch) -> StandIn:
    """The attack's captured run on the CPU, recorded by the stand-in (a CUDA graph needs a
    GPU: the refusal is the test below)."""
    stand_in = StandIn()
    monkeypatch.setattr(captured_step, "cuda_graph", stand_in)
    monkeypatch.setattr(captured_step, "refuse_unless_stepped", lambda *args: None)
    return stand_in


def _ends_as_eager(eager, captured, atol: float) -> None:
    for a, b in zip(eager.candidates, captured.candidates, strict=True):
        assert b.steps == a.steps and b.stop_reason == "completed"
        assert b.loss == pytest.approx(a.loss, rel=5e-3)
        torch.testing.assert_close(b.images, a.images, rtol=0, atol=atol)


# Measured on this CPU: IG's images within 2.5e-4 of eager after 10 replays, GI's within 3e-5
# after 4 (after 10 a few pixels drift 6e-3: signs of entries near 0), GRNN's and FedLeak's
# within 3e-6 after 10 (the traced step's dense Linear gradient and torch.func.grad sum in
# another order). Replays that read the recording's inputs instead of each step's own end
# 0.07 to 0.35 away (IG's 0.18, GI's 0.10).
@pytest.mark.parametrize(
    ("attack", "params", "replays", "atol"),
    [
        ("ig", {"restarts": 2, "signed": False}, 10, 5e-3),
        ("gi", {"restarts": 2, "noise": 0.0, "warmup": 0}, 4, 5e-3),
        ("grnn", {"restarts": 2}, 10, 5e-4),
        ("fedleak", CPU_SCALED, 10, 5e-3),
    ],
)
def test_each_attack_captured_ends_where_it_ends_eager(monkeypatch, attack, params, replays, atol):
    spec = lenet_spec(attack, batch=2) if attack != "gi" else resnet20_spec("gi", batch=2)
    _, _, release = release_for(spec)
    steps = WARMUP_STEPS + replays  # enough for a stale input to show
    eager = _final(attack, release, params, steps)
    stand_in = _captured_here(monkeypatch)
    captured = _final(attack, release, {**params, "captured": True}, steps)
    assert stand_in.recorded == (2 if attack == "fedleak" else 1)  # FedLeak: iterate, look-ahead
    _ends_as_eager(eager, captured, atol)
    assert (eager.stepped, captured.stepped) == (Stepped(EAGER), Stepped(RECORDED))


def test_an_adaptive_twin_s_step_through_the_defense_s_transform_is_recorded_too(monkeypatch):
    """IG's twin under clipping (its candidate's update clipped as the client's was): its
    starts run together, so its step records, and it ends where it ends eager."""
    _, _, release = release_for(
        lenet_spec("ig", batch=2), defense="clip", defense_params={"mode": "norm", "bound": 0.5}
    )
    knowledge = dataclasses.replace(release.knowledge, defense=release.known_defense)
    twin = dataclasses.replace(release, knowledge=knowledge)
    params = {"restarts": 2, "signed": False}
    eager = _final("ig", twin, params, WARMUP_STEPS + 4)
    stand_in = _captured_here(monkeypatch)
    captured = _final("ig", twin, {**params, "captured": True}, WARMUP_STEPS + 4)
    assert stand_in.recorded == 1 and captured.stepped == Stepped(RECORDED)
    _ends_as_eager(eager, captured, 5e-3)


@pytest.mark.parametrize(
    ("attack", "params"),
    [
        ("ig", {"restarts": 2}),
        ("gi", {"restarts": 2, "noise": 0.0, "warmup": 0}),
        ("grnn", {"restarts": 2}),
        ("fedleak", CPU_SCALED),
        ("dlg", {"restarts": 2, "lbfgs_max_iter": 3}),
        ("idlg", {"restarts": 1, "lbfgs_max_iter": 3}),
        ("dlm", {"restarts": 2, "lbfgs_max_iter": 3, "line_search": "strong_wolfe"}),
        ("dlm+", {"restarts": 2, "lbfgs_max_iter": 3}),
    ],
)
def test_a_recording_reads_nothing_back_from_the_device(monkeypatch, attack, params):
    # What a CUDA graph cannot hold fails a real recording (and the run then steps
    # eagerly): a read back from the device, or a copy to it of host values. The stand-in's
    # recording runs the step with test_host_reads' spies on auditlib's code.
    seen, watched = reads_while(monkeypatch)
    stand_in = StandIn()
    monkeypatch.setattr(captured_step, "cuda_graph", watched(stand_in))
    monkeypatch.setattr(captured_step, "refuse_unless_stepped", lambda *args: None)
    batch = 1 if attack == "idlg" else 2  # iDLG's label rule holds for one image
    spec = lenet_spec(attack, batch=batch) if attack != "gi" else resnet20_spec("gi", batch=2)
    _, _, release = release_for(spec)
    _final(attack, release, {**params, "captured": True}, WARMUP_STEPS + 2)
    assert stand_in.recorded >= 1
    assert seen == []


def test_a_step_that_cannot_be_recorded_runs_eagerly_and_ends_where_eager_ends(monkeypatch):
    # As a real recording refuses a host read inside the step: the run goes on eagerly.
    tried = []

    def refuses(run, stream):
        tried.append(stream)
        raise RuntimeError("operation not permitted when stream is capturing")

    _, _, release = release_for(lenet_spec("ig", batch=2))
    params = {"restarts": 2, "signed": False}
    eager = _final("ig", release, params, WARMUP_STEPS + 3)
    monkeypatch.setattr(captured_step, "cuda_graph", refuses)
    monkeypatch.setattr(captured_step, "refuse_unless_stepped", lambda *args: None)
    steps = []
    original = CapturedGradient.__call__

    def counted(self, *variables, given=()):
        result = original(self, *variables, given=given)
        steps.append(self.unrecorded)
        return result

    monkeypatch.setattr(CapturedGradient, "__call__", counted)
    captured = _final("ig", release, {**params, "captured": True}, WARMUP_STEPS + 3)
    assert len(tried) == 1 and steps[:WARMUP_STEPS] == [None] * WARMUP_STEPS  # tried once
    assert set(steps[WARMUP_STEPS:]) == {
        "RuntimeError: operation not permitted when stream is capturing"
    }
    _ends_as_eager(eager, captured, 5e-3)
    assert captured.stepped == Stepped(
        EAGER,
        "its recording as a CUDA graph failed (RuntimeError: operation not permitted when "
        "stream is capturing); it ran eagerly",
    )


def test_a_run_that_ends_within_its_eager_first_steps_says_it_recorded_nothing(monkeypatch):
    _, _, release = release_for(lenet_spec("ig", batch=1))
    stand_in = _captured_here(monkeypatch)
    final = _final("ig", release, {"captured": True}, WARMUP_STEPS)
    assert stand_in.recorded == 0 and final.steps == WARMUP_STEPS
    assert final.stepped == Stepped(
        EAGER,
        f"nothing was recorded: each count of its starts stopped within the first "
        f"{WARMUP_STEPS} steps (L-BFGS: evaluations), which run eagerly before the recording",
    )


def _gradient(replayed: int, unrecorded: str | None) -> CapturedGradient:
    gradient = CapturedGradient(lambda x: (x.sum(), {}), torch.device("cpu"))
    gradient.replayed, gradient.unrecorded = replayed, unrecorded
    return gradient


def test_how_a_run_stepped_is_what_its_decided_configuration_and_its_graphs_did():
    config, _ = build_attack_config("ig", {}, "paper")
    asked = dataclasses.replace(config, captured=True)
    compiled = dataclasses.replace(config, compiled=True, captured=False)
    chose = "the run's choice on CUDA; captured=false keeps it eager"
    cases = [
        (dataclasses.replace(config, captured=False), False, [], Stepped(EAGER)),
        (compiled, False, [], Stepped(COMPILED)),
        (asked, False, [_gradient(5, None)], Stepped(RECORDED)),
        (asked, True, [_gradient(5, None)], Stepped(RECORDED, chose)),
        # FedLeak's two: one replayed, the other's recording failed at a later count
        (
            asked,
            False,
            [_gradient(5, None), _gradient(3, "RuntimeError: x")],
            Stepped(
                RECORDED, "a later recording failed (RuntimeError: x), and those steps ran eagerly"
            ),
        ),
    ]
    for decided, by_the_run, gradients, expected in cases:
        how = captured_step.HowStepped(decided, by_the_run=by_the_run)
        how.made(*gradients, None)  # None: an eager group's (nothing to keep)
        assert how.stepped() == expected


def test_two_plans_of_one_run_keep_the_later_way_and_both_notes():
    first = Stepped(RECORDED, "the run's choice")
    assert first.then(Stepped(RECORDED, "the run's choice")) == first
    assert first.then(Stepped(EAGER, "its recording failed")) == Stepped(
        EAGER, "the run's choice; its recording failed"
    )
    assert Stepped(EAGER).then(Stepped(EAGER)) == Stepped(EAGER)


def test_a_captured_step_is_refused_on_the_cpu_and_with_compiled():
    _, _, release = release_for(lenet_spec("ig"))
    config, _ = build_attack_config("ig", {"captured": True})
    with pytest.raises(AttackUnsupportedError, match="ig cannot record its step as a CUDA graph"):
        get_attack("ig").run(release.observation, release.knowledge, config, RunControl(2), 0)
    for attack in ("ig", "gi", "grnn", "fedleak"):
        with pytest.raises(AuditInputError, match="two ways to run one step"):
            build_attack_config(attack, {"captured": True, "compiled": True})


def test_a_captured_step_attacks_a_samples_updates_one_after_another():
    for attack in ("ig", "gi", "grnn", "fedleak"):
        config, _ = build_attack_config(attack, {"captured": True})
        why = get_attack(attack).why_updates_apart(config, False)
        assert why == f"{attack} traces one update's step (captured=true)"


# --- On a GPU: real CUDA graphs ------------------------------------------------------------


def count_recordings(monkeypatch) -> list:
    """Real CUDA graphs, with a list of the recordings that succeeded (one that fails leaves
    its run stepping eagerly, and is not counted)."""
    recorded = []
    graph = captured_step.cuda_graph

    def counted(run, stream):
        result = graph(run, stream)
        recorded.append(stream)
        return result

    monkeypatch.setattr(captured_step, "cuda_graph", counted)
    return recorded


@CUDA
@pytest.mark.parametrize(
    ("attack", "params"),
    [
        ("ig", {"restarts": 2, "signed": False}),
        ("gi", {"restarts": 2, "noise": 0.0, "warmup": 0}),
        ("grnn", {"restarts": 2}),
        ("fedleak", CPU_SCALED),
    ],
)
def test_each_attack_captured_as_a_cuda_graph_ends_where_it_ends_eager_there(
    monkeypatch, attack, params
):
    recorded = count_recordings(monkeypatch)
    if attack == "gi":
        spec = resnet20_spec("gi", batch=2, device="cuda")
    else:
        spec = dataclasses.replace(lenet_spec(attack, batch=2), device="cuda")
    _, _, release = release_for(spec)
    steps = WARMUP_STEPS + 4
    eager = _final(attack, release, params, steps)
    captured = _final(attack, release, {**params, "captured": True}, steps)
    assert len(recorded) == (2 if attack == "fedleak" else 1)  # real graphs, replayed
    _ends_as_eager_there(eager, captured)


def test_a_run_on_cuda_records_its_step_by_default_only_once_that_is_switched_on(monkeypatch):
    """``captured`` is three-way: none (the default) leaves it to the run, which decides
    true or false before it steps; true and false as asked stay."""
    config, _ = build_attack_config("ig", {})
    assert config.captured is None  # left to the run
    on_cuda = SimpleNamespace(device=torch.device("cuda"))
    on_cpu = SimpleNamespace(device=torch.device("cpu"))
    assert captured_step.BY_DEFAULT_ON_CUDA is False  # until its CUDA figures are in
    assert captured_step.by_default(config, on_cuda, None).captured is False
    monkeypatch.setattr(captured_step, "BY_DEFAULT_ON_CUDA", True)
    assert captured_step.by_default(config, on_cuda, None).captured is True
    assert captured_step.by_default(config, on_cpu, None).captured is False
    assert captured_step.by_default(config, on_cuda, "a TorchScript model").captured is False
    compiled, _ = build_attack_config("ig", {"compiled": True})
    assert captured_step.by_default(compiled, on_cuda, None).captured is False  # asked: compiled
    # Asked for either way: kept, so captured=false keeps a run on CUDA eager.
    for asked in (True, False):
        config, _ = build_attack_config("dlg", {"captured": asked})
        assert captured_step.by_default(config, on_cuda, None) is config


def test_a_run_leaves_a_cuda_graph_to_the_run_unless_asked_and_says_so_in_its_words():
    for attack in ("ig", "gi", "grnn", "fedleak", "dlg", "idlg", "dlm", "dlm+"):
        info = ATTACKS[attack]
        [field] = [f for f in field_info(info.config_type) if f.name == "captured"]
        assert field.type == "bool" and field.optional and field.default is None, attack
        assert field.description.endswith(
            "none (the default): the run decides, recording where it runs on CUDA and can, "
            "once recording by default is switched on (it is off until its GPU figures are "
            "in); false: never"
        ), attack
        no, _ = build_attack_config(attack, {"captured": "false"})
        left, _ = build_attack_config(attack, {"captured": ""})
        assert (no.captured, left.captured) == (False, None), attack


@CUDA
def test_every_attack_of_a_plan_records_its_step_on_cuda_once_that_is_switched_on(monkeypatch):
    recorded = count_recordings(monkeypatch)
    monkeypatch.setattr(captured_step, "BY_DEFAULT_ON_CUDA", True)
    _, _, release = release_for(dataclasses.replace(lenet_spec("ig", batch=2), device="cuda"))
    _final("ig", release, {"restarts": 2, "signed": False}, WARMUP_STEPS + 2)
    assert len(recorded) == 1


@CUDA
def test_captured_false_keeps_a_run_on_cuda_eager_once_recording_is_the_default(monkeypatch):
    recorded = count_recordings(monkeypatch)
    monkeypatch.setattr(captured_step, "BY_DEFAULT_ON_CUDA", True)
    _, _, release = release_for(dataclasses.replace(lenet_spec("ig", batch=2), device="cuda"))
    params = {"restarts": 2, "signed": False, "captured": False}
    _final("ig", release, params, WARMUP_STEPS + 2)
    assert recorded == []
