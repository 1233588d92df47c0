"""Specifications of DLM and DLM+ (Deep Leakage from Model, Zhao, Luo, Ding 2022).

The client runs FedAvg and uploads its weights; the server does not trust the client's
learning rate. DLM learns a factor gamma that rescales the observed descent W - W' to the
dummy gradient; DLM+ compares both normalised, so the learning rate cancels. Victim: the
DLG LeNet (sigmoid, U(-0.5, 0.5) init, 100 classes) on a photograph at 12x12, small enough
for a run to take a second or two (benchmarks use 32x32 and the paper's 200 iterations).
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from auditlib.attacks import RunControl, build_attack_config, get_attack
from auditlib.attacks.dlm import DlmPlusConfig, ModelLeakageObjective
from auditlib.attacks.objectives import random_images, random_label_logits
from auditlib.client.protocol import ClientProtocol
from auditlib.defenses import build_defense
from auditlib.engine.audit import prepare_victim
from auditlib.errors import AttackUnsupportedError, AuditInputError
from auditlib.fl.scenario import release_update
from auditlib.metrics import evaluate
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from auditlib.threat import Observation


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: these tiny models only lose time to threading on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# The paper's setting (Sec. 5.2): one local SGD step with the client's lr 0.01, new weights sent.
FEDAVG = ClientProtocol(algorithm="fedavg", local_steps=1, local_lr=0.01, shared="weights")


def spec_for(batch=1, offset=0, data="photographs", shape=(3, 12, 12), device="cpu"):
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", 100, shape, init="uniform")),
        data=DataSpec("samples", data, batch_size=batch, offset=offset),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlm+"),
        defense=ComponentSpec.of("none"),
        budget=Budget(10),
        seed=0,
        device=device,
    )


def release_for(protocol=FEDAVG, nominal_lr=None, labels_known=False, **spec):
    """The victim's upload; ``nominal_lr`` is the learning rate the server believes in."""
    victim = prepare_victim(spec_for(**spec))
    release = release_update(
        victim.model,
        victim.batch,
        protocol,
        build_defense("none", None)[0],
        normalization=victim.normalization,
        num_classes=100,
        labels_known=labels_known,
        seed=0,
    )
    knowledge = release.knowledge
    if nominal_lr is not None:
        nominal = dataclasses.replace(protocol, local_lr=nominal_lr)
        knowledge = dataclasses.replace(knowledge, protocol=nominal)
    return victim, release.observation, knowledge


def run_attack(name, observation, knowledge, steps, params=None, preset=None, seed=0, **control):
    config, _ = build_attack_config(name, params, preset)
    run = get_attack(name).run(observation, knowledge, config, RunControl(steps, **control), seed)
    events = list(run)
    return events, events[-1].final


def psnr_of(images, victim):
    from auditlib.reconstruction import Candidate, Reconstruction

    candidate = Candidate(images, None, 0.0, 0, 0, "completed")
    scores = evaluate(
        Reconstruction((candidate,), "completed", 0),
        victim.batch,
        victim.normalization,
        lpips_nets=(),
    )
    return scores.attacker_selected.psnr_mean


def scaled(observation: Observation, knowledge, factor: float) -> Observation:
    """The same upload had the client used ``factor`` times its learning rate (to first order)."""
    if observation.kind == "weights":
        start = knowledge.parameters()
        tensors = tuple(
            p.detach() + factor * (w - p.detach())
            for p, w in zip(start.values(), observation.tensors, strict=True)
        )
    else:
        tensors = tuple(factor * t for t in observation.tensors)
    return Observation(observation.kind, tensors, observation.parameter_names)


def dummy_batch(knowledge, seed=3):
    generator = torch.Generator().manual_seed(seed)
    images = random_images(knowledge, generator)
    return images, torch.softmax(random_label_logits(knowledge, generator), dim=-1)


