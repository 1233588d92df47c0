"""The model check's behaviour signals (``defenses.model_behaviour``): on the client's own batch,
nested sets of images flag an imprint's bins (rtf as built, and as a full-image convolution
with ``clamp_min(0)``, which no weight signature reads), units owned by one image flag trap
rows (cah as built over photographs, and with ``clamp_min(0)`` and perturbed magnitudes),
and one image's dominating gradient flags a layer built for it (SEER's D-SNR); honest LeNet,
ResNet-18 at 32 px and MLPs pass, untrained and after FedAvg; the model is left as found.
Fixed seeds, 32 px, batches of 8."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from auditlib.attacks import ATTACKS
from auditlib.client.protocol import ClientProtocol
from auditlib.config import build_config
from auditlib.data.model_input import to_model_batch
from auditlib.data.normalization import Normalization
from auditlib.data.samples import load_sample_set
from auditlib.defenses import ClientContext, build_defense
from auditlib.defenses import model_behaviour as mb
from auditlib.defenses.model_behaviour_grads import batch_gradients
from auditlib.errors import AuditInputError
from auditlib.fl.training import FederatedTraining, federated_averaging, pretraining_pool
from auditlib.models import ModelSpec, build_model
from auditlib.server import BuildContext

torch.set_num_threads(1)

SHAPE = (3, 32, 32)
NORM = Normalization((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
BATCH = 8


def images(source: str, count: int = BATCH) -> torch.Tensor:
    return to_model_batch(list(load_sample_set(source, count).images), SHAPE, NORM)


LABELS = torch.arange(BATCH) % 10


def malicious(attack: str) -> nn.Module:
    info = ATTACKS[attack]
    config = build_config(info.config_type, dict(info.audit.values), attack)
    context = BuildContext(
        model=build_model(ModelSpec("lenet", 10, SHAPE, seed=0)),
        input_shape=SHAPE,
        batch_size=BATCH,
        clients=1,
        normalization=NORM,
        audited_source="fashion-mnist",
        seed=0,
    )
    return info.builds(config, context).model_for(0)


class ClampedBlock(nn.Module):
    """A built block's rows as a full-image Conv2d (``conv=True``) or a Linear, switched by
    ``clamp_min(0)`` instead of a ReLU: what an evading server can send."""

    def __init__(self, block: nn.Module, conv: bool) -> None:
        super().__init__()
        self.front, self.spread, self.shape = block.front, block.spread, block.input_shape
        rows = block.bins.out_features
        if conv:
            self.bins = nn.Conv2d(SHAPE[0], rows, SHAPE[1:])
            weight = block.bins.weight.detach().view(rows, *SHAPE)
        else:
            self.bins = nn.Linear(block.bins.in_features, rows)
            weight = block.bins.weight.detach()
        with torch.no_grad():
            self.bins.weight.copy_(weight)
            self.bins.bias.copy_(block.bins.bias.detach())

    def forward(self, x):
        pixels = self.front(x)
        if isinstance(self.bins, nn.Linear):
            pixels = pixels.flatten(1)
        hidden = self.bins(pixels).clamp_min(0).flatten(1)
        return self.spread(hidden).view(x.shape[0], *self.shape)


def clamped(attack: str, conv: bool, perturb: float = 0.0) -> nn.Module:
    model = malicious(attack)
    block = ClampedBlock(model.server_block, conv)
    if perturb:  # the trap's magnitudes x (1 + perturb N): the mirror test no longer holds
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            noise = torch.randn(block.bins.weight.shape, generator=generator)
            block.bins.weight.mul_(1 + perturb * noise)
    model.server_block = block
    return model


def findings(model: nn.Module, batch: torch.Tensor) -> dict[str, list[str]]:
    seen = mb.behaviour(model, batch, LABELS)
    assert not seen.why_unavailable
    out: dict[str, list[str]] = {}
    for finding in mb.behaviour_findings(seen):
        out.setdefault(finding.signature, []).append(finding.layer)
    return out


# --- the signals on malicious models ------------------------------------------------------


@pytest.mark.parametrize("source", ["fashion-mnist", "photographs"])
def test_nested_sets_flag_the_imprint_as_built_and_as_a_clamped_full_image_convolution(source):
    batch = images(source)
    assert findings(malicious("rtf"), batch)["chain"] == ["server_block.bins"]
    model = clamped("rtf", conv=True)
    assert isinstance(model.server_block.bins, nn.Conv2d)
    from auditlib.defenses.model_signatures import weight_findings

    imprint = [f for f in weight_findings(model)[0] if f.signature == "imprint"]
    assert imprint == []  # the weight test skips 4-D weights; behaviour does not
    assert findings(model, batch)["chain"] == ["server_block.bins"]


def test_units_owned_by_one_image_flag_trap_rows_as_built_and_clamped_and_perturbed():
    batch = images("photographs")
    assert findings(malicious("cah"), batch)["ownership"] == ["server_block.bins"]
    for conv in (False, True):
        model = clamped("cah", conv=conv, perturb=1e-3)
        assert findings(model, batch)["ownership"] == ["server_block.bins"]


def test_trap_rows_over_fashion_mnist_look_like_an_honest_relu_layer_and_pass_behaviour():
    # Said in the docs: the as-built trap rows, calibrated on faces, fire for about a fifth
    # of Fashion-MNIST's images, as often as an honest ReLU layer's units at initialisation;
    # only the weight signatures catch them there.
    seen = mb.behaviour(malicious("cah"), images("fashion-mnist"), LABELS)
    bins = next(layer for layer in seen.layers if layer.name == "server_block.bins")
    assert 0.05 < bins.ownership < mb.OWNERSHIP


class OneImageAmplifier(nn.Module):
    """A layer whose gradient one image dominates: 16 rows that fire only for the brightest
    pixels' image of the batch, with a large output weight (SEER's disguise makes one
    image's gradient dominate a layer; this is its simplest form)."""

    def __init__(self, model: nn.Module, threshold: float) -> None:
        super().__init__()
        size = 3 * 32 * 32
        self.bins = nn.Linear(size, 16)
        self.spread = nn.Linear(16, size)
        with torch.no_grad():
            self.bins.weight.fill_(1.0 / size)
            self.bins.bias.fill_(-threshold)
            self.spread.weight.fill_(100.0)
            self.spread.bias.zero_()
        self.model = model

    def forward(self, x):
        hidden = torch.relu(self.bins(x.flatten(1)))
        return self.model(x + self.spread(hidden).view_as(x))


