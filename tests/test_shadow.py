"""Specification of the Shadow defense (Jiang, Ma, Yang 2025): where its noise goes, how
strong it is, and that the server receives the update taken on the noised images."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import named_tensors, trainable_parameters
from auditlib.defenses import ClientContext, build_defense
from auditlib.defenses.shadow_noise import (
    amplitude,
    cam_influence,
    momentum_map,
    noise_map,
    perturbation,
    spare_foreground,
)
from auditlib.errors import AuditInputError
from auditlib.fl.scenario import defended_update
from auditlib.models.saliency import grad_cam_plus_plus, last_convolution

torch.set_num_threads(1)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def left_half_low_error(batch: int = 2, side: int = 16) -> torch.Tensor:
    """Squared errors: small on the left half (well reconstructed), large on the right."""
    g = gen(1)
    error = 1.0 + torch.rand(batch, 1, side, side, generator=g)
    error[..., : side // 2] = 0.1 * torch.rand(batch, 1, side, side // 2, generator=g)
    return error


# --- the noise map ---------------------------------------------------------------------------


def test_noise_map_is_a_distribution_per_image():
    noise = noise_map(left_half_low_error())
    assert (noise > 0).all()
    assert torch.allclose(noise.flatten(1).sum(1), torch.ones(2), atol=1e-5)


def test_noise_concentrates_where_the_shadow_reconstructs_well():
    error = left_half_low_error()
    noise = noise_map(error)
    left = noise[..., :8].flatten(1).sum(1)
    assert (left > 0.99).all()  # the well-reconstructed half carries the noise
    # Equalised ranks: the best-reconstructed 20 % of pixels carry about 90 % of the mass.
    flat_error, flat_noise = error.flatten(1), noise.flatten(1)
    best = flat_error.argsort(dim=1)[:, : flat_error.shape[1] // 5]
    share = flat_noise.gather(1, best).sum(1)
    assert (share > 0.85).all() and (share < 0.97).all()
    # Within the left half the order holds too: lower error, more noise (rank correlation).
    e, n = flat_error[0], flat_noise[0]
    ranks_e, ranks_n = e.argsort().argsort().double(), n.argsort().argsort().double()
    assert torch.corrcoef(torch.stack([ranks_e, ranks_n]))[0, 1] < -0.9


def test_equalised_noise_depends_on_the_error_ranks_only():
    error = left_half_low_error()

    # Equalisation maps each level to its cumulative frequency (256 bins), so a monotone change
    # of the error (its square root) barely moves the map; the raw map is reshaped by it.
    def moved(equalized: bool) -> float:
        a, b = noise_map(error, equalized=equalized), noise_map(error.sqrt(), equalized=equalized)
        return float((a - b).abs().flatten(1).sum(1).max()) / 2  # total variation distance

    assert moved(True) < 0.05
    assert moved(False) > 4 * moved(True)
    # Here the raw map is the flatter one: min-max of 1 / softmax(E / 20) is nearly linear in
    # E, so the well-reconstructed half shares the noise almost evenly (docs/ALGORITHMS.md).
    peak = noise_map(error).flatten(1).max(1).values
    assert (noise_map(error, equalized=False).flatten(1).max(1).values < peak / 2).all()


def test_colour_maps_share_one_grey_equalisation_across_channels():
    error = torch.rand(1, 3, 8, 8, generator=gen(2))
    noise = noise_map(error)
    assert torch.allclose(noise[:, 0], noise[:, 1]) and torch.allclose(noise[:, 1], noise[:, 2])


def test_the_foreground_is_spared():
    noise = noise_map(left_half_low_error())
    cam = torch.zeros(2, 16, 16)
    cam[:, :8, :8] = 1.0  # the top-left quadrant (low error) is the task's foreground
    cam[:, :8, 8:] = 0.5
    spared = spare_foreground(noise, cam, alpha=0.5, top=0.3, mode="paper")
    ratio = spared / (noise / noise.flatten(1).max(1).values.view(-1, 1, 1, 1))
    assert torch.allclose(ratio[..., :8, :8], torch.tensor(0.5))  # 1 - alpha * 1
    assert torch.allclose(ratio[..., 8:, :8], torch.tensor(1.0))  # same error, background

    # The foreground's share of the noise falls, the background's rises.
    def share(m, rows):
        return float(m[..., rows, :].sum() / m.sum())

    assert share(spared, slice(0, 8)) < 0.8 * share(noise, slice(0, 8))
    assert share(spared, slice(8, 16)) > share(noise, slice(8, 16))
    assert torch.equal(spare_foreground(noise, cam, 0.5, mode="off"), noise)
    # The authors' code form subtracts a near-uniform softmax: the map's shape barely changes.
    code = spare_foreground(noise, cam, 0.5, mode="code")
    assert code.shape == noise.shape and (code < noise).all()


def test_schedule_and_amplitude():
    assert amplitude(0.19, 0, 100, "increasing") == pytest.approx(0.19)
    assert amplitude(0.19, 100, 100, "increasing") == pytest.approx(0.19 * math.e)
    assert amplitude(0.19, 50, 100, "constant") == pytest.approx(0.19)
    assert amplitude(0.19, 100, 100, "decreasing") == pytest.approx(0.19 / math.e)
    assert cam_influence(0, 100) == 0.1 and cam_influence(30, 100) == 0.3
    assert cam_influence(90, 100) == 0.5
    images = torch.randn(3, 1, 8, 8, generator=gen(3))
    noise = noise_map(torch.rand(3, 1, 8, 8, generator=gen(4)))
    delta = perturbation(images, noise, 0.2)
    peaks = images.flatten(1).max(1).values.abs()
    assert torch.allclose(delta.flatten(1).max(1).values, 0.2 * peaks)


def test_momentum_weights_the_new_map():
    old, new = torch.zeros(1, 1, 2, 2), torch.ones(1, 1, 2, 2)
    assert torch.equal(momentum_map(new, None, 0.9), new)
    assert torch.allclose(momentum_map(new, old, 0.9), torch.full((1, 1, 2, 2), 0.9))


# --- Grad-CAM++ -------------------------------------------------------------------------------


def cam_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 2),
    )


def test_grad_cam_finds_the_region_the_class_score_reads():
    model = cam_model()
    with torch.no_grad():
        model[0].weight.fill_(0.1)
        model[0].bias.zero_()
        model[4].weight.fill_(1.0)
    images = torch.zeros(2, 1, 12, 12)
    images[:, :, 2:5, 7:10] = 1.0  # the only thing that moves the score
    before = {n: t.clone() for n, t in named_tensors(model).items()}
    cam = grad_cam_plus_plus(model, images, torch.tensor([0, 1]), last_convolution(model))
    assert cam.shape == (2, 12, 12) and cam.min() >= 0 and cam.max() <= 1
    assert cam[:, 2:5, 7:10].mean() > 5 * cam[:, 8:, :4].mean()
    assert all(torch.equal(before[n], t) for n, t in named_tensors(model).items())
    with pytest.raises(AuditInputError, match="not a module"):
        grad_cam_plus_plus(model, images, torch.tensor([0, 1]), "nope")


# --- the defense on a client -------------------------------------------------------------------


def lenet_like() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, 3),
    )


FAST = {
    "pretrain_steps": 20,
    "latent_steps": 20,
    "finetune_steps": 2,
    "rounds": 10,
    "shadow_rounds": 2,
}


FEDSGD = ClientProtocol()


def defend(defense, images, labels, round=0, protocol=FEDSGD):
    model = lenet_like()
    parameters = trainable_parameters(model)
    return defended_update(
        model, parameters, images, labels, protocol, defense, gen(), round=round
    ), model


@pytest.mark.parametrize("shadow", ["generator", "prior"])
def test_the_server_receives_the_update_of_the_noised_images(shadow):
    g = gen(5)
    images, labels = torch.randn(4, 1, 8, 8, generator=g), torch.tensor([0, 1, 2, 0])
    defense, _ = build_defense("shadow", FAST | {"shadow": shadow})
    (clean, released), _ = defend(defense, images, labels)
    delta = defense.last["delta"]
    assert not torch.allclose(
        torch.cat([t.flatten() for t in clean]), torch.cat([t.flatten() for t in released])
    )
    # The released update is exactly the client's update on images + delta.
    none, _ = build_defense("none")
    (expected, _), _ = defend(none, images + delta, labels)
    for r, e in zip(released, expected, strict=True):
        assert torch.allclose(r, e, atol=1e-6)
    peaks = images.flatten(1).max(1).values.abs()
    assert torch.allclose(delta.flatten(1).max(1).values, 0.19 * peaks, rtol=1e-4)


def test_same_batch_same_noise_and_the_state_carries_over_rounds():
    g = gen(6)
    images, labels = torch.randn(3, 1, 8, 8, generator=g), torch.tensor([0, 1, 2])
    first, _ = build_defense("shadow", FAST)
    second, _ = build_defense("shadow", FAST)
    (_, a), _ = defend(first, images, labels)
    (_, b), _ = defend(second, images, labels)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))  # no randomness: no DP
    assert first.privacy_report()["epsilon"] is None
    defend(first, images, labels, round=1)
    stored = first.states[next(iter(first.states))].momentum.clone()
    defend(first, images, labels, round=5)  # after T_s = 2 the stored map is reused
    assert torch.equal(first.last["noise"], stored) and "error" not in first.last
    grown = first.last["delta"].flatten(1).max(1).values
    peaks = images.flatten(1).max(1).values.abs()
    assert torch.allclose(grown, 0.19 * math.exp(0.5) * peaks, rtol=1e-4)


def test_fedavg_clients_are_defended_too():
    g = gen(7)
    images, labels = torch.randn(4, 1, 8, 8, generator=g), torch.tensor([0, 1, 2, 0])
    defense, _ = build_defense("shadow", FAST | {"shadow": "prior"})
    protocol = ClientProtocol("fedavg", local_steps=2, local_lr=0.1)
    (clean, released), _ = defend(defense, images, labels, protocol=protocol)
    assert all(c.shape == r.shape for c, r in zip(clean, released, strict=True))
    assert not all(torch.allclose(c, r) for c, r in zip(clean, released, strict=True))


def test_shadow_needs_the_client_and_checks_its_settings():
    defense, _ = build_defense("shadow", FAST)
    with pytest.raises(AuditInputError, match="ClientContext"):
        defense.perturb_images(None, gen())
    with pytest.raises(AuditInputError, match="cam_min <= cam_max"):
        build_defense("shadow", {"cam_min": 0.6, "cam_max": 0.5})
    with pytest.raises(AuditInputError, match="sigma0"):
        build_defense("shadow", {"sigma0": -1})
    context = ClientContext(
        nn.Sequential(nn.Flatten(), nn.Linear(64, 3)),
        {},
        torch.randn(2, 1, 8, 8),
        torch.tensor([0, 1]),
        ClientProtocol(),
    )
    with pytest.raises(AuditInputError, match=r"nn\.Conv2d"):
        build_defense("shadow", FAST | {"shadow": "prior"})[0].perturb_images(context, gen())
