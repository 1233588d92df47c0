"""The client's model check (``model-check``): it refuses the models a malicious server builds
here (rtf, cah, loki) and lets honest models through with the update unchanged; each
signature fires on its own attack's layer and not on an honest one. LeNet at 32 px, fixed
seeds, the builders of ``auditlib.server`` through the attacks' configs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from auditlib.attacks import ATTACKS
from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import trainable_parameters
from auditlib.config import build_config
from auditlib.data.model_input import to_model_batch
from auditlib.data.normalization import Normalization
from auditlib.data.samples import load_sample_set
from auditlib.defenses import ClientContext, build_defense
from auditlib.defenses import model_signatures as sig
from auditlib.fl.scenario import defended_update
from auditlib.models import ModelSpec, build_model
from auditlib.server import BuildContext

torch.set_num_threads(1)

SHAPE = (3, 32, 32)
NORM = Normalization((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
BATCH = 8
FEDSGD = ClientProtocol()


def images(source: str = "fashion-mnist", count: int = BATCH) -> torch.Tensor:
    return to_model_batch(list(load_sample_set(source, count).images), SHAPE, NORM)


def lenet(init: str = "default") -> nn.Module:
    return build_model(ModelSpec("lenet", 10, SHAPE, init=init, seed=0))


def malicious(attack: str, params: dict | None = None) -> nn.Module:
    """The model the server sends client 0 for ``attack``'s audit preset (and ``params``)."""
    info = ATTACKS[attack]
    config = build_config(info.config_type, {**info.audit.values, **(params or {})}, attack)
    context = BuildContext(
        model=lenet(),
        input_shape=SHAPE,
        batch_size=BATCH,
        clients=8 if attack == "loki" else 1,
        normalization=NORM,
        audited_source="fashion-mnist",
        seed=0,
    )
    return info.builds(config, context).model_for(0)


def context_of(model: nn.Module, batch: torch.Tensor) -> ClientContext:
    parameters = trainable_parameters(model)
    labels = torch.arange(len(batch)) % 10
    return ClientContext(
        model, {n: p.detach() for n, p in parameters.items()}, batch, labels, FEDSGD
    )


def check():
    defense, _ = build_defense("model-check")
    return defense


# --- the defense -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attack", "signatures"),
    [
        ("rtf", ["an imprint", "columns are identical"]),
        ("cah", ["trap weights", "columns are identical"]),
        ("loki", ["an imprint", "passes one input through", "columns are identical"]),
    ],
)
def test_the_check_refuses_every_malicious_model_and_says_why(attack, signatures):
    defense = check()
    reason = defense.refuses(context_of(malicious(attack), images()))
    assert reason is not None and reason.startswith("model check: layer server_block.")
    for words in signatures:
        assert words in reason, reason
    assert defense.privacy_report()["model_check"].startswith("flagged 1 of 1 models")


@pytest.mark.parametrize(
    "spec",
    [
        ModelSpec("lenet", 10, SHAPE),
        ModelSpec("lenet", 10, SHAPE, init="uniform"),
        ModelSpec("resnet20", 10, SHAPE),
        ModelSpec("resnet20", 10, SHAPE, init="uniform"),
        ModelSpec("mlp", 10, SHAPE, activation="relu"),
    ],
    ids=["lenet", "lenet-uniform", "resnet20", "resnet20-uniform", "mlp-relu"],
)
def test_the_check_passes_honest_untrained_models_and_leaves_them_as_found(spec):
    model = build_model(spec).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    defense = check()
    assert defense.refuses(context_of(model, images())) is None
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert defense.privacy_report()["model_check"].startswith("passed: checked")


def test_defended_update_sends_zeros_for_a_flagged_model_and_the_update_for_an_honest_one():
    defense = check()
    batch, labels = images(), torch.arange(BATCH) % 10
    for model, flagged in ((malicious("rtf"), True), (lenet(), False)):
        parameters = trainable_parameters(model)
        generator = torch.Generator().manual_seed(0)
        update, sent = defended_update(model, parameters, batch, labels, FEDSGD, defense, generator)
        assert any(bool(u.abs().sum() > 0) for u in update)
        if flagged:
            assert all(not bool(s.any()) for s in sent)
        else:
            assert all(torch.equal(u, s) for u, s in zip(update, sent, strict=True))
    assert defense.privacy_report()["model_check"].startswith("flagged 1 of 2 models")


