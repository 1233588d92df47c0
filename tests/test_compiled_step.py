"""Specification of an attack's traced and compiled step (attacks.compiled, issue 55): the
gradient the trace takes is the eager step's, BatchNorm on batch statistics included, and
Inverting Gradients compiled ends where it ends eager."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_attacks import lenet_spec, release_for, resnet20_spec
from torch import nn
from torch._dynamo.utils import counters

from auditlib.attacks import (
    RunControl,
    build_attack_config,
    fedleak_step,
    get_attack,
    grnn_restarts,
)
from auditlib.attacks import compiled as compiled_step
from auditlib.attacks import gradinversion as gi
from auditlib.attacks import inverting_gradients as ig
from auditlib.attacks.compiled import CompiledGradient, held, traced_model, traces_on
from auditlib.attacks.fedleak_terms import keep_output
from auditlib.attacks.forward_hooks import HeldHooks
from auditlib.attacks.objectives import UpdateMatcher, total_variation
from auditlib.attacks.race import PLAN
from auditlib.client.protocol import ClientProtocol
from auditlib.data.normalization import Normalization
from auditlib.defenses import build_defense
from auditlib.errors import AttackUnsupportedError
from auditlib.fl.scenario import release_update
from auditlib.threat import PrivateBatch


def _batchnorm_release(protocol: ClientProtocol, dtype: torch.dtype = torch.float64):
    """A small convolutional model with train-mode BatchNorm, in float64 (or ``dtype``),
    and the update of a batch of 2."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, stride=2),
        nn.BatchNorm2d(4),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(4 * 3 * 3, 5),
    ).to(dtype)
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(2, 3, 8, 8, generator=generator, dtype=dtype)
    batch = PrivateBatch(images, torch.tensor([1, 3]), ("a", "b"))
    return release_update(
        model,
        batch,
        protocol,
        build_defense("none")[0],
        normalization=Normalization((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
        num_classes=5,
        labels_known=True,
        seed=0,
    )


def test_the_traced_gradient_is_the_eager_one_with_batchnorm_in_double_precision():
    # FedAvg's local steps and train-mode BatchNorm: the most the trace has to follow (the
    # plain FedSGD gradient is traced in the attack's test below).
    release = _batchnorm_release(ClientProtocol("fedavg", local_steps=2, local_lr=0.1))
    knowledge = release.knowledge
    matcher = UpdateMatcher(release.observation, knowledge, "cosine")
    labels = knowledge.labels
    generator = torch.Generator().manual_seed(2)
    rows = torch.randn(3, 2, 3, 8, 8, generator=generator, dtype=torch.float64)

    def objective(images):
        distance = matcher.together(images, labels)
        return distance + 1e-2 * total_variation(images), {"update_distance": distance}

    with traced_model(knowledge):
        eager = rows.clone().requires_grad_()
        value, _ = objective(eager)
        (expected,) = torch.autograd.grad(value.sum(), eager)
        matcher.factored = False
        # The trace as the product takes it, run without generating code (the code Inductor
        # generates is run by the attack's tests below).
        compiled = CompiledGradient(objective, knowledge.device, backend="aot_eager")
        (gradient,), traced_value, losses = compiled(rows)
    torch.testing.assert_close(traced_value, value.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(gradient, expected, rtol=1e-9, atol=1e-12 * expected.abs().max())
    assert set(losses) == {"update_distance"} and losses["update_distance"].shape == (3,)
    assert all("forward" not in m.__dict__ for m in knowledge.model.modules())  # restored


def _count_traced(monkeypatch, module, calls: list, backend: str = "inductor") -> None:
    """``module``'s compiled steps counted into ``calls`` (each call's count of starts, and
    whether it was given inputs besides), on ``backend`` (``aot_eager``: the trace as the
    product takes it, run without generating code)."""

    class Counted(CompiledGradient):
        def __init__(self, objective, device, **role):
            super().__init__(objective, device, backend=backend, **role)

        def __call__(self, *variables, given=()):
            calls.append((variables[0].shape[0], len(given) > 0))
            return super().__call__(*variables, given=given)

    monkeypatch.setattr(module, "CompiledGradient", Counted)


def _ig(spec, params, steps, compiled, monkeypatch=None, race=None):
    calls = []
    if monkeypatch is not None:  # count the compiled steps that ran
        _count_traced(monkeypatch, ig, calls)
    _, _, release = release_for(spec)
    config, _ = build_attack_config("ig", {**params, "compiled": compiled})
    info = get_attack("ig")
    control = RunControl(steps, race=race)
    events = list(info.run(release.observation, release.knowledge, config, control, 0))
    return events[-1].final, [count for count, _ in calls]


def test_inverting_gradients_compiled_ends_where_it_ends_eager(monkeypatch):
    spec = lenet_spec("ig", batch=2)  # labels unknown: soft labels fitted with the images
    # Plain Adam: the sign of a gradient entry near 0 flips with float order, and signed
    # steps carry such flips on (the gradients' equality is the test above).
    params = {"restarts": 2, "signed": False}
    eager, _ = _ig(spec, params, 10, False)
    compiled, calls = _ig(spec, params, 10, True, monkeypatch)
    assert calls == [2] * 10  # every step, both starts in one traced step
    for a, b in zip(eager.candidates, compiled.candidates, strict=True):
        assert b.steps == a.steps == 10 and b.stop_reason == "completed"
        # Measured: 5e-6 and 1.3e-4 apart after 10 steps (float order; an entry's Adam
        # step is about lr times its sign at first, so rounding grows step by step). The
        # bounds leave room for another CPU's kernels; a step fed the wrong rows, variables
        # or labels moves pixels by about lr = 0.1 a step. The gradient itself: the test above.
        assert b.loss == pytest.approx(a.loss, rel=5e-3)
        torch.testing.assert_close(b.images, a.images, rtol=0, atol=5e-3)
        assert torch.equal(b.labels, a.labels)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_inverting_gradients_compiled_as_a_cuda_graph_ends_where_it_ends_eager_there(monkeypatch):
    spec = dataclasses.replace(lenet_spec("ig", batch=2), device="cuda")
    params = {"restarts": 2, "signed": False}
    eager, _ = _ig(spec, params, 10, False)
    compiled, calls = _ig(spec, params, 10, True, monkeypatch)
    assert calls == [2] * 10
    _ends_as_eager_there(eager, compiled)


def _ends_as_eager_there(eager, compiled) -> None:
    """A CUDA graph's run (Inductor's kernels, TF32 off) against the eager run on the GPU."""
    for a, b in zip(eager.candidates, compiled.candidates, strict=True):
        assert b.images.device.type == "cpu"  # candidates come back to the CPU
        assert b.loss == pytest.approx(a.loss, rel=5e-3)
        torch.testing.assert_close(b.images, a.images, rtol=0, atol=5e-3)


def _eager_and_compiled(
    attack: str, release, params: dict, steps: int, preset="paper", knowledge=None, traced=None
) -> list:
    """The attack's final, eager and compiled (Inductor; on CUDA a CUDA graph), on
    ``knowledge`` (else the release's). ``traced``: (monkeypatch, module, calls), to count
    the compiled run's traced calls, traced without generating code (``aot_eager``)."""
    knowledge = knowledge or release.knowledge
    finals = []
    for compiled in (False, True):
        if compiled and traced is not None:
            _count_traced(*traced, "aot_eager")
        config, _ = build_attack_config(attack, {**params, "compiled": compiled}, preset)
        run = get_attack(attack).run(release.observation, knowledge, config, RunControl(steps), 0)
        finals.append(list(run)[-1].final)
    return finals


def _lenet_release(model_seed: int, offset: int, device: str):
    """A release of two photographs from ``offset`` on, on a LeNet initialised from
    ``model_seed``."""
    spec = lenet_spec("ig", batch=2, offset=offset)
    model = dataclasses.replace(
        spec.model, spec=dataclasses.replace(spec.model.spec, seed=model_seed)
    )
    return release_for(dataclasses.replace(spec, model=model, device=device))[2]


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(
                not torch.cuda.is_available(), reason="needs a CUDA device (none here)"
            ),
        ),
    ],
)
def test_a_later_run_on_another_model_steps_on_the_kept_trace_and_ends_where_eager_ends(
    device, monkeypatch
):
    # The weights, the target update and the variables are the trace's inputs: a run on
    # another model of the same structure needs no trace of its own (on CUDA, where traces
    # are kept only when asked for, its graph is recorded again for the new weights), and
    # is this run's answer, not the first's.
    monkeypatch.setattr(compiled_step, "KEEP_ON_CUDA", True)
    params = {"restarts": 2, "signed": False}
    _, first = _eager_and_compiled("ig", _lenet_release(0, 0, device), params, 5)
    graphs = counters["stats"]["unique_graphs"]
    eager, later = _eager_and_compiled("ig", _lenet_release(1, 2, device), params, 5)
    assert counters["stats"]["unique_graphs"] == graphs
    for a, b in zip(eager.candidates, later.candidates, strict=True):
        assert b.steps == a.steps == 5
        assert b.loss == pytest.approx(a.loss, rel=5e-3)
        torch.testing.assert_close(b.images, a.images, rtol=0, atol=5e-3)
    assert later.selected.loss != pytest.approx(first.selected.loss, rel=0.05)