def test_seer_s_dsnr_flags_a_layer_one_image_dominates():
    batch = images("photographs")
    brightness = batch.flatten(1).mean(1).sort().values
    threshold = float(brightness[-2] + brightness[-1]) / 2  # only the brightest fires
    model = OneImageAmplifier(build_model(ModelSpec("lenet", 10, SHAPE, seed=0)), threshold)
    seen = mb.behaviour(model, batch, LABELS)
    bins = next(layer for layer in seen.layers if layer.name == "bins")
    assert bins.dsnr == float("inf")  # one image's gradient and nothing else
    assert "dsnr" in findings(model, batch)


# --- honest models pass ---------------------------------------------------------------------

HONEST = [
    ModelSpec("lenet", 10, SHAPE, seed=0),
    ModelSpec("resnet18", 10, SHAPE, seed=0),
    ModelSpec("mlp", 10, SHAPE, seed=0),
    ModelSpec("mlp", 10, SHAPE, activation="relu", seed=0),
]


@pytest.mark.parametrize("spec", HONEST, ids=["lenet", "resnet18", "mlp", "mlp-relu"])
def test_honest_models_pass_untrained_and_after_fedavg(spec):
    model = build_model(spec)
    for source in ("fashion-mnist", "photographs"):
        assert findings(model, images(source)) == {}
    pool = pretraining_pool("fashion-mnist", 128, SHAPE, 10, NORM, seed=0)
    training = FederatedTraining(rounds=2, clients_per_round=2, examples_per_client=16)
    federated_averaging(model, *pool, training, seed=0)
    for source in ("fashion-mnist", "photographs"):
        assert findings(model, images(source)) == {}


