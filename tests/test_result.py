"""The typed audit result: one JSON form, every stored shape readable, newer ones refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditlib.engine.audit import run_audit
from auditlib.errors import AuditInputError
from auditlib.metrics.catalogue import CATALOGUE, RECONSTRUCTION_METRICS
from auditlib.models import ModelSpec
from auditlib.result import SCHEMA_VERSION, AuditSummary, UtilityRecord
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

FIXTURES = Path(__file__).parent / "fixtures" / "results"


def stored(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def test_the_first_stored_shape_opens_with_what_it_lacks_as_none():
    """Written by commit 766bdbe: no guesses, no risk, no RDLV, no verdict, no attack list."""
    data = stored("result_766bdbe.json")
    result = AuditSummary.from_json(data)
    assert result.metrics.psnr_mean == data["metrics"]["psnr_mean"]
    assert result.metrics.ssim_mean == data["metrics"]["ssim_mean"]
    assert result.metrics.risk is None and result.metrics.guesses is None
    assert result.metrics.rdlv_mean is None
    assert result.metrics.why_unavailable("lpips") == "LPIPS-alex not requested"
    assert result.verdict is None and result.attacks == () and result.utility is None
    assert result.timing.iterations == data["timing"]["iterations"]
    assert result.timing.planned_iterations is None  # not recorded then
    assert [p.name for p in result.metrics.per_image] == data["victim"]["data"]["names"]


def test_the_shape_before_verdicts_opens_with_its_risk_and_guesses():
    data = stored("result_9555ea9_parent.json")
    result = AuditSummary.from_json(data)
    assert result.verdict is None and result.attacks == ()
    assert result.metrics.risk.images_recovered == 0
    assert result.metrics.risk.psnr_rate_at(20.0) == 0.0
    assert [g.name for g in result.metrics.guesses] == [
        "grey",
        "data mean image",
        "data mean colour",
    ]
    assert result.defense_report.epsilon is None
    assert "pruning" in result.defense_report.epsilon_unavailable_reason
    assert result.defense_report.update_norm_after < result.defense_report.update_norm_before


def test_a_fresh_result_round_trips_through_its_json():
    spec = RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 16, 16), init="uniform")),
        data=DataSpec("samples", "photographs", batch_size=2),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("ig"),
        defense=ComponentSpec.of("prune", {"ratio": 0.5}),
        budget=Budget(3),
        seed=2,
    )
    summary = run_audit(spec, lpips_nets=()).summary
    data = json.loads(json.dumps(summary.to_json()))
    assert data["schema"] == SCHEMA_VERSION
    assert AuditSummary.from_json(data) == summary
    assert summary.verdict is not None and len(summary.attacks) == 2  # plain and adaptive
    assert summary.metrics.risk is not None


def test_a_result_of_a_newer_schema_is_refused_not_misread():
    data = stored("result_9555ea9_parent.json") | {"schema": SCHEMA_VERSION + 1}
    with pytest.raises(AuditInputError, match=f"schema {SCHEMA_VERSION + 1}.*upgrade"):
        AuditSummary.from_json(data)


@pytest.mark.parametrize(
    "bad", [[], {"spec_id": "x"}, {**stored("result_766bdbe.json"), "timing": 3}]
)
def test_what_is_not_a_result_is_refused_with_a_clear_message(bad):
    with pytest.raises(AuditInputError, match="result"):
        AuditSummary.from_json(bad)


def test_a_utility_record_of_an_older_run_reads_its_missing_fields_as_unknown():
    rounds = [
        {"round": 0, "accuracy": 0.1, "macro_f1": 0.02, "train_loss": None, "seconds": 0.0},
        {"round": 1, "accuracy": 0.4, "macro_f1": 0.3, "train_loss": 1.2, "seconds": 2.0},
    ]
    record = UtilityRecord.from_json(
        {
            "dataset": "fashion-mnist",
            "train_examples": 200,
            "test_examples": 100,
            "federation": {"clients": 2, "rounds": 1},
            "rounds": rounds,
            "accuracy": 0.4,
            "macro_f1": 0.3,
            "seconds": 2.5,
        }
    )
    assert record.rounds_completed == 1 and record.initial_accuracy == 0.1
    assert record.chance_accuracy is None and record.learned is None
    assert record.federation.clients == 2


def test_the_catalogue_reads_every_reconstruction_metric_of_a_result():
    result = AuditSummary.from_json(stored("result_9555ea9_parent.json"))
    for info in RECONSTRUCTION_METRICS:
        value = result.metrics.mean(info.key)
        assert value is not None or result.metrics.why_unavailable(info.key), info.key
    assert CATALOGUE["psnr"].text(result.metrics.psnr_mean) == "6.47"
    assert CATALOGUE["label_accuracy"].text(0.5) == "50%"
    assert CATALOGUE["lpips"].text(None) == "n/a"
    assert CATALOGUE["epsilon"].text(2.06e-5) == "2.06e-5"
    assert CATALOGUE["psnr"].heading == "PSNR (dB)"
