"""Specification of the adaptive attacker (issue 17): every defense faced by an attacker
who knows its mechanism and public parameters (``KnownDefense``), matching through it
(``ThroughDefense``), run beside the plain attack as its twin."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from auditlib.attacks.base import ATTACKS
from auditlib.attacks.fedleak import GradientModel
from auditlib.attacks.objectives import UpdateMatcher
from auditlib.client.protocol import ClientProtocol
from auditlib.defenses import DEFENSES, build_defense
from auditlib.defenses.base import ClientContext
from auditlib.defenses.fedkl import FedKL, FedKLConfig
from auditlib.engine.audit import prepare_victim, run_audit
from auditlib.models.keylock import key_lock_modules
from auditlib.spec import ComponentSpec, ScenarioSpec
from auditlib.threat import KnownDefense
from tests.test_attacks import lenet_spec, release_for

torch.set_num_threads(1)

# Defenses with no adaptive attacker of this kind, and why (docs/ALGORITHMS.md).
NOT_OFFERED = {
    "none": "nothing to know",
    "fedboosting": "its audit already is the adversary that knows the protocol",
}


def matcher(release, known: bool) -> UpdateMatcher:
    knowledge = release.knowledge
    if known:
        knowledge = dataclasses.replace(knowledge, defense=release.known_defense)
    return UpdateMatcher(release.observation, knowledge, "l2")


def test_every_defense_offers_an_adaptive_attacker_or_says_why_not():
    offered = {n for n, info in DEFENSES.items() if hasattr(info.factory, "known_to_attacker")}
    assert offered.isdisjoint(NOT_OFFERED)
    assert offered | set(NOT_OFFERED) == set(DEFENSES)


def test_with_nothing_known_the_adaptive_objective_is_the_plain_one():
    _, batch, release = release_for(lenet_spec(), defense="none")
    assert release.known_defense is None
    empty = dataclasses.replace(release.knowledge, defense=KnownDefense("none", "knows nothing"))
    images = torch.randn_like(batch.images)
    plain = UpdateMatcher(release.observation, release.knowledge, "l2")(images, batch.labels)
    same = UpdateMatcher(release.observation, empty, "l2")(images, batch.labels)
    assert torch.equal(plain, same)


@pytest.mark.parametrize(
    "defense, params, protocol",
    [
        ("prune", {"ratio": 0.8}, None),
        ("soteria", {"ratio": 0.5}, None),
        ("clip", {"bound": 1.0}, None),
        ("clip", {"bound": 0.02, "mode": "value"}, None),
        ("quantize", {"bits": 4, "stochastic": False}, None),
        ("quantize", {"bits": 1}, None),
        # FedAvg: the transform acts on the weight difference, not on its gradient reading.
        ("clip", {"bound": 0.01}, ClientProtocol("fedavg", local_lr=0.1, local_steps=2)),
        (
            "dlm-sparsify",
            {"ratio": 0.5},
            ClientProtocol("fedavg", local_lr=0.01, shared="weights"),
        ),
    ],
)
def test_at_the_true_batch_the_adaptive_objective_is_zero_and_the_plain_one_is_not(
    defense, params, protocol
):
    # The attacker who knows a deterministic defense models its release exactly.
    _, batch, release = release_for(
        lenet_spec(), protocol=protocol, defense=defense, defense_params=params
    )
    images, labels = batch.images, batch.labels
    target = matcher(release, False).target
    scale = sum(float(t.pow(2).sum()) for t in target)
    assert float(matcher(release, True)(images, labels).detach()) <= 1e-9 * scale
    assert float(matcher(release, False)(images, labels).detach()) > 1e-3 * scale


def test_outposts_attacker_weighs_each_layer_by_its_known_noise_scale():
    _, _, release = release_for(lenet_spec(), defense="outpost", defense_params={})
    known, observed = release.known_defense, release.observation.tensors
    assert known.distance == "l2"
    for weight, tensor in zip(known.mask, observed, strict=True):
        assert torch.equal(weight == 0, tensor == 0)  # the pruned entries are left out
    # The noise's scale is the layer weights' variance times noise_base: larger variance,
    # smaller weight (LeNet's layers differ in fan-in, so in their init's spread).
    variances = [float(p.var()) for p in release.knowledge.model.parameters() if p.numel() > 1]
    scales = [float(w.max()) for w, t in zip(known.mask, observed, strict=True) if t.numel() > 1]
    pairs = sorted(zip(variances, scales, strict=True))
    assert all(a[1] >= b[1] - 1e-12 for a, b in itertools.pairwise(pairs))
    # A round in which OUTPOST did not perturb (its probability decays with the round)
    # releases the update as computed, with no pruning zeros; the attacker sees that.
    _, _, plain = release_for(lenet_spec(), defense="none")
    outpost, _ = build_defense("outpost")
    weights = dict(release.knowledge.model.named_parameters())
    assert outpost.known_to_attacker(plain.observation, weights).mask is None


def test_noise_is_matched_with_its_likelihood():
    _, _, gaussian = release_for(lenet_spec(), defense="dp-gaussian", defense_params={"sigma": 0.1})
    _, _, laplace = release_for(lenet_spec(), defense="dp-laplace", defense_params={"scale": 0.1})
    assert gaussian.known_defense.distance == "l2" and laplace.known_defense.distance == "l1"
    assert "clipping to L2 norm 30" in gaussian.known_defense.summary
    assert matcher(laplace, True).distance.__name__ == "l1_distance"
    assert "not averaged" in gaussian.known_defense.summary  # one release per audit


def test_soteria_holds_against_dlg_but_not_against_dlg_that_knows_it():
    spec = lenet_spec("dlg", 100, defense=ComponentSpec.of("soteria", {"ratio": 0.5}))
    summary = run_audit(spec, lpips_nets=()).summary
    plain, adaptive = summary.attacks
    assert (plain.adaptive, adaptive.adaptive) == (False, True)
    assert adaptive.label == "dlg (knows the defense)"
    assert plain.psnr_mean < 15 < 30 < adaptive.psnr_mean
    # The verdict counts the stronger: the adaptive twin's recovery.
    assert summary.metrics.psnr_mean >= adaptive.psnr_mean - 1e-9
    assert summary.verdict.level == "Very High"
    card = {k.item: k for k in summary.verdict.scope.threat.knowledge}
    line = card["the defense's mechanism and public parameters"]
    assert line.known and "Soteria pruned 50%" in line.detail


@pytest.mark.parametrize(
    "preset, knows, twins",
    [("paper", None, False), (None, False, False), ("paper", True, True), (None, None, True)],
)
def test_the_twin_runs_by_default_except_for_the_paper_preset(preset, knows, twins):
    spec = lenet_spec("dlg", 1, defense=ComponentSpec.of("prune", {"ratio": 0.5}))
    spec = dataclasses.replace(
        spec,
        attack=ComponentSpec.of("dlg", preset=preset),
        scenario=ScenarioSpec(attacker_knows_defense=knows),
    )
    attacks = run_audit(spec, lpips_nets=()).summary.attacks
    assert [a.adaptive for a in attacks] == ([False, True] if twins else [False])


def test_fedleak_matches_through_the_defense_too():
    _, batch, release = release_for(lenet_spec(), defense="prune", defense_params={"ratio": 0.8})
    knows = dataclasses.replace(release.knowledge, defense=release.known_defense)
    model = GradientModel(release.observation, knows, unroll=False)
    candidate = model(torch.randn_like(batch.images), batch.labels, differentiable=False)
    for mask, target, simulated in zip(
        release.known_defense.mask, model.target, candidate, strict=True
    ):
        assert torch.equal(target[mask == 0], torch.zeros_like(target[mask == 0]))
        assert torch.equal(simulated[mask == 0], torch.zeros_like(simulated[mask == 0]))
    assert sum(int((s != 0).sum()) for s in candidate) > 0


@pytest.mark.parametrize("fit", ["affine", "key"])
def test_fedkls_attacker_fits_the_lock_and_at_the_clients_lock_matches_exactly(fit):
    # The key and the lock are the client's secrets; the adaptive attacker makes them free
    # parameters of its own copy of the model, and the plain attacker's model is untouched.
    _, batch, release = release_for(
        lenet_spec(), defense="fedkl", defense_params={"adaptive_fit": fit}
    )
    adaptive, plain = matcher(release, True), matcher(release, False)
    assert adaptive.view.model is not release.knowledge.model
    assert plain.view.model is release.knowledge.model and plain.unknowns == ()
    assert all(u.requires_grad for u in adaptive.unknowns)
    assert len(adaptive.unknowns) == (2 if fit == "affine" else 1)
    # The client's lock, rebuilt from the run's seed as release_for's client built it.
    client = (
        FedKL(FedKLConfig(adaptive_fit=fit))
        .change_model(lenet_spec_model(), (3, 32, 32), seed=0)
        .client
    )
    ((_, lock),) = key_lock_modules(client)
    truth = lock.affine() if fit == "affine" else (lock.key,)
    images, labels = batch.images, batch.labels
    target = sum(float(t.pow(2).sum()) for t in adaptive.target)
    at_guess = float(adaptive(images, labels).detach())
    with torch.no_grad():
        for unknown, value in zip(adaptive.unknowns, truth, strict=True):
            unknown.copy_(value)
    assert float(adaptive(images, labels).detach()) <= 1e-9 * target < 1e-3 * target < at_guess
    # A new restart starts again from the attacker's own guess.
    adaptive.restart()
    assert float(adaptive(images, labels).detach()) == pytest.approx(at_guess, rel=1e-5)
    # The objective reaches the unknowns: the attack can fit them.
    loss = adaptive(torch.randn_like(images), labels)
    grads = torch.autograd.grad(loss, adaptive.unknowns)
    assert all(float(g.abs().sum()) > 0 for g in grads)


def lenet_spec_model():
    return prepare_victim(lenet_spec()).model


def test_attacks_that_cannot_match_through_a_defense_have_no_twin_and_say_why():
    _, _, fedkl = release_for(lenet_spec(), defense="fedkl")
    _, _, clip = release_for(lenet_spec(), defense="clip", defense_params={"bound": 1.0})
    for name in ("dlg", "idlg", "ig", "grnn"):
        assert ATTACKS[name].why_not_adaptive(fedkl.known_defense) is None
    reason = ATTACKS["fedleak"].why_not_adaptive(fedkl.known_defense)
    assert "unknown model parameters" in reason and "fedkl" in reason
    assert ATTACKS["gi"].why_not_adaptive(fedkl.known_defense) is not None
    assert "clip or quantiser" in ATTACKS["dlm+"].why_not_adaptive(clip.known_defense)


def test_dlm_compares_only_the_weights_that_survived_sparsification():
    from auditlib.attacks.dlm import DlmPlusConfig, ModelLeakageObjective

    protocol = ClientProtocol("fedavg", local_lr=0.01, shared="weights")
    _, batch, release = release_for(
        lenet_spec(), protocol=protocol, defense="dlm-sparsify", defense_params={"ratio": 0.5}
    )
    assert ATTACKS["dlm+"].why_not_adaptive(release.known_defense) is None
    knows = dataclasses.replace(release.knowledge, defense=release.known_defense)
    adaptive = ModelLeakageObjective(release.observation, knows, DlmPlusConfig())
    plain = ModelLeakageObjective(release.observation, release.knowledge, DlmPlusConfig())
    for mask, target in zip(release.known_defense.mask, adaptive.target, strict=True):
        assert torch.equal(target[mask == 0], torch.zeros_like(target[mask == 0]))
    images = torch.randn_like(batch.images)
    assert float(adaptive(images, batch.labels)) != float(plain(images, batch.labels))


def test_a_twin_that_cannot_match_through_the_defense_is_skipped_and_the_card_says_so():
    spec = lenet_spec("gi", 3, defense=ComponentSpec.of("fedkl", {}))
    summary = run_audit(spec, lpips_nets=()).summary
    plain, twin = summary.attacks
    assert not plain.skipped and plain.psnr_mean is not None
    assert twin.adaptive and "gi cannot match through fedkl" in twin.skipped
    card = {k.item: k for k in summary.verdict.scope.threat.knowledge}
    line = card["the defense's mechanism and public parameters"]
    assert not line.known and "offered, but no twin ran: gi cannot match" in line.detail


def test_shadows_attacker_undoes_the_perturbation_it_can_compute():
    # Given the perturbed images (what any attack recovers at best), the attacker that
    # knows Shadow gets closer to the client's own by removing the perturbation's level.
    params = {"shadow": "prior", "sigma0": 0.5}
    _, batch, release = release_for(lenet_spec(), defense="shadow", defense_params=params)
    known = release.known_defense
    assert ATTACKS["dlg"].why_not_adaptive(known) is None and known.postprocess is not None
    shadow, _ = build_defense("shadow", params)
    perturbed = shadow.perturb_images(
        ClientContext(
            release.knowledge.model,
            {n: p.detach() for n, p in release.knowledge.parameters().items()},
            batch.images,
            batch.labels,
            release.knowledge.protocol,
        ),
        torch.Generator().manual_seed(1),
    )
    undone = known.postprocess(perturbed, batch.labels, release.knowledge)
    before = float((perturbed - batch.images).pow(2).mean())
    after = float((undone - batch.images).pow(2).mean())
    assert after < 0.85 * before
