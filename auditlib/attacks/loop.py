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
objective stops being finite is dropped as diverged at the first step it did, and the
others go on.

No step waits for the device: the losses stay there until the loop reads them back, in one
transfer, at each event, at each rung, at the end and at least every ``READ_BACK_EVERY``
steps (:func:`read_losses`); a diverged restart found there took its steps since the read
for nothing (each restart is its own rows: its values never enter another's).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from auditlib.attacks.base import Clock, ProgressEvent, RunControl, final_event
from auditlib.attacks.objectives import random_images, random_label_logits
from auditlib.attacks.race import PLAN, HalvingPlan
from auditlib.reconstruction import Candidate
from auditlib.threat import AttackerKnowledge

# ``PLAN`` and ``HalvingPlan`` live in ``race.py``; importers of ``attacks.loop`` keep them.
__all__ = [
    "PLAN",
    "READ_BACK_EVERY",
    "HalvingPlan",
    "MakeRestarts",
    "ReadLosses",
    "Restarts",
    "StepInterrupted",
    "read_losses",
    "run_restarts",
    "stacked",
    "stacked_starts",
    "start_seed",
    "total_steps",
]


# Losses stay on the device between reads (no host synchronisation in a step): they are
# read back at each event, at each rung of a race, at the end, and at least this often.
READ_BACK_EVERY = 32


@dataclass(frozen=True)
class ReadLosses:
    """Steps' losses read back together (:func:`read_losses`)."""

    objective: dict[int, float]  # position -> its objective at the last step read
    diverged: dict[int, int]  # position -> the first step at which it stopped being finite


def read_losses(
    pending: Sequence[tuple[int, Mapping[str, torch.Tensor]]], positions: Sequence[int]
) -> ReadLosses:
    """The losses of the ``pending`` (step, losses) since the last read, in one transfer.
    Each step's losses list ``positions`` in order (the running restarts: they change only
    when restarts finish, which happens at reads); the first loss is the objective. A
    restart whose objective stopped being finite diverged at the first step it did; its
    steps after that, taken before this read, are not counted."""
    if not pending:
        return ReadLosses({}, {})
    first = next(iter(pending[0][1]))
    values = torch.stack([losses[first] for _, losses in pending]).cpu()
    objective, diverged = {}, {}
    for index, position in enumerate(positions):
        column = values[:, index]
        finite = torch.isfinite(column)
        if bool(finite.all()):
            objective[position] = float(column[-1])
        else:
            diverged[position] = pending[int((~finite).nonzero()[0])][0]
    return ReadLosses(objective, diverged)


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

    def read_back(group: _Group, pending: list[tuple[int, Mapping[str, torch.Tensor]]]) -> None:
        read = read_losses(pending, group.alive)
        pending.clear()
        for position, value in read.objective.items():
            objective[group.ids[position]] = value
        for position, step in read.diverged.items():
            steps[group.ids[position]] = step
            finish(group, position, "diverged")

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
        pending: list[tuple[int, Mapping[str, torch.Tensor]]] = []  # steps not read back yet
        while group.alive and group.step < until:
            reason = clock.stop_reason()
            if reason is not None:
                read_back(group, pending)
                for position in list(group.alive):
                    finish(group, position, reason)
                return
            alive = list(group.alive)
            try:
                losses = {k: v.detach() for k, v in group.restarts.step(alive).items()}
            except StepInterrupted as stop:
                read_back(group, pending)
                for position in list(group.alive):
                    finish(group, position, stop.reason)
                return
            group.step += 1
            for position in alive:
                steps[group.ids[position]] = group.step
            pending.append((group.step, losses))
            # The first step is told at once: a slow attack's page shows it moving long
            # before its tenth step (issue 52: "step 0" for 15 s on a ResNet-18).
            emit = (
                group.step == 1
                or group.step % control.emit_every == 0
                or group.step == control.max_steps
            )
            due = emit or group.step >= until or len(pending) >= READ_BACK_EVERY
            if not due:
                continue
            read_back(group, pending)
            live = [(i, p) for i, p in enumerate(alive) if p in group.alive]
            if not emit or not live:
                continue
            with_images = group.step % control.image_every == 0 or group.step == control.max_steps
            # Restarts that advance together share one frame per image step: the leader's by
            # the attack's own objective (the live view follows the restart it would pick).
            leader = min(live, key=lambda ip: objective[group.ids[ip[1]]])[1]
            shown = {k: v.cpu() for k, v in losses.items()}  # this step's, read back above
            for index, position in live:
                images, labels = (
                    group.restarts.frame(position)
                    if with_images and position == leader
                    else (None, None)
                )
                yield ProgressEvent(
                    sum(steps),
                    total,
                    clock.elapsed,
                    {k: float(v[index]) for k, v in shown.items()},
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


def stacked_starts(
    knowledge: AttackerKnowledge, generators: Sequence[torch.Generator], labelled: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each start's dummy images, then its label logits unless the labels are fixed
    (``labelled``), drawn in turn from its generator as a start alone draws them, stacked
    one row per start (each a leaf to optimise)."""
    images, logits = [], []
    for generator in generators:
        images.append(random_images(knowledge, generator))
        if not labelled:
            logits.append(random_label_logits(knowledge, generator))
    return stacked(images), stacked(logits) if logits else None