def test_a_kept_trace_is_set_aside_at_half_the_recompile_limit_for_a_fresh_one():
    # Past torch's recompile limit a code object would run its step eagerly, silently.
    def objective(rows):
        return (rows**2).sum(dim=1), {}

    half = torch._dynamo.config.recompile_limit // 2
    codes = []
    for count in range(1, half + 2):  # one trace per count of rows
        step = CompiledGradient(objective, torch.device("cpu"), "aot_eager", role="set aside")
        codes.append(step.code)
        rows = torch.full((count, 3), 2.0)
        (grad,), value, _ = step(rows)
        assert torch.equal(grad, 2 * rows) and torch.equal(value, torch.full((count,), 12.0))
    assert all(code is codes[0] for code in codes[:half]) and traces_on(codes[0]) == half
    assert codes[half] is not codes[0] and traces_on(codes[half]) == 1
    # Not kept on CUDA unless asked for (a CUDA graph keeps its memory pool).
    cuda = (objective.__code__, "set aside", "inductor", "reduce-overhead", "cuda")
    assert compiled_step._kept_code(objective.__code__, cuda) is not codes[half]
    assert cuda not in compiled_step._kept
    # A time estimate measures the compiling a run's worker may pay: nothing reused or kept.
    with compiled_step.fresh_traces():
        fresh = CompiledGradient(objective, torch.device("cpu"), "aot_eager", role="set aside")
    kept = CompiledGradient(objective, torch.device("cpu"), "aot_eager", role="set aside")
    assert fresh.code is not codes[half] and kept.code is codes[half]
    for role in range(compiled_step.KEPT + 1):  # at most KEPT kept, the least recently used let go
        CompiledGradient(objective, torch.device("cpu"), "aot_eager", role=str(role))
    assert len(compiled_step._kept) == compiled_step.KEPT


