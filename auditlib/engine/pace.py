"""What a run's attacks take per step on this machine, measured before the run starts
(``engine.preflight.estimate_time``): a few real steps of each planned attack that will run
(its own step: L-BFGS with its line search, Adam, ...; its restarts, its race), on the
run's model, batch, release and device, after the victim and the server's release are made
exactly as the run makes them (``engine.audit.prepare_run``).

A formula over one loss evaluation was off by 20x either way (issue 52): an L-BFGS step
evaluates the loss up to 20 times, a batched restart costs what its rows cost, a closed form
costs what reading the block back costs. Only running the step says what it takes.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace

from auditlib.attacks.compiled import fresh_traces
from auditlib.attacks.restarts import race_of
from auditlib.engine.attack_phase import AttackCall, attack_call, steps_that_run
from auditlib.errors import AttackUnsupportedError

# Steps timed per attack after its first (which pays for allocations later ones do not);
# an attack whose steps are slow is timed on fewer, never on more than PROBE_S seconds
# past its first step. The median step counts: on a shared machine a burst of others' work
# can make one step 30 times its usual time (measured: 1.8 s against 0.06 s for LeNet DLG).
PROBE_STEPS = 6
PROBE_S = 2.0
# A compiled step traces again when a race changes its count of starts (a rung in the first
# steps of a short run): a step at a new count is not timed as a step (``_step_paces``). Its
# steps are timed for up to COMPILED_PROBE_S past its first once one step is timed, and for
# no longer than COMPILED_PROBE_CAP_S in all: on a loaded 2-core machine each trace of IG on
# LeNet took about 40 s, so that 60 s held only retraced steps (an 18 s "step" estimated).
COMPILED_PROBE_S = 60.0
COMPILED_PROBE_CAP_S = 600.0
# A first step is let run this long before it is cut and timed by its evaluations instead:
# a batched L-BFGS step evaluates fewer starts as they settle, so 20 times its first
# evaluations overstates it (3x on LeNet DLG's 8 starts).
FIRST_STEP_S = 6.0


@dataclass(frozen=True)
class CountPace:
    """A race's steps at one count of running starts that step together: the batched steps
    it runs (each a step of every running start) and the seconds of one."""

    starts: int
    steps: int
    step_s: float


@dataclass(frozen=True)
class AttackPace:
    """One planned attack's measured pace: seconds per step (the run's steps: every
    restart's step counts), or per pass for a closed form (one step)."""

    label: str
    adaptive: bool  # a twin: its time comes from the twins' own budget (``attack_call``)
    planned_steps: int
    step_s: float  # with all its starts running (a race's first steps)
    # Paid once before the steps: a compiled step's tracing, once per count of running
    # starts (``attacks.compiled``); 0 for an eager step.
    setup_s: float = 0.0
    # A race of starts that step together, count by count (``_race_paces``): a step's cost
    # per start changes with its count (measured: LeNet DLG's batched step of 8 starts
    # 0.30 s, of 1 start 0.13 s). () where every step costs ``step_s``.
    race: tuple[CountPace, ...] = ()
    # An L-BFGS step, timed at its first steps' loss evaluations: one whose start has
    # converged ends early, so the run can take less (measured: LeNet DLG's audit preset
    # from PyTorch's default initialisation took a fifth of its estimate, from the DLG
    # paper's uniform one two thirds: docs/PERFORMANCE.md).
    lbfgs: bool = False

    @property
    def seconds(self) -> float:
        if self.race:
            return self.setup_s + sum(c.steps * c.step_s for c in self.race)
        return self.setup_s + self.planned_steps * self.step_s

    def steps_within(self, seconds: float) -> int:
        """About how many of the planned steps ``seconds`` of stepping make."""
        if not self.race:
            return min(self.planned_steps, int(seconds / self.step_s))
        done = 0
        for count in self.race:
            batched = min(count.steps, int(seconds / count.step_s))
            done += batched * count.starts
            seconds -= batched * count.step_s
            if batched < count.steps:
                break
        return done


def unmeasured(prepared) -> tuple[str, ...]:
    """The planned attacks ``measure_paces`` leaves out for their cost: the servers built to
    pass a model check (``twins.with_evading``)."""
    return tuple(a.name for a in prepared.planned if a.twin_of is not None)


