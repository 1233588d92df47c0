"""What a run will take on this machine, said before it starts (``engine.preflight``'s
``estimate_time``): a few real steps of the run's own attacks measured on its model, batch
and device, scaled by the planned steps (the count its progress shows); the budget that
would let it finish."""

from __future__ import annotations

import dataclasses
import json
import math
import time
import types
from pathlib import Path

from auditlib.attacks import ProgressEvent, RunControl
from auditlib.attacks.race import PLAN
from auditlib.cli import main
from auditlib.engine import pace
from auditlib.engine.attack_phase import plan_attacks
from auditlib.engine.audit import AuditResult, iter_audit
from auditlib.engine.pace import AttackPace, CountPace, running_counts
from auditlib.engine.preflight import TimeEstimate, duration_words, estimate_time
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

EXAMPLES = Path(__file__).resolve().parents[1] / "assets" / "example-images"


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


def test_the_words_say_the_measured_pace_the_time_and_the_budget_that_would_let_it_finish():
    """Issue 35: a ResNet-18 at 224 px stopped at step 3 of 475 after its 120 s budget, with
    no word beforehand; issue 52: the words are a measured pace, not a lower bound."""
    slow = TimeEstimate((AttackPace("dlg", False, 300, 12.0),), budget_s=120.0, measuring_s=30.0)
    assert slow.unbounded_s == 3600.0 and slow.expected_s == 120.0 and not slow.fits
    assert slow.steps_in_budget == 10 and slow.planned_steps == 300
    assert slow.words() == (
        "measured here on a few real steps: dlg 12 s a step, so the 300 planned steps take "
        "about 60 min; the time budget of 120 s stops the attack after about 10 of them: a "
        "budget of at least 3,600 s would let it finish"
    )
    quick = TimeEstimate((AttackPace("dlg", False, 300, 0.05),), budget_s=120.0, measuring_s=1.0)
    assert quick.fits and quick.words().endswith("so the 300 planned steps take about 15 s")
    one = TimeEstimate((AttackPace("rtf", False, 1, 0.3),), budget_s=None, measuring_s=1.0)
    assert one.words() == (
        "measured here on a few real steps: rtf 0.3 s (one pass), so the 1 planned step takes "
        "about 0.3 s"
    )
    assert [duration_words(s) for s in (0.42, 45, 1000, 4 * 3600)] == [
        "0.4 s",
        "45 s",
        "17 min",
        "4.0 h",
    ]


def test_a_compiled_step_is_estimated_with_its_compiling_once_per_count_of_starts():
    compiled = TimeEstimate(
        (AttackPace("ig (audit preset)", False, 2320, 0.001, setup_s=6.0),),
        budget_s=7.0,
        measuring_s=3.0,
    )
    assert compiled.unbounded_s == 6.0 + 2.32 and not compiled.fits
    assert compiled.steps_in_budget == 1000  # the budget's first 6 s go to compiling
    assert compiled.words().startswith(
        "measured here on a few real steps: ig (audit preset) 0.001 s a step after 6.0 s of "
        "compiling, so the 2,320 planned steps take about 8.3 s"
    )
    planned = plan_attacks(ComponentSpec.of("ig", {"compiled": "true"}, preset="audit"), 300)
    assert running_counts(planned[0], 300, 10) == [4, 2, 1]  # the audit preset's race of 4
    # 20 steps on a grid of 10: the three rungs fall on one event, one drop (4 -> 2).
    assert running_counts(planned[0], 20, 10) == [4, 2]
    paper = plan_attacks(ComponentSpec.of("ig", {"compiled": "true"}, preset="paper"), 300)
    assert running_counts(paper[0], 300, 10) == [1]


@dataclasses.dataclass(frozen=True)
class _RacedCompiledStep:
    """A compiled step's events as a race of 4 starts makes them: its first step at each
    count of starts (4, then 2 after step 1, then 1 after step 3) traces first, for
    ``trace_s``; a step takes ``step_s`` (its batch at once)."""

    control: RunControl
    trace_s: float
    step_s: float = 0.01
    attack: object = dataclasses.field(
        default_factory=lambda: types.SimpleNamespace(config=types.SimpleNamespace(compiled=True))
    )

    def events(self):
        for restart in range(4):
            yield ProgressEvent(0, 40, 0.0, {}, restart=restart)
        done, traced = 0, set()
        for step in range(12):
            count = 4 if step < 1 else 2 if step < 3 else 1
            time.sleep(self.step_s + (self.trace_s if count not in traced else 0.0))
            traced.add(count)
            done += count
            yield ProgressEvent(done, 40, 0.0, {})


