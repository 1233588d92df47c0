"""Specification of the verdict: a bound beside a guess and a control, never one run alone."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from auditlib.metrics.risk import LabelEvidence, label_test
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


def test_a_leak_of_several_attacks_names_those_whose_picks_were_recovered_not_all_tried():
    """``--attack all`` on LeNet at 20 steps: iDLG's pick beat the guess (12.03 against
    11.03 dB), IG's and FedLeak's fell below it (7.45, 9.02 dB); the headline said all five
    "rebuilt the client's images"."""
    tried = ("dlg (audit preset)", "idlg (audit preset)", "ig (audit preset)")
    scope = replace(SCOPE, attacks=tried, defense="none")
    one = replace(finding(1, batch=1), recovered_by=("idlg (audit preset)",))
    verdict = judge(one, scope, defended=False)
    assert verdict.headline == "Very High: idlg (audit preset) rebuilt the client's images"
    assert verdict.sentence.startswith(
        "dlg (audit preset), idlg (audit preset), ig (audit preset): 1 of 1 image recovered"
    )
    assert "; the recovered image is idlg (audit preset)'s pick;" in verdict.sentence
    two = replace(finding(3), recovered_by=("dlg (audit preset)", "idlg (audit preset)"))
    defended = judge(two, replace(scope, defense="prune"), defended=True, control=finding(4))
    assert defended.headline == (
        "Very High: the defense did not stop dlg (audit preset) and idlg (audit preset)"
    )
    assert "the recovered images are the picks of dlg (audit preset) and idlg" in defended.sentence
    # Stored and read back (a list in JSON), and a verdict recorded before it: all named.
    again = Verdict.from_dict(json.loads(json.dumps(verdict.to_dict())))
    assert again.finding == verdict.finding
    before = judge(finding(1, batch=1), scope, defended=False)
    assert before.headline.startswith("Very High: dlg (audit preset), idlg (audit preset), ig")


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
    assert VERDICT_VERSION == 6


def test_a_stored_verdict_whose_twin_diverged_reads_inconclusive_not_low(monkeypatch):
    """Before version 6 a twin whose every start diverged counted as run: DLG's under DP
    noise of sigma 10 broke down within 19 steps and the verdict said "Low". Read now, its
    scope says the twin did not run, and the verdict judged from it is no finding."""
    from auditlib.engine.twins import rescoped
    from auditlib.result import AttackRecord

    low = judge(finding(0), SCOPE, defended=True, control=finding(4), control_note="c")
    assert low.level == "Low" and low.version == 6
    stored = replace(low, version=5)
    plain = AttackRecord("dlg", "dlg (audit preset)", stop_reason="completed", steps=200)
    broke = AttackRecord(
        "dlg", "dlg (audit preset, knows the defense)", adaptive=True, stop_reason="diverged"
    )
    broke = replace(broke, steps=19)
    again = rescoped(stored, (plain, broke))
    assert again.scope.twins == "none" and again.scope.twins_words == (
        "the twin of dlg did not run: every start of it diverged: its optimisation broke down "
        "within 19 steps, so it measured nothing"
    )
    assert again.outcome == "inconclusive" and again.version == 6
    assert "the defense held against the plain attack only" in again.headline
    assert again.control == finding(4) and again.control_note == "c"
    # A verdict of the present rules, or one whose twins measured, reads as it was.
    assert rescoped(low, (plain, broke)) is low
    ran = replace(broke, stop_reason="completed")
    assert rescoped(stored, (plain, ran)) is stored
    # Where the stored spec no longer reads, the dashboard and the report show the run's
    # own verdict: read by the same rule.
    from types import SimpleNamespace

    import dashboard.stored_runs as stored_runs
    from auditlib.report.subject import _judged

    result = SimpleNamespace(verdict=stored, attacks=(plain, broke))
    record = SimpleNamespace(status="completed", spec={"of": "an older version"}, result=result)
    monkeypatch.setattr(stored_runs, "get_store", lambda: None)  # the fallback reads none
    assert stored_runs.run_verdict(record) == again
    assert _judged(None, record, result) == (again, None)


def _labels(found: Finding, truth: list[int], guess: list[int], classes: int) -> Finding:
    """The finding with labels judged by the relabelling test (``metrics.risk.label_test``)."""
    test = label_test([[guess]], [truth], classes)
    evidence = LabelEvidence(test.correct, classes, test.beyond_chance, test.p_value, test.words())
    return Finding.from_scores(
        _risk_of(found), found.stop_reason, found.steps, 300, labels=evidence
    )


def _risk_of(found: Finding):
    from auditlib.metrics.scores import Risk

    return Risk(
        level=found.level,
        meaning="",
        basis="",
        images_recovered=found.images_recovered,
        batch_size=found.batch_size,
        batch_beyond_guess=found.leaked,
        psnr_mean=found.psnr_mean,
        ssim_mean=found.ssim_mean,
        guess_psnr_mean=found.guess_psnr_mean,
        guess_ssim_mean=found.guess_ssim_mean,
        images_per_level={},
        psnr_success_rate=(),
        images_held=found.images_held,
    )


def test_labels_recovered_without_an_image_are_a_label_leak_not_nothing():
    # ResNet-18, 224 px, 1000 classes, one photograph: no image, the label came back.
    alone = _labels(finding(0, batch=1), [417], [417], 1000)
    verdict = judge(alone, SCOPE, defended=False)
    assert verdict.outcome == "labels_leak" and verdict.level == "Labels"
    assert verdict.is_finding
    assert verdict.headline.startswith("Labels: dlg (audit preset) recovered the private label ")
    assert "the private label was recovered, 1 of 1 (p = 0.001" in verdict.sentence
    assert "recovered nothing" not in verdict.headline + verdict.sentence
    # One correct label of ten classes is not beyond chance: nothing follows from it.
    chance = judge(_labels(finding(0, batch=1), [3], [3], 10), SCOPE, defended=False)
    assert chance.outcome == "inconclusive"


def test_a_labels_verdict_says_what_is_known_of_the_images():
    """Beside the labels, what the verdict would have said of the images: on an undefended
    update a failed image attack is not evidence of safety; under a defense that held them
    (twin ran, control broke), that they held."""
    alone = _labels(finding(0, batch=1), [417], [417], 1000)
    verdict = judge(alone, SCOPE, defended=False)
    assert verdict.headline.endswith(
        "the images not shown safe (a failed attack on the undefended update is not evidence "
        "of safety)"
    )
    assert "The images: none was recovered, and that is no evidence they are safe: a failed" in (
        verdict.sentence
    )
    assert verdict.images_words.startswith("not shown safe: a failed attack")
    held = judge(
        _labels(finding(0), [1, 4, 6, 8], [1, 4, 6, 8], 100),
        SCOPE,
        defended=True,
        control=finding(4),
        control_note="c",
    )
    assert held.outcome == "labels_leak" and held.headline.endswith(
        "images held against these attacks"
    )
    assert "the defense held for the images at this budget, not for the labels" in held.sentence
    read = Verdict.from_dict(json.loads(json.dumps(held.to_dict())))
    assert read == held


def test_labels_leak_beside_images_and_under_a_defense_that_held_the_images():
    both = judge(_labels(finding(4), [0, 1, 2, 3], [0, 1, 2, 3], 100), SCOPE, defended=False)
    assert both.outcome == "leaks"
    assert "Besides, the private labels were recovered, 4 of 4" in both.sentence
    held_images = judge(
        _labels(finding(0), [0, 1, 2, 3], [0, 1, 2, 3], 100),
        SCOPE,
        defended=True,
        control=finding(4),
        control_note="c",
    )
    assert held_images.outcome == "labels_leak" and held_images.level == "Labels"


def test_distinct_guesses_of_distinct_labels_are_not_a_leak_at_8_of_10_classes():
    """Issue 50's false leak: 8 distinct guesses of 10 classes meet 8 distinct labels in at
    least 6, whatever the update says; 6 of 8 is what a guess without it gets."""
    guess, truth = [0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 8, 9]
    verdict = judge(_labels(finding(0, batch=8), truth, guess, 10), SCOPE, defended=False)
    assert verdict.outcome == "inconclusive"
    assert verdict.finding.labels_recovered == 6 and verdict.finding.label_p_value == 1.0


def test_a_labels_verdict_recorded_before_version_3_still_reads():
    """Version 2 stored labels judged by the binomial test, without the basis or p-value."""
    v3 = judge(_labels(finding(0, batch=1), [417], [417], 1000), SCOPE, defended=False)
    old = v3.to_dict()
    for key in ("label_p_value", "label_basis"):
        del old["finding"][key]
    del old["images_words"]
    old["version"] = 2
    read = Verdict.from_dict(old)
    assert read.version == 2 and read.images_words == ""
    assert read.finding.label_basis == "" and read.finding.label_p_value is None
    assert "(a binomial test against 1/C, as judged before" in read.finding.label_words()
    # Re-judged (a defended run is, beside its control), it is no finding either way.
    again = judge(read.finding, SCOPE, defended=True, control=finding(4), control_note="c")
    assert again.outcome == "inconclusive"
    assert again.headline == "Inconclusive: its labels were judged by a test since found unsound"


def test_a_client_that_refused_the_model_stops_that_server_only():
    scope = replace(
        SCOPE,
        twins="not offered",
        twins_words="no attacker that knows model-check is offered",
        refused="model check: layer server_block.bins: 128 of 128 rows share one direction",
    )
    # Issue 50, item 9: whatever the reconstructions of an update of zeros score (a flat
    # grey beat the mid-grey guess on 7 of 16 dark crops), a refused model is no leak, and
    # the verdict says the server received nothing, whatever the control did.
    for found, control in ((finding(0), finding(4)), (finding(2, level="Medium"), None)):
        verdict = judge(found, scope, defended=True, control=control, control_note="c")
        assert verdict.outcome == "inconclusive" and not verdict.is_finding
        assert verdict.headline == (
            "Inconclusive: the client refused the server's model: the server received nothing"
        )
        assert "128 of 128 rows share one direction" in verdict.sentence
        assert "so nothing was recovered" in verdict.sentence
        assert "stop this server only" in verdict.sentence  # no evading server was tried
        assert "Medium" not in verdict.headline + verdict.sentence
        assert "raise the budget" not in verdict.sentence
    assert Scope.from_dict(json.loads(json.dumps(verdict.to_dict()))["scope"]).refused
    # The History table's cell says it too, never a level.
    from dashboard.verdict_words import verdict_cell

    assert verdict_cell(verdict, control=False) == (
        "Inconclusive: the client refused the server's model: the server received nothing"
    )


def test_a_refused_model_held_only_against_every_server_built_to_pass_the_check():
    """Issue 54: "Low" (held) only where the servers built to pass the check were all tried
    (twins "ran") and refused, and the same attack broke the undefended update; the servers
    tried are said. Any one not tried, or a control that did not leak: no level."""
    tried = (
        "the model check was tried against 3 servers: rtf refused; rtf-evading refused; "
        "seer-disguised refused"
    )
    held_scope = replace(
        SCOPE,
        twins="ran",
        twins_words=tried,
        refused="model check: layer server_block.bins: 128 of 128 rows share one direction",
        evading=("rtf-evading", "seer-disguised"),
    )
    verdict = judge(finding(0), held_scope, defended=True, control=finding(4), control_note="c")
    assert verdict.outcome == "defense_held" and verdict.level == "Low"
    assert "2 built to pass it" in verdict.headline
    assert tried in verdict.sentence and "these servers only" in verdict.sentence
    assert Scope.from_dict(json.loads(json.dumps(verdict.to_dict()))["scope"]).evading == (
        "rtf-evading",
        "seer-disguised",
    )
    # One evading server not tried (its model could not be built): no level.
    partly = replace(
        held_scope,
        twins="partly",
        twins_words=tried.replace("seer-disguised refused", "seer-disguised not tried (too large)"),
    )
    verdict = judge(finding(0), partly, defended=True, control=finding(4), control_note="c")
    assert verdict.outcome == "inconclusive"
    assert "not every server built to pass the check was tried" in verdict.sentence
    assert "seer-disguised not tried (too large)" in verdict.sentence
    # The control did not break the undefended update: nothing shows the check was needed.
    verdict = judge(finding(0), held_scope, defended=True, control=finding(0), control_note="c")
    assert verdict.outcome == "inconclusive" and "did not break" in verdict.sentence


# --------------------------------------- issue 50, items 3 and 6: "held" on every pick


def _pick(psnr: float, ssim: float, guess: tuple[float, float]):
    """One image's pick as ``metrics.risk`` flags it against ``guess`` (PSNR, SSIM)."""
    from auditlib.metrics.risk import risk_summary
    from auditlib.metrics.scores import ImageScore

    image = {"psnr": psnr, "ssim": ssim}
    risk_summary([image], [{"guess": "grey", "psnr": guess[0], "ssim": guess[1]}])
    return ImageScore(
        "astronaut",
        0,
        10 ** (-psnr / 10),
        psnr,
        0,
        ssim=ssim,
        guess_psnr=guess[0],
        guess_ssim=guess[1],
        beyond_guess=image["beyond_guess"],
        nothing_shown=image["nothing_shown"],
    )


