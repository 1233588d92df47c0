"""The L-BFGS restart loop shared by DLG and iDLG."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from auditlib.attacks.base import Clock, ProgressEvent, RunControl, snapshot


class _Interrupted(Exception):
    """Raised inside the closure so a budget or a cancellation stops a long L-BFGS step."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RestartOutcome:
    """Filled in by :func:`lbfgs_restart` when its generator finishes."""

    steps: int = 0
    evaluations: int = 0  # objective evaluations (an L-BFGS step makes up to max_iter)
    stop_reason: str = "completed"
    images: torch.Tensor | None = None  # the images of the last full step


def lbfgs_restart(
    variables: list[torch.Tensor],
    objective: Callable[[], torch.Tensor],
    images: torch.Tensor,
    current_labels: Callable[[], torch.Tensor | None],
    *,
    lr: float,
    max_iter: int,
    history_size: int,
    line_search: str | None,
    control: RunControl,
    clock: Clock,
    restart: int,
    step_offset: int,
    total_steps: int,
    outcome: RestartOutcome,
) -> Iterator[ProgressEvent]:
    """Minimise ``objective`` over ``variables`` for up to ``control.max_steps`` L-BFGS steps.

    One step is one ``optimizer.step(closure)`` call, which may evaluate the objective up to
    ``max_iter`` times (torch's default 20), as in the original DLG and iDLG scripts.
    """
    optimizer = torch.optim.LBFGS(
        variables, lr=lr, max_iter=max_iter, history_size=history_size, line_search_fn=line_search
    )

    def closure() -> torch.Tensor:
        # One L-BFGS step may evaluate the objective 20 times (seconds on a large model), so
        # budgets and cancellation are checked at every evaluation, not only between steps.
        reason = clock.stop_reason()
        if reason is not None:
            raise _Interrupted(reason)
        outcome.evaluations += 1
        optimizer.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    completed = [v.detach().clone() for v in variables]  # state after the last full step
    yield ProgressEvent(
        step_offset, total_steps, clock.elapsed, {}, restart, snapshot(images), current_labels()
    )
    for step in range(1, control.max_steps + 1):
        try:
            loss = float(optimizer.step(closure).detach())
        except _Interrupted as stop:
            outcome.stop_reason = stop.reason
            break
        if not math.isfinite(loss) or not bool(torch.isfinite(images).all()):
            # L-BFGS with a fixed step of 1 can blow up; the last finite state stands.
            outcome.stop_reason = "diverged"
            break
        outcome.steps = step
        completed = [v.detach().clone() for v in variables]
        if step % control.emit_every == 0 or step == control.max_steps:
            with_images = step % control.image_every == 0 or step == control.max_steps
            yield ProgressEvent(
                step_offset + step,
                total_steps,
                clock.elapsed,
                {"gradient_distance": loss, "evaluations": float(outcome.evaluations)},
                restart,
                snapshot(images) if with_images else None,
                current_labels() if with_images else None,
            )
    # Back to the last full step: a step cut short by a budget or a cancellation leaves a
    # line-search trial point, a diverged step non-finite values (images and labels alike).
    with torch.no_grad():
        for variable, saved in zip(variables, completed, strict=True):
            variable.copy_(saved)
    outcome.images = snapshot(images)
