"""Specification of auditlib.defenses: what each defense does to an update, and what it can
say about privacy. An update is a tuple of tensors, one per trainable parameter.

Why one file over 400 lines: it is the specification of one package or page set, read
from top to bottom; its tests share fixtures and helpers defined here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from auditlib.defenses import DEFENSES, build_defense, clip_update
from auditlib.defenses.dp_noise import DEFAULT_CLIP
from auditlib.errors import AuditInputError

DELTA = 1e-5
# Opacus's default RDP orders; the hand reference below evaluates the same grid.
ALPHAS = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)), dtype=np.float64)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def large_update(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = gen(seed)
    return (
        torch.randn(400, 250, generator=g),  # 100k
        torch.randn(100_000, generator=g),  # 100k
    )


def flat(update: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in update]).double()


def gaussian_rdp_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """Full-participation Gaussian mechanism by hand: RDP(alpha) = rounds * alpha / (2 z^2),
    converted to (epsilon, delta) with Balle et al. 2020, Thm 21 (Opacus's conversion)."""
    rdp = rounds * ALPHAS / (2 * noise_multiplier**2)
    eps = rdp - (np.log(delta) + np.log(ALPHAS)) / (ALPHAS - 1) + np.log((ALPHAS - 1) / ALPHAS)
    return float(eps.min())


def epsilon(name: str, **params) -> float | None:
    defense, _ = build_defense(name, params)
    return defense.privacy_report()["epsilon"]


# --- registry and no defense ----------------------------------------------------------------


def test_registry_holds_every_defense():
    assert set(DEFENSES) == {
        "none",
        "dp-gaussian",
        "dp-laplace",
        "prune",
        "clip",
        "quantize",
        "soteria",
        "outpost",
        "dlm-dp",
        "dlm-sparsify",
        "fedkl",
        "shadow",
        "fedboosting",
        "model-check",
    }


def test_no_defense_returns_equal_copies():
    update = (torch.tensor([1.0, -2.0]), torch.tensor([[3.0]]))
    defense, settings = build_defense("none")
    assert settings == {}
    out = defense.apply(update, gen())
    assert len(out) == 2
    for o, u in zip(out, update, strict=True):
        assert torch.equal(o, u)
        assert o is not u
        assert o.data_ptr() != u.data_ptr()
    out[0].add_(100.0)
    assert torch.equal(update[0], torch.tensor([1.0, -2.0]))
    assert defense.privacy_report() == {}


def test_build_defense_returns_effective_settings_and_parses_strings():
    _, settings = build_defense("dp-gaussian", {"sigma": "0.5", "clip": "none", "rounds": "3"})
    assert settings == {
        "sigma": 0.5,
        "clip": None,
        "delta": 1e-5,
        "rounds": 3,
        "neighbours": "replace-one",
        "sample_rate": 1.0,
        "trusted_sampler": False,
    }


# --- Gaussian noise -------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.01, 0.5, 3.0])
def test_gaussian_noise_has_standard_deviation_sigma(sigma):
    update = large_update()
    defense, _ = build_defense("dp-gaussian", {"sigma": sigma, "clip": "none"})
    noise = flat(defense.apply(update, gen(1))) - flat(update)
    assert noise.numel() == 200_000
    assert float(noise.std()) == pytest.approx(sigma, rel=0.02)
    assert abs(float(noise.mean())) < 5 * sigma / math.sqrt(noise.numel())


def test_gaussian_noise_is_fixed_by_the_generator_seed():
    update = large_update()
    defense, _ = build_defense("dp-gaussian", {"sigma": 0.1})
    first = defense.apply(update, gen(7))
    again = defense.apply(update, gen(7))
    other = defense.apply(update, gen(8))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])
    # Each tensor gets its own noise, not a repeated draw.
    assert not torch.equal(first[0].reshape(-1) - update[0].reshape(-1), first[1] - update[1])


