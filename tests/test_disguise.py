"""SEER's learned disguise (``seer-disguised``): the server trains the global model's own
weights with a secret decoder on public data, and reads one image off the update.

Tiny trainings (a few steps, seeded) keep these fast; what a longer training recovers is
measured in ``benchmarks/disguise.py``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from auditlib.attacks import ATTACKS, build_attack_config
from auditlib.data.model_input import content_hashes
from auditlib.data.normalization import Normalization
from auditlib.defenses.model_behaviour import model_dsnr as disaggregation_snr
from auditlib.engine.audit import run_audit
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model
from auditlib.server import BuildContext
from auditlib.server.bins import AuditedPixels
from auditlib.server.disguise import DisguisedModification, forget_cache, public_set
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

LENET = ModelSpec("lenet", 10, (1, 32, 32))
TINY = {"steps": 3}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test trains into a data folder of its own, from an empty in-process cache."""
    monkeypatch.setenv("AUDIT_DATA_DIR", str(tmp_path / "data"))
    forget_cache()
    yield
    forget_cache()


def context_for(model, shape=(1, 32, 32), batch=8, **more) -> BuildContext:
    norm = Normalization.identity(shape[0])
    return BuildContext(model, shape, batch, 1, norm, "fashion-mnist", 0, **more)


def build(params=None, context=None):
    config, _ = build_attack_config("seer-disguised", {**TINY, **(params or {})}, "audit")
    return ATTACKS["seer-disguised"].builds(config, context or context_for(build_model(LENET)))


def test_the_disguised_model_is_the_global_architecture_with_its_weights_trained():
    global_model = build_model(LENET)
    built = build(context=context_for(global_model))
    assert isinstance(built, DisguisedModification)
    sent = dict(built.model.named_parameters())
    original = dict(global_model.named_parameters())
    assert {n: p.shape for n, p in sent.items()} == {n: p.shape for n, p in original.items()}
    assert type(built.model) is type(global_model)  # no block in front, no layer added
    changed = [n for n in sent if (sent[n] - original[n]).abs().max() > 1e-6]
    assert changed  # the training moved the weights
    assert "disguised" in ATTACKS["seer-disguised"].summary
    assert "one image per update" in built.evasion and "approximately" in built.evasion


def test_the_read_back_runs_through_the_audit_and_gives_one_decoded_image():
    spec = RunSpec(
        model=ModelRef(LENET),
        data=DataSpec("samples", "fashion-mnist", batch_size=8),
        scenario=ScenarioSpec(server="malicious"),
        attack=ComponentSpec.of("seer-disguised", TINY, "audit"),
        defense=ComponentSpec.of("none"),
        budget=Budget(1),
    )
    summary = run_audit(spec, lpips_nets=()).summary
    (record,) = summary.attacks
    assert record.skipped is None
    assert record.attack_loss == 7.0  # images not read back: all but the decoded one
    assert len(summary.metrics.per_image) == 8
    assert sum(bool(p.beyond_guess) for p in summary.metrics.per_image) <= 1


def run_read_back(built, tensors) -> int:
    """The attack on ``tensors`` as the update; how many images it read back."""
    from auditlib.attacks.base import RunControl
    from auditlib.client.protocol import ClientProtocol
    from auditlib.threat import AttackerKnowledge, Observation

    names = tuple(n for n, _ in built.model.named_parameters())
    knowledge = AttackerKnowledge(
        built.model,
        ClientProtocol(),
        8,
        (1, 32, 32),
        10,
        Normalization.identity(1),
        server=built,
    )
    config, _ = build_attack_config("seer-disguised", TINY, "audit")
    run = ATTACKS["seer-disguised"].run
    events = list(run(Observation("gradient", tensors, names), knowledge, config, RunControl(1), 0))
    return events[-1].final.label_inference["images_read_back"]