def measure_paces(prepared) -> tuple[tuple[AttackPace, ...], tuple[str, ...]]:
    """Each planned attack of ``prepared`` (an ``engine.audit.PreparedRun``) that will run,
    with its pace; attacks that will not run (do not apply, a twin that is its plain
    attack's result undone) are left out, as the run's step count leaves them out
    (``attack_phase.steps_that_run``). Then why each attack refused only once it ran
    (``captured=true`` off CUDA), in words: the run skips them too."""
    planned = prepared.planned
    release_for = prepared.rounds.for_attack
    running = steps_that_run(planned, release_for)
    probe = replace(prepared.control, max_seconds=None, emit_every=1, image_every=10**9)
    paces, refused = [], []
    for index, attack in enumerate(planned):
        if not running[index] or attack.twin_of is not None:
            # A server built to pass the model check builds its model first (the learned
            # disguise trains for a minute): not built for an estimate (``unmeasured``).
            continue
        call = attack_call(
            index, planned, release_for, probe, prepared.attack_seed, {}, {False: 0.0, True: 0.0}
        )
        if not isinstance(call, AttackCall):
            continue
        try:
            with fresh_traces():  # the compiling a run's worker may pay, not a kept trace
                step_s, first_extra_s, together = _step_seconds(call)
                race = _race_paces(call, prepared.control, step_s, together)
        except AttackUnsupportedError as exc:  # found only once it runs: the run skips it
            words = str(exc)
            refused.append(words if words.startswith(attack.name) else f"{attack.label}: {words}")
            continue
        setup_s = 0.0
        if _compiled(call):  # the first step traced the step: again per count of starts
            control = prepared.control  # the run's: its rungs on the run's event grid
            shapes = running_counts(attack, control.max_steps, control.emit_every)
            setup_s = first_extra_s * len(shapes)
        lbfgs = getattr(attack.config, "lbfgs_max_iter", 1) > 1 and (
            getattr(attack.config, "optimizer", "lbfgs") == "lbfgs"
        )
        paces.append(
            AttackPace(
                attack.label, attack.adaptive, attack.planned_steps, step_s, setup_s, race, lbfgs
            )
        )
    return tuple(paces), tuple(refused)


def _race_paces(call: AttackCall, control, step_s: float, together: int) -> tuple[CountPace, ...]:
    """A race of starts that step together (the audit preset's), count by count of running
    starts (``HalvingPlan.schedule`` on the run's ``control``), each with the seconds of one
    batched step: measured with all the starts (``step_s`` a start, ``together`` of them)
    and, in a probe of its own, with the race's last count; a count between, linear in its
    count between those two (a step's cost is neither constant nor proportional in its
    starts: LeNet DLG's batched step of 8 starts took 2.0 to 2.4 times one start's, ResNet-18
    IG's of 4 at 32 px 5.5 to 6.4 times, on a 2-core CPU). A compiled step is timed at its
    first count only (another count traces again: tens of seconds on a CPU), so () for it,
    as where the starts step apart or there is one."""
    config = call.attack.config
    restarts = getattr(config, "restarts", 1)
    race = race_of(config, call.attack.preset)
    if race is None or restarts < 2 or together != restarts or _compiled(call):
        return ()
    schedule = race.schedule(restarts, control.max_steps, control.emit_every)
    least = schedule[-1][0]
    if least == restarts:  # no rung within the steps: every step at ``step_s``
        return ()
    first_s = step_s * restarts
    fewer = replace(call, attack=replace(call.attack, config=replace(config, restarts=least)))
    last_s = _step_seconds(fewer)[0] * least
    slope = (first_s - last_s) / (restarts - least)
    return tuple(
        CountPace(count, steps, last_s + slope * (count - least)) for count, steps in schedule
    )


def running_counts(attack, max_steps: int, every: int) -> list[int]:
    """The counts of starts a planned attack's step runs with, in turn (its race drops the
    worse share at each rung, on the run's event grid of ``every`` steps, where rungs that
    fall on one event are one): each is a shape a compiled step traces once."""
    restarts = getattr(attack.config, "restarts", 1)
    race = race_of(attack.config, attack.preset)
    if race is None:
        return [restarts]
    return sorted({count for count, _ in race.schedule(restarts, max_steps, every)}, reverse=True)


def _compiled(call: AttackCall) -> bool:
    return bool(getattr(call.attack.config, "compiled", False))


