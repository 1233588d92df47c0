"""The malicious server: the models it builds (auditlib.server), the attacks that read them
back (rtf, cah, loki), secure aggregation, and the refusals an auditor meets."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from auditlib.attacks import ATTACKS
from auditlib.attacks.imprint import BlockUpdate, read_bins
from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import client_update, trainable_parameters
from auditlib.data.normalization import Normalization
from auditlib.defenses import build_defense
from auditlib.engine.attack_phase import plan_attacks
from auditlib.engine.audit import run_audit
from auditlib.errors import AuditInputError
from auditlib.fl.scenario import release_aggregate
from auditlib.models import ModelSpec, build_model
from auditlib.server import BuildContext
from auditlib.server.bins import public_prior
from auditlib.server.build import build_rtf
from auditlib.server.modification import refuse_unwrappable
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from auditlib.threat import KnownDefense, PrivateBatch

LENET = ModelSpec("lenet", 10, (1, 32, 32))


def spec_of(attack, batch=16, params=None, data="fashion-mnist", **scenario):
    return RunSpec(
        model=ModelRef(LENET),
        data=DataSpec("samples", data, batch_size=batch),
        scenario=ScenarioSpec(server="malicious", **scenario),
        attack=ComponentSpec.of(attack, params, "audit"),
        defense=ComponentSpec.of("none"),
        budget=Budget(1),
    )


def test_rtf_reads_back_the_images_alone_in_their_bins_exactly():
    summary = run_audit(spec_of("rtf"), lpips_nets=()).summary
    exact = [p for p in summary.metrics.per_image if p.psnr > 60]  # exact up to float32
    assert len(exact) >= 12  # 128 bins for 16 images: a few share a bin
    assert all(p.beyond_guess for p in exact)
    assert summary.verdict.outcome == "leaks"
    assert summary.verdict.scope.threat.sok_model == "F-H"
    changed = {k.item: k for k in summary.verdict.scope.threat.knowledge}
    assert "imprint block" in changed["active manipulation of the model or clients"].detail


def test_rtf_reads_fedavg_weights_after_several_local_steps():
    protocol = ClientProtocol("fedavg", local_steps=3, local_lr=0.01, shared="weights")
    summary = run_audit(spec_of("rtf", protocol=protocol), lpips_nets=()).summary
    assert sum(p.psnr >= 30 for p in summary.metrics.per_image) >= 10


def test_cah_reads_back_images_that_fired_a_trap_row_alone():
    summary = run_audit(spec_of("cah"), lpips_nets=()).summary
    assert sum(p.psnr > 60 for p in summary.metrics.per_image) >= 6  # exact up to float32


def test_loki_attributes_each_image_to_its_client_through_secure_aggregation():
    spec = spec_of("loki", batch=16, secure_aggregation=4)
    summary = run_audit(spec, lpips_nets=()).summary
    (record,) = summary.attacks
    recovered = sum(p.beyond_guess for p in summary.metrics.per_image)
    assert recovered >= 12
    assert record.images_attributed == recovered
    knowledge = {k.item: k for k in summary.verdict.scope.threat.knowledge}
    assert "4 clients" in knowledge["individual updates"].detail


def test_rtf_recovers_through_secure_aggregation_without_attributing():
    summary = run_audit(spec_of("rtf", secure_aggregation=4), lpips_nets=()).summary
    assert sum(p.beyond_guess for p in summary.metrics.per_image) >= 12
    assert summary.attacks[0].images_attributed is None


def test_every_applicable_attack_under_the_malicious_server_is_the_server_s_attacks():
    names = [p.name for p in plan_attacks(ComponentSpec.of("all"), 10, server="malicious")]
    assert names == ["rtf", "cah", "loki"]
    honest = [p.name for p in plan_attacks(ComponentSpec.of("all"), 10)]
    assert "rtf" not in honest and "dlg" in honest


def test_a_batch_beyond_the_block_s_bins_is_refused_with_how_many_it_can_separate():
    with pytest.raises(
        AuditInputError, match="separates at most 8 images per client; the batch has 16"
    ):
        run_audit(spec_of("rtf", params={"bins": 8}), lpips_nets=())


def test_the_server_s_attacks_need_the_malicious_threat_model():
    with pytest.raises(AuditInputError, match="malicious-server threat model"):
        plan_attacks(ComponentSpec.of("rtf"), 1)


def test_secure_aggregation_of_one_client_is_refused():
    with pytest.raises(AuditInputError, match="with one client the sum is that client's update"):
        ScenarioSpec(secure_aggregation=1)


def test_more_clients_than_images_is_refused():
    with pytest.raises(AuditInputError, match="at least one image per client"):
        run_audit(spec_of("rtf", batch=2, secure_aggregation=4), lpips_nets=())


def test_the_bins_prior_never_comes_from_the_audited_images():
    with pytest.raises(AuditInputError, match="not from the client's images"):
        run_audit(spec_of("rtf", data="faces"), lpips_nets=())


def test_a_fixed_graph_archive_cannot_have_a_block_put_in_front():
    scripted = torch.jit.script(build_model(LENET))
    with pytest.raises(AuditInputError, match="graph is fixed"):
        refuse_unwrappable(scripted, "rtf")


def test_a_block_too_large_for_the_machine_is_refused_before_it_is_built():
    context = BuildContext(
        build_model(LENET), (3, 224, 224), 64, 1, Normalization.identity(3), None, 0
    )
    with pytest.raises(AuditInputError, match="M parameters"):
        build_rtf(context, 4096, public_prior("faces"), "faces")


def test_the_secure_aggregate_of_fedsgd_clients_is_the_union_batch_s_gradient():
    torch.manual_seed(0)
    model = build_model(ModelSpec("lenet", 10, (1, 32, 32)))
    images, labels = torch.rand(6, 1, 32, 32), torch.tensor([0, 1, 2, 3, 4, 5])
    batches = [
        PrivateBatch(images[s], labels[s], tuple("x" for _ in range(len(labels[s]))))
        for s in (slice(0, 2), slice(2, 6))
    ]
    defense, _ = build_defense("none")
    release = release_aggregate(
        lambda k: model,
        batches,
        ClientProtocol(),
        defense,
        normalization=Normalization.identity(1),
        num_classes=10,
        labels_known=False,
        seed=0,
    )
    union = client_update(
        model, trainable_parameters(model), images, labels, ClientProtocol(), differentiable=False
    )
    for aggregate, whole in zip(release.observation.tensors, union, strict=True):
        torch.testing.assert_close(aggregate, whole, rtol=1e-5, atol=1e-6)
    assert release.knowledge.batch_size == 6 and release.knowledge.clients == 2


def _bins_with_two_images(noise: float) -> tuple[BlockUpdate, torch.Tensor]:
    """32 bins of 16 pixels; two images (delta 10) in bins 20 and 27, so rows 0..20 and
    0..27 fire for them; noise of standard deviation ``noise`` on every entry, as DP adds."""
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(2, 16, generator=generator, dtype=torch.float64)
    weight = torch.zeros(32, 16, dtype=torch.float64)
    bias = torch.zeros(32, dtype=torch.float64)
    for image, last in zip(images, (20, 27), strict=True):
        weight[: last + 1] += 10 * image
        bias[: last + 1] += 10
    weight += noise * torch.randn(weight.shape, generator=generator, dtype=torch.float64)
    bias += noise * torch.randn(bias.shape, generator=generator, dtype=torch.float64)
    return BlockUpdate(weight.float(), bias, None), images


def test_under_noise_the_bins_kept_are_those_whose_step_holds_images_not_the_first():
    update, images = _bins_with_two_images(0.1)
    thresholds = tuple(k / 32 for k in range(32))
    reads = read_bins(update, 0, thresholds, by_bias=True)
    assert len(reads) == 32  # under noise no step is zero: the plain attacker finds every bin
    strongest = sorted(reads, key=lambda r: -r[0])[:2]
    for _, pixels in strongest:  # the two bins that hold the images, read back to ~0.014
        error = (pixels.double() - images).square().mean(dim=1).sqrt().min()
        assert error < 0.03
    # Knowing the noise, the twin keeps only the bins whose step stands above it.
    known = read_bins(update, 0, thresholds, by_bias=True, entry_noise=0.1)
    assert len(known) == 2


def test_without_noise_the_twin_s_reading_is_the_plain_one():
    update, images = _bins_with_two_images(0.0)
    thresholds = tuple(k / 32 for k in range(32))
    for entry_noise in (0.0, 0.1):
        reads = read_bins(update, 0, thresholds, by_bias=True, entry_noise=entry_noise)
        assert len(reads) == 2
        for _, pixels in reads:
            assert (pixels.double() - images).abs().amax(dim=1).min() < 1e-6


def test_the_twin_s_block_stands_above_the_noise_and_the_model_after_it_sees_the_same_input():
    context = BuildContext(
        build_model(LENET), (1, 32, 32), 4, 1, Normalization.identity(1), None, 0
    )
    prior = public_prior("faces")
    plain = build_rtf(context, 32, prior, "faces")
    twin = build_rtf(replace(context, noise_std=0.1), 32, prior, "faces")
    with torch.no_grad():
        ratio = plain.model.server_block.bins.weight / twin.model.server_block.bins.weight
    factor = float(ratio.mean())
    assert factor > 1e3
    torch.testing.assert_close(ratio, torch.full_like(ratio, factor), rtol=1e-5, atol=0)
    images = torch.rand(4, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(
            twin.model.server_block(images), plain.model.server_block(images), rtol=1e-4, atol=1e-7
        )
    assert "standard deviation 0.1" in twin.what_changed
    assert "standard deviation" not in plain.what_changed


def test_rtf_s_twin_takes_known_noise_and_norm_clipping_and_nothing_else():
    rtf = ATTACKS["rtf"]
    config = rtf.presets["audit"]
    noise = build_defense("dp-gaussian", {"clip": None})[0].known_to_attacker(None, {})
    clipped = build_defense("dp-gaussian")[0].known_to_attacker(None, {})
    assert clipped.clip_norm == 30 and clipped.entry_noise_std == 0.1
    for known in (noise, clipped):
        assert rtf.why_not_adaptive(known) is None and not rtf.twin_adds_nothing(known, config)
    # A norm clip alone cancels in the read-back's ratio: the twin is the plain attack.
    clip = build_defense("clip")[0].known_to_attacker(None, {})
    assert rtf.why_not_adaptive(clip) is None and rtf.twin_adds_nothing(clip, config)
    pruned = KnownDefense("prune", "knows the survivors", mask=(torch.ones(3),))
    assert "adapts only to noise" in rtf.why_not_adaptive(pruned)
    # The other servers have no twin: "held" against them is never claimed (Scope.twins).
    assert ATTACKS["cah"].why_not_adaptive(noise) is not None
    assert ATTACKS["loki"].why_not_adaptive(noise) is not None


def test_the_server_that_knows_the_noise_recovers_where_the_plain_one_does_not():
    # Item 5 of issue 50, small: DP noise of sigma 0.1 without a clip on 4 images.
    spec = replace(spec_of("rtf", batch=4), defense=ComponentSpec.of("dp-gaussian", {"clip": None}))
    summary = run_audit(spec, lpips_nets=()).summary
    plain, twin = summary.attacks
    assert not plain.adaptive and plain.images_recovered == 0
    assert twin.adaptive and twin.images_recovered >= 3  # measured: 4, at 62 to 75 dB
    assert summary.verdict.scope.twins == "ran"
    knows = [k for k in summary.threat_model.server_knows if "knows the defense" in k]
    assert knows and "scaled the block" in knows[0]


def test_with_every_attack_the_finding_is_one_server_s_never_several_servers_union():
    # Issue 50, item 4: a server sends one model a round, so rtf's, cah's and loki's picks
    # are three servers'; per image the best of them is no server's (rtf 15, cah 8, loki 15
    # read "16 of 16"). The finding is the best single server's own pick.
    from auditlib.engine.judging import ONE_SERVER

    summary = run_audit(spec_of("all"), lpips_nets=()).summary
    ran = [a for a in summary.attacks if a.images_recovered is not None]
    assert [a.attack for a in ran] == ["rtf", "cah", "loki"]
    best = max(ran, key=lambda a: (a.images_recovered, a.psnr_mean))
    finding = summary.verdict.finding
    assert finding.one_server == best.label
    recovered = summary.metrics.risk.images_recovered
    assert finding.images_recovered == best.images_recovered == recovered
    assert {p.attack for p in summary.metrics.per_image} == {best.label}
    assert summary.metrics.view.startswith(ONE_SERVER)
    assert "several servers' models" in summary.metrics.view
    assert summary.verdict.headline.startswith(f"{finding.level}: {best.label}'s server rebuilt")
    assert "best single server" in summary.verdict.sentence


def test_against_every_server_the_twins_ran_only_partly_so_held_is_never_claimed():
    # cah and loki have no twin: Scope.twins reads "partly", and the verdict gives "Low"
    # only where it reads "ran" (metrics.verdict).
    spec = replace(spec_of("all", batch=4), defense=ComponentSpec.of("dp-gaussian"))
    scope = run_audit(spec, lpips_nets=()).summary.verdict.scope
    assert scope.twins == "partly"
    assert "the twin of cah did not run" in scope.twins_words
    assert "the twin of loki did not run" in scope.twins_words
    assert "rtf" not in scope.twins_words