def test_an_update_of_zeros_reads_back_nothing_and_a_gradient_one_image():
    built = build()
    zeros = tuple(torch.zeros_like(p) for p in built.model.parameters())
    assert run_read_back(built, zeros) == 0  # a client that refused: the guess is no read-back
    images, labels = torch.rand(8, 1, 32, 32), torch.arange(8)
    loss = torch.nn.functional.cross_entropy(built.model(images), labels)
    gradient = torch.autograd.grad(loss, list(built.model.parameters()))
    assert run_read_back(built, tuple(gradient)) == 1


def test_the_decoder_is_additive_so_a_sum_decodes_to_the_sum_of_its_parts():
    built = build()
    decoder = built.decoder
    size = sum(decoder.sizes)
    a, b = torch.randn(1, size), torch.randn(1, size)
    empty = decoder.decode_flat(torch.zeros(1, size))
    together = decoder.decode_flat(a + b) - empty
    apart = decoder.decode_flat(a) - empty + decoder.decode_flat(b) - empty
    assert torch.allclose(together, apart, atol=1e-4)


def test_a_trained_server_is_kept_in_process_and_on_disk():
    first = build()
    second = build()
    for (name, p), q in zip(first.model.named_parameters(), second.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    forget_cache()  # from the disk cache now
    third = build()
    assert third.outcome == first.outcome
    assert torch.equal(third.decoder.index, first.decoder.index)


def test_the_trained_server_depends_on_its_seed_not_on_the_global_generator(tmp_path, monkeypatch):
    torch.manual_seed(1)
    first = build()
    monkeypatch.setenv("AUDIT_DATA_DIR", str(tmp_path / "elsewhere"))  # no disk cache
    forget_cache()
    torch.manual_seed(2)
    again = build()
    for p, q in zip(first.model.parameters(), again.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)
    for p, q in zip(first.decoder.parameters(), again.decoder.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_a_model_beyond_what_trains_here_is_refused_with_the_limit():
    resnet = build_model(ModelSpec("resnet18", 10, (3, 32, 32)))
    with pytest.raises(AuditInputError, match="at most 2 M parameters; this one has 11"):
        build(context=context_for(resnet, (3, 32, 32)))
    with pytest.raises(AuditInputError, match="at most 32 x 32 px"):
        build(context=context_for(build_model(ModelSpec("lenet", 10, (1, 64, 64))), (1, 64, 64)))


def test_a_decoder_beyond_what_trains_here_is_refused_before_it_is_built():
    with pytest.raises(AuditInputError, match="decoder would hold 67 M parameters"):
        build({"hidden": 4096})


def test_fedavg_is_refused_with_the_reason():
    with pytest.raises(AuditInputError, match="built for FedSGD, as SEER is"):
        build(context=context_for(build_model(LENET), local_lr=0.01))


def test_public_images_holding_an_audited_image_are_refused():
    from auditlib.server.disguise import _fashion_train

    first = _fashion_train()[0][:1]
    pixels = AuditedPixels(32, 32, frozenset(content_hashes(list(first), 32, 32, cached=False)))
    context = context_for(build_model(LENET), audited_pixels=pixels)
    with pytest.raises(AuditInputError, match="not on the client's images"):
        public_set("fashion-mnist-train", context)


def test_d_snr_is_high_where_one_image_owns_a_layer_and_low_where_none_does():
    """The model check's D-SNR (``model_behaviour.model_dsnr``), the one the benchmark
    reports: low where every image reaches a layer alike, high where rows only the first
    image fires own the layer's update."""
    torch.manual_seed(0)
    images, labels = torch.randn(8, 4), torch.zeros(8, dtype=torch.long)
    images[0] *= 5  # the first image stands out along its own direction
    spread = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 10))
    assert disaggregation_snr(spread, images, labels) < 1.0
    # ReLU rows that only the first image fires: that image owns the first layer's update.
    owned = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 10))
    with torch.no_grad():
        owned[0].weight.copy_((images[:1] / images[0].norm()).expand(8, 4))
        threshold = float((images[1:] @ owned[0].weight[:1].T).max())
        owned[0].bias.fill_(-max(threshold, 0.0) - 1e-3)
    assert float(images[0].norm()) > threshold  # the first image fires the rows
    assert disaggregation_snr(owned, images, labels) > 100
