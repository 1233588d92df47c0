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
from auditlib.client.update import client_update
from auditlib.defenses import DEFENSES, build_defense
from auditlib.defenses.base import ClientContext
from auditlib.defenses.fedkl import FedKL, FedKLConfig
from auditlib.engine.audit import prepare_victim, run_audit
from auditlib.likelihoods import STEP_FLOOR, QsgdLikelihood, image_prior_nats
from auditlib.models.keylock import key_lock_modules
from auditlib.spec import ComponentSpec, ScenarioSpec
from auditlib.threat import KnownDefense
from tests.test_attacks import lenet_spec, release_for

torch.set_num_threads(1)

# Defenses with no adaptive attacker of this kind, and why (docs/ALGORITHMS.md).
NOT_OFFERED = {
    "none": "nothing to know",
    "fedboosting": "its audit already is the adversary that knows the protocol",
    # Its attacker is a server built to pass it (``with_evading``), not a twin told of it.
    "model-check": "servers built to pass the check stand in for the built ones",
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


def test_outposts_attacker_prunes_and_ranks_its_candidate_as_outpost_does():
    _, batch, release = release_for(lenet_spec(), defense="outpost", defense_params={})
    known, observed = release.known_defense, release.observation.tensors
    assert known.needs() == {"likelihood"} and known.mask is None
    # At the client's own update the modelled release is exact where OUTPOST added no
    # noise (pruned zeros and untouched survivors alike), and differs only where it did.
    protocol = release.knowledge.protocol
    update = client_update(
        release.knowledge.model,
        release.knowledge.parameters(),
        batch.images,
        batch.labels,
        protocol,
        differentiable=False,
    )
    means, stds = known.noise.model(tuple(u.detach() for u in update))
    exact = min(float(s.min()) for s in stds)
    noised = pruned_and_noised = 0
    for mean, std, seen in zip(means, stds, observed, strict=True):
        quiet = std == exact
        assert torch.equal(seen[quiet], mean[quiet])
        noised += int((~quiet).sum())
        pruned_and_noised += int(((mean == 0) & ~quiet & (seen != 0)).sum())
    assert noised > 0 and pruned_and_noised > 0  # pure noise where a pruned entry was noised
    # The noise's scale is each layer's weights' variance times noise_base: a layer with a
    # larger spread of weights gets a larger standard deviation.
    variances = [float(p.detach().var()) for p in release.knowledge.model.parameters()]
    widest = [float(s.max()) for s in stds]
    pairs = sorted((v, w) for v, w in zip(variances, widest, strict=True) if w > exact)
    assert all(a[1] <= b[1] + 1e-12 for a, b in itertools.pairwise(pairs))
    # A round in which OUTPOST did not perturb (its probability decays with the round)
    # releases the update as computed, with no pruning zeros; the attacker sees that, and
    # knowing the defense then changes nothing.
    _, _, plain = release_for(lenet_spec(), defense="none")
    outpost, _ = build_defense("outpost")
    weights = dict(release.knowledge.model.named_parameters())
    unperturbed = outpost.known_to_attacker(plain.observation, weights)
    assert unperturbed.needs() == frozenset()
    assert ATTACKS["dlg"].twin_adds_nothing(unperturbed, None)


def test_under_noise_the_twin_is_the_bayes_optimal_attacker():
    # -log p(y | u(x)) - log p(x): the noise's likelihood in nats plus the image prior,
    # whose weight relative to the data term grows with the known noise scale.
    images = None
    for sigma in (0.01, 0.1):
        _, batch, release = release_for(
            lenet_spec(), defense="dp-gaussian", defense_params={"sigma": sigma, "clip": None}
        )
        images = torch.randn_like(batch.images) if images is None else images
        plain, twin = matcher(release, False), matcher(release, True)
        squares = float(plain(images, batch.labels).detach())
        prior = float(image_prior_nats(images, 1.0))
        assert float(twin(images, batch.labels).detach()) == pytest.approx(
            squares / (2 * sigma**2) + prior, rel=1e-5
        )
    _, batch, laplace = release_for(
        lenet_spec(), defense="dp-laplace", defense_params={"scale": 0.1}
    )
    assert laplace.known_defense.distance == "l1"
    absolute = sum(
        float((s - t).abs().sum().detach())
        for s, t in zip(
            matcher(laplace, False).simulate(images, batch.labels),
            matcher(laplace, False).target,
            strict=True,
        )
    )
    assert float(matcher(laplace, True)(images, batch.labels).detach()) == pytest.approx(
        absolute / 0.1 + float(image_prior_nats(images, 1.0)), rel=1e-5
    )
    _, _, gaussian = release_for(lenet_spec(), defense="dp-gaussian", defense_params={"sigma": 0.1})
    assert "clipping to L2 norm 30" in gaussian.known_defense.summary
    assert "not averaged" in gaussian.known_defense.summary  # one release per audit


def test_the_qsgd_twin_reads_each_buckets_norm_and_weighs_its_own_step():
    _, batch, release = release_for(
        lenet_spec(), defense="quantize", defense_params={"bits": 4, "bucket_size": 64}
    )
    known = release.known_defense
    assert known.needs() == {"likelihood"}
    update = client_update(
        release.knowledge.model,
        release.knowledge.parameters(),
        batch.images,
        batch.labels,
        release.knowledge.protocol,
        differentiable=False,
    )
    steps = []
    for u, step in zip(update, known.noise.steps, strict=True):
        rows = torch.nn.functional.pad(u.detach().reshape(-1), (0, -u.numel() % 64)).view(-1, 64)
        if u.numel() < 64:
            rows = u.detach().reshape(1, -1)
        norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
        alive = norms.squeeze(1) > 0
        # The released step is the bucket's norm over the 7 levels of 4 bits.
        torch.testing.assert_close(step[alive], norms[alive] / 7, rtol=1e-4, atol=0)
        steps.append(step[alive])
    steps = torch.cat(steps)
    assert float(steps.max()) > 10 * float(steps.min())  # scales differ by coordinate
    # The client's own update is far likelier than the same update with a sign flipped.
    truth = [u.detach() for u in update]
    flipped = [t.clone() for t in truth]
    index = int(flipped[0].abs().argmax())
    flipped[0].view(-1)[index] *= -1
    observed = release.observation.tensors
    assert known.noise.nll(flipped, observed, 1.0) > known.noise.nll(truth, observed, 1.0) + 50


def test_the_qsgd_twin_reads_no_bucket_finer_than_a_tenth_of_the_coarsest_step():
    """QSGD's 8 bits on LeNet's 100 classes: the rows of the classes the model all but rules
    out leave at steps of 1e-13 where the coarsest is 0.1. Read at their own steps those
    terms outweighed the rest by 1e24, and every start of DLG's twin left float32's finite
    numbers within 16 steps (benchmarks/qsgd_floor.py). The twin reads a bucket no finer
    than a tenth of the coarsest step: as the release of a coarser rounding of it."""
    release = release_for(lenet_spec(), defense="quantize", defense_params={"bits": 8})[2]
    floored = release.known_defense.noise
    observed = release.observation.tensors
    exact = QsgdLikelihood.read(observed, 127, 512, floor=0)
    coarsest = max(float(s.max()) for s in exact.steps)
    assert min(float(s.min()) for s in exact.steps) < 1e-9 * coarsest  # what it is for
    for step, own, unit in zip(exact.steps, exact.units, floored.units, strict=True):
        assert torch.equal(own, step)
        assert torch.equal(unit, step.clamp_min(STEP_FLOOR * coarsest))
    # Within one bucket every term (rounding, norm, signs) is read in the bucket's unit: a
    # change there costs the exact likelihood's times (step / unit)^2, 1 where the bucket is
    # read at its own step.
    base = tuple(t.double() for t in observed)
    weights = exact.steps[6].squeeze(1)  # the 100 x 768 layer's buckets
    for bucket in (int(weights.argmin()), int(weights.argmax())):
        moved = tuple(t.clone() for t in base)
        unit = float(floored.units[6][bucket])
        moved[6].view(-1)[512 * bucket + 3] += 0.3 * unit
        change = {
            read: float(read.nll(moved, observed, 1.0) - read.nll(base, observed, 1.0))
            for read in (exact, floored)
        }
        scale = (float(weights[bucket]) / unit) ** 2
        assert abs(change[floored]) > 0.1  # a change the sum resolves
        assert change[floored] == pytest.approx(change[exact] * scale, rel=1e-4)
    assert "no finer than 0.1 of the coarsest step" in floored.describe()


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


def test_shadows_attacker_simulates_the_client_on_valid_pixels_of_a_wild_recovery():
    """DLG's pick under Shadow (LeNet, 100 classes, 300 steps, one start, this AMD): finite,
    but so far outside the pixels that the squared error of Shadow's noise map overflowed
    and the run failed ("autodetected range of [nan, nan]"). The attacker runs Shadow on its
    recovery within the pixel range, and the estimate stays finite."""
    _, batch, release = release_for(lenet_spec(), defense="shadow")
    known = release.known_defense
    wild = batch.images.clone()
    wild[..., :4, :] = 1e25  # a finite value whose square overflows float32
    undone = known.postprocess(wild, batch.labels, release.knowledge)
    assert torch.isfinite(undone).all() and undone.shape == wild.shape
