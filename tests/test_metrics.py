"""Specification of auditlib.metrics: every reported number, checked against a hand value.

Images handed to the per-image metrics are H x W x C float arrays in [0, 1]; ``score`` and
``evaluate`` take model-space B x C x H x W tensors plus the batch's normalisation.

Why one file over 400 lines: it is the specification of one package or page set, read
from top to bottom; its tests share fixtures and helpers defined here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from skimage.metrics import structural_similarity

from auditlib.data.normalization import Normalization
from auditlib.metrics import (
    PSNR_CAP_DB,
    evaluate,
    label_accuracy,
    lpips_availability,
    lpips_metric,
    match,
    mse,
    psnr,
    psnr_from_mse,
    score,
    ssim,
    to_unit_range,
)
from auditlib.metrics.matching import pairwise_mse
from auditlib.reconstruction import Candidate, Reconstruction
from auditlib.threat import PrivateBatch

ALEX_FILE = "alexnet-owt-7be5be79.pth"
K1, K2 = 0.01, 0.03
C1, C2 = K1**2, K2**2  # SSIM stabilisers for data range 1


def constant(value: float, height: int = 4, width: int = 4, channels: int = 1) -> np.ndarray:
    return np.full((height, width, channels), value, dtype=np.float64)


def noise(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((height, width, channels))


# --- MSE and PSNR ---------------------------------------------------------------------------


def test_mse_of_images_differing_by_a_tenth_everywhere_is_a_hundredth():
    assert mse(constant(0.4), constant(0.3)) == pytest.approx(0.01, rel=1e-12)


def test_mse_is_mean_over_pixels_and_channels():
    a = np.zeros((2, 2, 3))
    b = np.zeros((2, 2, 3))
    b[0, 0, 0] = 1.0  # one of 12 entries off by 1
    assert mse(a, b) == pytest.approx(1 / 12)


def test_psnr_of_a_tenth_offset_is_20_db():
    assert psnr(constant(0.6), constant(0.5)) == pytest.approx(20.0, abs=1e-9)


def test_psnr_from_mse_is_ten_log10_of_the_inverse():
    assert psnr_from_mse(1e-3) == pytest.approx(30.0, abs=1e-12)
    assert psnr_from_mse(1.0) == 0.0
    assert psnr_from_mse(0.01) == pytest.approx(20.0, abs=1e-12)


def test_identical_images_report_the_psnr_cap():
    image = noise(5, 5, 3, seed=0)
    assert PSNR_CAP_DB == 100.0
    assert psnr(image, image.copy()) == PSNR_CAP_DB
    assert psnr_from_mse(0.0) == PSNR_CAP_DB
    # The cap is where the formula itself reaches 100 dB: no jump at the boundary.
    assert psnr_from_mse(1e-10) == PSNR_CAP_DB
    assert psnr_from_mse(2e-10) == pytest.approx(100 - 10 * math.log10(2))


# --- SSIM -----------------------------------------------------------------------------------


def test_ssim_of_identical_images_is_one():
    image = noise(16, 16, 1, seed=1)
    assert ssim(image, image.copy()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("value", [0.0, 0.37, 1.0])
def test_ssim_of_a_constant_image_with_itself_is_one(value):
    assert ssim(constant(value, 16, 16), constant(value, 16, 16)) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize(("c1", "c2"), [(0.2, 0.8), (0.5, 0.4), (0.0, 1.0), (0.9, 0.1)])
def test_ssim_of_two_constant_images_is_the_luminance_term(c1, c2):
    """Zero variances make the contrast-structure term (0 + C2) / (0 + 0 + C2) = 1, so SSIM is
    the luminance term (2 c1 c2 + C1) / (c1^2 + c2^2 + C1) with K1 = 0.01, data range 1."""
    expected = (2 * c1 * c2 + C1) / (c1**2 + c2**2 + C1)
    assert ssim(constant(c1, 16, 16), constant(c2, 16, 16)) == pytest.approx(expected, abs=1e-9)


def test_ssim_uses_the_documented_gaussian_window_settings():
    y, x = np.mgrid[0:20, 0:24] / 24.0
    a = 0.5 + 0.4 * np.sin(6 * x) * np.cos(4 * y)
    b = 0.5 + 0.4 * np.sin(6 * x + 0.8) * np.cos(4 * y)  # the same pattern, phase-shifted
    settings = {"data_range": 1.0, "gaussian_weights": True, "sigma": 1.5, "K1": K1, "K2": K2}
    reference = structural_similarity(b, a, use_sample_covariance=False, **settings)
    assert ssim(a[..., None], b[..., None]) == pytest.approx(reference, abs=1e-12)
    assert 0.5 < reference < 0.9
    # Each setting matters, so the equality above pins all of them.
    assert abs(structural_similarity(b, a, data_range=1.0) - reference) > 1e-2  # 7x7 uniform
    assert (
        abs(structural_similarity(b, a, use_sample_covariance=True, **settings) - reference) > 1e-4
    )
    assert (
        abs(
            structural_similarity(
                b, a, data_range=2.0, gaussian_weights=True, sigma=1.5, use_sample_covariance=False
            )
            - reference
        )
        > 1e-2
    )


def test_ssim_of_a_colour_image_is_the_mean_of_its_channels():
    a, b = noise(16, 16, 3, seed=4), noise(16, 16, 3, seed=5)
    b = 0.3 * a + 0.7 * b
    per_channel = [ssim(a[..., [c]], b[..., [c]]) for c in range(3)]
    assert ssim(a, b) == pytest.approx(np.mean(per_channel), abs=1e-12)
    assert len({round(v, 6) for v in per_channel}) == 3  # channels really differ


# --- matching and labels --------------------------------------------------------------------


def test_pairwise_mse_is_indexed_original_then_reconstruction():
    originals = np.stack([constant(0.0, 2, 2), constant(1.0, 2, 2)])
    reconstructions = np.stack([constant(0.5, 2, 2), constant(0.9, 2, 2), constant(0.0, 2, 2)])
    cost = pairwise_mse(reconstructions, originals)
    assert cost.shape == (2, 3)
    np.testing.assert_allclose(cost, [[0.25, 0.81, 0.0], [0.25, 0.01, 1.0]])


def test_pairwise_mse_equals_the_mean_of_each_pairs_squared_difference():
    rng = np.random.default_rng(0)
    originals, reconstructions = rng.random((5, 7, 7, 3)), rng.random((4, 7, 7, 3))
    direct = [[np.mean((o - r) ** 2) for r in reconstructions] for o in originals]
    np.testing.assert_allclose(pairwise_mse(reconstructions, originals), direct, rtol=1e-12)
    assert (pairwise_mse(originals, originals).diagonal() >= 0).all()


def test_matching_64_images_of_224x224_stays_within_the_two_batches_memory():
    import tracemalloc

    rng = np.random.default_rng(0)
    originals = rng.random((64, 224, 224, 3), dtype=np.float32)
    reconstructions = originals[::-1].copy()
    tracemalloc.start()
    try:
        order = match(reconstructions, originals)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(order, np.arange(64)[::-1])
    # Two float64 copies of the batches are 2 x 77 MB; every pair's difference would be 4.9 GB.
    assert peak < 200e6, f"{peak / 1e6:.0f} MB"


def test_a_permuted_batch_is_matched_back():
    originals = np.stack([noise(6, 6, 3, seed=s) for s in range(5)])
    permutation = np.array([3, 0, 4, 1, 2])
    reconstructions = originals[permutation]  # reconstruction j shows original permutation[j]
    order = match(reconstructions, originals)
    np.testing.assert_array_equal(order, np.argsort(permutation))
    np.testing.assert_array_equal(reconstructions[order], originals)


def test_matching_minimises_the_total_error_not_each_originals_own():
    # Greedy (original 0 takes its nearest, 0.45) would leave original 1 with cost 1.0:
    # total 1.0025. The optimal assignment swaps: 0.25 + 0.2025 = 0.4525.
    originals = np.stack([constant(0.5, 1, 1), constant(0.0, 1, 1)])
    reconstructions = np.stack([constant(0.45, 1, 1), constant(1.0, 1, 1)])
    np.testing.assert_array_equal(match(reconstructions, originals), [1, 0])


def test_matching_never_trades_an_exact_reconstruction_for_a_smaller_total_error():
    # The exact copy of the 0.3 original and a grey filler (0.5): on total MSE, pairing the
    # copy with the dark original (0.09 + 0.04) beats keeping it (0 + 0.25); the copy keeps
    # its original all the same.
    originals = np.stack([constant(0.0, 2, 2), constant(0.3, 2, 2)])
    reconstructions = np.stack([constant(0.3, 2, 2), constant(0.5, 2, 2)])
    np.testing.assert_array_equal(match(reconstructions, originals), [1, 0])


def test_label_accuracy_is_a_multiset_overlap():
    assert label_accuracy([1, 1, 2], [1, 2, 2]) == pytest.approx(2 / 3)
    assert label_accuracy([2, 1, 1], [2, 2, 1]) == pytest.approx(2 / 3)


def test_label_accuracy_ignores_order():
    assert label_accuracy([3, 0, 7], [7, 3, 0]) == 1.0
    assert label_accuracy(np.array([5, 5]), np.array([5, 5])) == 1.0
    assert label_accuracy([0, 1], [2, 3]) == 0.0
    assert label_accuracy([9], [0]) == 0.0  # predicted class beyond every true one


# --- de-normalisation -----------------------------------------------------------------------


def test_to_unit_range_denormalises_clamps_and_moves_channels_last():
    norm = Normalization(mean=(0.5, 0.25), std=(0.25, 0.5))
    images = torch.zeros(1, 2, 1, 3)
    images[0, 0, 0] = torch.tensor([0.0, 1.0, -4.0])  # -> 0.5, 0.75, -0.5 (clamped to 0)
    images[0, 1, 0] = torch.tensor([1.0, 2.0, -0.5])  # -> 0.75, 1.25 (clamped to 1), 0.0
    out = to_unit_range(images, norm)
    assert out.shape == (1, 1, 3, 2)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out[0, 0, :, 0], [0.5, 0.75, 0.0])
    np.testing.assert_allclose(out[0, 0, :, 1], [0.75, 1.0, 0.0])


def test_to_unit_range_maps_non_finite_pixels_into_range():
    images = torch.tensor([math.nan, math.inf, -math.inf, 0.3]).view(1, 1, 2, 2)
    out = to_unit_range(images, Normalization.identity(1))
    np.testing.assert_allclose(out[0, :, :, 0], [[0.0, 1.0], [0.0, 0.3]])


def test_to_unit_range_does_not_need_grad_free_inputs():
    images = torch.full((1, 1, 2, 2), 0.2, requires_grad=True)
    out = to_unit_range(images * 2, Normalization.identity(1))
    np.testing.assert_allclose(out, 0.4)


# --- score and evaluate ---------------------------------------------------------------------


def batch_of(values: list[float], size: int = 4, labels=None) -> PrivateBatch:
    images = torch.stack([torch.full((1, size, size), v, dtype=torch.float64) for v in values])
    labels = torch.tensor(labels if labels is not None else list(range(len(values))))
    return PrivateBatch(images, labels, tuple(f"img{i}.png" for i in range(len(values))))


def candidate_images(values: list[float], size: int = 4) -> torch.Tensor:
    return batch_of(values, size).images.float()


@pytest.fixture
def no_lpips_weights(monkeypatch, tmp_path):
    """No LPIPS backbone on this machine, whatever the real caches hold."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("AUDIT_LPIPS_WEIGHTS_DIR", str(empty))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    lpips_metric._model.cache_clear()
    yield
    lpips_metric._model.cache_clear()


