"""The malicious server: the models it builds (auditlib.server), the attacks that read them
back (rtf, cah, loki), secure aggregation, and the refusals an auditor meets."""

from __future__ import annotations

import pytest
import torch

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
from auditlib.threat import PrivateBatch

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
