"""GradInversion's BatchNorm prior (Yin et al. 2021, Eq. 6; the DeepInversion prior): the
candidate batch's per-channel statistics at the input of every BatchNorm layer against the
running statistics of the server's model, read by forward hooks. Used by GradInversion and by
Shadow's defense."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from auditlib.attacks.forward_hooks import HeldHooks

BATCHNORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def _channel_statistics(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and biased variance, as BatchNorm normalises a batch."""
    dims = [d for d in range(features.dim()) if d != 1]
    return features.mean(dims), features.var(dims, unbiased=False)


def _record_first_call(seen: dict, index: int, features: torch.Tensor) -> None:
    """Layer ``index``'s statistics at its first call since ``seen`` was emptied (FedAvg:
    the first local step's), kept in ``seen``."""
    if index not in seen:
        seen[index] = _channel_statistics(features)


class BatchNormPrior:
    """R_BN: the candidate batch's statistics at each BatchNorm input against the running ones.

    Forward hooks record the statistics of the first call of each layer after ``reset``
    (for FedAvg, the first local step). The targets are the running statistics of the
    server's model as sent, copied once.
    """

    def __init__(self, model: nn.Module) -> None:
        self.layers = [
            m
            for m in model.modules()
            if isinstance(m, BATCHNORM_TYPES)
            and m.running_mean is not None
            and m.running_var is not None
        ]
        self.targets = [
            (m.running_mean.detach().clone(), m.running_var.detach().clone()) for m in self.layers
        ]
        self.captured: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        # The stacked statistics' hooks: held for a traced run (GradInversion's
        # ``compiled=true``; a trace cannot register them, and the client's simulation then
        # records nothing through them), else registered for each stacked pass.
        self.hooks = HeldHooks(self.layers, _record_input_statistics, dict)

    def __len__(self) -> int:
        return len(self.layers)

    def _hook(self, index: int):
        def record(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: object) -> None:
            _record_first_call(self.captured, index, inputs[0])

        return record

    def attach(self) -> None:
        self.detach()
        self._handles = [
            layer.register_forward_hook(self._hook(i)) for i, layer in enumerate(self.layers)
        ]

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @contextlib.contextmanager
    def attached(self) -> Iterator[BatchNormPrior]:
        """Its hooks on the model while the block runs, removed however it ends."""
        self.attach()
        try:
            yield self
        finally:
            self.detach()

    def reset(self) -> None:
        self.captured = {}

    def loss(self, images: torch.Tensor) -> torch.Tensor:
        """Sum over the layers seen since ``reset`` of the two L2 norms (paper Eq. 6)."""
        return self._against_running(self.captured, images.new_zeros(()))

    def _against_running(self, captured: dict, total: torch.Tensor) -> torch.Tensor:
        # One value, or one per row where the statistics are R x C.
        for index, (mean, var) in captured.items():
            running_mean, running_var = self.targets[index]
            total = total + torch.linalg.vector_norm(mean - running_mean, dim=-1)
            total = total + torch.linalg.vector_norm(var - running_var, dim=-1)
        return total

    def against_running(self, seen: dict, images: torch.Tensor) -> torch.Tensor:
        """R_BN of R candidate batches (``images`` R x B x C x H x W), one value per row, from
        the statistics recorded in their stacked simulation (R x C each, by
        ``UpdateMatcher.recorded_updates`` through ``hooks.recording``): each layer's first
        call, the first local step's examples at the server's weights in the client's
        BatchNorm mode, as the hooks record a start alone."""
        return self._against_running(seen, images.new_zeros(images.shape[0]))


def _record_input_statistics(seen: dict, index: int, inputs: tuple, _output: object) -> None:
    """The prior's record (``forward_hooks.Record``): the statistics at a layer's input."""
    _record_first_call(seen, index, inputs[0])