def test_evaluate_keeps_the_attackers_pick_apart_from_the_oracle_best(no_lpips_weights):
    # Truth: constant images 0.2 and 0.6.
    # Restart 0 (loss 0.1, the attacker's pick): 0.5 and 0.9, matched in order, MSE 0.09 each.
    # Restart 1 (loss 0.5): the truth swapped and offset by 0.1, MSE 0.01 each -> 20 dB.
    truth = batch_of([0.2, 0.6])
    low_loss = Candidate(
        candidate_images([0.5, 0.9]), None, 0.1, restart=0, steps=7, stop_reason="completed"
    )
    high_psnr = Candidate(
        candidate_images([0.7, 0.3]), None, 0.5, restart=1, steps=9, stop_reason="completed"
    )
    reconstruction = Reconstruction((low_loss, high_psnr), "completed", steps=16)

    result = evaluate(reconstruction, truth, Normalization.identity(1), lpips_nets=())

    selected, oracle = result.attacker_selected, result.oracle_best
    assert selected.restart == 0
    assert selected.attack_loss == 0.1
    assert selected.steps == 7
    assert oracle.restart == 1
    assert oracle.attack_loss == 0.5
    assert result.restarts == 2
    assert selected.mse_mean == pytest.approx(0.09, abs=1e-6)
    assert selected.psnr_mean == pytest.approx(10 * math.log10(1 / 0.09), abs=1e-4)
    assert oracle.psnr_mean == pytest.approx(20.0, abs=1e-4)
    assert result.psnr_by_restart == {
        "0": selected.psnr_mean,
        "1": pytest.approx(oracle.psnr_mean),
    }
    assert [p.name for p in selected.per_image] == ["img0.png", "img1.png"]
    assert [p.reconstruction_index for p in selected.per_image] == [0, 1]
    assert [p.reconstruction_index for p in oracle.per_image] == [1, 0]
    assert [p.true_label for p in oracle.per_image] == [0, 1]
    for entry in oracle.per_image:
        assert entry.mse == pytest.approx(0.01, abs=1e-6)
        assert entry.psnr == pytest.approx(20.0, abs=1e-4)