def test_gaussian_noise_keeps_dtype_and_leaves_the_input_alone():
    update = (torch.zeros(3, dtype=torch.float32), torch.zeros(2, 2, dtype=torch.float64))
    defense, _ = build_defense("dp-gaussian", {"sigma": 1.0})
    out = defense.apply(update, gen())
    assert [t.dtype for t in out] == [torch.float32, torch.float64]
    assert [t.shape for t in out] == [t.shape for t in update]
    assert all(torch.count_nonzero(t) == 0 for t in update)


def test_gaussian_clip_scales_a_large_update_to_the_bound():
    update = (torch.tensor([3.0, 0.0]), torch.tensor([[4.0]]))  # L2 norm 5
    defense, _ = build_defense("dp-gaussian", {"sigma": 0.0, "clip": 1.0})
    out = defense.apply(update, gen())
    torch.testing.assert_close(out[0], torch.tensor([0.6, 0.0]))
    torch.testing.assert_close(out[1], torch.tensor([[0.8]]))
    assert float(torch.linalg.vector_norm(flat(out))) == pytest.approx(1.0, abs=1e-6)


def test_gaussian_clip_leaves_a_small_update_unchanged():
    update = (torch.tensor([0.3, 0.0]), torch.tensor([[0.4]]))  # L2 norm 0.5
    defense, _ = build_defense("dp-gaussian", {"sigma": 0.0, "clip": 1.0})
    out = defense.apply(update, gen())
    for o, u in zip(out, update, strict=True):
        torch.testing.assert_close(o, u)


def test_gaussian_clips_before_adding_noise():
    update = tuple(100.0 * t for t in large_update())
    defense, _ = build_defense("dp-gaussian", {"sigma": 0.5, "clip": 1.0})
    unit = clip_update(update, 1.0)
    noise = flat(defense.apply(update, gen(3))) - flat(unit)
    assert float(noise.std()) == pytest.approx(0.5, rel=0.02)


def test_gaussian_epsilon_needs_a_clip_bound():
    for off in ("none", None):  # a form's or the CLI's text, or Python's None
        defense, settings = build_defense("dp-gaussian", {"sigma": 1.0, "clip": off})
        assert settings["clip"] is None
        report = defense.privacy_report()
        assert report["epsilon"] is None
        assert "clip" in report["epsilon_unavailable_reason"]


def test_default_gaussian_clips_and_reports_a_finite_epsilon():
    defense, settings = build_defense("dp-gaussian")
    assert settings["clip"] == DEFAULT_CLIP == 30.0 and settings["sigma"] == 0.1
    report = defense.privacy_report()
    assert report["epsilon"] is not None and math.isfinite(report["epsilon"])
    # Replace-one neighbours: two clipped updates are up to 2 x clip apart.
    assert report["epsilon"] > 0 and report["noise_multiplier"] == pytest.approx(0.1 / 60)
    assert "one example replaced" in report["neighbours"]
    assert "no amplification" in report["sampling"]
    # The same mechanism as sigma 1 at clip 300 (noise multiplier 1 / 300 either way).
    assert report["epsilon"] == pytest.approx(epsilon("dp-gaussian", sigma=1.0, clip=300.0))
    # An update below the bound is left as it is; only the noise is added.
    small = (torch.full((4,), 1.0), torch.full((2, 2), -2.0))  # L2 norm 4.5 < 30
    out = defense.apply(small, gen(5))
    again = build_defense("dp-gaussian", {"clip": "none"})[0].apply(small, gen(5))
    assert all(torch.equal(a, b) for a, b in zip(out, again, strict=True))
    # A larger one is scaled down to the bound before the noise.
    big = tuple(100.0 * t for t in large_update())
    noise = flat(defense.apply(big, gen(3))) - flat(clip_update(big, DEFAULT_CLIP))
    assert float(noise.std()) == pytest.approx(0.1, rel=0.02)


def test_gaussian_epsilon_is_infinite_without_noise():
    report = build_defense("dp-gaussian", {"sigma": 0.0, "clip": 1.0})[0].privacy_report()
    assert report["epsilon"] is None
    assert "infinite" in report["epsilon_unavailable_reason"]


