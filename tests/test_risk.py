"""Specification of the leakage verdict: FedLeak's PSNR bands, success-rate curves, RDLV."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from auditlib.data.normalization import Normalization
from auditlib.metrics import score
from auditlib.metrics.risk import leakage_level, rdlv, risk_summary, success_rate
from auditlib.threat import PrivateBatch


@pytest.mark.parametrize(
    ("psnr", "level"),
    [
        (35.0, "Very High"),
        (20.0, "Very High"),
        (19.99, "High"),
        (15.0, "High"),
        (12.0, "Medium"),
        (10.0, "Medium"),
        (9.99, "Low"),
        (-3.0, "Low"),
    ],
)
def test_fedleak_bands(psnr, level):
    assert leakage_level(psnr) == level


def test_success_rate_over_thresholds():
    assert success_rate([5.0, 12.0, 22.0, 31.0], (10, 20, 30)) == [
        {"threshold": 10.0, "rate": 0.75},
        {"threshold": 20.0, "rate": 0.5},
        {"threshold": 30.0, "rate": 0.25},
    ]
    errors = success_rate([0.01, 0.1], (0.05,), higher_is_better=False)
    assert errors == [{"threshold": 0.05, "rate": 0.5}]


def test_rdlv_is_zero_for_the_template_and_positive_for_a_copy():
    rng = np.random.default_rng(0)
    original = rng.random((16, 16, 1))
    prior = np.clip(original * 0.3 + 0.35 + 0.05 * rng.standard_normal((16, 16, 1)), 0, 1)
    assert rdlv(prior, original, prior) == pytest.approx(0.0)
    assert rdlv(original, original, prior) > 0
    far = 1.0 - original  # the inverted image: less like the original than the template
    assert rdlv(far, original, prior) < 0
    assert rdlv(original, original, 1.0 - original) is None  # the template's SSIM <= 0


def test_the_run_level_comes_from_the_mean_psnr_and_each_image_has_its_own():
    per_image = [{"psnr": 25.0, "ssim": 0.9}, {"psnr": 8.0, "ssim": 0.1}]
    summary = risk_summary(per_image, psnr_mean=16.5)
    assert summary["level"] == "High"
    assert [i["leakage_level"] for i in per_image] == ["Very High", "Low"]
    assert summary["images_per_level"] == {"Very High": 1, "High": 0, "Medium": 0, "Low": 1}
    assert summary["ssim_success_rate"][0] == {"threshold": 0.2, "rate": 0.5}


def test_every_score_carries_the_verdict():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(2, 1, 16, 16, generator=g)
    truth = PrivateBatch(images, torch.tensor([0, 1]), ("a", "b"))
    normalization = Normalization.parse("none", 1)
    exact = score(images.clone(), None, truth, normalization, lpips_nets=())
    assert exact["risk"]["level"] == "Very High"
    assert exact["risk"]["psnr_success_rate"][-1]["rate"] == 1.0
    noise = score(torch.rand(2, 1, 16, 16, generator=g), None, truth, normalization, ())
    assert noise["risk"]["level"] == "Low"