def test_the_check_offers_no_adaptive_attacker():
    assert not hasattr(check(), "known_to_attacker")


def test_the_defense_imports_neither_the_server_nor_the_attacks():
    folder = Path(sig.__file__).parent
    for name in (
        "model_check.py",
        "model_signatures.py",
        "model_behaviour.py",
        "model_behaviour_grads.py",
    ):
        tree = ast.parse((folder / name).read_text())
        imported = [
            node.module if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        ]
        assert not [
            m for m in imported if m and m.startswith(("auditlib.server", "auditlib.attacks"))
        ]


# --- each signature on its own ---------------------------------------------------------------


def layer(model: nn.Module, name: str):
    module = model.get_submodule(name)
    bias = getattr(module, "bias", None)
    return module.weight.detach(), None if bias is None else bias.detach()


def honest_linear(rows: int = 64, features: int = 3072) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    linear = nn.Linear(features, rows)
    return linear.weight.detach(), linear.bias.detach()


@pytest.mark.parametrize("attack", ["rtf", "loki"])
def test_shared_directions_fire_on_the_imprint_and_loki_bins_only(attack):
    finding = sig.shared_directions("bins", *layer(malicious(attack), "server_block.bins"))
    assert finding is not None and finding.signature == "imprint" and finding.statistic == 1.0
    assert ("8 directions" in finding.text) == (attack == "loki")
    assert sig.shared_directions("fc", *honest_linear()) is None
    assert sig.shared_directions("fc", *layer(lenet(), "fc.0")) is None
    # Parallel rows with one bias (a constant initialisation) are not bins.
    weight = torch.ones(16, 32)
    assert sig.shared_directions("copies", weight, torch.zeros(16)) is None


def test_trap_weights_fire_on_the_trap_rows_only():
    weight, bias = layer(malicious("cah"), "server_block.bins")
    finding = sig.trap_weights("bins", weight, bias)
    assert finding is not None and "mirror" in finding.text and finding.statistic == 1.0
    assert sig.trap_weights("fc", *honest_linear()) is None
    assert (
        sig.trap_weights("fc", *layer(build_model(ModelSpec("mlp", 10, SHAPE)), "body.0")) is None
    )
    assert sig.trap_weights("bins", *layer(malicious("rtf"), "server_block.bins")) is None


def test_trap_rows_that_no_longer_mirror_are_still_caught_by_their_sums():
    torch.manual_seed(0)
    magnitudes = torch.randn(64, 100_000).abs()
    weight = torch.cat([-magnitudes, 0.95 * magnitudes], dim=1)
    weight += 1e-3 * torch.randn_like(weight)  # noise breaks the exact mirror
    finding = sig.trap_weights("bins", weight)
    assert finding is not None and "sum far below zero" in finding.text


def test_the_transmit_ratio_fires_on_loki_s_client_kernels_only():
    kernels, _ = layer(malicious("loki"), "server_block.front.conv")
    finding = sig.transmits("front", kernels)
    assert finding is not None and "21 of its 24 kernels are zero" in finding.text
    ratios = sig.transmit_ratios(kernels)
    assert int(ratios.isinf().sum()) == 3 and int(ratios.isnan().sum()) == 21
    model = lenet()
    for name in ("body.0", "body.2", "body.4"):
        assert sig.transmits(name, layer(model, name)[0]) is None
    assert float(sig.transmit_ratios(layer(model, "body.0")[0]).max()) < 1  # SEER: honest < 1


@pytest.mark.parametrize("attack", ["rtf", "cah", "loki"])
def test_identical_columns_fire_on_the_layer_back_to_the_input_only(attack):
    weight, bias = layer(malicious(attack), "server_block.spread")
    assert sig.identical_columns("spread", weight, bias) is not None
    assert sig.identical_columns("fc", *honest_linear()) is None
    assert sig.identical_columns("zero", torch.zeros(8, 8)) is None