def test_a_raced_compiled_run_traces_each_count_of_running_starts(monkeypatch):
    spec = lenet_spec("ig", batch=2)
    final, calls = _ig(spec, {"restarts": 2, "signed": False}, 40, True, monkeypatch, race=PLAN)
    assert final.stop_reason == "completed"
    # The race keeps the better start at its first rung: 2 starts in the step, then 1.
    assert sorted(set(calls)) == [1, 2] and calls == sorted(calls, reverse=True)
    # Every step of every running start ran traced.
    assert len(calls) == 40 and sum(calls) == PLAN.planned_steps(2, 40, 10)


@pytest.mark.parametrize("attack", ["ig", "grnn", "fedleak"])
def test_a_model_that_keeps_starts_apart_refuses_a_compiled_step(attack):
    _, _, release = release_for(lenet_spec(attack))
    knowledge = dataclasses.replace(
        release.knowledge, model=torch.jit.script(release.knowledge.model)
    )
    config, _ = build_attack_config(attack, {"compiled": True})
    with pytest.raises(AttackUnsupportedError, match="cannot compile its step here: a Torch"):
        list(get_attack(attack).run(release.observation, knowledge, config, RunControl(5), 0))


def test_the_model_is_held_on_composite_batchnorm_exactly_as_long_as_the_run():
    model = nn.Sequential(nn.Conv2d(3, 2, 3), nn.BatchNorm2d(2))
    knowledge = type("K", (), {"model": model})()

    def events():
        assert "forward" in model[1].__dict__
        yield 1
        yield 2

    run = held(traced_model(knowledge), events())
    assert next(run) == 1
    run.close()  # the consumer stops early
    assert "forward" not in model[1].__dict__


