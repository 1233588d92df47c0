"""The L-BFGS restart loop shared by DLG and iDLG."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from auditlib.attacks.base import Clock, ProgressEvent, RunControl, snapshot
from auditlib.attacks.loop import StepInterrupted


class RestartOutcome:
    """Filled in by :func:`lbfgs_restart` when its generator finishes."""

    steps: int = 0
    evaluations: int = 0  # objective evaluations (an L-BFGS step makes up to max_iter)
    stop_reason: str = "completed"
    images: torch.Tensor | None = None  # the images of the last full step


class LbfgsSteps:
    """One restart's L-BFGS: each :meth:`step` is one ``optimizer.step(closure)``, which may
    evaluate the objective up to ``max_iter`` times (torch's default 20), as in the original
    DLG and iDLG scripts. Keeps the state of the last full step for :meth:`restore`."""

    def __init__(
        self,
        variables: list[torch.Tensor],
        objective: Callable[[], torch.Tensor],
        clock: Clock,
        *,
        lr: float,
        max_iter: int,
        history_size: int,
        line_search: str | None,
    ) -> None:
        self.variables = variables
        self.objective = objective
        self.clock = clock
        self.evaluations = 0
        self.optimizer = torch.optim.LBFGS(
            variables,
            lr=lr,
            max_iter=max_iter,
            history_size=history_size,
            line_search_fn=line_search,
        )
        self.completed = [v.detach().clone() for v in variables]

    def _closure(self) -> torch.Tensor:
        # One L-BFGS step may evaluate the objective 20 times (seconds on a large model), so
        # budgets and cancellation are checked at every evaluation, not only between steps.
        reason = self.clock.stop_reason()
        if reason is not None:
            raise StepInterrupted(reason)
        self.evaluations += 1
        self.optimizer.zero_grad()
        loss = self.objective()
        loss.backward()
        return loss

    def step(self) -> float:
        """One L-BFGS step; its loss, or NaN when it left the finite numbers (the state of
        the last full step is then kept). Raises :class:`StepInterrupted`."""
        loss = float(self.optimizer.step(self._closure).detach())
        if not math.isfinite(loss) or not all(
            bool(torch.isfinite(v).all()) for v in self.variables
        ):
            # L-BFGS with a fixed step of 1 can blow up; the last finite state stands.
            return math.nan
        self.completed = [v.detach().clone() for v in self.variables]
        return loss

    def restore(self) -> None:
        """Back to the last full step: a step cut short by a budget or a cancellation leaves
        a line-search trial point, a diverged step non-finite values."""
        with torch.no_grad():
            for variable, saved in zip(self.variables, self.completed, strict=True):
                variable.copy_(saved)


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
    steps = LbfgsSteps(
        variables,
        objective,
        clock,
        lr=lr,
        max_iter=max_iter,
        history_size=history_size,
        line_search=line_search,
    )
    yield ProgressEvent(
        step_offset, total_steps, clock.elapsed, {}, restart, snapshot(images), current_labels()
    )
    for step in range(1, control.max_steps + 1):
        try:
            loss = steps.step()
        except StepInterrupted as stop:
            outcome.stop_reason = stop.reason
            break
        finally:
            outcome.evaluations = steps.evaluations
        if not math.isfinite(loss):
            outcome.stop_reason = "diverged"
            break
        outcome.steps = step
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
    steps.restore()
    outcome.images = snapshot(images)
