"""Specification of BatchNorm by composite operations under torch.func (client.exact_batchnorm):
the values of torch's fused batch_norm, and the pixel gradient of an update distance that
autograd and finite differences give, where torch.func's own departs from them."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from test_attacks import release_for, resnet20_spec
from torch import nn

from auditlib.attacks.objectives import UpdateMatcher, why_not_together
from auditlib.client.exact_batchnorm import batch_norm_composite, exact_batchnorm
from auditlib.client.protocol import ClientProtocol


@pytest.mark.parametrize("training", [True, False])
def test_composite_batch_norm_has_the_fused_kernels_values_and_running_statistics(training):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 5, 5, generator=generator, dtype=torch.float64)
    weight, bias = torch.rand(3, dtype=torch.float64) + 0.5, torch.randn(3, dtype=torch.float64)
    stats = [(torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5)]
    fused, composite = [tuple(t.clone() for t in stats[0]) for _ in range(2)]
    expected = F.batch_norm(x, *fused, weight, bias, training, 0.1, 1e-5)
    got = batch_norm_composite(x, *composite, weight, bias, training, 0.1, 1e-5)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    for a, b in zip(composite, fused, strict=True):  # the running statistics moved alike
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_modules_inside_normalise_by_composite_operations_and_are_restored():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    seen = []
    model[1].register_forward_hook(lambda m, args, out: seen.append(out.shape))
    x = torch.randn(2, 3, 6, 6)
    plain = model(x)
    with exact_batchnorm(model):
        assert "forward" in model[1].__dict__
        with exact_batchnorm(model):  # nested: the outer one keeps its patch
            inside = model(x)
        assert "forward" in model[1].__dict__
    assert "forward" not in model[1].__dict__
    torch.testing.assert_close(inside, plain, rtol=1e-5, atol=1e-5)
    assert len(seen) == 2  # the module's hooks run inside too
    assert int(model[1].num_batches_tracked) == 2


def _resnet_release(protocol, device="cpu"):
    spec = resnet20_spec("ig", device=device)
    _, _, release = release_for(spec, protocol=protocol)
    release.knowledge.model.double()
    observation = dataclasses.replace(
        release.observation, tensors=tuple(t.double() for t in release.observation.tensors)
    )
    return observation, release.knowledge


def _alone_and_stacked(protocol, distance, device="cpu"):
    """float64, ResNet-20 on batch statistics: one candidate batch's value and pixel gradient
    by plain autograd, and the same batch as the first of two restarts stacked through
    torch.func (the second its images reordered)."""
    observation, knowledge = _resnet_release(protocol, device)
    assert why_not_together(knowledge) is None
    matcher = UpdateMatcher(observation, knowledge, distance)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 16, 16, generator=generator, dtype=torch.float64).to(device)
    labels = torch.tensor([1, 2], device=device)
    alone = x.clone().requires_grad_()
    value = matcher(alone, labels)
    (gradient,) = torch.autograd.grad(value, alone)
    rows = torch.stack([x, x.flip(0)]).requires_grad_()
    values = matcher.together(rows, labels)
    (stacked,) = torch.autograd.grad(values[0], rows)
    torch.testing.assert_close(values[0], value, rtol=1e-12, atol=0)
    torch.testing.assert_close(stacked[0], gradient, rtol=1e-9, atol=1e-12 * gradient.abs().max())
    assert float(stacked[1].abs().max()) == 0  # each restart's value is its own rows'
    return matcher, x, labels, stacked[0]


PROTOCOLS = [
    ClientProtocol(),  # FedSGD: the classifier's gradient factored (low_rank)
    ClientProtocol(algorithm="fedavg", local_steps=2, local_lr=0.1),  # client_update
]


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=["fedsgd", "fedavg"])
@pytest.mark.parametrize("distance", ["cosine", "l2", "layer-l2"])
def test_the_batched_pixel_gradient_through_train_mode_batchnorm_is_autograds(protocol, distance):
    """float64, ResNet-20 on batch statistics: restarts stacked through torch.func get
    autograd's value and pixel gradient (before, 3e-4 apart), and finite differences agree."""
    matcher, x, labels, stacked = _alone_and_stacked(protocol, distance)
    direction = torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=x.dtype)
    h = 1e-6
    with torch.enable_grad():
        ahead = matcher((x + h * direction).requires_grad_(), labels).detach()
        behind = matcher((x - h * direction).requires_grad_(), labels).detach()
    finite = float((ahead - behind) / (2 * h))
    assert float((stacked * direction).sum()) == pytest.approx(finite, rel=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
@pytest.mark.parametrize("protocol", PROTOCOLS, ids=["fedsgd", "fedavg"])
def test_the_batched_pixel_gradient_through_train_mode_batchnorm_on_cuda_is_autograds(protocol):
    """The same in float64 on CUDA, where torch's fused batch_norm is cuDNN's or its own
    kernel: the composite forward serves the stacked path there too."""
    _alone_and_stacked(protocol, "l2", "cuda")


@pytest.mark.parametrize("training", [True, False])
def test_an_exported_program_on_batch_statistics_keeps_its_restarts_apart(training):
    """An exported program's BatchNorm is a call in its graph, which exact_batchnorm cannot
    replace: on batch statistics its restarts run one after another; in eval mode, batched."""
    _, knowledge = _resnet_release(ClientProtocol())
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train(training)
    exported = torch.export.export(model, (torch.randn(2, 3, 8, 8),)).module()
    reason = why_not_together(dataclasses.replace(knowledge, model=exported))
    if training:
        assert "exported program normalises by batch statistics" in reason
    else:
        assert reason is None