def test_evaluate_when_the_attackers_pick_is_also_the_best():
    truth = batch_of([0.2, 0.6])
    good = Candidate(candidate_images([0.25, 0.65]), None, 0.1, 0, 5, "completed")
    bad = Candidate(candidate_images([0.9, 0.9]), None, 3.0, 1, 5, "completed")
    result = evaluate(
        Reconstruction((bad, good), "completed", 10),
        truth,
        Normalization.identity(1),
        lpips_nets=(),
    )
    assert result.attacker_selected.restart == 0
    assert result.oracle_best.restart == 0
    assert result.oracle_best.psnr_mean == result.attacker_selected.psnr_mean


def test_ranking_psnr_is_the_scores_psnr_and_rdlv_is_computed_from_the_pair():
    from auditlib.metrics.evaluate import matched_psnr_mean
    from auditlib.metrics.risk import rdlv

    generator = torch.Generator().manual_seed(0)
    truth = PrivateBatch(
        torch.rand(3, 3, 16, 16, generator=generator), torch.tensor([0, 1, 2]), ("a", "b", "c")
    )
    noisy = truth.images + 0.1 * torch.randn(3, 3, 16, 16, generator=generator)
    candidate = noisy[[2, 0, 1]]  # permuted: matching finds each image's own
    prior = np.full((16, 16, 3), 0.4) + 0.2 * np.random.default_rng(0).random((16, 16, 3))
    none = Normalization.parse("none", 3)
    scores = score(candidate, None, truth, none, lpips_nets=(), prior=prior)
    originals = to_unit_range(truth.images, none)
    assert matched_psnr_mean(candidate, originals, none) == scores.psnr_mean
    recon = to_unit_range(candidate, none)
    assert [p.reconstruction_index for p in scores.per_image] == [1, 2, 0]
    for i, entry in enumerate(scores.per_image):
        expected = rdlv(recon[entry.reconstruction_index], originals[i], prior)
        assert entry.rdlv == pytest.approx(expected, abs=1e-12)


