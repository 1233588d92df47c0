"""torchvision classification models as victims: ``ModelSpec("torchvision:NAME")`` and
``--model torchvision:NAME``, their refusals, the auditor's weights, reproducible random
init, and a small audit from the command line.

Kept small for two CPU cores: convolutional networks at 32-64 px; ViT only through its
builder arguments, its refusals and one attention module (its smallest builder makes 88M
parameters).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn

from auditlib.cli import main
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model, describe_model, load_weights, zoo
from auditlib.models.shapes import training_batch_problem

SMALL = (3, 32, 32)


def _build(name: str, shape=SMALL, **fields) -> nn.Module:
    return build_model(ModelSpec(f"torchvision:{name}", input_shape=shape, **fields))


def _save(model: nn.Module, path: Path) -> Path:
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(state, str(path))
    return path


@pytest.fixture(scope="module")
def mobilenet() -> nn.Module:
    return _build("mobilenet_v3_small", num_classes=10, seed=1)


# --- names ------------------------------------------------------------------------------


def test_every_torchvision_classification_builder_is_auditable():
    from torchvision import models

    names = zoo.torchvision_names()
    assert set(names) == set(models.list_models(module=models))
    for name in ("resnet50", "wide_resnet50_2", "resnext50_32x4d", "mobilenet_v2"):
        assert name in names
    for name in ("mobilenet_v3_small", "efficientnet_v2_s", "regnet_y_400mf", "densenet121"):
        assert name in names
    for name in ("convnext_tiny", "vit_b_16", "swin_t", "maxvit_t"):
        assert name in names
    assert not any(n.startswith(("fasterrcnn", "fcn_", "r3d_")) for n in names)  # not classifiers


def test_a_model_is_built_by_name_with_the_spec_kept():
    from torchvision.models import ResNet

    model = build_model(ModelSpec(" TorchVision:ResNet18 ", 7, SMALL))
    assert isinstance(model, ResNet) and not model.training
    assert model.spec.architecture == "torchvision:resnet18"
    assert model(torch.rand(2, *SMALL)).shape == (2, 7)
    assert ModelSpec.from_dict(model.spec.as_dict()) == model.spec


def test_an_unknown_torchvision_name_lists_close_matches_and_how_to_list_all():
    with pytest.raises(AuditInputError) as caught:
        ModelSpec("torchvision:mobilenet_v3")
    message = str(caught.value)
    assert "'torchvision:mobilenet_v3' is not a torchvision classification model" in message
    assert (
        "torchvision:mobilenet_v3_small" in message and "torchvision:mobilenet_v3_large" in message
    )
    assert "python -m auditlib models" in message


def test_a_bare_torchvision_name_points_at_the_prefixed_one():
    with pytest.raises(AuditInputError) as caught:
        ModelSpec("efficientnet_b0")
    message = str(caught.value)
    assert "did you mean torchvision:efficientnet_b0?" in message
    assert "lenet" in message and "python -m auditlib models" in message


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"input_shape": (1, 32, 32)}, r"takes colour input \(3 channels\), got 1.*--channels 3"),
        ({"init": "uniform"}, r"init 'uniform' was given .*expected init 'default'"),
        ({"activation": "relu"}, r"keeps its builder's activations; expected no activation"),
        ({"stem": "cifar"}, r"stem='cifar' was given for torchvision:resnet18, which has no stem"),
    ],
)
def test_what_a_torchvision_model_cannot_take_is_refused_in_the_spec(fields, expected):
    with pytest.raises(AuditInputError, match=expected):
        ModelSpec("torchvision:resnet18", **fields)


def test_a_vit_gets_its_image_size_and_refuses_sides_off_its_patch_grid():
    assert zoo.builder_kwargs("torchvision:vit_b_16", (3, 64, 64)) == {"image_size": 64}
    assert zoo.builder_kwargs("torchvision:maxvit_t", (3, 224, 224)) == {"input_size": (224, 224)}
    with pytest.raises(AuditInputError, match=r"multiple of its 16-pixel patches, got 50x50; "):
        ModelSpec("torchvision:vit_b_16", input_shape=(3, 50, 50))
    with pytest.raises(AuditInputError, match=r"expected e\.g\. 32x32 or 64x64"):
        ModelSpec("torchvision:vit_b_32", input_shape=(3, 48, 48))


def test_a_size_a_model_cannot_take_is_refused_naming_the_smallest_it_takes():
    with pytest.raises(AuditInputError, match=r"cannot take 16x16 inputs .*at least 17x17 pixels"):
        _build("squeezenet1_1", (3, 16, 16))


# --- what the model layer tells the attacks ---------------------------------------------


def test_describe_model_reports_batchnorm_and_the_last_linear_layer(mobilenet):
    summary = describe_model(mobilenet)
    assert summary["has_batchnorm"] is True
    assert summary["last_linear"] == {"name": "classifier.3", "shape": [10, 1024]}
    assert summary["spec"]["architecture"] == "torchvision:mobilenet_v3_small"
    squeezenet = describe_model(_build("squeezenet1_1"))
    assert squeezenet["has_batchnorm"] is False and squeezenet["last_linear"] is None
    assert ModelSpec("torchvision:squeezenet1_1").info.has_batchnorm is False


@pytest.mark.parametrize("name", ["squeezenet1_1", "mobilenet_v3_small", "shufflenet_v2_x0_5"])
def test_batchnorm_and_linear_head_by_name_agree_with_the_built_model(name):
    model = _build(name)
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert zoo.has_batchnorm(name) == has_bn
    assert zoo.ends_in_linear(name) == any(isinstance(m, nn.Linear) for m in model.modules())
    assert not zoo.has_batchnorm("vit_b_16") and not zoo.has_batchnorm("swin_t")
    assert zoo.has_batchnorm("vgg11_bn") and not zoo.has_batchnorm("vgg11")


def test_the_update_is_deterministic_and_twice_differentiable(mobilenet):
    model = _build("mobilenet_v3_small", num_classes=10, seed=1).train()
    dropout = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert dropout and all(m.p == 0 for m in dropout)
    x = torch.rand(2, *SMALL, requires_grad=True)
    assert torch.equal(model(x), model(x))  # no random masks in training mode
    loss = F.cross_entropy(model(x), torch.tensor([1, 2]))
    grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
    (pixels,) = torch.autograd.grad(sum(g.pow(2).sum() for g in grads), x)
    assert torch.isfinite(pixels).all() and pixels.abs().sum() > 0


def test_swapped_modules_compute_the_same_function_with_a_double_backward():
    x = torch.linspace(-5, 5, 101)
    assert torch.allclose(zoo.ClampHardsigmoid()(x), F.hardsigmoid(x), atol=1e-6)
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2, batch_first=True)
    reference = nn.MultiheadAttention(8, 2, batch_first=True)
    reference.load_state_dict(attention.state_dict())
    zoo.make_deterministic(attention)
    assert isinstance(attention, zoo.MathAttention)
    assert attention.state_dict().keys() == reference.state_dict().keys()
    tokens = torch.rand(1, 5, 8, requires_grad=True)
    out = attention(tokens, tokens, tokens, need_weights=False)[0]
    assert torch.allclose(out, reference(tokens, tokens, tokens, need_weights=False)[0], atol=1e-6)
    grads = torch.autograd.grad(out.sum(), list(attention.parameters()), create_graph=True)
    (second,) = torch.autograd.grad(sum(g.pow(2).sum() for g in grads), tokens)
    assert torch.isfinite(second).all()


def test_a_batch_training_batchnorm_cannot_normalise_is_explained(mobilenet):
    problem = training_batch_problem(mobilenet, SMALL, 1)
    assert problem is not None
    assert problem.startswith("torchvision:mobilenet_v3_small cannot compute a training-mode")
    assert "sees a 1x1 feature map" in problem and "at least 2 images" in problem
    assert "--bn-mode eval" in problem
    assert training_batch_problem(mobilenet, SMALL, 2) is None
    assert training_batch_problem(mobilenet, (3, 64, 64), 1) is None


# --- seeds and weights ------------------------------------------------------------------


def test_the_seed_makes_the_random_init_reproducible(mobilenet):
    before = torch.random.get_rng_state()
    again = _build("mobilenet_v3_small", num_classes=10, seed=1)
    other = _build("mobilenet_v3_small", num_classes=10, seed=2)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG is untouched
    state, same, different = mobilenet.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(state[k], same[k]) for k in state)
    assert not torch.equal(state["classifier.3.weight"], different["classifier.3.weight"])


def test_weights_that_fit_are_loaded_from_safetensors_and_state_dicts(mobilenet, tmp_path):
    target = _build("mobilenet_v3_small", num_classes=10, seed=5)
    load_weights(target, _save(mobilenet, tmp_path / "mobilenet.safetensors"))
    assert all(torch.equal(v, target.state_dict()[k]) for k, v in mobilenet.state_dict().items())
    buffer = io.BytesIO()
    torch.save({"model_state_dict": mobilenet.state_dict()}, buffer)
    fresh = _build("mobilenet_v3_small", num_classes=10, seed=6)
    load_weights(fresh, buffer.getvalue(), filename="checkpoint.pt")
    assert torch.equal(fresh.classifier[3].weight, mobilenet.classifier[3].weight)


def test_weights_of_another_architecture_are_refused_naming_the_first_mismatches(
    mobilenet, tmp_path
):
    target = _build("efficientnet_b0", num_classes=10)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(AuditInputError) as caught:
        load_weights(target, _save(mobilenet, tmp_path / "mobilenet.safetensors"))
    message = str(caught.value)
    assert message.startswith(
        "weights in 'mobilenet.safetensors' do not fit torchvision:efficientnet_b0 "
        "(num_classes=10, input 3x32x32): 5 shape mismatches, e.g. features.0.0.weight is "
        "[16, 3, 3, 3] in the file but [32, 3, 3, 3] in the model"
    )
    assert "missing keys (features.1.0.block.0.0.weight," in message
    assert "unexpected keys (classifier.0.bias, classifier.0.weight," in message
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_weights_for_another_class_count_say_which(mobilenet, tmp_path):
    thousand = _build("mobilenet_v3_small", num_classes=1000)
    with pytest.raises(AuditInputError) as caught:
        load_weights(mobilenet, _save(thousand, tmp_path / "imagenet.safetensors"))
    message = str(caught.value)
    assert "classifier.3.weight is [1000, 1024] in the file but [10, 1024] in the model" in message
    assert "saved for 1000 classes" in message and "--num-classes 1000" in message


# --- command line -----------------------------------------------------------------------


def test_the_models_command_lists_builtins_and_torchvision_names(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "lenet:" in out and "--model torchvision:NAME" in out
    assert "mobilenet_v3_small" in out and "vit_b_16*" in out and "vgg11_bn," in out
    assert f"{len(zoo.torchvision_names())} names" in out


def test_the_cli_refuses_an_unknown_model_and_a_grayscale_torchvision_model(tmp_path, capsys):
    base = ["audit", "--samples", "photographs", "--out", str(tmp_path / "out")]
    assert main([*base, "--model", "torchvision:mobilenet"]) == 2
    assert "close matches: torchvision:mobilenet_v2" in capsys.readouterr().err
    assert main([*base, "--model", "torchvision:resnet18", "--channels", "1"]) == 2
    assert "takes colour input (3 channels), got 1" in capsys.readouterr().err


def test_the_cli_refuses_a_batch_training_batchnorm_cannot_take(tmp_path, capsys):
    args = ["audit", "--model", "torchvision:mobilenet_v3_small", "--samples", "photographs"]
    code = main([*args, "--attack", "ig", "--out", str(tmp_path / "out")])
    assert code == 2
    assert "cannot compute a training-mode update on one image of 32x32" in capsys.readouterr().err


def test_a_small_audit_of_mobilenet_v3_runs_from_the_cli_with_weights(mobilenet, tmp_path, capsys):
    model = _build("mobilenet_v3_small", (3, 64, 64), num_classes=10, seed=3)
    weights = _save(model, tmp_path / "mobilenet.safetensors")
    out = tmp_path / "out"
    code = main(
        [
            "audit",
            "--model",
            "torchvision:mobilenet_v3_small",
            "--input-size",
            "64",
            "--weights",
            str(weights),
            "--samples",
            "photographs",
            "--attack",
            "ig",
            "--attack-param",
            "restarts=1",
            "--iterations",
            "1",
            "--lpips-nets",
            "none",
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads((out / "result.json").read_text())
    assert result["stop_reason"] == "completed"
    assert (out / "reconstruction.png").is_file()