# --- the check leaves the model as found ---------------------------------------------------


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_the_check_leaves_parameters_buffers_modes_and_grads_as_found(mode):
    model = build_model(ModelSpec("resnet18", 10, SHAPE, seed=0)).train()
    model.layer1.eval()  # a mixed state must come back mixed
    before = copy.deepcopy(model.state_dict())
    modes = {name: m.training for name, m in model.named_modules()}
    defense, _ = build_defense("model-check", {"behaviour_check": True, "behaviour_mode": mode})
    batch = images("photographs")
    parameters = {n: p.detach() for n, p in model.named_parameters()}
    context = ClientContext(model, parameters, batch, LABELS, ClientProtocol())
    assert defense.refuses(context) is None
    assert defense.behaviour is not None and len(defense.behaviour.layers) == 21
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert modes == {name: m.training for name, m in model.named_modules()}
    assert all(p.grad is None for p in model.parameters())


def test_a_batch_below_four_images_leaves_the_behaviour_signals_unavailable_and_says_why():
    defense, _ = build_defense("model-check", {"behaviour_check": True})
    model = build_model(ModelSpec("lenet", 10, SHAPE, seed=0))
    batch = images("photographs", 2)
    parameters = {n: p.detach() for n, p in model.named_parameters()}
    context = ClientContext(model, parameters, batch, LABELS[:2], ClientProtocol())
    assert defense.refuses(context) is None
    report = defense.privacy_report()["model_check"]
    assert "behaviour signals unavailable: a batch of 2 images" in report


def test_the_behaviour_signals_are_off_unless_asked_for():
    """Off by default: measured over 205 honest models they refused 11 % of honest checks
    (benchmarks/model_check_rates.py); a client asks for them with behaviour_check."""
    defense, settings = build_defense("model-check")
    assert settings["behaviour_check"] is False
    model = build_model(ModelSpec("lenet", 10, SHAPE, seed=0))
    parameters = {n: p.detach() for n, p in model.named_parameters()}
    batch = images("photographs")
    defense.refuses(ClientContext(model, parameters, batch, LABELS, ClientProtocol()))
    assert defense.behaviour is None


def test_thresholds_are_checked_and_can_be_set():
    with pytest.raises(AuditInputError, match="ownership"):
        build_defense("model-check", {"ownership": 1.5})
    defense, settings = build_defense("model-check", {"chain": 0.95, "dsnr": 3})
    assert settings["chain"] == 0.95 and defense.config.thresholds.dsnr == 3.0


# --- the per-image gradients are exact -------------------------------------------------------


def test_per_image_unit_gradients_match_torch_func_for_linear_grouped_and_padded_convs():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.LeakyReLU(0.01),
        nn.Conv2d(4, 8, 3, stride=2, groups=2, padding=1, padding_mode="reflect"),
        nn.GELU(),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 10),
    )
    x, y = torch.randn(5, 3, 8, 8), torch.arange(5)
    found = batch_gradients(model, x, y)
    weights = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        logits = functional_call(model, p, (xi[None],))
        return nn.functional.cross_entropy(logits, yi[None])

    own = vmap(grad(loss), in_dims=(None, 0, 0))(weights, x, y)
    assert [layer.name for layer in found.layers] == ["0", "2", "5"]
    assert [layer.head for layer in found.layers] == [False, False, True]
    for layer in found.layers:
        expected = own[f"{layer.name}.weight"].flatten(2).norm(dim=2).double()
        torch.testing.assert_close(layer.per_unit, expected, rtol=1e-4, atol=1e-9)
        summed = own[f"{layer.name}.weight"].sum(0).flatten(1).norm(dim=1).double()
        torch.testing.assert_close(layer.update_rows, summed, rtol=1e-4, atol=1e-9)
