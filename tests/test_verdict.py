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
