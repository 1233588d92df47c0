"""L-BFGS steps shared by DLG, iDLG and DLM (the restarts are attacks.loop's): one restart's
on torch's own optimiser (:class:`LbfgsSteps`), or several starts advancing together on
``lbfgs_batched.BatchedLbfgs`` (:class:`LbfgsTogether`), each with its own history."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from auditlib.attacks.base import Clock
from auditlib.attacks.lbfgs_batched import BatchedLbfgs
from auditlib.attacks.loop import StepInterrupted
from auditlib.attacks.objectives import backward_to


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

    @classmethod
    def of(cls, variables, objective, clock: Clock, config) -> LbfgsSteps:
        """From an attack config's ``lr``, ``lbfgs_max_iter``, ``history_size`` and
        ``line_search`` (DLG's, iDLG's, DLM's)."""
        return cls(
            variables,
            objective,
            clock,
            lr=config.lr,
            max_iter=config.lbfgs_max_iter,
            history_size=config.history_size,
            line_search=None if config.line_search == "none" else config.line_search,
        )

    def _closure(self) -> torch.Tensor:
        # One L-BFGS step may evaluate the objective 20 times (seconds on a large model), so
        # budgets and cancellation are checked at every evaluation, not only between steps.
        reason = self.clock.stop_reason()
        if reason is not None:
            raise StepInterrupted(reason)
        self.evaluations += 1
        self.optimizer.zero_grad()
        loss = self.objective()
        backward_to(loss, self.optimizer)
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


class LbfgsTogether:
    """K starts' L-BFGS advanced together: each :meth:`step` is one ``optimizer.step`` of
    every start asked for, with torch's algorithm per start (its own curvature history,
    step size and stopping tests) and one batched objective evaluation for all of them.

    ``objective(rows)`` returns one loss per row of the stacked ``variables`` (leading
    dimension K). Budgets and cancellation are checked before every evaluation, as
    :class:`LbfgsSteps` does."""

    def __init__(
        self,
        variables: list[torch.Tensor],
        objective: Callable[[list[int]], torch.Tensor],
        clock: Clock,
        starts: int,
        *,
        lr: float,
        max_iter: int,
        history_size: int,
        line_search: str | None,
    ) -> None:
        self.objective = objective
        self.clock = clock
        self.optimizer = BatchedLbfgs(
            variables,
            starts,
            lr=lr,
            max_iter=max_iter,
            history_size=history_size,
            line_search_fn=line_search,
        )

    @classmethod
    def of(cls, variables, objective, clock: Clock, starts: int, config) -> LbfgsTogether:
        """From an attack config, as :meth:`LbfgsSteps.of`."""
        return cls(
            variables,
            objective,
            clock,
            starts,
            lr=config.lr,
            max_iter=config.lbfgs_max_iter,
            history_size=config.history_size,
            line_search=None if config.line_search == "none" else config.line_search,
        )

    @property
    def evaluations(self) -> list[int]:
        """Objective evaluations so far, per start."""
        return self.optimizer.evaluations

    def _checked(self, rows: list[int]) -> torch.Tensor:
        reason = self.clock.stop_reason()
        if reason is not None:
            raise StepInterrupted(reason)
        return self.objective(rows)

    def step(self, rows: list[int]) -> list[float]:
        """One L-BFGS step of each start in ``rows``; each one's loss at the start of its
        step, NaN for a start that left the finite numbers (it keeps its last full step and
        stops). Raises :class:`StepInterrupted`."""
        return self.optimizer.step(self._checked, rows)

    def restore(self, rows: list[int]) -> None:
        """The rows back at their last full step (see :meth:`LbfgsSteps.restore`)."""
        self.optimizer.restore(rows)