def _ran(name: str, candidates, *, adaptive: bool = False):
    """An attack that ran, with its starts' candidates (images, loss): the lowest loss is
    its own pick."""
    import torch

    from auditlib.attacks import Candidate, Reconstruction
    from auditlib.engine.attack_phase import AttackRun, PlannedAttack

    starts = tuple(
        Candidate(torch.as_tensor(images, dtype=torch.float32), None, loss, k, 10, "completed")
        for k, (images, loss) in enumerate(candidates)
    )
    final = Reconstruction(starts, "completed", 10 * len(starts))
    return AttackRun(PlannedAttack(name, "audit", None, {}, 10, adaptive), final, None, 1.0)


def test_a_twin_between_the_lines_is_not_hidden_behind_a_plain_pick_that_shows_nothing():
    # The stub case: the plain attack's pick 1.5 dB under the guess (and 0.1 under
    # its SSIM) shows nothing; the twin's pick has more structure than the guess but its
    # pixels are too far behind to count: between the lines. The old combination kept the
    # higher PSNR, the plain pick, and the image read "held".
    import numpy as np

    from auditlib.engine.attack_phase import worst_case

    guess = (12.0, 0.20)
    plain, twin = _pick(10.5, 0.10, guess), _pick(9.0, 0.30, guess)
    assert plain.nothing_shown and not plain.beyond_guess
    assert not twin.nothing_shown and not twin.beyond_guess and plain.psnr > twin.psnr
    image = np.zeros((1, 1, 2, 2))
    runs = [_ran("dlg", [(image, 0.1)]), _ran("dlg", [(image + 1, 0.1)], adaptive=True)]
    _, sources = worst_case(runs, [(plain,), (twin,)])
    assert sources == ["dlg (audit preset, knows the defense)"]
    kept = twin  # the combination's image scores as the pick it came from
    found = replace(finding(0, batch=1), images_held=int(bool(kept.nothing_shown)))
    verdict = judge(found, SCOPE, defended=True, control=finding(1, batch=1), control_note="c")
    assert verdict.outcome == "inconclusive" and verdict.level == "Inconclusive"
    assert "sits between the guess and the recovered line" in verdict.headline
    # Every pick below the guess by the margins: held, the higher PSNR shown.
    other = _pick(9.5, 0.05, guess)
    _, sources = worst_case(runs, [(plain,), (other,)])
    assert sources == ["dlg (audit preset)"]