def test_the_attacker_never_picks_a_diverged_candidate():
    truth = batch_of([0.2, 0.6])
    diverged = Candidate(candidate_images([0.2, 0.6]), None, math.nan, 0, 5, "diverged")
    finite = Candidate(candidate_images([0.9, 0.9]), None, 2.0, 1, 5, "completed")
    result = evaluate(
        Reconstruction((diverged, finite), "diverged", 10),
        truth,
        Normalization.identity(1),
        lpips_nets=(),
    )
    assert result.attacker_selected.restart == 1
    assert result.oracle_best.restart == 0  # the oracle may still see it was exact
    assert result.oracle_best.psnr_mean == PSNR_CAP_DB


def test_score_reports_label_accuracy_unavailable_without_candidate_labels(no_lpips_weights):
    result = score(
        candidate_images([0.2, 0.6]), None, batch_of([0.2, 0.6]), Normalization.identity(1), ()
    )
    assert result.label_accuracy is None
    assert "labels" in result.why_unavailable("label_accuracy")
    assert result.recovered_labels is None


def test_score_reports_recovered_labels_by_matched_reconstruction():
    truth = batch_of([0.2, 0.6], labels=[3, 5])
    # Reconstruction 0 shows image 1 (label 5), reconstruction 1 shows image 0 (label 3).
    result = score(
        candidate_images([0.6, 0.2]),
        torch.tensor([5, 4]),
        truth,
        Normalization.identity(1),
        (),
    )
    assert result.label_accuracy == pytest.approx(0.5)
    assert result.recovered_labels == (5, 4)
    assert [p.recovered_label for p in result.per_image] == [4, 5]
    assert [p.true_label for p in result.per_image] == [3, 5]


def test_score_summaries_are_mean_std_min_max_over_the_batch():
    truth = batch_of([0.2, 0.6])
    result = score(candidate_images([0.3, 0.9]), None, truth, Normalization.identity(1), ())
    # Per-image MSE 0.01 and 0.09.
    assert result.mse_mean == pytest.approx(0.05, abs=1e-6)
    assert result.spreads["mse"].std == pytest.approx(0.04, abs=1e-6)
    assert result.spreads["mse"].min == pytest.approx(0.01, abs=1e-6)
    assert result.spreads["mse"].max == pytest.approx(0.09, abs=1e-6)
    assert result.spreads["psnr"].max == pytest.approx(20.0, abs=1e-4)


