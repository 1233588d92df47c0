"""Specification of auditlib.models: built-in victims, their specs, and safe weight loading.

Why one file over 400 lines: it is the specification of one package or page set, read
from top to bottom; its tests share fixtures and helpers defined here.
"""

from __future__ import annotations

import io
import json
import math
import pickle
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn

from auditlib.errors import AuditInputError
from auditlib.models import (
    ARCHITECTURES,
    ModelSpec,
    build_model,
    describe_model,
    last_linear,
    load_trusted_archive,
    load_weights,
)

NAMES = sorted(ARCHITECTURES)


def _build(architecture: str, **fields: object) -> nn.Module:
    return build_model(ModelSpec(architecture, **fields))  # type: ignore[arg-type]


def _params_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _other_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Same keys and shapes as ``model``, different values."""
    return {k: v + 1 if v.is_floating_point() else v for k, v in model.state_dict().items()}


class _OpensFileWhenUnpickled:
    """A pickle payload whose only effect, if ever unpickled, is to create ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.path), "w"))


# --- building ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 32, 32)])
@pytest.mark.parametrize("architecture", NAMES)
def test_every_architecture_maps_a_batch_to_one_logit_per_class(architecture, shape):
    model = _build(architecture, num_classes=7, input_shape=shape)
    logits = model(torch.rand(2, *shape))
    assert logits.shape == (2, 7)
    assert torch.isfinite(logits).all()


def test_built_models_are_cpu_float32_eval_and_remember_their_resolved_spec():
    model = _build("resnet20")
    assert not model.training
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert model.spec == ModelSpec("resnet20", activation="relu", stem="cifar")


def test_lenet_is_dlgs_network_with_768_features_at_32_pixels():
    model = _build("lenet")
    name, fc = last_linear(model)
    assert (name, fc.in_features) == ("fc.0", 768)
    assert [type(m) for m in model.body] == [nn.Conv2d, nn.Sigmoid] * 3
    assert [c.stride for c in model.body if isinstance(c, nn.Conv2d)] == [(2, 2), (2, 2), (1, 1)]
    # 12 * ceil(H / 4) * ceil(W / 4): 28x28 MNIST gives DLG's 588, 64x64 gives 3072.
    assert last_linear(_build("lenet", input_shape=(1, 28, 28)))[1].in_features == 588
    assert last_linear(_build("lenet", input_shape=(3, 64, 64)))[1].in_features == 3072


def test_convnet_is_inverting_gradients_network_with_36_width_features_at_32_pixels():
    model = _build("convnet")
    assert last_linear(model)[1].in_features == 36 * 64
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 8
    assert last_linear(_build("convnet", input_shape=(3, 64, 64)))[1].in_features == 49 * 4 * 64


def test_convnet_refuses_inputs_too_small_for_its_two_pools():
    with pytest.raises(AuditInputError, match=r"at least 9x9 pixels.*got 3x8x8"):
        _build("convnet", input_shape=(3, 8, 8))


def test_resnet_stem_defaults_to_cifar_up_to_64_pixels_and_imagenet_above():
    assert ModelSpec("resnet18", input_shape=(3, 64, 64)).resolved().stem == "cifar"
    assert ModelSpec("resnet18", input_shape=(3, 128, 128)).resolved().stem == "imagenet"
    assert ModelSpec("resnet20", input_shape=(3, 128, 128)).resolved().stem == "cifar"
    assert ModelSpec("lenet").resolved().stem is None


def test_resnet_imagenet_stem_downsamples_by_four_before_the_blocks():
    model = _build("resnet18", input_shape=(3, 64, 64), stem="imagenet")
    assert model.conv1.kernel_size == (7, 7) and model.conv1.stride == (2, 2)
    assert isinstance(model.maxpool, nn.MaxPool2d)
    assert model(torch.rand(2, 3, 64, 64)).shape == (2, 10)
    cifar = _build("resnet18", input_shape=(3, 64, 64))
    assert cifar.conv1.kernel_size == (3, 3) and isinstance(cifar.maxpool, nn.Identity)


def test_resnet_depths_and_widths_follow_he_et_al():
    def blocks(model: nn.Module) -> list[int]:
        return [len(model.get_submodule(f"layer{i + 1}")) for i in range(model.num_stages)]

    assert blocks(_build("resnet10")) == [1, 1, 1, 1]
    assert blocks(_build("resnet18")) == [2, 2, 2, 2]
    assert blocks(_build("resnet34")) == [3, 4, 6, 3]
    assert blocks(_build("resnet20")) == [3, 3, 3]
    assert last_linear(_build("resnet20"))[1].in_features == 64