class _Watch:
    """The probe's ``is_cancelled``: notes each time the attack asks (before each step, and
    before every loss evaluation inside an L-BFGS step), and stops it once the first step
    outlasts FIRST_STEP_S after its restarts were made, with a few evaluations timed."""

    def __init__(self, cuts: bool = True) -> None:
        self.cuts = cuts  # False: a compiled step's first step (its tracing) runs whole
        self.calls: list[float] = []
        self.armed: float | None = None  # when the restarts were ready
        self.first = 0  # the first call after that
        self.stopped = False

    def arm(self, at: float) -> None:
        if self.armed is None:
            self.armed, self.first = at, len(self.calls)

    def __call__(self) -> bool:
        now = time.perf_counter()
        self.calls.append(now)
        timed = len(self.calls) - self.first
        slow = self.armed is not None and now - self.armed > FIRST_STEP_S
        if self.cuts and slow and timed >= 5:
            self.stopped = True
        return self.stopped

    def evaluation_s(self) -> float | None:
        """The median time between the attack's asks after its first step began, less the
        first two intervals: the loop's ask before the step to the step's first, and the
        first evaluation (which pays for allocations later ones do not)."""
        timed = self.calls[self.first :]
        gaps = sorted(b - a for a, b in itertools.pairwise(timed[2:]))
        return gaps[len(gaps) // 2] if gaps else None


def _step_seconds(call: AttackCall) -> tuple[float, float, int]:
    """Seconds per step of ``call``'s attack: the median of the steps timed after its first
    (or its first, from when its restarts were ready, where that is all that fits), what
    the first step took beyond that pace (a compiled step's tracing), and how many starts
    stepped together in its first step. Events come right after each step (every step here:
    ``emit_every`` 1), their ``step`` counting every restart's steps. A closed form runs its
    one pass whole. A step too slow to finish within PROBE_S (an L-BFGS step of 20 loss
    evaluations on a large model) is stopped after a few evaluations: its time is theirs
    times the evaluations a step makes (``lbfgs_max_iter``), over the restarts it advances.
    A compiled step's first step is its tracing: the steps after it are always timed."""
    compiled = _compiled(call)
    watch = _Watch(cuts=not compiled)
    events = replace(call, control=replace(call.control, is_cancelled=watch)).events()
    began = time.perf_counter()
    ready, together = began, 0  # when the restarts were made; how many advance together
    marks: list[tuple[int, float]] = []  # (steps done, when), one per distinct step count
    try:
        for event in events:
            now = time.perf_counter()
            if event.final is not None:
                if not watch.stopped and (not marks or marks[-1][0] < event.step):
                    marks.append((event.step, now))
                break
            if event.step == 0:  # a restart made, its first frame: no step yet
                together += not marks
                ready = now
                watch.arm(now)
                continue
            if not marks or marks[-1][0] != event.step:
                marks.append((event.step, now))
            # Enough steps timed, or the time spent; a first step slower than PROBE_S is
            # timed alone (its allocations included) rather than waiting for a second.
            if compiled:
                timed = len(_step_paces(marks, compiled))
                spent = timed and now - marks[0][1] > COMPILED_PROBE_S
                done = timed >= PROBE_STEPS or spent or now - began > COMPILED_PROBE_CAP_S
            else:
                slow_first = len(marks) == 1 and now - ready > PROBE_S
                done = len(marks) > PROBE_STEPS or now - marks[0][1] > PROBE_S or slow_first
            if done:
                break
    finally:
        events.close()  # the attack stops here; nothing of it is kept
    if len(marks) >= 2:
        # Only retraced steps timed (the cap reached, or the attack ended first): theirs.
        # Eager, the steps of all the starts: a short run's race drops some within the
        # probe, and a step of fewer starts is another count's (``_race_paces``).
        first = None if compiled else _step_paces(marks, False, together)
        paces = sorted(first or _step_paces(marks, compiled) or _step_paces(marks, False))
        pace = paces[(len(paces) - 1) // 2]  # the lower median: bursts only ever add time
        return pace, max(marks[0][1] - ready - marks[0][0] * pace, 0.0), together
    if marks:  # one step (a closed form's pass, or one slow step)
        return (marks[0][1] - ready) / marks[0][0], 0.0, together
    evaluation = watch.evaluation_s()
    if evaluation is None:  # stopped before any evaluation was timed: all it took
        return time.perf_counter() - ready, 0.0, together
    per_step = getattr(call.attack.config, "lbfgs_max_iter", 1)
    return evaluation * per_step / max(together, 1), 0.0, together


def _step_paces(
    marks: list[tuple[int, float]], compiled: bool, starts: int | None = None
) -> list[float]:
    """Seconds per step between consecutive ``marks`` (steps done over every start, when),
    one batched step apart. For a compiled step, only the steps run at the count of starts
    of the step before: a step at a new count (its steps done rose by another count: a
    race's rung) traced that count first, which ``setup_s`` counts, not the pace.
    ``starts``: only the steps of that many starts."""
    counts = [marks[0][0]] + [b[0] - a[0] for a, b in itertools.pairwise(marks)]
    return [
        (b[1] - a[1]) / (b[0] - a[0])
        for k, (a, b) in enumerate(itertools.pairwise(marks))
        if (not compiled or counts[k + 1] == counts[k])
        and (starts is None or counts[k + 1] == starts)
    ]
