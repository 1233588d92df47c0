"""The report's facts without reportlab: what the PDF states about a run, read from the
typed result and spec (here real result.json files of earlier versions, stored on SQLite),
in the metric catalogue's labels and formats, with "not recorded" where a run lacks a part."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from auditlib.metrics.catalogue import (
    CATALOGUE,
    EPSILON_NOTE,
    MEANINGFUL_EPSILON,
    RECONSTRUCTION_METRICS,
    UTILITY_METRICS,
)
from auditlib.metrics.scores import ImageScore
from auditlib.report import facts, facts_back, facts_results, facts_server, verdict_facts
from auditlib.report.subject import ReportEntry, RunRow, learns_nothing, run_row, run_subject
from auditlib.report.text import NOT_RECORDED, knowledge_text, metric_text, plain
from auditlib.result import AuditSummary
from auditlib.store import Store

FIXTURES = Path(__file__).parent / "fixtures" / "results"


def stored(tmp_path: Path, name: str) -> ReportEntry:
    """The fixture ``name`` stored as a completed run, read back as a report entry."""
    summary = AuditSummary.from_json(json.loads((FIXTURES / f"{name}.json").read_text()))
    with Store(f"sqlite:///{tmp_path}/{name}.db") as store:
        run_id = store.create_run(dict(summary.config.spec), summary.spec_id, name)
        store.mark_running(run_id)
        store.finish(run_id, "completed", summary=summary)
        return run_subject(store, run_id).entries[0]


@pytest.fixture
def old(tmp_path) -> ReportEntry:
    """Written by 766bdbe: no verdict, no guesses, no RDLV, no attack list, no utility."""
    return stored(tmp_path, "result_766bdbe")


@pytest.fixture
def pruned(tmp_path) -> ReportEntry:
    """Written just before the verdict: guesses, risk and RDLV, under prune."""
    return stored(tmp_path, "result_9555ea9_parent")


def test_the_facts_need_no_reportlab():
    code = (
        "import sys; import auditlib.report.facts, auditlib.report.facts_back, "
        "auditlib.report.facts_results, auditlib.report.facts_server, "
        "auditlib.report.verdict_facts, auditlib.report.text, auditlib.report.subject; "
        "print(any(m.startswith('reportlab') for m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_an_old_run_is_described_from_its_typed_result_and_spec(old):
    assert old.has_result and old.spec is not None and old.verdict is None
    assert facts.model_text(old) == (
        "lenet, input 3 x 32 x 32, 10 classes, 15,826 parameters, uniform initialisation (seed 0)"
    )
    assert facts.images_count(old, "private image") == "2 private images"
    assert facts.data_source(old) == "sample set 'photographs'"
    assert facts.attack_names([old]) == ["ig"]
    pairs = dict(facts.scenario_pairs(old))
    assert pairs["FL algorithm"] == "fedsgd" and pairs["Images"] == "astronaut, chelsea"
    assert pairs["Server observes"].startswith("the client's gradient")
    known = facts.server_knows([old])
    assert (
        "client protocol (algorithm: fedsgd; local_steps: 1; local_epochs: None"
        in (known.common[1])
    )
    (attack,) = facts.attack_settings([old])
    assert attack.budget == "5 optimiser steps per restart (the paper: 24000)"
    assert attack.preset == "none" and attack.lpips_nets == "none"


def test_the_row_reads_the_typed_scores_and_says_what_is_missing(old, pruned):
    row = run_row(old)
    scores = old.result.metrics
    assert row.psnr == scores.psnr_mean and row.ssim == scores.ssim_mean
    assert row.mse == scores.mse_mean and row.label_accuracy == 0.5
    assert row.lpips is None and row.rdlv is None  # not requested / not yet computed
    assert row.beyond_guess is None and row.recovered is None and row.level is None
    assert row.metric("psnr") == row.psnr and row.metric("accuracy") is None

    later = run_row(pruned)
    assert later.beyond_guess == (0, 2) and later.rdlv == pruned.result.metrics.rdlv_mean
    assert later.recovered == pruned.result.metrics.risk.psnr_rate_at(20.0) == 0.0


def test_limits_say_what_an_old_result_did_not_record(old, pruned):
    assert facts_back.unrecorded_parts(old.result) == [
        "the verdict",
        "the best guesses (so the images recovered beyond them)",
        "RDLV",
    ]
    assert facts_back.unrecorded_parts(pruned.result) == ["the verdict"]
    rows = [run_row(old), run_row(pruned)]
    items = facts_back.limits([old, pruned], rows)
    assert "LPIPS (AlexNet) unavailable: LPIPS-alex not requested." in items
    assert any(f"{NOT_RECORDED}: the verdict, the best guesses" in i for i in items)
    assert f"ε n/a for {pruned.label}: pruning gives no formal DP guarantee." in items
    assert any("ig ran 5 optimiser steps per restart, its paper 24000" in i for i in items)


def test_a_spec_this_version_cannot_read_is_said_as_not_recorded(old):
    unread = dataclasses.replace(old, spec=None)
    assert facts.model_text(unread) == f"model {NOT_RECORDED}, 15,826 parameters"
    assert facts.attack_names([unread]) == ["ig"]  # from the result
    pairs = dict(facts.scenario_pairs(unread))
    assert pairs["FL algorithm"] == pairs["Global model"] == NOT_RECORDED
    assert pairs["Batch size"] == "2"  # the result's images
    (attack,) = facts.attack_settings([unread])
    assert attack.budget == attack.seed_device == NOT_RECORDED
    assert facts_back.identifiers(unread).seed == NOT_RECORDED


def test_defense_and_cost_tables_use_the_catalogue(pruned):
    (defense,) = facts.defense_rows([pruned], [run_row(pruned)])
    assert defense.settings == "ratio: 0.9; scope: layer"
    assert defense.epsilon == "n/a" and defense.update_norm == "25.1 → 20.1"

    row = dataclasses.replace(
        run_row(pruned), utility_accuracy=0.7234, utility_f1=0.61234, epsilon=2.06e-05
    )
    columns = {c.key: c for c in facts_results.cost_columns([row])}
    assert list(columns) == [
        "run",
        "accuracy",
        "undefended",
        "macro_f1",
        "epsilon",
        "attack_s",
        "training_s",
    ]
    assert columns["accuracy"].head == CATALOGUE["accuracy"].heading
    assert columns["accuracy"].cells == ("72.3%",) and columns["macro_f1"].cells == ("0.612",)
    assert columns["epsilon"].cells == ("2.06e-5",)  # the catalogue's short exponent
    with_chance = facts_results.cost_columns([dataclasses.replace(row, utility_chance=0.1)])
    assert [c.head for c in with_chance][2] == "Chance"
    assert "Model accuracy after federated training 72.3%" in facts.utility_words(row)


def test_metric_definitions_are_the_catalogue():
    assert facts_back.metric_definitions() == [
        (m.heading, f"{m.definition}. {facts_back.DIRECTION_WORDS[m.direction]}")
        for m in RECONSTRUCTION_METRICS
    ]
    utility = dict(facts_back.metric_definitions(UTILITY_METRICS))
    assert utility["ε"].endswith("Smaller is more private.")
    assert utility["Accuracy"] == f"{CATALOGUE['accuracy'].definition}."


def test_words_and_numbers():
    assert metric_text("psnr", 13.7712) == "13.77" and metric_text("ssim", None) == "n/a"
    assert metric_text("epsilon", 0.25) == "0.25" and metric_text("mse", float("nan")) == "n/a"
    assert plain({"algorithm": "fedsgd", "local_lr": 0.01}) == "algorithm: fedsgd; local_lr: 0.01"
    assert knowledge_text("client protocol {'algorithm': 'fedsgd'}") == (
        "client protocol (algorithm: fedsgd)"
    )
    image = ImageScore("a", 0, 0.1, 10.0, 1, beyond_guess=True, leakage_level="Medium")
    assert verdict_facts.caption_level(image) == verdict_facts.image_level(image) == "Medium"
    assert verdict_facts.caption_level(dataclasses.replace(image, beyond_guess=False)) == "≤ guess"
    assert verdict_facts.image_level(dataclasses.replace(image, beyond_guess=None)) == "n/a"


def test_counts_of_a_batch_without_verdicts(old, pruned):
    not_run = dataclasses.replace(old, run=None, result=None, label="later")
    assert verdict_facts.counts_sentence([old, pruned, not_run]) == (
        "0 of the 3 runs have a finding, 0 are inconclusive, 2 have no verdict (recorded "
        "before verdicts) and 1 has no result."
    )
    assert verdict_facts.no_verdict_reason(not_run) == "not run yet"
    assert facts.runs_text([old, pruned, not_run]) == "2 with results of 3"


# ------------------------------------------------------------------------------ malicious server


def malicious_spec(attack: str = "rtf", defense: str = "none", clients: int | None = None):
    """LeNet at 32 px on 8 fashion-mnist images under the malicious server (a closed form:
    one pass, about a second)."""
    from auditlib.models import ModelSpec
    from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

    return RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (1, 32, 32), init="uniform")),
        data=DataSpec("samples", "fashion-mnist", batch_size=8),
        scenario=ScenarioSpec(server="malicious", secure_aggregation=clients),
        attack=ComponentSpec.of(attack, preset="audit"),
        defense=ComponentSpec.of(defense),
        budget=Budget(iterations=1),
    )


def ran(tmp_path: Path, spec, name: str) -> ReportEntry:
    """``spec`` really run, stored as a completed run, read back as a report entry."""
    from auditlib.engine.audit import run_audit

    summary = run_audit(spec, lpips_nets=()).summary
    with Store(f"sqlite:///{tmp_path}/{name}.db") as store:
        run_id = store.create_run(spec.to_dict(), summary.spec_id, name)
        store.mark_running(run_id)
        store.finish(run_id, "completed", summary=summary)
        return run_subject(store, run_id).entries[0]


def test_a_server_that_changes_the_model_is_described_from_the_card_and_the_defense_report(
    tmp_path, old
):
    checked = ran(tmp_path, malicious_spec(defense="model-check"), "checked")
    assert facts_server.is_malicious(checked) and facts_server.clients_of(checked) is None
    found = facts_server.malicious_server([checked])
    assert found is not None and not found.attributes and found.checks
    (change,) = found.changes
    card = {k.item: k.detail for k in checked.result.verdict.scope.threat.knowledge}
    assert change.changed == card["active manipulation of the model or clients"]
    assert "brightness" in change.changed  # rtf's imprint block, in words
    assert change.noticeable == card["whether the client could have noticed"]
    assert change.aggregation is None and change.labels == ("checked",)
    (run,) = found.runs
    assert run.defense == "model-check" and run.attributed is None
    # rtf refused; rtf-evading and the learned disguise, in its place, passed (issue 54)
    assert run.model_check.startswith("flagged 1 of 3 models: model check: layer server_block")
    finding = checked.verdict.finding
    assert run.recovered == (
        f"{finding.images_recovered} of 8 images recovered beyond the best guess"
    )
    pairs = dict(facts.scenario_pairs(checked))
    assert pairs["Server"].startswith("malicious: it changes the model it sends")
    assert pairs["Secure aggregation"] == "off: the server sees the client's own update"
    assert facts_server.attacker_words(checked) == (
        "changed the model it sent, then ran",
        "the update of one client holding",
    )
    # An honest server's run (recorded before the threat model existed): no such section.
    assert facts_server.malicious_server([old]) is None and not facts_server.is_malicious(old)
    assert dict(facts.scenario_pairs(old))["Server"].startswith("honest-but-curious")


def test_loki_under_secure_aggregation_attributes_the_images_to_their_clients(tmp_path):
    entry = ran(tmp_path, malicious_spec("loki", clients=4), "loki")
    found = facts_server.malicious_server([entry])
    (change,) = found.changes
    # Under its heading "Secure aggregation", never "Secure aggregation secure aggregation"
    assert change.aggregation == "only the example-weighted sum of 4 clients' updates"
    (run,) = found.runs
    attributed = entry.result.attacks[0].images_attributed
    assert attributed is not None and found.attributes and not found.checks
    assert run.attributed == f"{attributed} of 8 images attributed to the client that held them"
    assert run.model_check is None
    pairs = dict(facts.scenario_pairs(entry))
    assert pairs["Secure aggregation"].startswith(
        "the server sees only the example-weighted sum of 4 clients' updates"
    )
    assert pairs["Server observes"].startswith("the example-weighted sum of 4 clients' gradients")
    assert (
        facts_server.attacker_words(entry)[1] == "the summed update of 4 clients holding, in all,"
    )
    # Read from the summary's recorded spec where the typed one is gone.
    unread = dataclasses.replace(entry, spec=None)
    assert facts_server.is_malicious(unread) and facts_server.clients_of(unread) == 4


def _twin_row(label: str, plain: float, twin: float):
    from auditlib.report.subject import RunRow

    values = {f.name: None for f in dataclasses.fields(RunRow)}
    values |= {"label": label, "series": "s", "status": "completed", "has_result": True}
    values |= {"finding": False, "plain_psnr": plain, "adaptive_psnr": twin}
    return RunRow(**values)


def test_the_stronger_of_a_twin_and_its_attack_reads_equal_where_they_print_alike():
    rows = [
        _twin_row("tie", 5.2801, 5.2799),  # 5.28 dB both: no finding either way
        _twin_row("twin", 5.28, 6.10),
        _twin_row("plain", 7.5, 6.1),
    ]
    stronger = {row[0]: row[3] for row in facts_results.twin_rows(rows)}
    assert stronger == {"tie": "equal", "twin": "knowing the defense", "plain": "plain"}


def _utility_row(label: str, series: str, accuracy: float, undefended: float, **more):
    values = {f.name: None for f in dataclasses.fields(RunRow)}
    values |= {"label": label, "series": series, "status": "completed", "has_result": True}
    values |= {"finding": False, "utility_accuracy": accuracy, "utility_chance": 0.117}
    values |= {"utility_undefended": undefended, **more}
    return RunRow(**values)


def test_a_defended_model_that_learns_nothing_is_no_usable_defense():
    """Issue 35: sigma = 1 left 9.8% accuracy, below chance (11.7%), yet read "Low". A
    defended model that does not clearly beat chance while the undefended one does is no
    usable defense, and the facts say so beside the verdict and under the cost table."""
    dead = _utility_row("sigma=1", "dp-gaussian", 0.098, 0.767)
    expected = (
        "the defended model learns nothing (accuracy 9.8%, chance 11.7%, 76.7% without the "
        "defense): this setting is not a usable defense"
    )
    assert learns_nothing(dead) == expected
    assert "The defended model learns nothing (accuracy 9.8%" in facts.utility_words(dead)
    assert facts_results.cost_notes([dead]) == [f"sigma=1: {expected}"]
    # Within LEARNED_MARGIN (5 points) of chance is not learning either.
    assert learns_nothing(_utility_row("s", "dp-gaussian", 0.117 + 0.049, 0.767))
    # Not flagged: a model that learns under the defense, the undefended run itself, and a
    # training in which the undefended model did not learn (the training failed, not the
    # defense: utility_caveat says so).
    assert learns_nothing(_utility_row("s", "dp-gaussian", 0.117 + 0.05, 0.767)) is None
    assert learns_nothing(_utility_row("none", "none", 0.098, 0.098)) is None
    assert learns_nothing(_utility_row("s", "dp-gaussian", 0.098, 0.12)) is None
    assert learns_nothing(_utility_row("s", "dp-gaussian", 0.098, None)) is None


def test_epsilon_is_printed_one_way_and_a_large_one_is_said_to_guarantee_nothing():
    """Issue 35: one table printed 1.98e11 and 2.09e+03, and neither said what it meant."""
    assert [metric_text("epsilon", v) for v in (1.98e11, 2090.0, 1.98e5, 2.06e-5, 0.25)] == [
        "1.98e11",
        "2.09e3",
        "1.98e5",
        "2.06e-5",
        "0.25",
    ]
    assert metric_text("epsilon", 999.7) == "1e3"  # .3g's own exponent, in the one form
    assert EPSILON_NOTE.startswith(f"an ε above {MEANINGFUL_EPSILON:g} gives no meaningful")
    assert EPSILON_NOTE in CATALOGUE["epsilon"].definition
    huge = _utility_row("sigma=0.1", "dp-gaussian", 0.7, 0.767, epsilon=1.98e11)
    small = _utility_row("sigma=10", "dp-gaussian", 0.6, 0.767, epsilon=2.5)
    assert facts_results.cost_notes([small]) == []
    assert facts_results.cost_notes([small, huge]) == [EPSILON_NOTE]
    assert "ε = 1.98e11 (above 10: no meaningful formal guarantee)" in facts.utility_words(huge)
    assert "above 10" not in facts.utility_words(small)


def test_the_cost_tables_times_are_one_quantity_each_in_every_row():
    """Issue 35: "Time" claimed the whole run while the undefended row held its attack
    alone. Now two columns, each the same quantity in every row, said in the caption."""
    rows = [
        _utility_row("none", "none", 0.767, 0.767, seconds=54.7, utility_seconds=20.04),
        _utility_row("sigma=1", "dp-gaussian", 0.5, 0.767, seconds=112.3, utility_seconds=21.0),
    ]
    columns = {c.key: c for c in facts_results.cost_columns(rows)}
    assert columns["attack_s"].head == "Attack s" and columns["attack_s"].cells == ("54.7", "112.3")
    assert columns["training_s"].head == "Training s"
    assert columns["training_s"].cells == ("20.0", "21.0")
    assert "Attack s: the wall time of all the attacks" in facts_results.TIME_COLUMNS_NOTE
    assert "Training s: the wall time of the utility training" in facts_results.TIME_COLUMNS_NOTE
