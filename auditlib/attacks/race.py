"""The race of an attack's restarts: where successive halving drops the worse ones.

A plan is plain data with its arithmetic (rungs in steps, planned steps, survivors). It
lives apart from ``loop.py``, which runs the race, so that ``base.RunControl`` can name it
without ``base`` and ``loop`` importing each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class HalvingPlan:
    """Where a race drops restarts: at each rung (a fraction of the step budget) the better
    ``keep`` share of the running restarts, by the attack's objective, goes on."""

    rungs: tuple[float, ...] = (0.03, 0.1, 0.25)
    keep: float = 0.5

    def rung_steps(self, max_steps: int, every: int = 1) -> list[int]:
        """The rungs in steps, on the event grid (every ``every`` steps)."""
        steps = {every * math.ceil(f * max_steps / every) for f in self.rungs}
        return sorted(s for s in steps if 0 < s < max_steps)

    def schedule(self, starts: int, max_steps: int, every: int = 1) -> list[tuple[int, int]]:
        """The race in turn, if none stops early: each count of running restarts, with the
        steps it runs for (one step of every running restart each; from one rung to the
        next)."""
        counts, alive, done = [], starts, 0
        for rung in self.rung_steps(max_steps, every):
            counts.append((alive, rung - done))
            alive, done = self.survivors(alive), rung
        return [*counts, (alive, max_steps - done)]

    def planned_steps(self, starts: int, max_steps: int, every: int = 1) -> int:
        """Steps over all restarts if none stops early."""
        return sum(alive * steps for alive, steps in self.schedule(starts, max_steps, every))

    def survivors(self, alive: int) -> int:
        return max(1, math.ceil(alive * self.keep))

    def describe(self) -> str:
        rungs = ", ".join(f"{f:.0%}" for f in self.rungs)
        return (
            f"successive halving: all starts run to {rungs} of the steps, keeping the better "
            f"{self.keep:.0%} by the attack's own objective at each"
        )


# The audit preset's race (``attacks.restarts``).
PLAN = HalvingPlan()
