"""Restarts raced by successive halving: the restart schedule of every attack's audit preset.

Gradient inversion depends on its random start: DLG's L-BFGS stalls at its first step or
settles in a poor minimum on about one photograph in four (docs/REPRODUCTION.md), and the
batch attacks' restarts differ by several dB. Running restarts one after another spends
the budget on whichever start came first. Here ``restarts`` starts race instead: every
start runs a few steps, the worse half by the attack's own objective is dropped at each
rung, and the survivors run on to the full step budget. The attacker's pick stays the
lowest objective over every candidate (dropped ones included), never the ground truth.

The race drives any attack through its ordinary contract: each start is the attack's own
generator with ``restarts=1`` and a seed of its own, interleaved here; a start is dropped
through its cancellation flag, so it ends with its own final event and candidate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from auditlib.attacks.base import (
    AttackInfo,
    AttackRun,
    Candidate,
    Clock,
    ProgressEvent,
    Reconstruction,
    RunControl,
    final_event,
)
from auditlib.attacks.loop import PLAN, HalvingPlan, start_seed
from auditlib.threat import AttackerKnowledge, Observation

AUDIT_PRESET = "audit"


def _objective(event: ProgressEvent) -> float | None:
    """The attack's own objective: the first entry of an event's losses."""
    for value in event.losses.values():
        return float(value)
    return None


def run_halving(
    run: AttackRun,
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: Any,
    control: RunControl,
    seed: int,
    plan: HalvingPlan = PLAN,
) -> Iterator[ProgressEvent]:
    """Race ``config.restarts`` starts of ``run``; events are renumbered to the race's
    steps, and the last event carries every start's candidate."""
    starts = int(config.restarts)
    single = dataclasses.replace(config, restarts=1)
    clock = Clock(control)
    total = plan.planned_steps(starts, control.max_steps, control.emit_every)
    dropped = [False] * starts
    steps = [0] * starts
    objective = [math.inf] * starts
    finals: dict[int, Reconstruction] = {}
    loss_name = "objective"

    def expired() -> bool:
        return control.max_seconds is not None and clock.elapsed >= control.max_seconds

    def make(start: int) -> Iterator[ProgressEvent]:
        # One clock for the race: a start's own clock would begin at its first step.
        sub = RunControl(
            max_steps=control.max_steps,
            emit_every=control.emit_every,
            image_every=control.image_every,
            is_cancelled=lambda: control.is_cancelled() or dropped[start] or expired(),
        )
        return iter(run(observation, knowledge, single, sub, start_seed(seed, start)))

    runs = {start: make(start) for start in range(starts)}

    def advance(start: int, until: int) -> Iterator[ProgressEvent]:
        """Pull start's events until it reaches step ``until`` or ends."""
        nonlocal loss_name
        for event in runs[start]:
            if event.final is not None:
                finals[start] = event.final
                loss_name = next(iter(event.losses), loss_name)
                steps[start] = event.final.steps
                del runs[start]
                return
            steps[start] = event.step
            value = _objective(event)
            if value is not None:
                objective[start] = value if math.isfinite(value) else math.inf
            yield dataclasses.replace(event, step=sum(steps), total_steps=total, restart=start)
            if event.step >= until:
                return
        raise RuntimeError("an attack ended without its final event")

    for rung in plan.rung_steps(control.max_steps, control.emit_every):
        for start in sorted(runs):
            yield from advance(start, rung)
        if control.is_cancelled() or expired():
            break
        running = sorted(runs, key=lambda s: objective[s])
        for start in running[plan.survivors(len(running)) :]:
            dropped[start] = True
            yield from advance(start, control.max_steps)
    for start in sorted(runs):  # the survivors to the end (or to the budget's end)
        while start in runs:
            yield from advance(start, control.max_steps)

    candidates: list[Candidate] = []
    for start in range(starts):
        candidate = finals[start].candidates[0]
        reason = candidate.stop_reason
        if reason == "cancelled" and not control.is_cancelled():
            reason = (
                f"dropped at step {candidate.steps} (behind in the race)"
                if dropped[start]
                else "time budget"
            )
        candidates.append(dataclasses.replace(candidate, restart=start, stop_reason=reason))
    if control.is_cancelled():
        stop = "cancelled"
    elif any(c.stop_reason == "time budget" for c in candidates):
        stop = "time budget"
    else:
        stop = "completed"
    inference = dict(finals[0].label_inference or {}) or None
    yield final_event(candidates, stop, sum(steps), total, clock, inference, loss_name)


def run_attack(
    info: AttackInfo,
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: Any,
    control: RunControl,
    seed: int,
    preset: str | None,
) -> Iterator[ProgressEvent]:
    """An attack with its preset's restart schedule: raced under the audit preset, the
    attack's own sequential restarts otherwise (the papers' way)."""
    if preset == AUDIT_PRESET and getattr(config, "restarts", 1) > 1:
        if info.in_loop:  # attacks.loop races the restarts itself
            control = dataclasses.replace(control, race=PLAN)
        else:
            return run_halving(info.run, observation, knowledge, config, control, seed)
    return info.run(observation, knowledge, config, control, seed)


def restart_schedule(config: Any, preset: str | None) -> str:
    restarts = getattr(config, "restarts", 1)
    if restarts <= 1:
        return "one start"
    if preset == AUDIT_PRESET:
        return f"{restarts} starts, {PLAN.describe()}"
    return f"{restarts} starts one after another, each to the full step budget"