def test_a_compiled_step_is_timed_on_steps_that_did_not_trace_however_long_tracing_takes(
    monkeypatch,
):
    """A race's rungs in a short run's first steps each trace a new count of starts: on a
    loaded 2-core machine IG's traces on LeNet took about 40 s each, the probe's time ran
    out on retraced steps only, and the estimate said 18 s a step with no compiling. A step
    at a new count is the count's tracing, not a step: the pace is the others'."""
    monkeypatch.setattr(pace, "COMPILED_PROBE_S", 0.2)  # shorter than one trace here
    step_s, setup_s, together = pace._step_seconds(_RacedCompiledStep(RunControl(40), trace_s=0.5))
    assert together == 4  # its first step's starts
    assert step_s < 0.05  # a step of 2 starts: 0.005 s a start (a retraced one: 0.25)
    assert 0.4 < setup_s < 2.0  # the first trace: 0.5 s


def test_a_race_is_estimated_count_by_count_of_its_running_starts():
    """The audit preset races 8 starts that step together, then 4, 2 and 1: LeNet DLG's
    batched step of 8 starts took 0.30 s here and of 1 start 0.13 s, so a pace measured in
    the race's first steps (0.038 s a start) said 18 s for a run of 35 s. Each count is
    timed (the first and the last measured, those between interpolated), and a budget
    reaches as far as those counts' steps take it."""
    race = (CountPace(8, 10, 0.32), CountPace(4, 20, 0.3), CountPace(2, 50, 0.24))
    raced = AttackPace(
        "dlg (audit preset)", False, 480, 0.04, race=(*race, CountPace(1, 220, 0.12))
    )
    assert raced.seconds == 3.2 + 6.0 + 12.0 + 26.4
    # 10 s: the 8 starts' 10 steps (3.2 s), the 4 starts' 20 (6 s), 3 steps of 2 starts.
    assert raced.steps_within(10.0) == 80 + 80 + 6 and raced.steps_within(100.0) == 480
    estimate = TimeEstimate((dataclasses.replace(raced, lbfgs=True),), 30.0, measuring_s=3.0)
    assert estimate.steps_in_budget == 80 + 80 + 100 + int((30 - 21.2) / 0.12)
    assert estimate.words() == (
        "measured here on a few real steps: dlg (audit preset) 0.04 s a step with its 8 starts "
        "stepping together, 0.12 s with the 1 its race keeps, so the 480 planned steps take "
        "about 48 s; an L-BFGS step ends early once its start has converged, so it may take "
        "less; the time budget of 30 s stops the attack after about 333 of them: a budget of "
        "at least 48 s would let it finish"
    )


def test_the_race_s_counts_are_measured_at_its_first_and_its_last():
    """On LeNet a batched step of 8 starts costs far less than 8 of one (its kernels are
    small): a step of the race's last start costs several times a start's share of the
    first count's step, and less than all of it. Starts that step apart cost the same each,
    and are timed as one pace."""
    raced = estimate_time(
        dataclasses.replace(spec(), attack=ComponentSpec.of("dlg", preset="audit"))
    )
    assert raced is not None
    (pace,) = raced.paces
    assert pace.lbfgs and [(c.starts, c.steps) for c in pace.race] == PLAN.schedule(8, 300, 10)
    assert sum(c.starts * c.steps for c in pace.race) == pace.planned_steps == 480
    first, last = pace.race[0], pace.race[-1]
    assert first.step_s == 8 * pace.step_s
    # One start's step: dearer than its share of the first's, cheaper than all of it
    # (measured: 2.5-3.4 times the share, a third of the whole).
    assert 1.5 * pace.step_s < last.step_s < first.step_s, (last.step_s, pace.step_s)
    for count in pace.race:  # 4 and 2 starts: linear in the count between those measured
        share = (count.starts - 1) / 7
        assert math.isclose(count.step_s, last.step_s + share * (first.step_s - last.step_s))
    apart = estimate_time(
        dataclasses.replace(
            spec(), attack=ComponentSpec.of("dlg", {"together": "false"}, preset="audit")
        )
    )
    assert apart is not None and apart.paces[0].race == ()
    assert apart.paces[0].planned_steps == 480


