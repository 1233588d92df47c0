"""Checks a run passes before anything is recorded or started, wherever it comes from (the
CLI, the dashboard's worker): what would otherwise fail in the middle of the run in
torch's words; and what the run will take on this machine (``estimate_time``: a few of
its attacks' real steps, measured)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the measuring imports torch and the attacks: only when it runs
    from auditlib.engine.pace import AttackPace


def smallest_forward_batch(spec) -> int | None:
    """The fewest images one forward of the client's update takes: the smallest client's
    share under secure aggregation (``engine.releases.client_batches`` splits in order, as
    evenly as they go), then its smallest local mini-batch. None while the batch size is
    unknown (a folder's images, counted when they are read)."""
    batch = spec.data.batch_size
    if batch is None:
        return None
    share = batch // spec.scenario.clients
    slices = spec.scenario.protocol.minibatch_slices(share)
    return min(len(range(*s.indices(share))) for s in slices)


def check_model_trains(spec) -> None:
    """Refuse, before any run, a model whose training-mode BatchNorm cannot take the
    client's batch (one image whose feature map shrinks to 1x1): torch would fail in the
    middle of the run with its own words. Built only where that can happen."""
    from auditlib.models import build_model
    from auditlib.models.registry import MAX_SIDE
    from auditlib.models.shapes import check_training_batch

    model_spec = spec.model.spec
    if spec.model.trusted_archive is not None or not model_spec.info.has_batchnorm:
        return
    if spec.scenario.protocol.batchnorm_mode != "train" or smallest_forward_batch(spec) != 1:
        return
    model = build_model(model_spec)
    check_training_batch(model, model_spec.input_shape, 1, MAX_SIDE)


@dataclass(frozen=True)
class TimeEstimate:
    """What a run's attacks will take on this machine: each attack that will run, with its
    pace measured on a few of its real steps (``engine.pace``), and the run's budget."""

    paces: tuple[AttackPace, ...]
    budget_s: float | None  # the run's time budget (None: none)
    measuring_s: float  # what the measurement took, victim and release included
    # Planned attacks not measured for their cost (servers built to pass a model check,
    # ``pace.unmeasured``): said beside the estimate, not counted in it.
    unmeasured: tuple[str, ...] = ()
    # The attacks will run at once (``engine.at_once``, where asked for): measured one at a time,
    # the estimate then counts them one after another, which the run need not take.
    at_once: bool = False
    # Planned attacks that refused once they ran (``pace.measure_paces``), in words: the run
    # skips them too.
    refused: tuple[str, ...] = ()

    @property
    def planned_steps(self) -> int:
        """The steps of the attacks that will run: the "of N" of the run's progress."""
        return sum(p.planned_steps for p in self.paces)

    def _pool_s(self, adaptive: bool) -> float:
        return sum(p.seconds for p in self.paces if p.adaptive == adaptive)

    @property
    def unbounded_s(self) -> float:
        """Every planned step at its measured pace."""
        return sum(p.seconds for p in self.paces)

    @property
    def expected_s(self) -> float:
        """What the attacks will take: the plain attacks and the twins each stop at the
        budget (each pool has a budget of its own: ``attack_phase.attack_call``)."""
        pools = [self._pool_s(False), self._pool_s(True)]
        if self.budget_s is None:
            return sum(pools)
        return sum(min(pool, self.budget_s) for pool in pools)

    @property
    def needed_budget_s(self) -> float:
        """The budget that lets every planned step run."""
        return max(self._pool_s(False), self._pool_s(True))

    @property
    def fits(self) -> bool:
        return self.budget_s is None or self.needed_budget_s <= self.budget_s

    @property
    def steps_in_budget(self) -> int:
        """About how many steps run before the budget stops them: each pool's attacks in
        turn, each with an equal share of what is left (what one leaves passes on)."""
        if self.budget_s is None:
            return self.planned_steps
        done = 0
        for adaptive in (False, True):
            pool = [p for p in self.paces if p.adaptive == adaptive]
            left = self.budget_s
            for k, pace in enumerate(pool):
                used = min(pace.seconds, left / (len(pool) - k))
                stepping = max(used - pace.setup_s, 0.0)
                done += pace.planned_steps if used >= pace.seconds else pace.steps_within(stepping)
                left -= used
        return done

    def words(self) -> str:
        """'measured here on a few real steps: dlg 0.094 s a step, so the 480 planned steps
        take about 45 s; the time budget of 30 s stops the attack after about 319 of them:
        a budget of at least 46 s would let it finish'."""
        if not self.paces:
            why = f": {'; '.join(self.refused)}" if self.refused else ""
            return f"none of the planned attacks will run here{why}"
        paces = ", ".join(pace_words(p) for p in self.paces)
        text = (
            f"measured here on a few real steps: {paces}, so the "
            f"{count_words(self.planned_steps, 'planned step')} "
            f"take{'s' if self.planned_steps == 1 else ''} about "
            f"{duration_words(self.unbounded_s)}"
        )
        if self.at_once:
            text += (
                " one attack after another; the attacks will run at once on this device, "
                "sharing it, so the run may take less"
            )
        if any(p.lbfgs for p in self.paces):  # each L-BFGS step timed at its full evaluations
            text += "; an L-BFGS step ends early once its start has converged, so it may take less"
        if not self.fits and self.at_once:  # the steps at once in a budget: unmeasured
            text += (
                f"; the time budget of {self.budget_s:g} s may stop them first (each attack "
                "may use all of it)"
            )
        elif not self.fits:
            text += (
                f"; the time budget of {self.budget_s:g} s stops the attack after about "
                f"{self.steps_in_budget:,} of them: a budget of at least "
                f"{math.ceil(self.needed_budget_s):,} s would let it finish"
            )
        if self.unmeasured:
            text += (
                f"; not counted: {', '.join(self.unmeasured)}, the servers built to pass the "
                "model check, each building its own model first (the learned disguise trains "
                "for about a minute a model the first time)"
            )
        if self.refused:
            text += f"; will not run: {'; '.join(self.refused)}"
        return text


def pace_words(pace: AttackPace) -> str:
    """'dlg 0.038 s a step with its 8 starts stepping together, 0.13 s with the 1 its race
    keeps', 'rtf 0.3 s (one pass)', 'ig 0.001 s a step after 6.0 s of compiling'."""
    if pace.planned_steps == 1:
        return f"{pace.label} {pace.step_s:.2g} s (one pass)"
    text = f"{pace.label} {pace.step_s:.2g} s a step"
    first, last = (pace.race[0], pace.race[-1]) if pace.race else (None, None)
    if first is not None and last.starts < first.starts:
        text += (
            f" with its {first.starts} starts stepping together, "
            f"{last.step_s / last.starts:.2g} s with the {last.starts} its race keeps"
        )
    if pace.setup_s:
        text += f" after {duration_words(pace.setup_s)} of compiling"
    return text


def count_words(count: int, noun: str) -> str:
    """'1 planned step', '480 planned steps'."""
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def duration_words(seconds: float) -> str:
    """'0.4 s', '45 s', '17 min', '3.2 h'."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_time(spec, assets=None, emit_every: int = 10) -> TimeEstimate | None:
    """A few real steps of each attack the run will run, measured on its model, batch,
    release and device exactly as the run makes them (``engine.pace``), before it starts;
    ``emit_every``: the run's event interval, which places a race's rungs and so its
    planned steps (the dashboard's 5: 475 for DLG's audit preset; the CLI's 10: 480).
    None for a trusted archive or a model class of the user's own code (its model runs in
    a process of its own); no paces where none of the planned attacks will run. Raises
    ``AuditInputError`` where the run itself would be refused (its images, its model)."""
    from auditlib.engine.attack_phase import runs_at_once
    from auditlib.engine.audit import prepare_run
    from auditlib.engine.isolation import runs_own_code
    from auditlib.engine.pace import measure_paces, unmeasured

    if runs_own_code(spec):
        return None
    started = time.perf_counter()
    check_model_trains(spec)  # refused in words, as the run is, not in torch's mid-step
    prepared = prepare_run(spec, assets=assets, emit_every=emit_every)
    paces, refused = measure_paces(prepared)
    at_once = runs_at_once(prepared.planned, prepared.rounds.for_attack)
    return TimeEstimate(
        paces,
        spec.budget.max_seconds,
        time.perf_counter() - started,
        unmeasured(prepared),
        at_once,
        refused,
    )