def test_gaussian_epsilon_for_one_release_at_noise_multiplier_one():
    """sigma 2 at clip 1: replacing one example moves the clipped update by up to 2, so the
    noise multiplier is 2 / 2 = 1 (4.73 at delta 1e-5); counting only the client's update
    present or absent (sensitivity 1), sigma 1 gives the same number, and sigma 2 a smaller
    one that promises less than it seems (docs/ALGORITHMS.md, "Epsilon")."""
    from opacus.accountants import RDPAccountant

    report = build_defense("dp-gaussian", {"sigma": 2.0, "clip": 1.0, "delta": DELTA})[
        0
    ].privacy_report()
    accountant = RDPAccountant()
    accountant.step(noise_multiplier=1.0, sample_rate=1.0)
    assert report["epsilon"] == pytest.approx(accountant.get_epsilon(delta=DELTA), rel=1e-9)
    assert report["epsilon"] == pytest.approx(gaussian_rdp_epsilon(1.0, 1, DELTA), rel=1e-9)
    assert report["epsilon"] == pytest.approx(4.7285, abs=1e-3)
    assert report["delta"] == DELTA
    assert report["noise_multiplier"] == 1.0
    present = {"clip": 1.0, "delta": DELTA, "neighbours": "client-present"}
    assert epsilon("dp-gaussian", sigma=1.0, **present) == pytest.approx(report["epsilon"])
    assert epsilon("dp-gaussian", sigma=2.0, **present) < report["epsilon"] / 2


def test_gaussian_epsilon_depends_on_sigma_over_clip():
    # Noise multiplier 1: sigma 2 at clip 1 and sigma 4 at clip 2 are the same mechanism.
    eps = epsilon("dp-gaussian", sigma=2.0, clip=1.0)
    assert eps == pytest.approx(gaussian_rdp_epsilon(1.0, 1, DELTA), rel=1e-9)
    assert epsilon("dp-gaussian", sigma=4.0, clip=2.0) == pytest.approx(eps, rel=1e-12)


def test_gaussian_epsilon_composes_over_rounds():
    eps = [epsilon("dp-gaussian", sigma=1.0, clip=1.0, rounds=r) for r in (1, 10, 100)]
    assert eps[0] < eps[1] < eps[2]
    assert eps[1] == pytest.approx(gaussian_rdp_epsilon(0.5, 10, DELTA), rel=1e-9)


def test_more_noise_gives_smaller_epsilon():
    eps = [epsilon("dp-gaussian", sigma=s, clip=1.0) for s in (0.8, 1.0, 2.0, 5.0)]
    assert eps == sorted(eps, reverse=True)
    assert len(set(eps)) == 4


def test_client_subsampling_lowers_epsilon_only_with_a_trusted_sampler():
    from opacus.accountants import RDPAccountant

    # The server picks the clients and is the adversary: no amplification unless a trusted
    # party draws the sample and keeps it from the server.
    with pytest.raises(AuditInputError, match="trusted party"):
        build_defense("dp-gaussian", {"sigma": 2.0, "clip": 1.0, "sample_rate": 0.01})
    trusted = {"sample_rate": 0.01, "trusted_sampler": True}
    eps = epsilon("dp-gaussian", sigma=2.0, clip=1.0, rounds=100, **trusted)
    accountant = RDPAccountant()
    for _ in range(100):
        accountant.step(noise_multiplier=1.0, sample_rate=0.01)
    assert eps == pytest.approx(accountant.get_epsilon(delta=DELTA), rel=1e-9)
    assert eps < epsilon("dp-gaussian", sigma=2.0, clip=1.0, rounds=100)
    report = build_defense("dp-gaussian", {"sigma": 2.0, "clip": 1.0, **trusted})[0]
    assert "trusted sampler at rate 0.01" in report.privacy_report()["sampling"]


def test_larger_delta_gives_smaller_epsilon():
    assert epsilon("dp-gaussian", sigma=1.0, clip=1.0, delta=1e-3) < epsilon(
        "dp-gaussian", sigma=1.0, clip=1.0, delta=1e-7
    )


