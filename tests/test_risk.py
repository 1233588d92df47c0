"""Specification of the leakage verdict: FedLeak's PSNR bands, success-rate curves, RDLV, and
the labels' test against the attacker's best guess without the update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from auditlib.data.labels import assign_labels
from auditlib.data.normalization import Normalization
from auditlib.metrics import score
from auditlib.metrics.risk import (
    LABEL_RELABELLINGS,
    label_matches,
    label_test,
    leakage_level,
    rdlv,
    risk_summary,
    success_rate,
)
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


def _guess(psnr, ssim=0.1):
    return {"guess": "grey", "psnr": psnr, "ssim": ssim}


def test_an_image_counts_only_beyond_the_best_guess():
    per_image = [
        {"psnr": 25.0, "ssim": 0.9},  # far beyond the guess
        {"psnr": 15.5, "ssim": 0.15},  # above 15 dB, but the grey guess gets 15 dB: not 1 dB more
        {"psnr": 8.0, "ssim": 0.05},  # nothing
    ]
    summary = risk_summary(per_image, [_guess(12.0), _guess(15.0), _guess(11.0)])
    assert [i["beyond_guess"] for i in per_image] == [True, False, False]
    assert [i["leakage_level"] for i in per_image] == ["Very High", None, None]
    assert summary["images_recovered"] == 1
    # The batch's mean (16.2 dB) beats its mean guess (12.7 dB) by 3.5 dB: FedLeak's band of it.
    assert summary["batch_beyond_guess"] and summary["level"] == "High"
    assert summary["images_per_level"] == {"Very High": 1, "High": 0, "Medium": 0}
    assert summary["ssim_success_rate"][0] == {"threshold": 0.2, "rate": 1 / 3}


def test_a_batch_worse_than_a_grey_guess_gets_no_level():
    # FedLeak's batch of 16 at 11.84 dB against a grey guess at 15.86 dB: the old rule said
    # "Medium" (FedLeak's band of the mean); nothing here is beyond the guess.
    per_image = [{"psnr": 11.84, "ssim": 0.17} for _ in range(16)]
    summary = risk_summary(per_image, [_guess(15.86, 0.25)] * 16)
    assert summary["level"] is None and summary["images_recovered"] == 0


def test_some_images_beyond_the_guess_make_a_portion():
    per_image = [{"psnr": 24.0, "ssim": 0.8}] + [{"psnr": 12.0, "ssim": 0.1}] * 7
    summary = risk_summary(per_image, [_guess(15.0, 0.2)] * 8)
    assert not summary["batch_beyond_guess"]
    assert summary["level"] == "Medium" and summary["images_recovered"] == 1


def test_structure_beyond_the_guess_counts_with_pixels_close_to_it():
    # GRNN on the smooth chelsea photograph (docs/REPRODUCTION.md): SSIM 0.72 against the data
    # mean image's 0.19, a recognisable cat, while its colours leave it 0.6 dB behind in PSNR.
    summary = risk_summary([{"psnr": 16.67, "ssim": 0.719}], [_guess(17.23, 0.191)])
    assert summary["images_recovered"] == 1 and summary["level"] == "High"
    # Structure recovered below FedLeak's lowest band is still a portion recovered.
    summary = risk_summary([{"psnr": 9.5, "ssim": 0.6}], [_guess(10.0, 0.2)])
    assert summary["images_recovered"] == 1 and summary["level"] == "Medium"
    # An SSIM gain under the margin is not.
    summary = risk_summary([{"psnr": 12.0, "ssim": 0.25}], [_guess(12.0, 0.2)])
    assert summary["images_recovered"] == 0 and summary["level"] is None


def test_structure_far_behind_the_guess_in_pixels_is_not_recovered():
    # FedLeak's batch of 16 at 16x16: a noise field whose bright centre matches the clock's
    # (SSIM 0.57 against 0.06) is 5 dB worse than the guess in pixels; coffee 1.6 dB worse.
    for psnr, ssim, guess in (
        (13.78, 0.573, _guess(19.01, 0.060)),
        (10.35, 0.383, _guess(11.95, 0.072)),
    ):
        summary = risk_summary([{"psnr": psnr, "ssim": ssim}], [guess])
        assert summary["images_recovered"] == 0 and summary["level"] is None


def test_pixels_beyond_the_guess_count_only_with_structure_no_worse():
    # Pixels 5 dB closer than any guess, with structure to match: recovered.
    summary = risk_summary([{"psnr": 20.0, "ssim": 0.35}], [_guess(15.0, 0.3)])
    assert summary["images_recovered"] == 1 and summary["level"] == "Very High"
    # FedLeak's hubble_deep_field: a dark noise field beats the too-bright guesses by 1.6 dB,
    # with less structure than they have: the image's brightness, not its content.
    summary = risk_summary([{"psnr": 10.72, "ssim": 0.125}], [_guess(9.07, 0.199)])
    assert summary["images_recovered"] == 0 and summary["level"] is None
    # Without SSIM (images under its window), pixels alone decide.
    summary = risk_summary([{"psnr": 20.0, "ssim": None}], [_guess(15.0, None)])
    assert summary["images_recovered"] == 1


def test_every_score_carries_the_guesses_and_what_was_recovered():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(2, 1, 16, 16, generator=g)
    truth = PrivateBatch(images, torch.tensor([0, 1]), ("a", "b"))
    normalization = Normalization.parse("none", 1)
    exact = score(images.clone(), None, truth, normalization, lpips_nets=())
    assert exact.risk.level == "Very High"
    assert exact.risk.images_recovered == 2
    assert exact.risk.psnr_success_rate[-1].rate == 1.0
    assert [g.name for g in exact.guesses] == ["grey"]  # no prior given
    noise = score(torch.rand(2, 1, 16, 16, generator=g), None, truth, normalization, ())
    assert noise.risk.level is None
    assert noise.risk.images_recovered == 0


def test_the_grey_guess_is_scored_like_a_reconstruction():
    images = torch.full((1, 1, 16, 16), 0.25)
    truth = PrivateBatch(images, torch.tensor([0]), ("a",))
    normalization = Normalization.parse("none", 1)
    grey = score(torch.full((1, 1, 16, 16), 0.5), None, truth, normalization, lpips_nets=())
    # MSE 0.0625: 12.04 dB, for the guess and for a "reconstruction" that is the guess.
    assert grey.guesses[0].psnr_mean == pytest.approx(12.041, abs=1e-3)
    assert grey.risk.guess_psnr_mean == pytest.approx(grey.psnr_mean)
    assert grey.risk.images_recovered == 0


def test_nothing_shown_needs_a_margin_below_the_guess_in_both_measures():
    from auditlib.metrics.risk import (
        HELD_MARGIN_DB,
        HELD_SSIM_FLOOR,
        HELD_SSIM_MARGIN,
        nothing_shown,
    )

    assert (HELD_MARGIN_DB, HELD_SSIM_MARGIN, HELD_SSIM_FLOOR) == (1.0, 0.05, 0.05)
    guess = (11.56, 0.141)  # the astronaut's best guess
    # DLG under 4-bit quantisation (defenses.json, privacy row 15): noise, far below.
    assert nothing_shown(4.92, 0.019, *guess)
    # GRNN's twin under pruning at 0.999 (holds-again row 3): below in pixels, above in SSIM.
    assert not nothing_shown(10.18, 0.179, *guess)
    # Just under the guess is not below it by the margin.
    assert not nothing_shown(11.0, 0.05, *guess)
    assert not nothing_shown(5.0, 0.12, *guess)
    assert nothing_shown(5.0, None, 11.56, None)  # without SSIM, pixels alone
    # A guess with little structure itself (the lab's 32 px astronaut, 11.03 dB / 0.040):
    # DLG's noise under Gaussian noise, 4.90 dB / 0.019, has none at all.
    assert nothing_shown(4.90, 0.019, 11.03, 0.040)
    assert not nothing_shown(4.90, 0.045, 11.03, 0.040)  # more structure than the guess


def test_the_risk_counts_images_held_apart_from_images_between():
    per_image = [
        {"psnr": 25.0, "ssim": 0.9},  # recovered
        {"psnr": 9.0, "ssim": 0.17},  # between: below in pixels, not in structure
        {"psnr": 5.0, "ssim": 0.01},  # nothing shown
    ]
    summary = risk_summary(per_image, [_guess(12.0, 0.2)] * 3)
    assert [i["nothing_shown"] for i in per_image] == [False, False, True]
    assert (summary["images_recovered"], summary["images_held"]) == (1, 1)


def test_a_matched_candidate_keeps_its_pairing_when_scored():
    # The per-image union of several attacks is already in the originals' order; Hungarian
    # matching on it could pair an image with another attack's reconstruction and lose it.
    g = torch.Generator().manual_seed(1)
    originals = torch.rand(2, 1, 16, 16, generator=g)
    truth = PrivateBatch(originals, torch.tensor([0, 1]), ("a", "b"))
    normalization = Normalization.parse("none", 1)
    swapped = originals.flip(0)  # reconstruction 0 looks like original 1 and vice versa
    hungarian = score(swapped, None, truth, normalization, ())
    identity = score(swapped, None, truth, normalization, (), matched_already=True)
    assert [p.reconstruction_index for p in hungarian.per_image] == [1, 0]
    assert [p.reconstruction_index for p in identity.per_image] == [0, 1]
    assert identity.risk.images_recovered == 0 and hungarian.risk.images_recovered == 2


# --- labels: against the attacker's best guess without the update ------------------------


def _enumerated_p(guess: list[int], truth: list[int], classes: int) -> float:
    """The relabelling p-value by enumerating every permutation of the classes."""
    import itertools

    observed = label_matches(guess, truth)
    perms = list(itertools.permutations(range(classes)))
    hits = sum(label_matches(guess, [perm[t] for t in truth]) >= observed for perm in perms)
    return hits / len(perms)


def test_distinct_guesses_of_distinct_labels_overlap_by_2b_minus_c_and_the_test_knows():
    # Issue 50's false leak: 8 distinct of 10 meet 8 distinct of 10 in at least 6.
    truth = [0, 1, 2, 3, 4, 5, 8, 9]
    six = label_test([[[0, 1, 2, 3, 4, 5, 6, 7]]], [truth], 10)
    assert (six.correct, six.p_value, six.method) == (6, 1.0, "exact")
    assert not six.beyond_chance
    # All 8 right: 1 of the C(10, 8) = 45 sets of 8 classes, not below 0.01.
    eight = label_test([[truth]], [truth], 10)
    assert eight.p_value == pytest.approx(1 / 45) and not eight.beyond_chance
    # All 10 of 10 classes: every guess gets them all.
    assert label_test([[list(range(10))]], [list(range(10))], 10).p_value == 1.0
    # One label: 1/C, so 1 of 100 is p = 0.01, not below LABEL_ALPHA.
    one = label_test([[[42]]], [[42]], 100)
    assert one.p_value == pytest.approx(0.01) and not one.beyond_chance


@pytest.mark.parametrize(
    ("guess", "truth"),
    [
        ([0, 1, 2], [0, 1, 4]),  # both distinct
        ([0, 0, 1, 2], [0, 3, 1, 2]),  # the labels distinct
        ([0, 1, 2, 3], [0, 0, 1, 1]),  # the guesses distinct
    ],
)
def test_the_exact_test_is_the_share_of_relabellings(guess, truth):
    test = label_test([[guess]], [truth], 6)
    assert test.method == "exact"
    assert test.p_value == pytest.approx(_enumerated_p(guess, truth, 6))


def test_with_repeats_on_both_sides_monte_carlo_estimates_the_share():
    guess, truth = [0, 0, 1, 1, 2], [0, 0, 1, 1, 3]
    test = label_test([[guess]], [truth], 6)
    assert test.method == "monte carlo" and test.relabellings == LABEL_RELABELLINGS
    exact = _enumerated_p(guess, truth, 6)
    assert test.p_value == pytest.approx(exact, abs=4 * (exact / LABEL_RELABELLINGS) ** 0.5)
    # A fixed seed: the same run judged twice reads the same.
    assert label_test([[guess]], [truth], 6) == test


@pytest.mark.parametrize("batch", [1, 4, 8, 10])
def test_the_test_is_calibrated_where_the_update_says_nothing(batch):
    """Guesses made without the labels (a fixed rule's output, or random draws) against labels
    assigned as a folder without labels gets them: p <= alpha at most alpha of the time."""
    rng = np.random.default_rng(batch)
    classes, trials = 10, 400
    fixed = sorted(rng.choice(classes, size=min(batch, classes), replace=False).tolist())
    ps = []
    for seed in range(trials):
        truth = list(assign_labels(batch, classes, seed))
        guess = fixed if seed % 2 else rng.integers(0, classes, size=batch).tolist()
        ps.append(label_test([[guess]], [truth], classes, relabellings=199).p_value)
    ps = np.asarray(ps)
    for alpha in (0.05, 0.1, 0.25, 0.5):
        assert (ps <= alpha).mean() <= alpha + 3 * (alpha * (1 - alpha) / trials) ** 0.5


def test_the_best_of_several_attacks_is_weighed_against_the_best_of_them():
    truth = [0, 1, 2, 3]
    guesses = [[[0, 1, 5, 6]], [[7, 8, 2, 3]]]  # each 2 of 4 right
    alone = label_test([guesses[0]], [truth], 10)
    both = label_test(guesses, [truth], 10)
    assert both.correct == alone.correct == 2
    assert both.p_value > alone.p_value  # two tries get 2 right more often than one


def test_updates_pooled_share_one_relabelling():
    """17 updates of one image each: 17 right is beyond chance when their labels were drawn
    apart, but one fact when every update holds the same class (as p = 1/C)."""
    truths = [[t] for t in assign_labels(17, 10, seed=0)]
    pooled = label_test([truths], truths, 10)
    assert pooled.correct == 17 and pooled.p_value == 1 / (1 + LABEL_RELABELLINGS)
    same = [[3]] * 17
    one_fact = label_test([same], same, 10)
    assert one_fact.p_value == pytest.approx(0.1, abs=0.01) and not one_fact.beyond_chance


def test_label_matches_is_label_accuracys_count():
    from auditlib.metrics.matching import label_accuracy

    guess, truth = [1, 1, 2, 5], [1, 2, 2, 3]
    assert label_matches(guess, truth) == 2 == round(label_accuracy(guess, truth) * 4)
