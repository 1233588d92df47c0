"""Malicious servers that know the client's model check (``rtf-evading``, ``cah-evading``,
``loki-evading``): each disguise passes the check's weight signatures and its batch check
as they stand, and the read-back still recovers images; the servers as built stay flagged.
LeNet at 32 px, 8 Fashion-MNIST images, FedSGD, fixed seeds."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from auditlib.attacks import ATTACKS, build_attack_config
from auditlib.attacks.base import RunControl
from auditlib.attacks.evading import invert_convolution
from auditlib.client.protocol import ClientProtocol
from auditlib.data.model_input import to_model_batch
from auditlib.data.normalization import Normalization
from auditlib.data.samples import load_sample_set
from auditlib.defenses import ClientContext, build_defense
from auditlib.defenses import model_signatures as sig
from auditlib.defenses.model_check import ModelCheck, ModelCheckConfig
from auditlib.engine.releases import client_batches
from auditlib.fl.scenario import release_aggregate, release_update
from auditlib.metrics import match, psnr, to_unit_range
from auditlib.models import ModelSpec, build_model
from auditlib.server import BuildContext
from auditlib.server.evading_blocks import activate
from auditlib.threat import PrivateBatch

torch.set_num_threads(1)

SHAPE = (1, 32, 32)
NORM = Normalization((0.5,), (0.25,))
BATCH = 8
EXACT_DB = 60.0  # float32 read-backs measure 77 to 100 dB (the metric caps at 100)


def batch() -> torch.Tensor:
    return to_model_batch(list(load_sample_set("fashion-mnist", BATCH).images), SHAPE, NORM)


def built(attack: str, params: dict, clients: int = 1):
    config, _ = build_attack_config(attack, params, "audit")
    context = BuildContext(
        build_model(ModelSpec("lenet", 10, SHAPE, seed=0)),
        SHAPE,
        BATCH // clients,
        clients,
        NORM,
        "fashion-mnist",
        0,
    )
    return config, ATTACKS[attack].builds(config, context)


def read_back(attack: str, params: dict, clients: int = 1) -> tuple[list[float], object]:
    """Per-image PSNR of the best matches of ``attack``'s read-back, best first."""
    config, server = built(attack, params, clients)
    images = batch()
    private = PrivateBatch(images, torch.arange(BATCH) % 10, tuple(map(str, range(BATCH))))
    guard, _ = build_defense("none")
    arguments = {"normalization": NORM, "num_classes": 10, "labels_known": False, "seed": 0}
    if clients == 1:
        release = release_update(server.model_for(0), private, ClientProtocol(), guard, **arguments)
    else:
        batches = client_batches(private, clients)
        release = release_aggregate(server.model_for, batches, ClientProtocol(), guard, **arguments)
    knowledge = replace(release.knowledge, server=server)
    for event in ATTACKS[attack].run(release.observation, knowledge, config, RunControl(1), 0):
        final = event.final
    rebuilt = to_unit_range(final.selected.images, NORM)
    originals = to_unit_range(images, NORM)
    order = match(rebuilt, originals)
    scores = [psnr(rebuilt[j], originals[i]) for i, j in enumerate(order)]
    return sorted(scores, reverse=True), server


def findings(model: nn.Module) -> list[str]:
    weights, _ = sig.weight_findings(model)
    behaviour, _ = sig.batch_findings(model, batch())
    return [f.text for f in weights + behaviour]


# (attack, parameters, clients, images read back above EXACT_DB at least; measured)
CASES = [
    ("rtf-evading", {}, 1, 3),  # measured 4: 100, 99.8, 95.7, 77.5 dB
    ("rtf-evading", {"disguise": "jitter"}, 1, 4),  # measured 6
    ("rtf-evading", {"disguise": "after-conv"}, 1, 4),  # measured 6
    ("rtf-evading", {"activation": "threshold"}, 1, 3),  # as conv: 4
    ("cah-evading", {}, 1, 2),  # measured 3 (and one at 37 dB)
    ("cah-evading", {"disguise": "noisy"}, 1, 3),  # measured 4
    ("loki-evading", {}, 4, 6),  # measured 8
    ("loki-evading", {"disguise": "random"}, 4, 6),  # measured 8
]


@pytest.mark.parametrize(("attack", "params", "clients", "least"), CASES)
def test_each_disguise_passes_the_check_and_still_reads_images_back(attack, params, clients, least):
    scores, server = read_back(attack, params, clients)
    for client in range(clients):
        assert findings(server.model_for(client)) == []
    assert sum(s > EXACT_DB for s in scores) >= least, scores
    assert server.evasion and server.attack == attack


@pytest.mark.parametrize(("attack", "clients"), [("rtf", 1), ("cah", 1), ("loki", 4)])
def test_the_servers_as_built_are_still_flagged(attack, clients):
    _, server = built(attack, {}, clients)
    assert findings(server.model_for(0)), attack
    assert server.evasion == ""