# --- Laplace noise --------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.05, 1.0])
def test_laplace_noise_has_variance_two_b_squared(scale):
    update = large_update()
    defense, _ = build_defense("dp-laplace", {"scale": scale})
    noise = flat(defense.apply(update, gen(2))) - flat(update)
    assert float(noise.var()) == pytest.approx(2 * scale**2, rel=0.03)
    assert float(noise.abs().mean()) == pytest.approx(scale, rel=0.02)  # E|X| = b
    assert abs(float(noise.median())) < 0.02 * scale
    assert bool(torch.isfinite(noise).all())


def test_laplace_noise_is_fixed_by_the_generator_seed():
    update = large_update()
    defense, _ = build_defense("dp-laplace", {"scale": 0.1})
    a, b = defense.apply(update, gen(4)), defense.apply(update, gen(4))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_laplace_clip_bounds_the_l1_norm():
    update = (torch.tensor([3.0, -1.0]), torch.tensor([[-6.0]]))  # L1 norm 10 (L2 norm ~6.8)
    defense, _ = build_defense("dp-laplace", {"scale": 0.0, "clip": 2.0})
    out = defense.apply(update, gen())
    torch.testing.assert_close(out[0], torch.tensor([0.6, -0.2]))
    torch.testing.assert_close(out[1], torch.tensor([[-1.2]]))
    assert float(flat(out).abs().sum()) == pytest.approx(2.0, abs=1e-6)


def test_laplace_epsilon_is_rounds_times_sensitivity_over_scale():
    # Replace-one: L1 sensitivity 2 x clip.
    assert epsilon("dp-laplace", scale=0.5, clip=1.0) == pytest.approx(4.0)
    assert epsilon("dp-laplace", scale=0.5, clip=1.0, rounds=3) == pytest.approx(12.0)
    assert epsilon("dp-laplace", scale=2.0, clip=0.1, rounds=10) == pytest.approx(1.0)
    present = epsilon("dp-laplace", scale=0.5, clip=1.0, neighbours="client-present")
    assert present == pytest.approx(2.0)
    report = build_defense("dp-laplace", {"scale": 0.5, "clip": 1.0})[0].privacy_report()
    assert report["delta"] == 0.0


def test_laplace_epsilon_needs_a_clip_bound_and_noise():
    no_clip = build_defense("dp-laplace", {"scale": 1.0})[0].privacy_report()
    assert no_clip["epsilon"] is None
    assert "clip" in no_clip["epsilon_unavailable_reason"]
    no_noise = build_defense("dp-laplace", {"scale": 0.0, "clip": 1.0})[0].privacy_report()
    assert no_noise["epsilon"] is None
    assert "infinite" in no_noise["epsilon_unavailable_reason"]


# --- pruning --------------------------------------------------------------------------------


def prune(update, **params):
    defense, _ = build_defense("prune", params)
    return defense.apply(update, gen())


def test_prune_half_per_layer_keeps_the_largest_magnitudes():
    update = (
        torch.tensor([0.1, -4.0, 0.3, 2.0, -0.2, 5.0]),
        torch.tensor([[-7.0, 0.01], [0.02, 9.0]]),
    )
    out = prune(update, ratio=0.5)
    torch.testing.assert_close(out[0], torch.tensor([0.0, -4.0, 0.0, 2.0, 0.0, 5.0]))
    torch.testing.assert_close(out[1], torch.tensor([[-7.0, 0.0], [0.0, 9.0]]))


def test_prune_zeroes_exactly_the_ratio_in_every_layer():
    update = (torch.randn(40, 25, generator=gen(5)), torch.randn(30, generator=gen(6)))
    out = prune(update, ratio=0.5)
    for o, u in zip(out, update, strict=True):
        assert int((o == 0).sum()) == u.numel() // 2
        kept = o[o != 0].abs()
        dropped = u[o == 0].abs()
        assert float(kept.min()) >= float(dropped.max())
        assert torch.equal(o[o != 0], u[o != 0])  # survivors are untouched