@pytest.mark.parametrize("attack", ["ig", "gi", "grnn", "fedleak"])
def test_updates_of_a_sample_run_one_after_another_when_the_step_is_compiled(attack):
    from auditlib.attacks.restarts import why_apart

    _, _, release = release_for(resnet20_spec(attack) if attack == "gi" else lenet_spec(attack))
    knowledges = [release.knowledge] * 2
    info = get_attack(attack)
    together, _ = build_attack_config(attack, {}, "paper")
    assert why_apart(info, together, knowledges) is None
    compiled = dataclasses.replace(together, compiled=True)
    assert why_apart(info, compiled, knowledges) == (
        f"{attack} traces one update's step (compiled=true)"
    )


@pytest.mark.parametrize("attack", ["ig", "gi", "grnn", "fedleak"])
def test_a_compiled_run_has_the_identity_of_the_eager_one(attack):
    from auditlib.engine.identity import run_identity
    from auditlib.spec import ComponentSpec

    eager = lenet_spec(attack)
    compiled = dataclasses.replace(eager, attack=ComponentSpec.of(attack, {"compiled": "true"}))
    assert compiled.identity() != eager.identity()  # as written
    assert run_identity(compiled) == run_identity(eager)  # what the run computes
    other = dataclasses.replace(eager, attack=ComponentSpec.of(attack, {"tv": "0.1"}))
    assert run_identity(other) != run_identity(eager)


# --- FedLeak's step compiled ---------------------------------------------------------------
# The code Inductor generates is run by IG's tests above (about 30 s of compiling per graph
# on this CPU, and FedLeak traces two per count of running starts); FedLeak's are the trace
# as the product takes it, run without generating code (``aot_eager``).
CPU_SCALED = {"lr": 0.1, "schedule": "cosine", "k": 0.1, "restarts": 2}


def _fedleak(spec, params, steps, compiled, monkeypatch=None, race=None):
    calls = []
    if monkeypatch is not None:  # trace without generating code; count the traced calls
        _count_traced(monkeypatch, fedleak_step, calls, "aot_eager")
    _, _, release = release_for(spec)
    config, _ = build_attack_config("fedleak", {**params, "compiled": compiled}, "paper")
    control = RunControl(steps, race=race)
    info = get_attack("fedleak")
    events = list(info.run(release.observation, release.knowledge, config, control, 0))
    return events[-1].final, calls, release.knowledge.model


@pytest.mark.parametrize(
    ("lookahead", "mask", "traced"),
    [
        ("descent_step", "reuse", [(2, False), (2, True)]),  # the paper's: the iterate's masks
        ("ascent_normalized", "recompute", [(2, False), (2, False)]),
    ],
)
def test_fedleak_compiled_ends_where_it_ends_eager(monkeypatch, lookahead, mask, traced):
    spec = lenet_spec("fedleak", batch=2)
    # The activation prior weighted up, so that a traced step that lost its hooks' outputs
    # would move differently (its hooks are registered for the run, not in the trace).
    params = {**CPU_SCALED, "activation": 1.0, "lookahead": lookahead, "lookahead_mask": mask}
    eager, _, _ = _fedleak(spec, params, 8, False)
    compiled, calls, model = _fedleak(spec, params, 8, True, monkeypatch)
    assert calls == traced * 8  # every evaluation of every step traced, both starts in one
    for a, b in zip(eager.candidates, compiled.candidates, strict=True):
        assert b.steps == a.steps == 8 and b.stop_reason == "completed"
        # The trace run eagerly is the eager step's arithmetic in another order of calls:
        # measured equal to 1e-7 after 8 steps; a step fed the wrong rows, masks or prior
        # moves pixels by about lr = 0.1.
        assert b.loss == pytest.approx(a.loss, rel=1e-4)
        torch.testing.assert_close(b.images, a.images, rtol=0, atol=1e-4)
        assert torch.equal(b.labels, a.labels)
    assert not any(m._forward_hooks for m in model.modules())  # held for the run only


def test_fedleak_compiled_with_one_start_steps_it_stacked_and_a_race_traces_each_count(
    monkeypatch,
):
    spec = lenet_spec("fedleak")
    one, calls, _ = _fedleak(spec, {**CPU_SCALED, "restarts": 1}, 3, True, monkeypatch)
    assert calls == [(1, False), (1, True)] * 3 and one.candidates[0].steps == 3
    calls.clear()
    final, calls, _ = _fedleak(spec, CPU_SCALED, 40, True, monkeypatch, race=PLAN)
    assert final.stop_reason == "completed"
    starts = [count for count, _ in calls[::2]]
    assert sorted(set(starts)) == [1, 2] and starts == sorted(starts, reverse=True)
    assert sum(starts) == PLAN.planned_steps(2, 40, 10)