def test_score_reports_ssim_unavailable_below_the_window_size():
    result = score(candidate_images([0.3]), None, batch_of([0.2]), Normalization.identity(1), ())
    assert result.ssim_mean is None
    assert "11x11" in result.why_unavailable("ssim")
    assert result.per_image[0].ssim is None


def test_score_reports_ssim_from_eleven_pixels_up():
    truth = batch_of([0.2, 0.8], size=11)
    result = score(
        candidate_images([0.8, 0.2], size=11), None, truth, Normalization.identity(1), ()
    )
    assert result.why_unavailable("ssim") is None
    assert result.ssim_mean == pytest.approx(1.0, abs=1e-6)
    assert [p.ssim for p in result.per_image] == [pytest.approx(1.0, abs=1e-6)] * 2


def test_score_names_lpips_nets_that_were_not_requested():
    result = score(candidate_images([0.3]), None, batch_of([0.2]), Normalization.identity(1), ())
    assert result.lpips_mean is None
    assert result.why_unavailable("lpips") == "LPIPS-alex not requested"
    assert result.mean("lpips_vgg") is None
    assert result.why_unavailable("lpips_vgg") == "LPIPS-vgg not requested"


# --- LPIPS ----------------------------------------------------------------------------------


def test_lpips_is_unavailable_without_backbone_weights(no_lpips_weights):
    state = lpips_availability("alex")
    assert state.available is False
    assert state.path is None
    assert ALEX_FILE in state.reason
    assert "AUDIT_LPIPS_WEIGHTS_DIR" in state.reason
    assert "vgg16-397923af.pth" in lpips_availability("vgg").reason
    # Both missing: one reason for both, so a table that lists both says it once.
    assert lpips_availability("alex").reason == lpips_availability("vgg").reason


def test_score_reports_lpips_unavailable_with_the_reason(no_lpips_weights):
    truth = batch_of([0.2, 0.6], size=32)
    result = score(candidate_images([0.3, 0.5], size=32), None, truth, Normalization.identity(1))
    assert result.lpips_mean is None
    assert ALEX_FILE in result.why_unavailable("lpips")
    assert result.mean("lpips_vgg") is None
    assert "vgg16-397923af.pth" in result.why_unavailable("lpips_vgg")
    assert result.per_image[0].lpips_alex is None


@pytest.fixture(scope="module")
def random_alexnet_dir(tmp_path_factory):
    import torchvision

    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("lpips_weights")
    torch.save(torchvision.models.alexnet().state_dict(), directory / ALEX_FILE)
    return directory


@pytest.fixture
def random_alexnet(monkeypatch, random_alexnet_dir, tmp_path):
    monkeypatch.setenv("AUDIT_LPIPS_WEIGHTS_DIR", str(random_alexnet_dir))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    lpips_metric._model.cache_clear()
    yield random_alexnet_dir
    lpips_metric._model.cache_clear()


def test_lpips_plumbing_with_a_local_backbone_file(random_alexnet):
    """Plumbing only: the backbone is a *random* AlexNet saved under the real file name, so
    these distances mean nothing; what is checked is that a file in AUDIT_LPIPS_WEIGHTS_DIR
    is found and loaded offline, and that the distance behaves like a distance."""
    state = lpips_availability("alex")
    assert state.available is True
    assert state.reason is None
    assert state.path == str(random_alexnet / ALEX_FILE)

    rng = np.random.default_rng(0)
    a = rng.random((2, 32, 32, 3))
    b = rng.random((2, 32, 32, 3))
    same = lpips_metric.lpips_distances("alex", a, a.copy())
    ab = lpips_metric.lpips_distances("alex", a, b)
    ba = lpips_metric.lpips_distances("alex", b, a)
    assert len(same) == len(ab) == 2
    assert all(abs(v) < 1e-6 for v in same)
    assert all(math.isfinite(v) and v > 0 for v in ab)
    np.testing.assert_allclose(ab, ba, rtol=1e-4)

    # score() picks it up: LPIPS-alex is reported, VGG (no file) stays unavailable.
    truth = PrivateBatch(
        torch.from_numpy(a).permute(0, 3, 1, 2).float(), torch.tensor([0, 1]), ("a", "b")
    )
    result = score(
        torch.from_numpy(b).permute(0, 3, 1, 2).float(), None, truth, Normalization.identity(3)
    )
    assert result.why_unavailable("lpips") is None
    assert math.isfinite(result.lpips_mean) and result.lpips_mean > 0
    assert all(p.lpips_alex is not None for p in result.per_image)
    assert result.mean("lpips_vgg") is None