def test_resnet18_names_match_torchvision_so_its_checkpoints_fit_the_imagenet_stem():
    torchvision = pytest.importorskip("torchvision")
    reference = torchvision.models.resnet18(num_classes=10).state_dict()
    ours = _build("resnet18", input_shape=(3, 224, 224), stem="imagenet").state_dict()
    assert {k: v.shape for k, v in reference.items()} == {k: v.shape for k, v in ours.items()}


def test_activation_defaults_follow_the_papers_and_can_be_switched():
    assert {n: info.default_activation for n, info in ARCHITECTURES.items()} == {
        "lenet": "sigmoid",
        "convnet": "relu",
        "resnet10": "relu",
        "resnet18": "relu",
        "resnet20": "relu",
        "resnet34": "relu",
        "mlp": "sigmoid",
    }
    sigmoid_resnet = _build("resnet18", activation="sigmoid")
    assert not any(isinstance(m, nn.ReLU) for m in sigmoid_resnet.modules())
    relu_lenet = _build("lenet", activation="relu")
    assert not any(isinstance(m, nn.Sigmoid) for m in relu_lenet.modules())
    assert all(not m.inplace for m in _build("convnet").modules() if isinstance(m, nn.ReLU))


def test_registry_flags_batchnorm_truthfully():
    for name, info in ARCHITECTURES.items():
        assert describe_model(_build(name))["has_batchnorm"] is info.has_batchnorm, name


# --- initialisation ---------------------------------------------------------------------


@pytest.mark.parametrize("architecture", ["lenet", "resnet20"])
def test_uniform_init_spreads_every_parameter_over_minus_half_to_half(architecture):
    model = _build(architecture, init="uniform")
    for name, param in model.named_parameters():
        assert param.min() >= -0.5 and param.max() <= 0.5, name
        if param.numel() >= 500:
            assert param.min() < -0.45 and param.max() > 0.45, name
    if architecture == "resnet20":  # BatchNorm scales too, as DLG's weights_init does
        assert model.bn1.weight.min() < 0


@pytest.mark.parametrize("init", ["default", "uniform"])
def test_same_seed_gives_identical_parameters_and_another_seed_different_ones(init):
    first = _build("resnet20", init=init, seed=3)
    assert _params_equal(first, _build("resnet20", init=init, seed=3))
    assert not _params_equal(first, _build("resnet20", init=init, seed=4))


def test_building_leaves_the_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(5)
    torch.manual_seed(123)
    _build("lenet", init="uniform", seed=9)
    _build("resnet20", seed=10)
    assert torch.equal(torch.rand(5), expected)


# --- second-order gradients (what the attacks differentiate) -----------------------------


@pytest.mark.parametrize(
    "spec",
    [ModelSpec("lenet", init="uniform"), ModelSpec("resnet18", activation="sigmoid")],
    ids=["lenet", "resnet18-sigmoid"],
)
def test_gradient_of_the_gradient_reaches_the_input(spec):
    model = build_model(spec)
    x = torch.rand(1, *spec.input_shape, requires_grad=True)
    loss = F.cross_entropy(model(x), torch.tensor([3]))
    grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
    sum(g.pow(2).sum() for g in grads).backward()
    assert x.grad is not None
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


# --- spec validation --------------------------------------------------------------------


def test_spec_round_trips_through_json():
    spec = ModelSpec("ResNet18", num_classes=100, input_shape=(3, 64, 64), stem="imagenet")
    data = json.loads(json.dumps(spec.as_dict()))
    assert data["architecture"] == "resnet18" and data["input_shape"] == [3, 64, 64]
    assert ModelSpec.from_dict(data) == spec


def test_unknown_architecture_lists_the_valid_names():
    with pytest.raises(AuditInputError) as caught:
        build_model(ModelSpec("vgg16"))
    message = str(caught.value)
    assert "'vgg16'" in message
    assert all(name in message for name in NAMES)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"num_classes": 1}, r"num_classes must be between 2 and 100000, got 1"),
        ({"num_classes": 100_001}, r"between 2 and 100000"),
        ({"num_classes": 2.5}, r"num_classes must be a whole number, got 2\.5"),
        ({"num_classes": True}, r"whole number"),
        ({"input_shape": (3, 32)}, r"input_shape must have 3 entries.*expected \(channels"),
        ({"input_shape": (2, 32, 32)}, r"2 channels; expected 1 .* or 3"),
        ({"input_shape": (3, 4, 32)}, r"4x32 pixels; expected .* between 8 and 512"),
        ({"input_shape": (3, 32, 1024)}, r"between 8 and 512"),
        ({"input_shape": (3, -32, 32)}, r"between 8 and 512"),
        ({"input_shape": "3x32x32"}, r"input_shape must be three numbers"),
        ({"init": "xavier"}, r"init 'xavier' is not known; expected one of default, uniform"),
        ({"activation": "tanh"}, r"activation 'tanh' .* expected one of sigmoid, relu"),
        ({"stem": "imagenet"}, r"stem='imagenet' was given for lenet, which has no stem"),
        ({"seed": -1}, r"seed must be between 0"),
    ],
)
def test_bad_spec_fields_are_refused_with_what_was_expected(fields, expected):
    with pytest.raises(AuditInputError, match=expected):
        build_model(ModelSpec("lenet", **fields))


