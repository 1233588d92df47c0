"""What a run will take on this machine, said before it starts (``engine.preflight``'s
``estimate_time``): one evaluation of the attack's gradient-matching loss measured on the
run's model and batch, scaled by the planned steps; the budget that would let it finish."""

from __future__ import annotations

import dataclasses
import time

from auditlib.cli import main
from auditlib.engine.attack_phase import plan_attacks
from auditlib.engine.preflight import TimeEstimate, duration_words, estimate_time
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec


def spec(
    architecture: str = "lenet", side: int = 32, batch: int = 1, seconds: float | None = None
) -> RunSpec:
    return RunSpec(
        model=ModelRef(ModelSpec(architecture, 10, (3, side, side))),
        data=DataSpec("samples", "photographs", batch_size=batch),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(300, max_seconds=seconds),
    )


def test_the_words_say_the_least_time_and_the_budget_that_would_let_it_finish():
    """Issue 35: a ResNet-18 at 224 px stopped at step 3 of 475 after its 120 s budget,
    with no word beforehand that it needed hours."""
    slow = TimeEstimate(evaluation_s=12.0, planned_steps=300, budget_s=120.0)
    assert slow.at_least_s == 3600.0 and not slow.fits
    assert slow.words() == (
        "one evaluation of the attack's gradient-matching loss takes 12 s on this machine, so "
        "the 300 planned steps take at least 60 min; the time budget of 120 s stops the "
        "attack after at most about 10 of them: a budget of at least 3,600 s would let it "
        "finish"
    )
    quick = TimeEstimate(evaluation_s=0.05, planned_steps=300, budget_s=120.0)
    assert quick.fits and quick.words().endswith("take at least 15 s")
    assert [duration_words(s) for s in (45, 1000, 4 * 3600)] == ["45 s", "17 min", "4.0 h"]


def test_the_estimate_is_measured_on_the_runs_model_and_counts_its_planned_steps():
    started = time.perf_counter()
    small = estimate_time(spec(seconds=60.0))
    spent = time.perf_counter() - started
    # One evaluation, timed within the call (which also built the model and warmed up).
    assert small is not None and 0 < small.evaluation_s < spent and small.budget_s == 60.0
    planned = plan_attacks(ComponentSpec.of("dlg"), 300)
    assert small.planned_steps == sum(p.planned_steps for p in planned)
    assert small.at_least_s == small.evaluation_s * small.planned_steps
    # Under a defense each attack runs beside its twin that knows the defense: twice.
    noised = dataclasses.replace(spec(), defense=ComponentSpec.of("prune"))
    assert estimate_time(noised).planned_steps == 2 * small.planned_steps
    # Nothing to estimate for a closed form (one pass).
    malicious = dataclasses.replace(
        spec(),
        attack=ComponentSpec.of("rtf"),
        scenario=dataclasses.replace(ScenarioSpec(), server="malicious"),
    )
    assert estimate_time(malicious) is None


def test_the_cli_prints_the_estimate_before_the_run(tmp_path, capsys):
    args = ["audit", "--model", "lenet", "--samples", "photographs", "--attack", "dlg"]
    assert main([*args, "--iterations", "2", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "estimate: one evaluation of the attack's gradient-matching loss takes" in err
    assert "planned steps take at least" in err