@pytest.mark.parametrize("norm", ["frobenius", "layer-mean"])
@pytest.mark.parametrize("shared", ["weights", "delta"])
def test_dlm_plus_distance_ignores_the_scale_of_the_learning_rate(norm, shared):
    protocol = dataclasses.replace(FEDAVG, shared=shared)
    _, observation, knowledge = release_for(protocol)
    images, labels = dummy_batch(knowledge)
    config = DlmPlusConfig(norm=norm)
    reference = float(
        ModelLeakageObjective(observation, knowledge, config)(images, labels).detach()
    )
    for factor in (0.1, 7.0):
        other = scaled(observation, knowledge, factor)
        value = float(ModelLeakageObjective(other, knowledge, config)(images, labels).detach())
        assert value == pytest.approx(reference, rel=1e-4)
    assert reference > 0
    if norm == "frobenius":  # ||a/|a| - b/|b|||^2 = 2 - 2 cos(a, b), bounded by 4
        assert reference < 4


def test_dlm_distance_is_zero_at_the_truth_with_gamma_one_over_the_client_lr():
    victim, observation, knowledge = release_for(nominal_lr=0.05)
    config, _ = build_attack_config("dlm")
    objective = ModelLeakageObjective(observation, knowledge, config)
    images, labels = victim.batch.images, victim.batch.labels
    truth = objective(images, labels, torch.tensor(1 / 0.01)).detach()
    off = objective(images, labels, torch.tensor(1 / 0.05)).detach()
    assert float(truth) < 1e-6 * float(off)


def test_dlm_learns_the_ratio_of_the_nominal_to_the_client_learning_rate():
    # The client trained with lr 0.01; the server believes 0.02, so gamma / (1 / 0.02) -> 2.
    # Known labels: with joint soft labels the same run collapses to gamma = 0 (see below).
    _, observation, knowledge = release_for(nominal_lr=0.02, labels_known=True)
    events, final = run_attack("dlm", observation, knowledge, 5, preset="paper", emit_every=1)
    assert final.label_inference["gamma_init"] == pytest.approx(1.2 / 0.02)  # ratio 1.2
    ratios = [e.losses["gamma_ratio"] for e in events if "gamma_ratio" in e.losses]
    assert ratios[-1] == pytest.approx(2.0, abs=0.01)
    assert final.label_inference["gamma_ratio_by_restart"][0] == pytest.approx(ratios[-1])


@pytest.mark.parametrize(
    ("name", "preset", "gain"), [("dlm+", "paper", 30.0), ("dlm", "stable", 15.0)]
)
def test_attack_lowers_its_objective_and_beats_the_random_start(name, preset, gain):
    # The server's nominal lr is 10x the client's; 10 L-BFGS steps. Measured on this case:
    # DLM+ 6 -> 70 dB, DLM (stable) 6 -> 41 dB; the margins are set at about half of that.
    victim, observation, knowledge = release_for(nominal_lr=0.1)
    events, final = run_attack(name, observation, knowledge, 10, preset=preset, emit_every=1)
    objectives = [e.losses["objective"] for e in events if "objective" in e.losses]
    assert objectives[-1] < 1e-3 * objectives[0]
    start = psnr_of(events[0].images, victim)
    assert psnr_of(final.selected.images, victim) > start + gain
    assert final.selected.labels.tolist() == victim.batch.labels.tolist()


def test_dlm_as_printed_in_the_paper_collapses_to_gamma_zero_at_32_pixels():
    # Eq. 3 has a trivial minimum: gamma = 0 and a dummy batch whose gradient vanishes. With
    # the paper's optimiser the 32x32 runs go there; the "stable" preset does not. Within 10
    # steps a start's path depends on the CPU's kernels (seed 0 reached gamma ratio 1e-5 with
    # AVX-512's, 0.18 with ATen's scalar ones, still falling), so the claim is over 4 starts:
    # at least 3 collapsed, and none recovered anything.
    victim, observation, knowledge = release_for(shape=(3, 32, 32))
    collapsed = 0
    for seed in range(4):
        events, final = run_attack("dlm", observation, knowledge, 10, preset="paper", seed=seed)
        collapsed += abs(final.label_inference["gamma_ratio_by_restart"][0]) < 0.01
        assert psnr_of(final.selected.images, victim) < psnr_of(events[0].images, victim) + 3.0
    assert collapsed >= 3