def test_the_default_evading_servers_pass_the_whole_check_and_decoys_are_what_beats_behaviour():
    """Each default evading server passes the check as a defense, its behaviour signals
    included; without its decoy rows the bins of rtf-evading and loki-evading still hold
    nested sets of images and are refused (the behaviour check reads what the weights
    hide), while the balanced trap rows of cah-evading, over Fashion-MNIST's dark
    backgrounds, fire for too many images to look owned and pass even so (a limit
    docs/ALGORITHMS.md states)."""
    images, labels = batch(), torch.arange(BATCH) % 10
    for attack, clients in (("rtf-evading", 1), ("cah-evading", 1), ("loki-evading", 4)):
        outcomes = {}
        for decoys in (1.5, 0.0):
            server = built(attack, {"decoys": decoys}, clients)[1]
            assert server.decoys == (
                0
                if decoys == 0
                else round(1.5 * server.rows * (clients if attack == "loki-evading" else 1))
            )
            model = server.model_for(0)
            parameters = {n: p.detach() for n, p in model.named_parameters()}
            context = ClientContext(model, parameters, images, labels, ClientProtocol())
            assert ModelCheck(ModelCheckConfig(behaviour_check=False)).refuses(context) is None
            behaviour = ModelCheckConfig(behaviour_check=True)  # off by default: its FPR
            outcomes[decoys] = ModelCheck(behaviour).refuses(context)
        assert outcomes[1.5] is None, (attack, outcomes[1.5])
        if attack == "cah-evading":
            assert outcomes[0.0] is None
        else:
            assert "nested sets" in outcomes[0.0], attack


def test_the_disguised_activations_are_the_relu_on_every_input_but_zero():
    x = torch.linspace(-2, 2, 41, dtype=torch.float64)
    x = x[x != 0].requires_grad_(True)
    for name in ("clamp", "threshold"):
        out = activate(x, name)
        (grad,) = torch.autograd.grad(out.sum(), x)
        torch.testing.assert_close(out, torch.relu(x))
        torch.testing.assert_close(grad, (x > 0).double())


def test_the_jittered_rows_are_not_parallel_and_spread_s_columns_not_identical():
    _, server = built("rtf-evading", {"disguise": "jitter"})
    block = server.model.server_block
    rows = torch.nn.functional.normalize(block.bins.weight.detach(), dim=1)
    cosine = (rows @ rows.T).fill_diagonal_(0).abs()
    assert 0.9 < float(cosine.max()) < sig.PARALLEL  # measured 0.96 at 20 % jitter
    low, high = torch.aminmax(block.spread.weight.detach(), dim=1)
    assert float((high - low).max() / high.abs().max()) > 10 * sig.IDENTICAL


def test_the_disguised_kernels_stay_below_the_transmit_ratio():
    _, server = built("loki-evading", {}, 4)
    kernels = server.model_for(2).server_block.front.conv.weight.detach()
    ratio = sig.transmit_ratios(kernels)
    live = ratio[~ratio.isnan()]
    assert len(live) == 1 and float(live.max()) == pytest.approx(5.0, rel=1e-5)


def test_a_full_rank_convolution_is_inverted_to_float_precision():
    generator = torch.Generator().manual_seed(0)
    conv = nn.Conv2d(1, 12, kernel_size=5, stride=2, padding=2)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=generator) * 0.2)
    x = torch.rand(3, 1, 16, 16, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        y = torch.nn.functional.conv2d(x, conv.weight.double(), conv.bias.double(), 2, 2)
    found, residual = invert_convolution(y, conv.weight, conv.bias, conv, (1, 16, 16))
    assert residual < 1e-9
    assert float((found - x).abs().max()) < 1e-6


def test_the_evading_servers_are_listed_and_stand_in_for_the_built_ones():
    for name, built_name in (
        ("rtf-evading", "rtf"),
        ("cah-evading", "cah"),
        ("loki-evading", "loki"),
    ):
        info = ATTACKS[name]
        assert "evading" in info.summary and info.stands_in_for == frozenset({built_name})
        assert info.presets["audit"]["disguise"] == info.config_type().disguise


def test_under_the_check_a_server_built_to_pass_it_is_tried_and_the_verdict_is_not_held():
    """Issue 54: an audit of rtf under ``model-check``. The built server's model is refused;
    the servers built to pass the check stand in for it (``with_evading``), rtf-evading's
    passes and reads images back, so the verdict is a leak naming it, never "held", and it
    says which servers the check was tried against."""
    from auditlib.engine.audit import run_audit
    from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

    spec = RunSpec(
        # tests/test_report.py's malicious_spec: the learned disguise trained for one is
        # the other's too (kept in the process, by model, batch and seed)
        model=ModelRef(ModelSpec("lenet", 10, SHAPE, init="uniform")),
        data=DataSpec("samples", "fashion-mnist", batch_size=BATCH),
        scenario=ScenarioSpec(server="malicious"),
        attack=ComponentSpec.of("rtf", None, "audit"),
        defense=ComponentSpec.of("model-check"),
        budget=Budget(1),
    )
    summary = run_audit(spec, lpips_nets=()).summary
    verdict = summary.verdict
    scope = verdict.scope
    assert "rtf-evading" in scope.evading and scope.twins == "ran"
    assert "rtf refused" in scope.twins_words
    assert "rtf-evading passed the check" in scope.twins_words
    assert verdict.outcome == "leaks" and verdict.level != "Low"
    assert "held" not in verdict.headline.lower()
    assert "rtf-evading" in verdict.headline + verdict.sentence
    assert verdict.finding.images_recovered >= 4
    card = {k.item: k for k in scope.threat.knowledge}
    assert "servers built to pass the check were tried" in (
        card["the defense's mechanism and public parameters"].detail
    )
