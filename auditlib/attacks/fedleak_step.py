"""FedLeak's iteration (Algorithm 1, lines 5-10) on the candidate pixels: one restart's
(:func:`step_one`) and the restarts' stacked (:class:`Restarts`), eager or, asked for, by
the traced and compiled objective (``attacks.compiled``), and the released code's median
filter on the output. ``fedleak.py`` holds the configuration, the objective and the run.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from auditlib.attacks.base import snapshot
from auditlib.attacks.captured import CapturedGradient, stepped
from auditlib.attacks.compiled import CompiledGradient
from auditlib.attacks.fedleak_terms import ascent_offset, blend_directions
from auditlib.attacks.loop import stacked
from auditlib.attacks.row_index import FirstBroken, RowIndex, full_rows, row_mask

Tensors = tuple[torch.Tensor, ...]


def median_filter(images01: torch.Tensor, size: int) -> torch.Tensor:
    """Per-channel median over a size x size window, reflect padding (the artifact's output)."""
    pad = size // 2
    mode = "reflect" if min(images01.shape[-2:]) > pad else "replicate"
    padded = F.pad(images01, (pad, pad, pad, pad), mode=mode)
    windows = padded.unfold(2, size, 1).unfold(3, size, 1)
    return windows.reshape(*windows.shape[:4], -1).median(dim=-1).values


def step_one(
    x01: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    objective: Any,  # fedleak.Objective (which imports this module)
    config: Any,  # fedleak.FedLeakConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One FedLeak iteration (Algorithm 1, lines 5-10). Returns (J, D, finite), ``finite``
    on the device (not read back: a broken step descends along zero, and the loop drops the
    restart at its next read of the losses)."""
    current, value, distance, masks = objective.evaluate(x01)
    finite = torch.isfinite(value) & torch.isfinite(current).all()
    current = torch.where(finite, current, torch.zeros_like(current))
    direction = current
    if config.blend > 0:
        reuse = masks if config.lookahead_mask == "reuse" else None
        if config.lookahead == "ascent_normalized":
            ahead, *_ = objective.evaluate(x01 + ascent_offset(current, config.k), reuse)
        else:
            # The released code's look-ahead: take the optimiser step, measure, come back
            # (its Adam moments see both gradients, as there).
            saved = x01.detach().clone()
            x01.grad = current
            optimizer.step()
            with torch.no_grad():
                x01.clamp_(0, 1)
            ahead, *_ = objective.evaluate(x01, reuse)
            with torch.no_grad():
                x01.copy_(saved)
        direction = torch.where(finite, blend_directions(current, ahead, config.blend), 0.0)
    x01.grad = direction
    optimizer.step()
    with torch.no_grad():
        x01.clamp_(0, 1)
    return value, distance, finite


class Restarts:
    """FedLeak's restarts: Adam on pixels in [0, 1], one x01 per restart, stacked when
    they advance together (each its own masks, look-ahead and direction)."""

    def __init__(
        self, generators, knowledge, config, objective, labels, iterations, label_rows=False
    ) -> None:
        self.config = config
        self.objective = objective
        self.labels = labels
        self.label_rows = label_rows  # updates together: a row of labels per start
        self.normalize = knowledge.normalization.normalize
        shape = (knowledge.batch_size, *knowledge.input_shape)
        starts = [torch.rand(shape, generator=g).to(knowledge.device) for g in generators]
        self.together = len(starts) > 1 or stepped(config)  # a traced step is the stacked one
        # (iterate, look-ahead on given masks): the two traced evaluations of a compiled run.
        self.compiled: tuple[CompiledGradient, ...] | tuple[CapturedGradient, ...] | None = None
        self.x01 = stacked(starts) if self.together else starts[0].requires_grad_(True)
        self.optimizer = torch.optim.Adam([self.x01], lr=config.lr)
        self.scheduler = (
            torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=iterations)
            if config.schedule == "cosine"
            else None
        )
        self._index = RowIndex(knowledge.device)  # the running rows, made once per set
        self.first_broken = FirstBroken(len(starts), knowledge.device)  # its pixels then

    def _pixels(self, position: int) -> torch.Tensor:
        kept = self.first_broken.at(position)
        if kept is not None:
            return kept[0]
        return (self.x01[position] if self.together else self.x01).detach()

    def step(self, alive):
        if self.together:
            value, distance, finite = self._step_together(alive)
        else:
            pixels = self.x01.detach().clone()
            value, distance, finite = step_one(
                self.x01, self.optimizer, self.objective, self.config
            )
            value, distance, finite = value.reshape(1), distance.reshape(1), finite.reshape(1)
            self.first_broken.keep(self._index(alive), finite, pixels.unsqueeze(0))
        if self.scheduler is not None:
            self.scheduler.step()
        value = torch.where(finite, value, torch.full_like(value, math.nan))
        return {"objective": value, "gradient_distance": distance}

    def traced(self, device: torch.device, captured: bool = False) -> None:
        """Evaluate by the traced objective from now on, compiled (``attacks.compiled``) or
        recorded as a CUDA graph (``attacks.captured``): one update's (such a run attacks
        updates one after another)."""
        objective = self.objective

        def terms(x01: torch.Tensor, *masks: torch.Tensor):
            value, distance, used = objective.stacked_terms(x01, masks or None)
            return value, {"gradient_distance": distance, "masks": used}

        gradient = CapturedGradient if captured else CompiledGradient
        self.compiled = (
            gradient(terms, device, role="iterate"),
            gradient(terms, device, role="lookahead"),
        )

    def _evaluate(self, objective, pixels: torch.Tensor, masks: Tensors | None = None):
        """``objective.evaluate_together(pixels, masks)``, traced in a compiled run."""
        if self.compiled is None:
            return objective.evaluate_together(pixels, masks)
        traced = self.compiled[masks is not None]
        (direction,), value, named = traced(pixels, given=() if masks is None else masks)
        if traced.cuda:  # the graph's next replay overwrites its gradient
            direction = direction.clone()
        if self.config.signed:
            direction = direction.sign()
        return direction, value, named["gradient_distance"], named["masks"]

    def _step_together(self, alive):
        """One FedLeak iteration (Algorithm 1, lines 5-10) of every alive restart at once."""
        config, objective, x01 = self.config, self.objective, self.x01
        objective = objective.at(alive)  # each row its own update's, where updates go together
        index = self._index(alive)
        pixels = x01.detach().index_select(0, index)
        current, value, distance, masks = self._evaluate(objective, pixels)
        finite = torch.isfinite(value) & torch.isfinite(current).flatten(1).all(1)
        self.first_broken.keep(index, finite, pixels)
        keep = row_mask(finite, current)
        current = torch.where(keep, current, torch.zeros_like(current))
        direction = current
        if config.blend > 0:
            reuse = masks if config.lookahead_mask == "reuse" else None
            if config.lookahead == "ascent_normalized":
                offset = torch.func.vmap(ascent_offset, in_dims=(0, None))(current, config.k)
                ahead, *_ = self._evaluate(objective, pixels + offset, reuse)
            else:  # the released code's look-ahead, as in step_one
                saved = x01.detach().clone()
                x01.grad = full_rows(x01, index, current)
                self.optimizer.step()
                with torch.no_grad():
                    x01.clamp_(0, 1)
                ahead, *_ = self._evaluate(objective, x01.detach().index_select(0, index), reuse)
                with torch.no_grad():
                    x01.copy_(saved)
            direction = torch.where(keep, blend_directions(current, ahead, config.blend), 0.0)
        x01.grad = full_rows(x01, index, direction)
        self.optimizer.step()
        with torch.no_grad():
            x01.clamp_(0, 1)
        return value, distance, finite

    def _labels(self, position: int) -> torch.Tensor:
        return self.labels[position] if self.label_rows else self.labels

    def frame(self, position):
        return snapshot(self.normalize(self._pixels(position))), self._labels(position)

    def candidate(self, position):
        pixels = self._pixels(position)
        score = self.objective.at([position]).score(pixels)
        if self.config.median_filter:
            pixels = median_filter(pixels, self.config.median_filter)
        return snapshot(self.normalize(pixels)), self._labels(position).clone(), score