def test_fedleaks_held_hooks_keep_only_what_an_evaluation_collects():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2), nn.Tanh())
    modules = [model[1], model[3]]
    with HeldHooks(modules, keep_output, list) as hooks:
        model(torch.ones(1, 3))  # a forward outside an evaluation (a candidate's score)
        assert hooks.store is None
        with hooks.capture() as outputs:
            model(torch.ones(1, 3))
            assert [o.shape for o in outputs] == [(1, 3), (1, 2)]
        assert hooks.store is None
    assert not any(m._forward_hooks for m in model.modules())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_fedleak_compiled_as_a_cuda_graph_ends_where_it_ends_eager_there():
    spec = dataclasses.replace(lenet_spec("fedleak", batch=2), device="cuda")
    eager, _, _ = _fedleak(spec, CPU_SCALED, 8, False)
    compiled, _, _ = _fedleak(spec, CPU_SCALED, 8, True)  # Inductor, as a CUDA graph
    _ends_as_eager_there(eager, compiled)


# --- GradInversion's step compiled ----------------------------------------------------------
# On the small train-mode BatchNorm model above: the BatchNorm prior's statistics are
# recorded through hooks held for the run, which the trace follows (it cannot register them).


def test_gradinversions_traced_objective_and_gradient_are_the_eager_ones_in_double_precision():
    # FedAvg's two local steps through two train-mode BatchNorm layers: the prior reads the
    # first step's statistics.
    release = _batchnorm_release(ClientProtocol("fedavg", local_steps=2, local_lr=0.1))
    knowledge, observation = release.knowledge, release.observation
    config, _ = build_attack_config("gi", {"restarts": 2, "labels": "known"}, "paper")
    labels = knowledge.labels
    prior, _ = gi._prior_and_record(knowledge, config)
    objective = gi.Objective(UpdateMatcher(observation, knowledge, config.distance), config, prior)
    generator = torch.Generator().manual_seed(3)
    rows = torch.randn(3, 2, 3, 8, 8, generator=generator, dtype=torch.float64)
    with traced_model(knowledge):
        eager = rows.clone().requires_grad_()
        value, parts = objective.rows(eager, labels, [0, 1, 2])
        (expected,) = torch.autograd.grad(value.sum(), eager)
        objective.matcher.factored = False
        with prior.hooks:
            compiled = CompiledGradient(
                lambda images: objective.rows(images, labels, None),
                knowledge.device,
                backend="aot_eager",
            )
            (gradient,), traced_value, traced_parts = compiled(rows)
    assert set(traced_parts) == {"update_distance", "tv", "l2", "bn"} == set(parts)
    assert (parts["bn"] > 0).all()
    for name, part in parts.items():  # the prior among them: its statistics were recorded
        torch.testing.assert_close(traced_parts[name], part.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(traced_value, value.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(gradient, expected, rtol=1e-9, atol=1e-12 * expected.abs().max())
    assert not any(m._forward_hooks for m in knowledge.model.modules())  # held, then gone


def test_gradinversion_compiled_ends_where_it_ends_eager(monkeypatch):
    # No Langevin noise and no warm-up: each step moves pixels by about lr = 0.1, so a step
    # fed the wrong rows, labels or prior shows.
    params = {"restarts": 2, "noise": 0.0, "warmup": 0, "labels": "known"}
    calls = []
    release = _batchnorm_release(ClientProtocol(), torch.float32)
    eager, compiled = _eager_and_compiled("gi", release, params, 6, traced=(monkeypatch, gi, calls))
    assert calls == [(2, False)] * 6  # every step, both starts in one traced step
    for a, b in zip(eager.candidates, compiled.candidates, strict=True):
        assert b.steps == a.steps == 6 and b.stop_reason == "completed"
        # Measured: 3.6e-7 and 7.2e-7 apart after 6 steps (the eager step keeps a Linear
        # weight's gradient factored, the traced one forms it: another float order; 3.0e-5
        # on ResNet-20 at 16 px); the bound leaves room for another CPU's kernels.
        assert b.loss == pytest.approx(a.loss, rel=1e-4)
        torch.testing.assert_close(b.images, a.images, rtol=0, atol=1e-3)
    assert not any(m._forward_hooks for m in release.knowledge.model.modules())


def test_gradinversion_compiles_only_where_its_starts_step_together():
    _, _, release = release_for(resnet20_spec("gi"))
    info = get_attack("gi")
    # Unraced starts draw their Langevin noise in turn from one stream: they stay apart.
    config, _ = build_attack_config("gi", {"compiled": True, "restarts": 2}, "paper")
    with pytest.raises(AttackUnsupportedError, match="gi cannot compile its step here: gi's un"):
        info.run(release.observation, release.knowledge, config, RunControl(5), 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_gradinversion_compiled_as_a_cuda_graph_ends_where_it_ends_eager_there():
    _, _, release = release_for(resnet20_spec("gi", batch=2, device="cuda"))
    params = {"restarts": 2, "noise": 0.0, "warmup": 0}
    _ends_as_eager_there(*_eager_and_compiled("gi", release, params, 6))


def test_ig_compiled_through_a_known_laplace_noise_ends_where_it_ends_eager(monkeypatch):
    # The adaptive attacker's data term is the release's Laplace likelihood, sum |y - u| / b;
    # torch fails to trace abs's derivative on stacked updates, so a traced step takes
    # |d| as max(d, -d) (``likelihoods._absolute``): the same values and derivatives.
    _, _, release = release_for(lenet_spec("ig", batch=2), None, None, "dp-laplace", None)
    knows = dataclasses.replace(release.knowledge, defense=release.known_defense)
    calls = []
    params = {"restarts": 2, "signed": False}
    traced = (monkeypatch, ig, calls)
    eager, compiled = _eager_and_compiled("ig", release, params, 5, None, knows, traced)
    assert calls == [(2, False)] * 5
    for a, b in zip(eager.candidates, compiled.candidates, strict=True):
        assert b.steps == a.steps == 5 and b.stop_reason == "completed"
        # Measured: equal here (0.0 apart); the bounds leave room for another CPU's kernels.
        assert b.loss == pytest.approx(a.loss, rel=1e-4)
        torch.testing.assert_close(b.images, a.images, rtol=0, atol=1e-3)


# --- GRNN's step compiled -------------------------------------------------------------------
# The traced step: the stacked generators' images and labels, the objective, and its
# gradient to their weights (their BatchNorm buffers and latents given, not differentiated).


def _grnn(params, steps, compiled, monkeypatch=None, calls=None):
    if monkeypatch is not None:
        _count_traced(monkeypatch, grnn_restarts, calls, "aot_eager")
    _, _, release = release_for(lenet_spec("grnn", batch=2))
    config, _ = build_attack_config("grnn", {**params, "compiled": compiled}, "paper")
    info = get_attack("grnn")
    events = list(info.run(release.observation, release.knowledge, config, RunControl(steps), 0))
    return events[-1].final


@pytest.mark.parametrize(
    "preset",
    [
        {"labels": "joint"},  # the label branch
        {"labels": "inferred"},  # fixed labels
        {"wasserstein": "sorted", "tv_form": "absolute"},  # the thesis-text preset
    ],
)
def test_grnn_compiled_ends_where_it_ends_eager(monkeypatch, preset):
    params = {"restarts": 2, **preset}
    eager = _grnn(params, 6, False)
    calls = []
    compiled = _grnn(params, 6, True, monkeypatch, calls)
    assert calls == [(2, True)] * 6  # every step, both generators in one traced step
    for a, b in zip(eager.candidates, compiled.candidates, strict=True):
        assert b.steps == a.steps == 6 and b.stop_reason == "completed"
        # Measured: up to 8.2e-6 apart after 6 steps (float order; the eager step keeps a
        # Linear weight's gradient factored), so the bound leaves room for another CPU's
        # kernels. A step fed another generator's weights, buffers or latent draws other
        # images altogether.
        assert b.loss == pytest.approx(a.loss, rel=1e-4)
        torch.testing.assert_close(b.images, a.images, rtol=0, atol=5e-4)
        assert torch.equal(b.labels, a.labels)
    calls.clear()
    one = _grnn({"restarts": 1}, 2, True, monkeypatch, calls)
    assert calls == [(1, True)] * 2 and one.candidates[0].steps == 2  # one, stacked too


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_grnn_compiled_as_a_cuda_graph_ends_where_it_ends_eager_there():
    _, _, release = release_for(dataclasses.replace(lenet_spec("grnn", batch=2), device="cuda"))
    _ends_as_eager_there(*_eager_and_compiled("grnn", release, {"restarts": 2}, 6))