def test_dlm_plus_reads_a_fedsgd_gradient_as_a_one_step_update():
    victim, observation, knowledge = release_for(ClientProtocol())
    assert observation.kind == "gradient"
    events, final = run_attack("dlm+", observation, knowledge, 10, preset="paper")
    assert psnr_of(final.selected.images, victim) > psnr_of(events[0].images, victim) + 30.0


@pytest.mark.parametrize("simulate", ["gradient", "client"])
def test_dlm_plus_attacks_several_local_steps(simulate):
    # 3 local steps at lr 0.05 that the server believes to be 0.01. Measured: 6 -> 17 dB
    # (one gradient, the paper) and 6 -> 19 dB (the unrolled schedule) in 10 steps.
    protocol = ClientProtocol(algorithm="fedavg", local_steps=3, local_lr=0.05, shared="delta")
    victim, observation, knowledge = release_for(protocol, nominal_lr=0.01)
    events, final = run_attack(
        "dlm+", observation, knowledge, 10, {"simulate": simulate}, emit_every=1
    )
    objectives = [e.losses["objective"] for e in events if "objective" in e.losses]
    assert objectives[-1] < 0.1 * objectives[0]
    assert psnr_of(final.selected.images, victim) > psnr_of(events[0].images, victim) + 6.0


def test_inferred_labels_ignore_the_unknown_learning_rate():
    victim, observation, knowledge = release_for(nominal_lr=1.0, batch=4)
    _, final = run_attack("dlm+", observation, knowledge, 2, {"labels": "inferred"})
    assert sorted(final.selected.labels.tolist()) == sorted(victim.batch.labels.tolist())
    assert final.label_inference["rule"].startswith("distinct")


def test_known_labels_need_a_threat_model_that_gives_them():
    _, observation, knowledge = release_for()
    with pytest.raises(AttackUnsupportedError, match="knows the labels"):
        run_attack("dlm", observation, knowledge, 2, {"labels": "known"})
    victim, observation, knowledge = release_for(labels_known=True)
    _, final = run_attack("dlm", observation, knowledge, 2)  # auto -> known
    assert final.selected.labels.tolist() == victim.batch.labels.tolist()


@pytest.mark.parametrize("name", ["dlm", "dlm+"])
def test_time_budget_stops_the_attack(name):
    _, observation, knowledge = release_for()
    start = time.perf_counter()
    _, final = run_attack(name, observation, knowledge, 100_000, max_seconds=1.0)
    assert final.stop_reason == "time budget"
    assert time.perf_counter() - start < 10
    assert final.steps < 100_000


@pytest.mark.parametrize("name", ["dlm", "dlm+"])
def test_cancellation_stops_the_attack_and_keeps_what_it_has(name):
    _, observation, knowledge = release_for()
    seen = []
    config, _ = build_attack_config(name, {"optimizer": "adam", "lr": 0.1})
    control = RunControl(10_000, emit_every=1, is_cancelled=lambda: len(seen) >= 3)
    for event in get_attack(name).run(observation, knowledge, config, control, 0):
        seen.append(event)
    final = seen[-1].final
    assert final.stop_reason == "cancelled"
    assert final.steps <= 3
    assert final.selected.images.shape == (1, 3, 12, 12)


def test_attack_is_deterministic_for_a_seed():
    _, observation, knowledge = release_for()
    _, first = run_attack("dlm", observation, knowledge, 3, seed=5)
    _, again = run_attack("dlm", observation, knowledge, 3, seed=5)
    assert torch.equal(first.selected.images, again.selected.images)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("dlm", {"gamma_init_ratio": 0}),
        ("dlm", {"gamma_on": "both"}),
        ("dlm", {"lr": -1}),
        ("dlm+", {"norm": "max"}),
        ("dlm+", {"tv": 20}),
        ("dlm+", {"restarts": 0}),
        ("dlm+", {"gamma_init_ratio": 1.0}),  # DLM+ has no factor
        ("dlm", {"labels": "idlg"}),
    ],
)
def test_bad_config_values_are_refused(name, params):
    with pytest.raises(AuditInputError):
        build_attack_config(name, params)


