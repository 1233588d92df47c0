"""Specification of the FedKL key-lock module: where it goes, what it computes, what is private."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model
from auditlib.models.keylock import (
    KeyLockNorm,
    KeyLockSite,
    insert_key_lock,
    private_parameter_names,
    random_key,
)

torch.set_num_threads(1)


def test_the_lock_follows_the_first_convolution_of_lenet():
    model = build_model(ModelSpec("lenet", 10, (3, 32, 32)))
    x = torch.rand(2, 3, 32, 32)
    site = insert_key_lock(model, random_key(1024, 1), (3, 32, 32))
    assert not site.replaced_batchnorm  # DLG's LeNet has no BatchNorm
    assert isinstance(model.get_submodule(site.lock), KeyLockNorm)
    assert model(x).shape == (2, 10)
    assert private_parameter_names(model) == {
        f"{site.lock}.lock_gamma.weight",
        f"{site.lock}.lock_gamma.bias",
        f"{site.lock}.lock_beta.weight",
        f"{site.lock}.lock_beta.bias",
    }


def test_the_lock_replaces_the_first_batchnorm_of_a_resnet():
    model = build_model(ModelSpec("resnet10", 10, (3, 16, 16)))
    batchnorms = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    site = insert_key_lock(model, random_key(1024, 1), (3, 16, 16))
    assert site == KeyLockSite("bn1", "conv1", True)
    assert site.replaced_batchnorm
    lock = model.get_submodule(site.lock)
    assert lock.lock_gamma.out_features == 64
    # One BatchNorm lost its affine and moved inside the lock; the rest are untouched.
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == batchnorms
    assert lock.norm.affine is False
    model.eval()
    assert model(torch.rand(2, 3, 16, 16)).shape == (2, 10)


def test_the_lock_computes_gamma_and_beta_from_the_key():
    torch.manual_seed(0)
    key = random_key(16, 3)
    lock = KeyLockNorm(4, key).train()
    u = torch.randn(5, 4, 3, 3)
    gamma = lock.lock_gamma.weight @ key + lock.lock_gamma.bias
    beta = lock.lock_beta.weight @ key + lock.lock_beta.bias
    mean = u.mean(dim=(0, 2, 3), keepdim=True)
    var = u.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
    expected = gamma.view(1, -1, 1, 1) * (u - mean) / torch.sqrt(var + 1e-5) + beta.view(
        1, -1, 1, 1
    )
    torch.testing.assert_close(lock(u), expected, rtol=1e-4, atol=1e-5)


def test_another_key_gives_another_model():
    model = build_model(ModelSpec("lenet", 10, (3, 32, 32)))
    insert_key_lock(model, random_key(1024, 1), (3, 32, 32))
    other = build_model(ModelSpec("lenet", 10, (3, 32, 32)))
    insert_key_lock(other, random_key(1024, 2), (3, 32, 32))
    x = torch.rand(2, 3, 32, 32)
    assert not torch.allclose(model(x), other(x))
    # The same key and lock seed give the same model: all clients start from one lock.
    same = build_model(ModelSpec("lenet", 10, (3, 32, 32)))
    insert_key_lock(same, random_key(1024, 1), (3, 32, 32))
    torch.testing.assert_close(model(x), same(x))


def test_keys_are_uniform_and_seeded():
    key = random_key(1024, 7)
    assert torch.equal(key, random_key(1024, 7))
    assert float(key.min()) >= 0 and float(key.max()) < 1
    assert float(key.mean()) == pytest.approx(0.5, abs=0.05)


def test_relu_lock_and_gamma_offset():
    torch.manual_seed(0)
    lock = KeyLockNorm(64, random_key(1024, 0), activation="relu")
    gamma, _beta = lock.affine()
    assert float((gamma >= 0).float().mean()) == 1.0
    shifted = KeyLockNorm(64, random_key(1024, 0), gamma_bias=1.0)
    assert float(shifted.affine()[0].detach().mean()) == pytest.approx(1.0, abs=0.3)


def test_a_model_without_convolution_is_refused():
    with pytest.raises(AuditInputError, match=r"no nn\.Conv2d"):
        insert_key_lock(
            build_model(ModelSpec("mlp", 10, (1, 8, 8))), random_key(1024, 0), (1, 8, 8)
        )


def test_insertion_leaves_the_global_random_state_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    insert_key_lock(
        build_model(ModelSpec("lenet", 10, (3, 32, 32))), random_key(1024, 0), (3, 32, 32)
    )
    assert torch.equal(torch.rand(3), expected)