@dataclasses.dataclass(frozen=True)
class _ShortRace:
    """An eager race of 4 starts in a short run, its rungs within the probe's steps: 3
    steps of 4 starts, then 2 of 2 and 3 of 1, quick ones (their starts have converged)."""

    control: RunControl
    attack: object = dataclasses.field(
        default_factory=lambda: types.SimpleNamespace(config=types.SimpleNamespace())
    )

    def events(self):
        for restart in range(4):
            yield ProgressEvent(0, 40, 0.0, {}, restart=restart)
        done = 0
        for count in (4, 4, 4, 2, 2, 1, 1, 1):
            time.sleep(0.04 if count == 4 else 0.002)
            done += count
            yield ProgressEvent(done, 40, 0.0, {})


def test_a_race_s_first_count_is_timed_on_its_own_steps_where_a_short_run_drops_starts():
    """LeNet DLG at 40 steps: its race drops starts at steps 2, 4 and 10, within the probe,
    and its starts converge soon after (an L-BFGS step of 2 starts then took 8 ms against
    220 ms for 4), so the steps' median said 0.011 s a step of 8 starts where one took 0.034
    s. The first count's pace is its own steps'."""
    step_s, _, together = pace._step_seconds(_ShortRace(RunControl(40)))
    assert together == 4
    assert step_s >= 0.01, step_s  # a start's share of 0.04 s; the later steps' 0.001-0.002


def test_the_twins_have_a_budget_of_their_own():
    """The plain attacks and the attacker that knows the defense each stop at the budget
    (``attack_phase.attack_call``): a defended run may take twice it."""
    paces = (AttackPace("dlg", False, 300, 0.1), AttackPace("dlg (knows)", True, 300, 0.1))
    estimate = TimeEstimate(paces, budget_s=20.0, measuring_s=1.0)
    assert estimate.planned_steps == 600 and estimate.unbounded_s == 60.0
    assert estimate.expected_s == 40.0 and estimate.steps_in_budget == 400
    assert estimate.needed_budget_s == 30.0 and not estimate.fits


def test_attacks_that_will_run_at_once_are_estimated_as_measured_one_after_another():
    """Where the attacks run at once (``engine.at_once``, asked for): their paces, measured one at a
    time, add up to what one after another would take, which the words say; what a budget
    lets them make at once is not measured, so no count of steps is promised."""
    paces = (AttackPace("dlg", False, 480, 0.5), AttackPace("ig", False, 350, 0.1))
    estimate = TimeEstimate(paces, budget_s=60.0, measuring_s=1.0, at_once=True)
    assert estimate.words() == (
        "measured here on a few real steps: dlg 0.5 s a step, ig 0.1 s a step, so the 830 "
        "planned steps take about 5 min one attack after another; the attacks will run at "
        "once on this device, sharing it, so the run may take less; the time budget of 60 s "
        "may stop them first (each attack may use all of it)"
    )
    apart = TimeEstimate(paces, budget_s=None, measuring_s=1.0)
    assert apart.words().endswith("so the 830 planned steps take about 5 min")


def test_an_attack_that_refuses_once_it_runs_is_named_with_its_reason_not_estimated():
    """An attack refused only once it runs (here ``captured=true`` on the CPU) is skipped
    by the run and said beside the estimate; where no planned attack runs, the estimate says
    that and why, not that the model runs elsewhere."""
    asked = dataclasses.replace(
        spec(), attack=ComponentSpec.of("ig", {"captured": "true"}, preset="audit")
    )
    estimate = estimate_time(asked)
    assert estimate is not None and estimate.paces == ()
    assert estimate.words() == (
        "none of the planned attacks will run here: ig cannot record its step as a CUDA graph "
        "here: a CUDA graph needs a CUDA device (this run is on cpu)"
    )
    paces = (AttackPace("dlg", False, 300, 0.05),)
    beside = TimeEstimate(paces, None, 1.0, refused=("grnn cannot compile its step here",))
    assert beside.words().endswith(
        "take about 15 s; will not run: grnn cannot compile its step here"
    )


