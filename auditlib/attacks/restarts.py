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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from auditlib.attacks.base import AttackInfo, ProgressEvent, RunControl
from auditlib.attacks.loop import PLAN, HalvingPlan, total_steps
from auditlib.attacks.updates import why_updates_apart
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
    """An attack with its preset's restart schedule."""
    race = race_of(config, preset)
    if race is not None:
        control = dataclasses.replace(control, race=race)
    return info.run(observation, knowledge, config, control, seed)


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
    (each update its own race): (update, event) pairs, one final event per update."""
    race = race_of(config, preset)
    if race is not None:
        control = dataclasses.replace(control, race=race)
    return info.run_updates(observations, knowledges, config, control, seeds)


def restart_schedule(config: Any, preset: str | None) -> str:
    restarts = getattr(config, "restarts", 1)
    if restarts <= 1:
        return "one start"
    race = race_of(config, preset)
    if race is not None:
        return f"{restarts} starts, {race.describe()}"
    return f"{restarts} starts, each to the full step budget"