def test_resnet_stem_must_be_cifar_or_imagenet():
    with pytest.raises(AuditInputError, match=r"stem 'tiny' .* expected one of cifar, imagenet"):
        ModelSpec("resnet18", stem="tiny")


def test_spec_from_dict_refuses_unknown_fields():
    with pytest.raises(AuditInputError, match=r"unknown fields depth; expected only"):
        ModelSpec.from_dict({"architecture": "lenet", "depth": 3})


# --- loading weights --------------------------------------------------------------------


@pytest.fixture
def lenet() -> nn.Module:
    return _build("lenet")


@pytest.fixture
def trained_lenet() -> nn.Module:
    """A LeNet whose weights differ from a fresh build, standing in for a trained model."""
    return _build("lenet", init="uniform", seed=42)


def test_safetensors_file_round_trips(tmp_path, lenet, trained_lenet):
    path = tmp_path / "weights.safetensors"
    safetensors.torch.save_file(trained_lenet.state_dict(), path)
    load_weights(lenet, path)
    assert _params_equal(lenet, trained_lenet)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_torch_save_file_round_trips(tmp_path, lenet, trained_lenet, legacy):
    path = tmp_path / "weights.pt"
    torch.save(trained_lenet.state_dict(), path, _use_new_zipfile_serialization=not legacy)
    load_weights(lenet, str(path))
    assert _params_equal(lenet, trained_lenet)


def test_format_is_detected_from_content_not_extension(lenet, trained_lenet):
    data = safetensors.torch.save(trained_lenet.state_dict())
    load_weights(lenet, data, filename="weights.pt")
    assert _params_equal(lenet, trained_lenet)


def test_checkpoint_wrappers_and_dataparallel_prefix_are_unwrapped(lenet, trained_lenet):
    state = {f"module.{k}": v for k, v in trained_lenet.state_dict().items()}
    buffer = io.BytesIO()
    torch.save({"epoch": 7, "model_state_dict": state}, buffer)
    load_weights(lenet, buffer.getvalue())
    assert _params_equal(lenet, trained_lenet)


def test_batchnorm_models_load_their_running_statistics(tmp_path):
    source = _build("resnet20", seed=1)
    source.bn1.running_mean.fill_(0.25)
    path = tmp_path / "resnet20.safetensors"
    safetensors.torch.save_file(source.state_dict(), path)
    target = _build("resnet20", seed=2)
    load_weights(target, path)
    assert _params_equal(target, source)


def test_pickled_object_posing_as_weights_is_refused_and_never_unpickled(tmp_path, lenet):
    marker = tmp_path / "payload-ran"
    payload = pickle.dumps({"fc.0.weight": _OpensFileWhenUnpickled(marker)})
    # Control: a plain unpickle really runs the payload (in a separate location).
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_OpensFileWhenUnpickled(control))).close()  # noqa: S301
    assert control.exists()

    path = tmp_path / "weights.pt"
    path.write_bytes(payload)
    with pytest.raises(AuditInputError) as caught:
        load_weights(lenet, path)
    message = str(caught.value)
    assert "'weights.pt' is not a safetensors file or a weights-only PyTorch state_dict" in message
    assert "pickled Python objects, which are never loaded" in message
    assert "expected" in message and "\n" not in message
    assert not marker.exists()


def test_torch_save_archive_holding_a_python_object_is_refused(tmp_path, lenet):
    marker = tmp_path / "payload-ran"
    buffer = io.BytesIO()
    torch.save({"fc.0.bias": torch.zeros(10), "extra": _OpensFileWhenUnpickled(marker)}, buffer)
    with pytest.raises(AuditInputError, match=r"pickled Python objects, which are never loaded"):
        load_weights(lenet, buffer.getvalue(), filename="model.pth")
    assert not marker.exists()


def test_text_file_renamed_pt_is_refused(tmp_path, lenet):
    path = tmp_path / "notes.pt"
    path.write_text("these are not weights\n")
    with pytest.raises(AuditInputError, match=r"'notes\.pt' is not a safetensors file or a Py"):
        load_weights(lenet, path)


def test_empty_missing_and_oversized_files_are_refused(tmp_path, lenet):
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(AuditInputError, match=r"'empty\.safetensors' is empty \(0 bytes\)"):
        load_weights(lenet, empty)
    with pytest.raises(AuditInputError, match=r"nowhere\.pt' was not found; expected a path"):
        load_weights(lenet, tmp_path / "nowhere.pt")
    big = tmp_path / "big.safetensors"
    safetensors.torch.save_file(lenet.state_dict(), big)
    with pytest.raises(AuditInputError, match=r"over the 1,000 bytes limit"):
        load_weights(lenet, big, max_bytes=1000)