def test_a_zero_update_is_refused():
    _, observation, knowledge = release_for(protocol=dataclasses.replace(FEDAVG, shared="delta"))
    zero = Observation(
        observation.kind,
        tuple(torch.zeros_like(t) for t in observation.tensors),
        observation.parameter_names,
    )
    with pytest.raises(AttackUnsupportedError, match="zero"):
        run_attack("dlm+", zero, knowledge, 1)


@pytest.mark.parametrize("name", ["dlm", "dlm+"])
def test_a_batch_of_64_runs(name):
    protocol = ClientProtocol(algorithm="fedavg", local_steps=2, local_lr=0.01, local_batch_size=32)
    _, observation, knowledge = release_for(protocol, batch=64, data="digits")
    _, final = run_attack(name, observation, knowledge, 2, {"lbfgs_max_iter": 2})
    assert final.selected.images.shape == (64, 3, 12, 12)
    assert final.selected.labels.shape == (64,)
    assert torch.isfinite(final.selected.images).all()


def _adam(restarts: int, **more) -> dict:
    """The paper's MLP optimiser (Adam, lr 0.1) with ``restarts`` starts."""
    return {"optimizer": "adam", "lr": 0.1, "restarts": restarts, **more}


def _same_but_for_flipped_steps(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal to float rounding, but for a few entries: Adam's first steps are about lr times
    the sign of the gradient, so a rounding in a gradient entry near zero (the batched
    kernels sum in another order) can turn it into a step the other way there."""
    off = (a - b).abs() > 1e-4
    assert float(off.float().mean()) < 0.01, float(off.float().mean())


@pytest.mark.parametrize("name", ["dlm", "dlm+"])
def test_adam_starts_together_end_where_each_ends_apart(name):
    """Adam is elementwise: one Adam over three stacked starts is each start's own, so they
    end where the same starts end one after another (``attacks.dlm_starts``)."""
    _, observation, knowledge = release_for()
    _, apart = run_attack(name, observation, knowledge, 3, _adam(3, together=False), "paper")
    _, together = run_attack(name, observation, knowledge, 3, _adam(3), "paper")
    for a, b in zip(apart.candidates, together.candidates, strict=True):
        assert (a.restart, a.steps, a.stop_reason) == (b.restart, b.steps, b.stop_reason)
        assert b.loss == pytest.approx(a.loss, rel=1e-3)
        _same_but_for_flipped_steps(a.images, b.images)
    if name == "dlm":  # each start's own gamma
        ratios = [r.label_inference["gamma_ratio_by_restart"] for r in (apart, together)]
        assert ratios[0].keys() == ratios[1].keys() == {0, 1, 2}
        assert list(ratios[1].values()) == pytest.approx(list(ratios[0].values()), rel=1e-3)


def test_an_adam_start_that_breaks_is_dropped_then_and_keeps_what_it_had_before(monkeypatch):
    """A start whose objective stops being finite at its third step is dropped as diverged
    at that step, scored by the images it had before it (as a start alone keeps its last
    finite step); the others run on. Nothing is read back to find it (``test_host_reads``)."""
    _, observation, knowledge = release_for()
    real, calls, before = ModelLeakageObjective.together, [0], []

    def together(self, images, labels, gamma=None):
        value = real(self, images, labels, gamma)
        calls[0] += 1
        if calls[0] >= 3 and images.shape[0] == 3:  # start 1 of the three, from step 3 on
            if calls[0] == 3:
                before.append(images[1].detach().clone())
            value = value.clone().index_fill_(0, torch.tensor([1]), float("inf"))
        return value

    monkeypatch.setattr(ModelLeakageObjective, "together", together)
    _, final = run_attack("dlm", observation, knowledge, 6, _adam(3), "paper", emit_every=100)
    reasons = {c.restart: (c.stop_reason, c.steps) for c in final.candidates}
    assert reasons == {0: ("completed", 6), 1: ("diverged", 3), 2: ("completed", 6)}
    broken = next(c for c in final.candidates if c.restart == 1)
    torch.testing.assert_close(broken.images, before[0].cpu(), rtol=0, atol=0)
