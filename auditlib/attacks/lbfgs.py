"""L-BFGS steps shared by DLG, iDLG and DLM (the restarts are attacks.loop's): one restart's
on torch's own optimiser (:class:`LbfgsSteps`), or several starts advancing together on
``lbfgs_batched.BatchedLbfgs`` (:class:`LbfgsTogether`), each with its own history, their
evaluations eager or recorded as a CUDA graph (:class:`RecordedRows`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from auditlib.attacks.base import Clock
from auditlib.attacks.captured import CapturedGradient
from auditlib.attacks.compiled import Objective as StackedObjective
from auditlib.attacks.lbfgs_batched import BatchedLbfgs, Graded, take_rows
from auditlib.attacks.loop import StepInterrupted
from auditlib.attacks.objectives import backward_to
from auditlib.attacks.updates import UpdatesMatcher


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


class RecordedRows:
    """The starts' L-BFGS evaluations by one step recorded as a CUDA graph
    (``attacks.captured``): each evaluation computes every row of the step's starts
    (:attr:`running`, set by :class:`LbfgsTogether` at each step; a graph per count of
    them, as a race's 8, 4, 2 and 1) and answers the rows asked for, with their gradients
    (``lbfgs_batched.Graded``). The rows whose step has ended are computed and dropped: a
    graph per subset of rows would be recorded again and again as the starts' stopping
    tests leave them out one by one, and on a GPU, whose step is bound by launches, the
    extra rows cost little. Each row's value is its own start's (the objectives batch
    starts by ``torch.func.vmap``), so the rows dropped do not change the others.

    ``objective(*rows_of_variables)``: each row's loss (and named outputs, unused) as
    ``attacks.compiled.Objective``. One update's starts only: several updates' rows would
    each need their own update's target and labels, which a graph would hold as recorded."""

    def __init__(
        self,
        variables: list[torch.Tensor],
        objective: StackedObjective,
        device: torch.device,
        matched: object,
    ) -> None:
        """``matched``: what the rows are matched against, refused where it is several
        updates' (``UpdatesMatcher``; the engine's ``why_updates_apart`` keeps them apart)."""
        if isinstance(matched, UpdatesMatcher):  # its rows' targets would be the graph's
            raise ValueError("a captured evaluation attacks one update (why_updates_apart)")
        self.variables = variables
        self.gradient = CapturedGradient(objective, device)
        self.running: list[int] = []

    def __call__(self, rows: list[int]) -> Graded:
        running = self.running
        grads, losses, _ = self.gradient(*(take_rows(v, running) for v in self.variables))
        asked = [running.index(row) for row in rows]
        return Graded(take_rows(losses, asked), tuple(take_rows(g, asked) for g in grads))


class LbfgsTogether:
    """K starts' L-BFGS advanced together: each :meth:`step` is one ``optimizer.step`` of
    every start asked for, with torch's algorithm per start (its own curvature history,
    step size and stopping tests) and one batched objective evaluation for all of them.

    ``objective(rows)`` returns one loss per row of the stacked ``variables`` (leading
    dimension K), or is a :class:`RecordedRows`. Budgets and cancellation are checked before
    every evaluation, as :class:`LbfgsSteps` does."""

    def __init__(
        self,
        variables: list[torch.Tensor],
        objective: Callable[[list[int]], torch.Tensor | Graded],
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

    def _checked(self, rows: list[int]) -> torch.Tensor | Graded:
        reason = self.clock.stop_reason()
        if reason is not None:
            raise StepInterrupted(reason)
        return self.objective(rows)

    def step(self, rows: list[int]) -> list[float]:
        """One L-BFGS step of each start in ``rows``; each one's loss at the start of its
        step, NaN for a start that left the finite numbers (it keeps its last full step and
        stops). Raises :class:`StepInterrupted`."""
        if isinstance(self.objective, RecordedRows):  # every evaluation computes these rows
            self.objective.running = list(rows)
        return self.optimizer.step(self._checked, rows)

    def restore(self, rows: list[int]) -> None:
        """The rows back at their last full step (see :meth:`LbfgsSteps.restore`)."""
        self.optimizer.restore(rows)