def _judged_beside_a_leaking_control(runs, originals):
    """``engine.judging.scored`` on ``runs`` (a defended run's plain attack and its twin),
    judged beside a control that broke the undefended update."""
    from types import SimpleNamespace

    import torch

    from auditlib.data.normalization import Normalization
    from auditlib.engine.judging import scored
    from auditlib.models import ModelSpec
    from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
    from auditlib.threat import PrivateBatch

    batch = len(originals)
    spec = RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (1, 32, 32))),
        data=DataSpec("samples", "photographs", batch_size=batch),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg", None, "audit"),
        defense=ComponentSpec.of("dp-gaussian", {"sigma": 1.0}),
        budget=Budget(10),
    )
    victim = SimpleNamespace(
        prior=None, prior_unavailable_reason="no prior", normalization=Normalization.identity(1)
    )
    truth = PrivateBatch(
        torch.as_tensor(originals, dtype=torch.float32),
        torch.zeros(batch, dtype=torch.long),
        tuple(f"image{i}" for i in range(batch)),
    )
    planned = [r.planned for r in runs]
    scope = replace(SCOPE, attacks=tuple(r.label for r in runs))
    judged = scored(spec, planned, runs, victim, truth, scope, "completed", (), 10 * len(runs))
    found = judged.verdict.finding
    return judge(found, scope, defended=True, control=finding(batch, batch=batch))


