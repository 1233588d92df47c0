"""The running rows of stacked restarts as a device index, made once per set of rows.

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


def row_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A mask of one value per row shaped to select whole rows of ``like`` (``torch.where``)."""
    return mask.view(-1, *([1] * (like.dim() - 1)))
