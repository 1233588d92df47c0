"""The restart loop of the optimisation attacks: one clock, one budget, one way to stop.

An attack brings its restarts (:class:`Restarts`: its variables, optimiser and objective,
for one restart or for several that advance together) and the loop owns everything else:
the wall clock and the step budget, cancellation, progress events, which restarts are still
running, why each stopped, and the candidates the attacker picks from by its own loss.

Restarts advance together when the attack's objective allows it (``together``): R
restarts are then one batched computation (``UpdateMatcher.together``, ``torch.func.vmap``
over the restarts) whose every slice is that restart's own objective, so each restart ends
where it would alone, up to float summation order. Restarts draw their starts in turn from
one generator seeded with the run's seed, so restart r starts from the same draw whether
the restarts run one after another or together; raced restarts each draw from a seed of
their own (:func:`start_seed`; restart 0 keeps the run's seed).

A race (``RunControl.race``, the audit preset's schedule) drops the worse share of the
running restarts by the attack's objective at each rung of the step budget; a restart whose
objective stops being finite is dropped at once, and the others go on.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from auditlib.attacks.base import Clock, ProgressEvent, RunControl, final_event
from auditlib.attacks.race import PLAN, HalvingPlan
from auditlib.reconstruction import Candidate

# ``PLAN`` and ``HalvingPlan`` live in ``race.py``; importers of ``attacks.loop`` keep them.
__all__ = [
    "PLAN",
    "HalvingPlan",
    "MakeRestarts",
    "Restarts",
    "StepInterrupted",
    "run_restarts",
    "stacked",
    "start_seed",
    "total_steps",
]


def total_steps(restarts: int, race: HalvingPlan | None, max_steps: int, every: int) -> int:
    """Steps over all restarts if none stops early: ``restarts`` to ``max_steps`` each, or
    fewer where they race (a race needs more than one restart): the loop's
    ``ProgressEvent.total_steps``, and the engine's plan through
    ``attacks.restarts.planned_steps``."""
    if race is None or restarts <= 1:
        return restarts * max_steps
    return race.planned_steps(restarts, max_steps, every)


def start_seed(seed: int, start: int) -> int:
    """Restart 0 keeps the run's seed (so it is the single run of the same seed)."""
    if start == 0:
        return seed
    digest = hashlib.sha256(f"{seed}/restart/{start}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


class StepInterrupted(Exception):
    """Raised by a step cut short by the budget or a cancellation (a long L-BFGS step checks
    at every evaluation); the step does not count and the restarts keep their last state."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Restarts(Protocol):
    """One or more restarts of an attack that take their optimiser steps together.

    Positions index the restarts the group was made with; ``alive`` lists those still
    running (a dropped restart's variables may go on changing: they are never read again).
    """

    def step(self, alive: Sequence[int]) -> Mapping[str, torch.Tensor]:
        """One optimiser step of the ``alive`` restarts. Returns each loss as a 1-D tensor,
        one value per alive restart; the first is the attack's objective, which decides a
        race, and a restart whose objective is not finite has diverged."""

    def frame(self, position: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The restart's current images (model space, CPU) and hard labels; the loop asks
        for the frame of one restart per group and image step, its leader."""

    def candidate(self, position: int) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        """The restart's result: images, hard labels and its score (the attacker's pick is
        the lowest)."""


# Makes restarts from their generators (one per restart) and the run's clock.
MakeRestarts = Callable[[Sequence[torch.Generator], Clock], Restarts]


@dataclass
class _Group:
    restarts: Restarts | None
    ids: list[int]  # restart numbers, by position
    alive: list[int]  # positions still running
    step: int = 0


def run_restarts(
    make: MakeRestarts,
    restarts: int,
    together: bool,
    control: RunControl,
    seed: int,
    loss_name: str,
    label_inference: Mapping | None,
) -> Iterator[ProgressEvent]:
    """Run ``restarts`` restarts made by ``make`` (all in one group when ``together``,
    otherwise one group each), raced when ``control.race`` says so; the last event carries
    every restart's candidate."""
    clock = Clock(control)
    race = control.race if restarts > 1 else None
    total = total_steps(restarts, race, control.max_steps, control.emit_every)
    ids = list(range(restarts))
    groups = (
        [_Group(None, ids, list(range(restarts)))]
        if together
        else [_Group(None, [r], [0]) for r in ids]
    )
    # Restarts that run to the end draw in turn from one stream seeded with ``seed`` (the
    # papers' code, and so the same numbers apart or together); raced ones interleave, so
    # each draws from a seed of its own.
    stream = torch.Generator().manual_seed(seed) if race is None else None
    steps = [0] * restarts
    objective = [math.inf] * restarts
    finished: dict[int, Candidate] = {}

    def finish(group: _Group, position: int, reason: str) -> None:
        restart = group.ids[position]
        images, labels, score = group.restarts.candidate(position)
        finished[restart] = Candidate(images, labels, score, restart, steps[restart], reason)
        group.alive.remove(position)

    def advance(group: _Group, until: int) -> Iterator[ProgressEvent]:
        if group.restarts is None:  # made when it first runs: a restart never run costs nothing
            generators = (
                [stream] * len(group.ids)
                if stream is not None
                else [torch.Generator().manual_seed(start_seed(seed, r)) for r in group.ids]
            )
            group.restarts = make(generators, clock)
            for position in group.alive:
                images, labels = group.restarts.frame(position)
                yield ProgressEvent(
                    sum(steps), total, clock.elapsed, {}, group.ids[position], images, labels
                )
        while group.alive and group.step < until:
            reason = clock.stop_reason()
            if reason is not None:
                for position in list(group.alive):
                    finish(group, position, reason)
                return
            alive = list(group.alive)
            try:
                losses = {k: v.detach().cpu() for k, v in group.restarts.step(alive).items()}
            except StepInterrupted as stop:
                for position in alive:
                    finish(group, position, stop.reason)
                return
            group.step += 1
            first = next(iter(losses))
            # The first step is told at once: a slow attack's page shows it moving long
            # before its tenth step (issue 52: "step 0" for 15 s on a ResNet-18).
            emit = (
                group.step == 1
                or group.step % control.emit_every == 0
                or group.step == control.max_steps
            )
            with_images = group.step % control.image_every == 0 or group.step == control.max_steps
            live = []
            for index, position in enumerate(alive):
                restart = group.ids[position]
                steps[restart] = group.step
                value = float(losses[first][index])
                if not math.isfinite(value):
                    finish(group, position, "diverged")
                    continue
                objective[restart] = value
                live.append((index, position))
            if not emit or not live:
                continue
            # Restarts that advance together share one frame per image step: the leader's by
            # the attack's own objective (the live view follows the restart it would pick).
            leader = min(live, key=lambda ip: objective[group.ids[ip[1]]])[1]
            for index, position in live:
                shown = with_images and position == leader
                images, labels = group.restarts.frame(position) if shown else (None, None)
                yield ProgressEvent(
                    sum(steps),
                    total,
                    clock.elapsed,
                    {k: float(v[index]) for k, v in losses.items()},
                    group.ids[position],
                    images,
                    labels,
                )

    def running() -> list[tuple[_Group, int]]:
        return [(g, p) for g in groups for p in g.alive]

    def stopped() -> bool:
        return (
            any(c.stop_reason in {"cancelled", "time budget"} for c in finished.values())
            or control.is_cancelled()
        )

    if race is not None:
        for rung in race.rung_steps(control.max_steps, control.emit_every):
            for group in groups:
                yield from advance(group, rung)
            if stopped():
                break
            ranked = sorted(running(), key=lambda gp: objective[gp[0].ids[gp[1]]])
            for group, position in ranked[race.survivors(len(ranked)) :]:
                finish(group, position, f"dropped at step {group.step} (behind in the race)")
    for group in groups:
        if finished and stopped():  # the first restart always starts: a run has a candidate
            break
        yield from advance(group, control.max_steps)
    for group in groups:  # what a cancellation or the budget left running (if it ran at all)
        for position in list(group.alive) if group.restarts is not None else ():
            done = group.step >= control.max_steps
            finish(group, position, "completed" if done else clock.stop_reason() or "time budget")

    candidates = [finished[r] for r in sorted(finished)]
    if control.is_cancelled():
        stop = "cancelled"
    elif any(c.stop_reason == "time budget" for c in candidates):
        stop = "time budget"
    else:
        stop = "completed"
    yield final_event(candidates, stop, sum(steps), total, clock, label_inference, loss_name)


def stacked(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Restarts' variables stacked along a new first dimension, as one leaf to optimise."""
    return torch.stack([t.detach() for t in tensors]).requires_grad_(True)
