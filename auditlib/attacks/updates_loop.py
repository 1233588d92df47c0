"""The restart loop of several updates advancing together: one clock, one batched step, a
race per update.

``attacks.loop.run_restarts`` runs one update's restarts; here U updates' R restarts each
are the U x R positions of one :class:`~auditlib.attacks.loop.Restarts` (position u R + r is
update u's restart r), stepped as one batched computation whose every row is its own
objective (``attacks.updates``). What each update would get alone it gets here:

- its starts: update u's restarts draw from the generators it would draw from alone (one
  stream seeded with its seed, in turn; raced, ``start_seed`` of its seed per start);
- its race: at each rung each update drops the worse share of its own running restarts by
  its own objective, never another update's (an update is not judged against the others);
- its steps: every running restart of every update takes every step (lockstep), so the
  step budget is each update's own and a time budget, one clock for all of them, cuts
  every update at the same step: none is starved while another runs on.

Each update ends with its own final event (its candidates and the attacker's pick among
them), as ``run_restarts`` ends one run.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

import torch

from auditlib.attacks.base import Clock, ProgressEvent, RunControl, final_event
from auditlib.attacks.loop import (
    READ_BACK_EVERY,
    MakeRestarts,
    StepInterrupted,
    read_losses,
    start_seed,
    total_steps,
)
from auditlib.reconstruction import EAGER, Candidate, Stepped


def generators_of(seeds: Sequence[int], restarts: int, raced: bool) -> list[torch.Generator]:
    """Each position's generator: update u's restarts draw as they would alone (one stream
    per update, used in turn; raced, a seed per start)."""
    drawn: list[torch.Generator] = []
    for seed in seeds:
        if raced:
            drawn += [torch.Generator().manual_seed(start_seed(seed, r)) for r in range(restarts)]
        else:
            drawn += [torch.Generator().manual_seed(seed)] * restarts
    return drawn


def run_updates(
    make: MakeRestarts,
    restarts: int,
    control: RunControl,
    seeds: Sequence[int],
    loss_name: str,
    label_inferences: Sequence[Mapping | None],
) -> Iterator[tuple[int, ProgressEvent]]:
    """Run ``len(seeds)`` updates' ``restarts`` restarts each as one group made by ``make``;
    yields (update, event), each update's steps counted as its own run counts them, and
    last one final event per update."""
    updates = len(seeds)
    clock = Clock(control)
    race = control.race if restarts > 1 else None
    total = total_steps(restarts, race, control.max_steps, control.emit_every)
    group = make(generators_of(seeds, restarts, race is not None), clock)
    owner = [p // restarts for p in range(updates * restarts)]
    alive = list(range(updates * restarts))
    steps = [0] * len(alive)
    objective = [math.inf] * len(alive)
    finished: dict[int, Candidate] = {}
    step = 0

    def of(u: int) -> list[int]:
        return [p for p in alive if owner[p] == u]

    def finish(position: int, reason: str) -> None:
        images, labels, score = group.candidate(position)
        restart = position % restarts
        finished[position] = Candidate(images, labels, score, restart, steps[position], reason)
        alive.remove(position)

    def event(u: int, position: int, losses, images=None, labels=None) -> tuple:
        done = sum(steps[p] for p in range(u * restarts, (u + 1) * restarts))
        shown = ProgressEvent(
            done, total, clock.elapsed, losses, position % restarts, images, labels
        )
        return u, shown

    for position in list(alive):
        images, labels = group.frame(position)
        yield event(owner[position], position, {}, images, labels)

    def read_back(pending: list[tuple[int, Mapping[str, torch.Tensor]]]) -> None:
        read = read_losses(pending, alive)
        pending.clear()
        for position, value in read.objective.items():
            objective[position] = value
        for position, at in read.diverged.items():
            steps[position] = at
            finish(position, "diverged")

    def advance(until: int) -> Iterator[tuple[int, ProgressEvent]]:
        nonlocal step
        pending: list[tuple[int, Mapping[str, torch.Tensor]]] = []  # steps not read back yet
        while alive and step < until:
            reason = clock.stop_reason()
            if reason is not None:
                read_back(pending)
                for position in list(alive):
                    finish(position, reason)
                return
            running = list(alive)
            try:
                losses = {k: v.detach() for k, v in group.step(running).items()}
            except StepInterrupted as stop:
                read_back(pending)
                for position in list(alive):
                    finish(position, stop.reason)
                return
            step += 1
            for position in running:
                steps[position] = step
            pending.append((step, losses))
            emit = step % control.emit_every == 0 or step == control.max_steps
            if not (emit or step >= until or len(pending) >= READ_BACK_EVERY):
                continue
            read_back(pending)
            if not emit:
                continue
            live = [(i, p) for i, p in enumerate(running) if p in alive]
            with_images = step % control.image_every == 0 or step == control.max_steps
            losses = {k: v.cpu() for k, v in losses.items()}  # this step's, read back above
            # One frame per update and image step: its leader's by its own objective.
            leaders = {}
            for _, position in live:
                u = owner[position]
                if u not in leaders or objective[position] < objective[leaders[u]]:
                    leaders[u] = position
            for index, position in live:
                shown = with_images and leaders[owner[position]] == position
                images, labels = group.frame(position) if shown else (None, None)
                values = {k: float(v[index]) for k, v in losses.items()}
                yield event(owner[position], position, values, images, labels)

    def stopped() -> bool:
        return (
            any(c.stop_reason in {"cancelled", "time budget"} for c in finished.values())
            or control.is_cancelled()
        )

    if race is not None:
        for rung in race.rung_steps(control.max_steps, control.emit_every):
            yield from advance(rung)
            if stopped():
                break
            for u in range(updates):  # each update's race among its own restarts
                ranked = sorted(of(u), key=lambda p: objective[p])
                for position in ranked[race.survivors(len(ranked)) :]:
                    finish(position, f"dropped at step {step} (behind in the race)")
    if not stopped():
        yield from advance(control.max_steps)
    for position in list(alive):
        done = step >= control.max_steps
        finish(position, "completed" if done else clock.stop_reason() or "time budget")

    for u in range(updates):
        positions = range(u * restarts, (u + 1) * restarts)
        candidates = [finished[p] for p in positions]
        if control.is_cancelled():
            stop = "cancelled"
        elif any(c.stop_reason == "time budget" for c in candidates):
            stop = "time budget"
        else:
            stop = "completed"
        done = sum(steps[p] for p in positions)
        # Several updates' rows are one eager batched step: a recorded graph holds one
        # update's (the attacks' ``why_updates_apart`` keeps traced runs apart).
        yield (
            u,
            final_event(
                candidates, stop, done, total, clock, label_inferences[u], loss_name, Stepped(EAGER)
            ),
        )
