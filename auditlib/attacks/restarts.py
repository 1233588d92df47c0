"""The restart schedule of an attack's preset: raced under the audit preset, one after
another (the papers' way) otherwise.

Gradient inversion depends on its random start: DLG's L-BFGS stalls at its first step or
settles in a poor minimum on about one photograph in four (docs/REPRODUCTION.md), and the
batch attacks' restarts differ by several dB. Running restarts to the end one after another
spends the budget on whichever start came first. Under the audit preset ``restarts``
starts race instead (``attacks.loop``): every start runs a few steps, the worse half by
the attack's own objective is dropped at each rung, and the survivors run on to the full
step budget. The attacker's pick stays the lowest objective over every candidate (dropped
ones included), never the ground truth.

Under a time budget, more steps per start than the preset plans never plan a weaker attack
than the preset's (:func:`run_attack`): the run's steps per start are planned from what the
clock allows, the preset's count first, then a longer plan with the time that leaves.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from auditlib.attacks.base import AttackInfo, ProgressEvent, RunControl
from auditlib.attacks.loop import PLAN, HalvingPlan, total_steps
from auditlib.attacks.updates import why_updates_apart
from auditlib.reconstruction import Reconstruction
from auditlib.threat import AttackerKnowledge, Observation

AUDIT_PRESET = "audit"


def race_of(config: Any, preset: str | None) -> HalvingPlan | None:
    """The race an attack's restarts run (the audit preset's, with more than one start), or
    None: they run one after another, each to the full step budget."""
    if preset == AUDIT_PRESET and getattr(config, "restarts", 1) > 1:
        return PLAN
    return None


def planned_steps(config: Any, preset: str | None, iterations: int, every: int) -> int:
    """Steps over all restarts of the attack if none stops early, as :func:`run_attack`'s
    loop counts them (``iterations`` per start, events every ``every`` steps)."""
    return total_steps(getattr(config, "restarts", 1), race_of(config, preset), iterations, every)


def run_attack(
    info: AttackInfo,
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: Any,
    control: RunControl,
    seed: int,
    preset: str | None,
) -> Iterator[ProgressEvent]:
    """An attack with its preset's restart schedule.

    Under a time budget with more steps per start than the preset plans (``preset_steps``),
    the steps are planned from the clock (:func:`staged`): a longer plan stretches the
    attack's step-size schedule and the race's rungs over steps the clock may never reach
    (Inverting Gradients' step-size drops at 3/8, 5/8, 7/8 of the steps, the race's rungs at
    3 %, 10 %, 25 %), so fewer starts finish and none is refined: weaker than the preset's
    plan on the same clock."""
    race = race_of(config, preset)
    if race is not None:
        control = dataclasses.replace(control, race=race)
    reference = _clock_plans(info, preset, control)
    if reference is None:
        return info.run(observation, knowledge, config, control, seed)
    return staged(info, observation, knowledge, config, control, seed, reference)


def _clock_plans(info: AttackInfo, preset: str | None, control: RunControl) -> int | None:
    """The preset's steps per start where the run is planned from the clock (a time budget,
    more steps asked than the preset plans); None: the steps asked are run as they are."""
    reference = preset_steps(info, preset)
    if control.max_seconds is None or reference is None or control.max_steps <= reference:
        return None
    return reference


def preset_steps(info: AttackInfo, preset: str | None) -> int | None:
    """The steps per start ``preset`` plans (the audit preset's, or the paper's for the
    paper's preset); None: a closed form, or a preset without a count of its own."""
    if info.closed_form:
        return None
    if preset == AUDIT_PRESET and info.audit is not None:
        return info.audit.iterations
    if preset is not None and preset.startswith("paper"):
        return info.paper_iterations
    return None


def staged(
    info: AttackInfo,
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: Any,
    control: RunControl,
    seed: int,
    reference: int,
) -> Iterator[ProgressEvent]:
    """The attack planned from the clock, for more steps per start (``control.max_steps``)
    than its preset's ``reference``: first the preset's plan (``reference`` steps per
    start, its schedule and race), then, with the time it leaves, the same starts (same
    seed) planned for the most steps per start up to ``control.max_steps`` whose race the
    first plan's pace fits in that time. The attacker's pick is the lowest objective over
    both plans' candidates, so it is never worse by its own objective than the preset's
    plan on the same clock. The stop reason is "completed" only where every start had its
    planned steps; "time budget" where the clock cut them short of ``control.max_steps``."""

    def one(planned: RunControl) -> Iterator[tuple[int, ProgressEvent]]:
        return ((0, e) for e in info.run(observation, knowledge, config, planned, seed))

    return (event for _, event in _staged(one, config, control, reference))


def _staged(
    run: Callable[[RunControl], Iterator[tuple[int, ProgressEvent]]],
    config: Any,
    control: RunControl,
    reference: int,
) -> Iterator[tuple[int, ProgressEvent]]:
    """:func:`staged` for ``run``'s updates (one, or several in lockstep: one clock, every
    update at the same step), (update, event) pairs, each update's final event last."""
    began = time.perf_counter()
    first_plan = _Finals()  # held: each update's final event comes last
    for k, event in run(_planned(control, reference)):
        if first_plan.keep(k, event):
            yield k, event
    elapsed = time.perf_counter() - began
    left = control.max_seconds - elapsed  # type: ignore[operator]
    # In lockstep every update takes every step: the seconds per step are the joint ones.
    steps = max(final.steps for _, final in first_plan.values())
    horizon = _affordable(config, control, reference, elapsed / max(steps, 1), left)
    stopped = any(f.stop_reason in {"time budget", "cancelled"} for _, f in first_plan.values())
    if stopped or horizon is None:
        for k, (event, first) in first_plan.items():
            yield k, _merged(event, first, None, began, control.max_steps > reference)
        return
    second_plan = _Finals()
    for k, event in run(_planned(control, horizon, left)):
        if second_plan.keep(k, event):
            done = first_plan[k][1].steps
            yield (
                k,
                dataclasses.replace(
                    event,
                    step=done + event.step,
                    total_steps=done + event.total_steps,
                    elapsed_s=elapsed + event.elapsed_s,
                ),
            )
    short = horizon < control.max_steps
    for k, (event, second) in second_plan.items():
        yield k, _merged(event, first_plan[k][1], second, began, short)


class _Finals(dict[int, tuple[ProgressEvent, Reconstruction]]):
    """Each update's final event and its reconstruction, held until both plans ran."""

    def keep(self, update: int, event: ProgressEvent) -> bool:
        """Holds ``event`` if it is final; True where it is a step's, to be passed on."""
        if event.final is None:
            return True
        self[update] = (event, event.final)
        return False


def _planned(control: RunControl, steps: int, seconds: float | None = None) -> RunControl:
    return dataclasses.replace(
        control, max_steps=steps, max_seconds=control.max_seconds if seconds is None else seconds
    )


def _affordable(
    config: Any, control: RunControl, reference: int, pace: float, left: float
) -> int | None:
    """The most steps per start, above ``reference`` and up to ``control.max_steps``, whose
    planned steps over all starts take at most ``left`` seconds at ``pace`` seconds a step
    (the first plan's, its setup included); None where no count above ``reference`` fits."""
    restarts = getattr(config, "restarts", 1)

    def cost(steps: int) -> float:
        return total_steps(restarts, control.race, steps, control.emit_every) * pace

    if left <= 0 or cost(reference + 1) > left:
        return None
    low, high = reference + 1, control.max_steps  # cost(low) fits; find the last that does
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if cost(middle) <= left else (low, middle - 1)
    return low


def _merged(
    event: ProgressEvent,
    first: Reconstruction,
    second: Reconstruction | None,
    began: float,
    short: bool,
) -> ProgressEvent:
    """The run's final event: both plans' candidates (the second's starts numbered after the
    first's), the attacker's pick by its own objective among them; "time budget" where the
    starts had fewer steps than asked (``short``)."""
    candidates = first.candidates
    steps = first.steps
    stop = first.stop_reason
    stepped = first.stepped
    if second is not None:
        offset = 1 + max(c.restart for c in first.candidates)
        candidates += tuple(
            dataclasses.replace(c, restart=c.restart + offset) for c in second.candidates
        )
        steps += second.steps
        stop = second.stop_reason
        if stepped is not None and second.stepped is not None:
            stepped = stepped.then(second.stepped)
    if short and stop == "completed":
        stop = "time budget"
    final = Reconstruction(candidates, stop, steps, first.label_inference, stepped)
    best = final.selected
    return dataclasses.replace(
        event,
        step=steps,
        total_steps=max(steps, event.total_steps),
        elapsed_s=time.perf_counter() - began,
        losses={name: best.loss for name in event.losses},
        restart=best.restart,
        images=best.images,
        labels=best.labels,
        final=final,
    )


def why_apart(
    info: AttackInfo,
    config: Any,
    knowledges: Sequence[AttackerKnowledge],
    preset: str | None = None,
) -> str | None:
    """Why these updates run this attack one after another rather than together (None: they
    can advance together, ``run_attack_updates``, with ``preset``'s restart schedule)."""
    if info.run_updates is None:
        return f"{info.name} has no batched form across updates"
    if not getattr(config, "together", True):
        return f"{info.name} was asked to run its starts apart (together=false)"
    raced = race_of(config, preset) is not None
    own = None if info.why_updates_apart is None else info.why_updates_apart(config, raced)
    if own is not None:
        return own
    return why_updates_apart(knowledges)


def run_attack_updates(
    info: AttackInfo,
    observations: Sequence[Observation],
    knowledges: Sequence[AttackerKnowledge],
    config: Any,
    control: RunControl,
    seeds: Sequence[int],
    preset: str | None,
) -> Iterator[tuple[int, ProgressEvent]]:
    """Several updates' runs of one attack together, each with its preset's restart schedule
    (each update its own race): (update, event) pairs, one final event per update. Under a
    time budget with more steps per start than the preset plans, planned from the clock as
    one run is (:func:`staged`), the updates' one clock and lockstep kept."""
    race = race_of(config, preset)
    if race is not None:
        control = dataclasses.replace(control, race=race)
    assert info.run_updates is not None
    run_updates = info.run_updates

    def together(planned: RunControl) -> Iterator[tuple[int, ProgressEvent]]:
        return run_updates(observations, knowledges, config, planned, seeds)

    reference = _clock_plans(info, preset, control)
    if reference is None:
        return together(control)
    return _staged(together, config, control, reference)


def restart_schedule(config: Any, preset: str | None) -> str:
    restarts = getattr(config, "restarts", 1)
    if restarts <= 1:
        return "one start"
    race = race_of(config, preset)
    if race is not None:
        return f"{restarts} starts, {race.describe()}"
    return f"{restarts} starts, each to the full step budget"