def test_global_scope_uses_one_threshold_across_layers():
    small = torch.tensor([0.01, 0.02, 0.03, 0.04])
    large = torch.tensor([10.0, 20.0, 30.0, 40.0])
    per_layer = prune((small, large), ratio=0.5)
    torch.testing.assert_close(per_layer[0], torch.tensor([0.0, 0.0, 0.03, 0.04]))
    torch.testing.assert_close(per_layer[1], torch.tensor([0.0, 0.0, 30.0, 40.0]))
    global_ = prune((small, large), ratio=0.5, scope="global")
    torch.testing.assert_close(global_[0], torch.zeros(4))
    torch.testing.assert_close(global_[1], large)


def test_global_scope_keeps_shapes():
    update = (torch.randn(3, 4, generator=gen(1)), torch.randn(5, generator=gen(2)))
    out = prune(update, ratio=0.25, scope="global")
    assert [o.shape for o in out] == [u.shape for u in update]
    assert int(sum((o == 0).sum() for o in out)) == round(0.25 * 17)


def test_prune_ratio_zero_is_the_identity():
    update = (torch.randn(3, 4, generator=gen(1)), torch.randn(5, generator=gen(2)))
    for scope in ("layer", "global"):
        out = prune(update, ratio=0.0, scope=scope)
        for o, u in zip(out, update, strict=True):
            assert torch.equal(o, u)
            assert o.data_ptr() != u.data_ptr()


def test_prune_ratio_one_is_refused():
    with pytest.raises(AuditInputError, match="ratio"):
        build_defense("prune", {"ratio": 1.0})


def test_prune_zeroes_an_exact_count_when_magnitudes_tie():
    update = (torch.full((10,), 0.5), -torch.ones(2, 5))
    out = prune(update, ratio=0.3)
    assert int((out[0] == 0).sum()) == 3
    assert int((out[1] == 0).sum()) == 3
    assert set(out[1][out[1] != 0].tolist()) == {-1.0}


def test_prune_does_not_modify_its_input():
    update = (torch.tensor([1.0, 2.0, 3.0, 4.0]),)
    prune(update, ratio=0.5)
    assert torch.equal(update[0], torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_prune_gives_no_epsilon():
    report = build_defense("prune", {"ratio": 0.5})[0].privacy_report()
    assert report["epsilon"] is None
    assert "no formal DP" in report["epsilon_unavailable_reason"]


# --- bad parameters -------------------------------------------------------------------------


def test_unknown_parameter_lists_the_valid_ones():
    with pytest.raises(
        AuditInputError,
        match="no parameter sigmaa; valid: clip, delta, neighbours, rounds, sample_rate, sigma, "
        "trusted_sampler",
    ):
        build_defense("dp-gaussian", {"sigmaa": 1.0})


def test_non_numeric_sigma_is_refused():
    with pytest.raises(AuditInputError, match="sigma='abc' must be a number"):
        build_defense("dp-gaussian", {"sigma": "abc"})
    with pytest.raises(AuditInputError, match="finite"):
        build_defense("dp-gaussian", {"sigma": "nan"})


def test_out_of_range_parameters_are_refused():
    cases = [
        ("dp-gaussian", {"sigma": -0.1}, "sigma must be in"),
        ("dp-gaussian", {"clip": 0}, "clip must be > 0"),
        ("dp-gaussian", {"delta": 1.0}, "delta must be in"),
        ("dp-gaussian", {"rounds": 0}, "rounds must be in"),
        ("dp-gaussian", {"rounds": 1.5}, "whole number"),
        ("dp-gaussian", {"sample_rate": 0}, "sample_rate must be in"),
        ("dp-laplace", {"scale": -1}, "scale must be in"),
        ("dp-laplace", {"clip": -1}, "clip must be > 0"),
        ("prune", {"ratio": -0.1}, "ratio"),
        ("prune", {"scope": "model"}, "not one of layer, global"),
    ]
    for name, params, message in cases:
        with pytest.raises(AuditInputError, match=message):
            build_defense(name, params)


def test_unknown_defense_lists_the_available_ones():
    with pytest.raises(
        AuditInputError,
        match="unknown defense 'dp'; available: clip, dlm-dp, dlm-sparsify, dp-gaussian",
    ):
        build_defense("dp")


def test_no_defense_takes_no_parameters():
    with pytest.raises(AuditInputError, match="valid: none"):
        build_defense("none", {"sigma": 1})