def test_the_estimate_times_the_attacks_own_steps_not_one_loss_evaluation():
    """Issue 52: LeNet DLG was said to take "at least 2 s" and took 44.7 s: an L-BFGS step
    evaluates the loss up to ``lbfgs_max_iter`` times. The pace is measured on the attack's
    own steps, so twenty evaluations a step cost several times one."""
    full = estimate_time(spec())
    one = estimate_time(
        dataclasses.replace(spec(), attack=ComponentSpec.of("dlg", {"lbfgs_max_iter": 1}))
    )
    assert full is not None and one is not None
    (full_pace,), (one_pace,) = full.paces, one.paces
    assert full_pace.label == "dlg" and full_pace.planned_steps == 300
    assert full_pace.step_s > 4 * one_pace.step_s, (full_pace.step_s, one_pace.step_s)


def test_one_planned_step_count_the_estimate_the_progress_and_the_result_share():
    """Issue 52: one run read 300 iterations, 480 planned and "step 40 of 475". The
    estimate's count is the progress's "of N" and the result's planned steps, twins
    included where they run and left out where they do not."""
    for run_spec in (
        dataclasses.replace(spec(), budget=Budget(6)),
        dataclasses.replace(
            spec(),
            attack=ComponentSpec.of("ig"),
            defense=ComponentSpec.of("prune"),
            budget=Budget(6),
        ),
    ):
        estimate = estimate_time(run_spec)
        totals, result = set(), None
        for item in iter_audit(run_spec, lpips_nets=()):
            if isinstance(item, ProgressEvent):
                totals.add(item.total_steps)
            elif isinstance(item, AuditResult):
                result = item
        assert estimate is not None and result is not None
        assert totals == {estimate.planned_steps}
        assert result.summary.timing.planned_iterations == estimate.planned_steps


def test_a_closed_form_and_a_folder_of_unknown_size_are_estimated_too():
    """A malicious server's one pass is measured like any step; a folder's images are
    counted where the run counts them (the CLI's common case: no --batch-size)."""
    malicious = dataclasses.replace(
        spec(batch=4),
        attack=ComponentSpec.of("rtf"),
        scenario=dataclasses.replace(ScenarioSpec(), server="malicious"),
    )
    estimate = estimate_time(malicious)
    assert estimate is not None and estimate.planned_steps == 1
    assert estimate.paces[0].step_s > 0
    folder = dataclasses.replace(spec(), data=DataSpec("folder", str(EXAMPLES)))
    started = time.perf_counter()
    estimate = estimate_time(folder)
    assert estimate is not None and estimate.planned_steps == 300
    assert time.perf_counter() - started < 30  # cheap: a few steps, not the run


def test_the_cli_prints_the_estimate_for_a_folder_without_a_batch_size(tmp_path, capsys):
    args = ["audit", "--model", "lenet", "--images", str(EXAMPLES), "--attack", "dlg"]
    assert main([*args, "--iterations", "2", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    # The count the run itself plans (the audit preset races its starts: 2 steps each).
    planned = json.loads((tmp_path / "out" / "result.json").read_text())["timing"]
    assert "estimate: measured here on a few real steps: dlg (audit preset) " in err
    assert f"so the {planned['planned_iterations']} planned steps take about" in err


def test_the_cli_estimates_a_defended_runs_control_first_and_a_samples_update(tmp_path, capsys):
    """A defended audit runs its control first (the same attack without the defense): the
    estimate measures both, each with the planned steps its own run counts. A sample's is
    one update's, and says so."""
    args = ["audit", "--model", "lenet", "--samples", "photographs", "--attack", "dlg"]
    args += ["--iterations", "2", "--lpips-nets", "none"]
    assert main([*args, "--defense", "prune", "--out", str(tmp_path / "one")]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("estimate: ")]
    planned = json.loads((tmp_path / "one" / "result.json").read_text())["timing"]
    control, run = lines
    # The control: DLG's 8 starts, 2 steps each; the run: its attacker that knows the
    # defense beside it.
    assert control.startswith("estimate: the control first: measured here on a few real")
    assert "so the 16 planned steps take about" in control
    assert run.startswith("estimate: then the run: measured here on a few real steps: dlg")
    assert f"so the {planned['planned_iterations']} planned steps take about" in run
    assert main([*args, "--updates", "2", "--out", str(tmp_path / "sample")]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("estimate: ")]
    assert lines[0].startswith("estimate: for one update of the 2 (each is a full audit")
    assert "so the 16 planned steps take about" in lines[1] and len(lines) == 2
