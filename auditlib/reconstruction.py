"""What an attack ends with: every restart's candidate and the attacker's own pick.

Plain data (tensors and numbers), so the metrics score it without importing the attacks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, eq=False)
class Candidate:
    """One restart's result. ``loss`` is the attack's own objective (lower is better)."""

    images: torch.Tensor  # B x C x H x W, model space, CPU
    labels: torch.Tensor | None  # B class ids, or None when the attack does not recover labels
    loss: float
    restart: int
    steps: int
    stop_reason: str
    # The client each image is attributed to, where the attack attributes (LOKI under
    # secure aggregation); -1 where an image was not read back.
    clients: tuple[int, ...] | None = None


# How an attack computed its step (``Stepped.how``): one kernel launch at a time from Python,
# traced and compiled (``compiled=true``), or recorded once as a CUDA graph and replayed.
EAGER, COMPILED, RECORDED = "eager", "compiled", "recorded as a CUDA graph"


@dataclass(frozen=True)
class Stepped:
    """How an attack's run computed its step (``attacks.captured.HowStepped``): ``how`` (one
    of ``EAGER``, ``COMPILED``, ``RECORDED``) and, where it is not simply what was asked,
    why (``note``): the run chose it, or a recording failed and the step ran eagerly."""

    how: str
    note: str | None = None

    def then(self, later: Stepped) -> Stepped:
        """One attack's two plans in turn (``attacks.restarts.staged``): the later plan's
        way, with both plans' notes."""
        notes = tuple(dict.fromkeys(n for n in (self.note, later.note) if n))
        return Stepped(later.how, "; ".join(notes) or None)


@dataclass(frozen=True, eq=False)
class Reconstruction:
    candidates: tuple[Candidate, ...]
    stop_reason: str  # "completed", "time budget", "cancelled" or "diverged"
    steps: int  # optimiser steps over all restarts
    label_inference: Mapping[str, Any] | None = None
    # How its step was computed; None where it has no optimisation step (the malicious
    # server reads its images back) or it was not told.
    stepped: Stepped | None = None

    @property
    def selected(self) -> Candidate:
        """The candidate the attacker would choose without ground truth: lowest loss."""
        finite = [c for c in self.candidates if math.isfinite(c.loss)]
        return min(
            finite or self.candidates, key=lambda c: c.loss if math.isfinite(c.loss) else math.inf
        )