def test_weights_of_another_architecture_are_refused_with_the_differences(tmp_path, lenet):
    path = tmp_path / "convnet.safetensors"
    safetensors.torch.save_file(_build("convnet").state_dict(), path)
    before = {k: v.clone() for k, v in lenet.state_dict().items()}
    with pytest.raises(AuditInputError) as caught:
        load_weights(lenet, path)
    message = str(caught.value)
    assert "weights in 'convnet.safetensors' do not fit lenet (num_classes=10, input 3x32x32)" in (
        message
    )
    assert "8 missing keys (body.0.weight" in message
    assert "unexpected keys (model." in message
    assert all(torch.equal(before[k], v) for k, v in lenet.state_dict().items())


def test_wrong_class_count_is_reported_as_shape_mismatches(tmp_path, lenet):
    path = tmp_path / "cifar100.pt"
    torch.save(_build("lenet", num_classes=100).state_dict(), path)
    with pytest.raises(AuditInputError) as caught:
        load_weights(lenet, path)
    message = str(caught.value)
    assert "2 shape mismatches, e.g. fc.0.weight is [100, 768] in the file but [10, 768]" in (
        message
    )
    assert "missing" not in message and "unexpected" not in message


def test_non_finite_weights_are_refused(lenet):
    state = _other_weights(lenet)
    state["body.2.weight"][0, 0, 0, 0] = math.nan
    state["body.2.weight"][0, 0, 0, 1] = math.inf
    with pytest.raises(AuditInputError, match=r"body\.2\.weight has 2 NaN or infinite values"):
        load_weights(lenet, safetensors.torch.save(state))


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ([torch.zeros(3)], r"holds a list, not a state_dict"),
        ({"fc.0.weight": 3}, r"maps 'fc\.0\.weight' to a int; expected a state_dict"),
        ({}, r"holds no tensors"),
    ],
)
def test_loaded_objects_that_are_not_state_dicts_are_refused(lenet, obj, expected):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with pytest.raises(AuditInputError, match=expected):
        load_weights(lenet, buffer.getvalue())


# --- trusted archives and descriptions --------------------------------------------------


@pytest.fixture
def scripted_lenet(tmp_path, trained_lenet) -> Path:
    path = tmp_path / "lenet_scripted.pt"
    with pytest.warns(FutureWarning):  # torch.jit is deprecated but still what users upload
        torch.jit.save(torch.jit.script(trained_lenet), path)
    return path


def test_torchscript_archive_loads_as_trusted_and_computes_the_same(scripted_lenet, trained_lenet):
    loaded = load_trusted_archive(scripted_lenet)
    x = torch.rand(3, 3, 32, 32)
    torch.testing.assert_close(loaded(x), trained_lenet(x))


def test_torchscript_archive_is_refused_as_plain_weights(scripted_lenet, lenet):
    with pytest.raises(AuditInputError, match=r"is a TorchScript archive, not a weights file"):
        load_weights(lenet, scripted_lenet)


def test_trusted_archive_loader_refuses_safetensors_and_other_files(tmp_path, lenet):
    path = tmp_path / "model.pt"
    safetensors.torch.save_file(lenet.state_dict(), path)
    with pytest.raises(AuditInputError, match=r"is a safetensors weights file; expected a Torch"):
        load_trusted_archive(path)
    state_dict = tmp_path / "state.pt"
    torch.save(lenet.state_dict(), state_dict)
    with pytest.raises(AuditInputError, match=r"is not a model archive"):
        load_trusted_archive(state_dict)


def test_describe_model_reports_counts_batchnorm_and_the_last_linear_layer():
    summary = describe_model(_build("convnet", num_classes=5))
    assert summary["num_parameters"] == summary["num_trainable"] > 0
    assert summary["num_parameters"] == sum(math.prod(s) for _, s in summary["parameters"])
    assert summary["parameters"][0] == ("model.conv0.weight", [64, 3, 3, 3])
    assert summary["has_batchnorm"] is True
    assert summary["last_linear"] == {"name": "model.linear", "shape": [5, 2304]}
    assert summary["spec"]["architecture"] == "convnet"
    json.dumps(summary)


def test_last_linear_is_the_last_in_module_order_and_required():
    model = nn.Sequential(nn.Linear(4, 8), nn.Sigmoid(), nn.Linear(8, 3))
    name, layer = last_linear(model)
    assert name == "2" and layer is model[2]
    with pytest.raises(AuditInputError, match=r"has no nn\.Linear layer; expected a classifier"):
        last_linear(nn.Sequential(nn.Conv2d(3, 4, 3)))
