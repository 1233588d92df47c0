"""Specification of the verdict: a bound beside a guess and a control, never one run alone."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from auditlib.metrics.risk import labels_beyond_chance
from auditlib.metrics.verdict import (
    CONTROL_LEAK_SHARE,
    VERDICT_VERSION,
    Finding,
    Scope,
    Verdict,
    judge,
    threat_card,
)


def finding(
    recovered: int,
    *,
    batch: int = 4,
    stop: str = "completed",
    level: str | None = None,
    held: int | None = None,
):
    """A run's finding: ``recovered`` images beyond the guess, the others below it by the
    held margins unless ``held`` says how many are."""
    return Finding(
        leaked=recovered > 0,
        level=level or ("Very High" if recovered else None),
        images_recovered=recovered,
        batch_size=batch,
        psnr_mean=35.0 if recovered else 9.0,
        guess_psnr_mean=12.0,
        ssim_mean=0.9 if recovered else 0.05,
        guess_ssim_mean=0.2,
        stop_reason=stop,
        steps=300 if stop == "completed" else 12,
        planned_steps=300,
        images_held=batch - recovered if held is None else held,
    )


SCOPE = Scope(
    attacks=("dlg (audit preset)",),
    defense="dp-gaussian (sigma=0.1)",
    restarts="dlg: 8 starts raced",
    iterations=300,
    time_budget_s=60.0,
    steps=300,
    seconds=41.0,
    threat=threat_card(
        protocol="FedSGD", labels_known=False, batchnorm_statistics=False, batch_size=4
    ),
    twins="ran",
    twins_words="dlg's twin ran",
)


def test_an_undefended_run_that_recovers_images_leaks_with_its_band():
    verdict = judge(finding(4), SCOPE, defended=False)
    assert verdict.outcome == "leaks" and verdict.level == "Very High"
    assert "4 of 4 images recovered beyond the best guess" in verdict.sentence
    assert verdict.is_finding


def test_an_undefended_run_that_recovers_nothing_is_inconclusive_not_low():
    verdict = judge(finding(0), SCOPE, defended=False)
    assert verdict.outcome == "inconclusive" and verdict.level == "Inconclusive"
    assert "not evidence of safety" in verdict.sentence
    assert "Low" not in verdict.headline + verdict.sentence


def test_a_defense_holds_only_against_a_control_that_leaked():
    held = judge(finding(0), SCOPE, defended=True, control=finding(3), control_note="control run")
    assert held.outcome == "defense_held" and held.level == "Low"
    assert "may still succeed" in held.sentence  # never a guarantee
    assert "the attacker that knows the defense ran" in held.sentence
    unknown = judge(finding(0), SCOPE, defended=True, control=finding(0), control_note="run")
    assert unknown.outcome == "inconclusive"
    assert "did not break even the undefended update" in unknown.sentence
    missing = judge(finding(0), SCOPE, defended=True, control=None, control_note="not run yet")
    assert missing.outcome == "inconclusive" and "not run yet" in missing.sentence


def test_a_defended_run_that_leaks_is_a_finding_about_the_defense():
    verdict = judge(finding(2), SCOPE, defended=True, control=finding(4), control_note="run")
    assert verdict.outcome == "leaks"
    assert verdict.headline.startswith("Very High: the defense did not stop")
    assert "Without the defense: 4 of 4 images" in verdict.sentence


@pytest.mark.parametrize("stop", ["time budget", "cancelled"])
def test_a_run_cut_short_that_recovered_nothing_is_inconclusive(stop):
    verdict = judge(finding(0, stop=stop), SCOPE, defended=True, control=finding(4))
    assert verdict.outcome == "inconclusive"
    assert f"stopped by its {stop} at step 12 of 300" in verdict.sentence


def test_a_run_cut_short_that_leaked_still_leaked():
    verdict = judge(finding(1, stop="time budget", level="Medium"), SCOPE, defended=False)
    assert verdict.outcome == "leaks" and verdict.level == "Medium"
    assert "the leak it had shown by then stands" in verdict.sentence


def test_the_verdict_round_trips_through_json():
    verdict = judge(finding(0), SCOPE, defended=True, control=finding(3), control_note="c")
    again = Verdict.from_dict(json.loads(json.dumps(verdict.to_dict())))
    assert again == verdict


def test_the_threat_card_names_the_sok_model():
    plain = threat_card(
        protocol="FedSGD", labels_known=False, batchnorm_statistics=False, batch_size=1
    )
    assert (plain.sok_model, plain.sok_name) == ("C", "Parameter-Aware Eavesdropper")
    informed = threat_card(
        protocol="FedSGD", labels_known=True, batchnorm_statistics=False, batch_size=1
    )
    assert informed.sok_model == "E"
    known = {k.item: k.known for k in informed.knowledge}
    assert known["labels"] and not known["surrogate data"]


# ------------------------------------------------------------------ issue 30: soundness


def test_held_needs_every_image_below_the_guess_by_the_margins():
    # Pruning at 0.999 against GRNN's twin (benchmarks/results/defenses.json, holds-again
    # row 3): 10.18 dB / SSIM 0.179 against the astronaut's guess 11.56 dB / 0.141. Not
    # recovered, yet more structure than the guess: it used to read "defense held".
    from auditlib.metrics.risk import risk_summary

    per_image = [{"psnr": 10.18, "ssim": 0.179}]
    risk = risk_summary(per_image, [{"guess": "grey", "psnr": 11.56, "ssim": 0.1407}])
    assert risk["images_recovered"] == 0 and risk["images_held"] == 0
    pruned = replace(finding(0, batch=1), images_held=risk["images_held"])
    verdict = judge(pruned, SCOPE, defended=True, control=finding(4), control_note="c")
    assert verdict.outcome == "inconclusive" and verdict.level == "Inconclusive"
    assert "sits between the guess and the recovered line" in verdict.headline
    # One image of four between the lines is enough to withhold "held".
    partly = judge(finding(0, held=3), SCOPE, defended=True, control=finding(4))
    assert partly.outcome == "inconclusive"
    assert "3 of 4 below it by the margins" in partly.sentence


def test_the_control_leaked_only_with_a_share_of_its_images():
    assert CONTROL_LEAK_SHARE == 0.5
    one = judge(finding(0), SCOPE, defended=True, control=finding(1, batch=4), control_note="c")
    assert one.outcome == "inconclusive"
    assert "did not break even the undefended update" in one.headline
    assert "at least 50% of its images" in one.sentence
    half = judge(finding(0), SCOPE, defended=True, control=finding(2, batch=4), control_note="c")
    assert half.outcome == "defense_held" and half.level == "Low"


def test_a_run_whose_every_attack_diverged_is_inconclusive_unless_it_leaked():
    diverged = judge(finding(0, stop="diverged"), SCOPE, defended=True, control=finding(4))
    assert diverged.outcome == "inconclusive"
    assert diverged.headline.startswith("Inconclusive: every attack diverged")
    leaked = judge(finding(2, stop="diverged"), SCOPE, defended=True, control=finding(4))
    assert leaked.outcome == "leaks"


def test_a_twin_skipped_for_want_of_budget_reads_in_the_sentence():
    scope = replace(
        SCOPE,
        twins="partly",
        twins_words="the twin of dlg did not run: the run's time budget was spent",
    )
    verdict = judge(finding(0, stop="time budget"), scope, defended=True, control=finding(4))
    assert verdict.outcome == "inconclusive"
    assert "stopped by its time budget" in verdict.headline
    assert "the twin of dlg did not run: the run's time budget was spent" in verdict.sentence


@pytest.mark.parametrize(
    ("twins", "why"),
    [
        ("off", "no twin ran: the paper preset runs the plain attack alone"),
        ("not offered", "no attacker that knows fedboosting is offered"),
        ("none", "the twin of dlg did not run: dlg cannot adapt to this defense"),
        ("partly", "the twin of ig did not run: ig cannot adapt to this defense"),
    ],
)
def test_low_only_against_the_attacker_that_knows_the_defense(twins, why):
    scope = replace(SCOPE, twins=twins, twins_words=why)
    verdict = judge(finding(0), scope, defended=True, control=finding(4), control_note="c")
    assert verdict.outcome == "inconclusive" and verdict.level == "Inconclusive"
    assert verdict.headline == (
        f"Inconclusive: the defense held against the plain attack only ({why})"
    )


def test_a_stored_verdict_from_before_reads_inconclusive_never_low():
    old = judge(finding(0), SCOPE, defended=True, control=finding(3), control_note="c").to_dict()
    del old["scope"]["twins"], old["scope"]["twins_words"]
    for key in ("images_held", "labels_recovered", "label_chance", "labels_beyond_chance"):
        del old["finding"][key]
    old["version"] = 1
    read = Verdict.from_dict(old)
    assert read.scope.twins == "none" and read.finding.images_held is None
    again = judge(read.finding, read.scope, defended=True, control=finding(3), control_note="c")
    assert again.outcome == "inconclusive"
    assert "recorded before the held margins" in again.headline
    assert VERDICT_VERSION == 2


def test_label_chance_is_a_one_sided_binomial_test():
    assert not labels_beyond_chance(1, 1, 10)  # p = 0.1: one correct label of ten classes
    assert labels_beyond_chance(1, 1, 1000)  # p = 0.001: ResNet-18's one ImageNet label
    assert labels_beyond_chance(3, 4, 10)  # p = 0.0037
    assert not labels_beyond_chance(2, 4, 10)  # p = 0.052
    assert not labels_beyond_chance(0, 4, 1000)


def _labels(found: Finding, k: int, classes: int) -> Finding:
    return replace(
        found,
        labels_recovered=k,
        label_chance=1 / classes,
        labels_beyond_chance=labels_beyond_chance(k, found.batch_size, classes),
    )


def test_labels_recovered_without_an_image_are_a_label_leak_not_nothing():
    # ResNet-18, 224 px, 1000 classes, one photograph: no image, the label came back.
    alone = _labels(finding(0, batch=1), 1, 1000)
    verdict = judge(alone, SCOPE, defended=False)
    assert verdict.outcome == "labels_leak" and verdict.level == "Labels"
    assert verdict.is_finding
    assert verdict.headline.startswith("Labels: dlg (audit preset) recovered the private labels")
    assert "the private labels were recovered, 1 of 1 against a chance of 0.1%" in verdict.sentence
    assert "recovered nothing" not in verdict.headline + verdict.sentence
    # One correct label of ten classes is not beyond chance: nothing follows from it.
    chance = judge(_labels(finding(0, batch=1), 1, 10), SCOPE, defended=False)
    assert chance.outcome == "inconclusive"


def test_labels_leak_beside_images_and_under_a_defense_that_held_the_images():
    both = judge(_labels(finding(4), 4, 10), SCOPE, defended=False)
    assert both.outcome == "leaks"
    assert "Besides, the private labels were recovered, 4 of 4" in both.sentence
    held_images = judge(
        _labels(finding(0), 4, 10), SCOPE, defended=True, control=finding(4), control_note="c"
    )
    assert held_images.outcome == "labels_leak" and held_images.level == "Labels"


def test_a_client_that_refused_the_model_stops_that_server_only():
    scope = replace(
        SCOPE,
        twins="not offered",
        twins_words="no attacker that knows model-check is offered",
        refused="model check: layer server_block.bins: 128 of 128 rows share one direction",
    )
    verdict = judge(finding(0), scope, defended=True, control=finding(4), control_note="c")
    assert verdict.outcome == "inconclusive"
    assert verdict.headline == (
        "Inconclusive: the client refused the server's model, so the server received nothing"
    )
    assert "128 of 128 rows share one direction" in verdict.sentence
    assert "stop this server only" in verdict.sentence
    assert "raise the budget" not in verdict.sentence
    assert Scope.from_dict(json.loads(json.dumps(verdict.to_dict()))["scope"]).refused