def test_held_holds_on_every_start_the_auditor_sees_not_only_the_attacker_s_pick():
    # Issue 50, item 6: "Low" looked at the attacker's lowest-loss pick alone. A start the
    # attacker ranked lower (here an exact copy of the images) is seen by the auditor (it is
    # the oracle best), and the images then showed something: not "held".
    import numpy as np

    rng = np.random.default_rng(50)
    originals = np.full((2, 1, 32, 32), 0.5)  # mostly flat: the grey guess's SSIM is 0.7
    originals[0, 0, 8:14, 8:14], originals[1, 0, 18:24, 12:18] = 0.9, 0.1
    noise = [rng.random(originals.shape) for _ in range(2)]  # nothing of the images

    def runs(*plain_starts):
        return [
            _ran("dlg", plain_starts),
            _ran("dlg", [(noise[1], 0.2)], adaptive=True),
        ]

    held = _judged_beside_a_leaking_control(runs((noise[0], 0.1)), originals)
    assert held.outcome == "defense_held" and held.finding.images_held == 2
    seen = _judged_beside_a_leaking_control(runs((noise[0], 0.1), (originals, 0.5)), originals)
    assert seen.finding.images_recovered == 0  # the attacker's own pick recovered nothing
    assert seen.finding.images_held == 0
    assert seen.outcome == "inconclusive"
    assert "sits between the guess and the recovered line" in seen.headline
