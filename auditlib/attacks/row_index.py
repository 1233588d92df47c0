"""The running rows of stacked restarts as a device index, made once per set of rows, and
what a broken row had, kept on the device.

A list of rows used as an index is copied to the device at every use, and on a GPU that
copy waits for the work queued before it: a host synchronisation in every step. The rows
change only when a race drops a start or a start finishes, so each set is made once, and
on CUDA copied from pinned memory, which does not wait."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class RowIndex:
    """``index(rows)``: ``rows`` as a tensor on ``device``, made at its first use."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._made: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, rows: Sequence[int]) -> torch.Tensor:
        key = tuple(rows)
        if key not in self._made:
            index = torch.tensor(key)
            if self.device.type == "cuda":  # from pinned memory, the copy need not wait
                index = index.pin_memory().to(self.device, non_blocking=True)
            self._made[key] = index.to(self.device)
        return self._made[key]


def full_rows(like: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """A tensor shaped as the stacked ``like``: ``rows`` at the running rows ``index``, 0
    elsewhere (a traced step's gradient, given for the running restarts only)."""
    return torch.zeros_like(like).index_copy_(0, index, rows)


def row_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A mask of one value per row shaped to select whole rows of ``like`` (``torch.where``)."""
    return mask.view(-1, *([1] * (like.dim() - 1)))


class FirstBroken:
    """Per restart, on the device: whether its objective stopped being finite, and the rows
    it was given at the first step it did (what the restart is shown and scored by once the
    loop drops it at its next read of the losses). Nothing is read back while stepping."""

    def __init__(self, restarts: int, device: torch.device) -> None:
        self.broken = torch.zeros(restarts, dtype=torch.bool, device=device)
        self.kept: tuple[torch.Tensor, ...] | None = None

    def keep(self, index: torch.Tensor, finite: torch.Tensor, *rows: torch.Tensor) -> None:
        """The running restarts ``index``, ``finite`` each: keep ``rows`` (one per running
        restart each) for those whose objective stopped being finite at this step."""
        if self.kept is None:
            size = len(self.broken)
            self.kept = tuple(r.detach().new_zeros((size, *r.shape[1:])) for r in rows)
        newly = ~finite & ~self.broken.index_select(0, index)
        for kept, now in zip(self.kept, rows, strict=True):
            chosen = torch.where(row_mask(newly, now), now.detach(), kept.index_select(0, index))
            kept.index_copy_(0, index, chosen)
        self.broken.index_copy_(0, index, self.broken.index_select(0, index) | ~finite)

    def at(self, position: int) -> tuple[torch.Tensor, ...] | None:
        """A broken restart's kept rows; None for one whose objective stayed finite."""
        if self.kept is None or not bool(self.broken[position]):
            return None
        return tuple(kept[position] for kept in self.kept)


def keep_rows(optimizer: torch.optim.Optimizer, index: torch.Tensor) -> dict[int, torch.Tensor]:
    """Cut every stacked leaf the optimiser steps (one row per start) to the rows ``index``,
    with its state (each state tensor shaped as its leaf, e.g. RMSprop's averages), so that
    its steps no longer update the rows of starts that stopped. Elementwise optimisers
    only: each kept row steps on as it would have. Returns the new leaf by the old one's
    ``id``, for the caller's own references to them."""
    cut: dict[int, torch.Tensor] = {}
    for group in optimizer.param_groups:
        kept = []
        for leaf in group["params"]:
            row = leaf.detach().index_select(0, index).requires_grad_(leaf.requires_grad)
            state = optimizer.state.pop(leaf, {})
            optimizer.state[row] = {
                name: value.index_select(0, index)
                if torch.is_tensor(value) and value.shape == leaf.shape
                else value
                for name, value in state.items()
            }
            cut[id(leaf)] = row
            kept.append(row)
        group["params"] = kept
    return cut