def test_one_sample_dominating_fires_on_trap_rows_over_photographs_only():
    # The paper's trap rows (bias 0) over natural photographs fire rarely, each mostly for
    # one image; over Fashion-MNIST they fire for about a fifth of the images and pass.
    paper = {"calibrate_on": "none"} if "calibrate_on" in ATTACKS["cah"].audit.values else {}
    model, batch = malicious("cah", paper), images("photographs")
    activations = sig.relu_activations(model, batch)
    assert set(activations) == {"server_block.bins"}
    finding = sig.dominance("server_block.bins", activations["server_block.bins"])
    assert finding is not None and finding.statistic >= sig.EXTREME
    for source in ("fashion-mnist", "photographs"):
        honest = build_model(ModelSpec("mlp", 10, SHAPE, activation="relu"))
        found = sig.relu_activations(honest, images(source))
        assert set(found) == {"body.0", "body.2"}
        assert all(sig.dominance(n, a) is None for n, a in found.items())
    # a sigmoid network has no ReLU after its linear layers: nothing to run
    assert sig.relu_activations(build_model(ModelSpec("mlp", 10, SHAPE)), batch) == {}


# ------------------------------------------------------------ issue 50, item 9: refusal


def _crops(folder: Path, count: int = 16, size: int = 64) -> None:
    """``count`` crops of ``size`` px of scikit-image's astronaut, as a user uploads them:
    dark sky, suit and face, so a flat grey of the right level beats mid-grey."""
    from PIL import Image
    from skimage import data

    photo = Image.fromarray(data.astronaut())
    step = photo.size[0] // 4
    for k in range(count):
        x, y = (k % 4) * step, (k // 4) * step
        photo.crop((x, y, x + size, y + size)).save(folder / f"crop{k:02d}.png")


def test_a_refused_model_reads_that_the_server_received_nothing_and_no_image_came_back(
    tmp_path,
):
    from auditlib.engine.audit import run_audit
    from auditlib.metrics.verdict import REFUSED, judge
    from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

    _crops(tmp_path)
    spec = RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 64, 64))),
        data=DataSpec("folder", str(tmp_path), batch_size=16),
        # The plain server alone (the servers built to pass the check are issue 54's, in
        # tests/test_evading_servers.py): what comes of a refused model.
        scenario=ScenarioSpec(server="malicious", attacker_knows_defense=False),
        attack=ComponentSpec.of("rtf", None, "audit"),
        defense=ComponentSpec.of("model-check"),
        budget=Budget(1),
    )
    result = run_audit(spec, lpips_nets=())
    summary, verdict = result.summary, result.summary.verdict
    assert verdict.scope.refused and "imprint" in verdict.scope.refused
    assert verdict.outcome == "inconclusive" and not verdict.is_finding
    assert verdict.headline == f"Inconclusive: {REFUSED}"
    assert "so nothing was recovered" in verdict.sentence
    # What rtf read from the zeros: flat images, each scored beside the image's best flat
    # images. None clears them, so none counts as recovered (issue 50: 7 of 16 beat the
    # mid-grey guess, the only one an upload had, and the run read "Medium").
    assert result.reconstruction.std(axis=(1, 2)).max() < 1e-6  # one colour per image
    per_image = summary.metrics.per_image
    assert summary.metrics.risk.images_recovered == 0
    assert all(p.flat_psnr is not None and p.psnr <= p.flat_psnr + 1e-9 for p in per_image)
    assert all(p.flat_ssim is not None and p.ssim < p.flat_ssim + 0.1 for p in per_image)
    # The server's public data (rtf's bins prior) gives guesses for uploaded images too.
    names = {g.name for g in summary.metrics.guesses}
    assert {"grey", "public data mean image (faces)", "public data mean colour (faces)"} <= names
    # Judged beside a control that leaked, it still reads as refused, never a level.
    again = judge(verdict.finding, verdict.scope, defended=True, control=verdict.finding)
    assert again.headline == verdict.headline
