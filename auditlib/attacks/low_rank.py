"""A Linear layer's gradient in stacked candidates, kept as its two factors and never formed.

FedSGD's gradient of a Linear weight is a sum of outer products, one per example (and per
token where the layer sees a sequence): sum_k d_k a_k^T, with a_k the layer's input and d_k
the loss's gradient at its output. When R candidates' updates are stacked (restarts or
updates together, ``UpdateMatcher.stacked_updates``), forming each row's out x in matrix and
measuring it against the target is several memory-bound passes over R x out x in values:
measured, 60 % of a batched DLG evaluation at 64 rows on LeNet's 100 x 768 classifier
(docs/PERFORMANCE.md, "Updates together"). The distances need only two numbers per row:

    ||sum_k d_k a_k^T||^2 = sum_kl (d_k . d_l)(a_k . a_l)    <sum_k d_k a_k^T, T> = sum_k d_k^T T a_k

Both are taken in float64, so that ||c||^2 - 2 <c, T> + ||T||^2 keeps the precision of the
direct difference near a match (DLG drives its distance to about 1e-10 of ||T||^2, where
float32's cancellation would leave a floor near 1e-7). Equal to the formed matrix's
distances up to float order (tests/test_low_rank.py).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from auditlib.client.exact_batchnorm import exact_batchnorm
from auditlib.client.update import (
    Recording,
    classification_loss,
    recording_block,
    set_training_mode,
)


@dataclass(frozen=True)
class LowRankRows:
    """R candidates' gradients of one ``out x in`` Linear weight, row r being
    sum_k left[r, k] outer right[r, k]."""

    left: torch.Tensor  # R x k x out: the loss's gradient at the layer's output
    right: torch.Tensor  # R x k x in: the layer's input

    def dense(self) -> torch.Tensor:
        """The R matrices formed (R x out x in), for a measure without a factored form."""
        return torch.bmm(self.left.transpose(1, 2), self.right)

    def squared_norm(self) -> torch.Tensor:
        """||c_r||^2 per row, float64."""
        left, right = self.left.double(), self.right.double()
        return (left @ left.transpose(1, 2) * (right @ right.transpose(1, 2))).sum((1, 2))

    def inner(self, target: torch.Tensor, rows: bool) -> torch.Tensor:
        """<c_r, T> per row, float64: ``target`` out x in (one for all rows) or, with
        ``rows``, R x out x in (each row its own)."""
        t64 = _float64(target)[0]
        right = self.right.double()
        if rows:
            projected = torch.bmm(right, t64.reshape(t64.shape[0], *self.shape).transpose(1, 2))
        else:
            projected = right @ t64.reshape(self.shape).T
        return (projected * self.left.double()).sum((1, 2))

    def target_norm(self, target: torch.Tensor) -> torch.Tensor:
        """||T||^2 (one value, or one per row where the target has rows), float64."""
        return _float64(target)[1]

    def squared_distance(self, target: torch.Tensor, rows: bool) -> torch.Tensor:
        """||c_r - T||^2 per row, float64 (clamped at 0 against rounding)."""
        value = self.squared_norm() - 2 * self.inner(target, rows)
        return (value + self.target_norm(target)).clamp_min(0.0)

    @property
    def shape(self) -> tuple[int, int]:
        return self.left.shape[2], self.right.shape[2]


def dense(updates: Sequence[torch.Tensor | LowRankRows]) -> tuple[torch.Tensor, ...]:
    """Stacked updates with every factored entry formed."""
    return tuple(u.dense() if isinstance(u, LowRankRows) else u for u in updates)


# A target's float64 copy and squared norm (per row where it has rows), made once per target
# tensor: targets are fixed for a matcher's life, and a cast per evaluation is a pass over
# R x out x in values, the cost this module exists to avoid. Keyed by identity and version.
_FLOAT64: dict[int, tuple[weakref.ref, int, torch.Tensor, torch.Tensor]] = {}


def _float64(target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    key = id(target)
    found = _FLOAT64.get(key)
    if found is not None and found[0]() is target and found[1] == target._version:
        return found[2], found[3]
    t64 = target.detach().double()
    squared = (t64 * t64).reshape(t64.shape[0], -1).sum(1) if t64.dim() == 3 else (t64 * t64).sum()
    _FLOAT64[key] = (weakref.ref(target), target._version, t64, squared)
    if found is None or found[0]() is not target:  # once per target, not per version
        # Gone with its target (a matcher's life), not held by an idle worker.
        weakref.finalize(target, _FLOAT64.pop, key, None)
    return t64, squared


@dataclass(frozen=True)
class FactoredLayers:
    """The Linear layers whose weight gradient is kept factored, by parameter name: each
    module, and the shape of its output for one candidate batch (the probe added there)."""

    modules: Mapping[str, nn.Linear]
    outputs: Mapping[str, tuple[int, ...]]


def factored_layers(
    model: nn.Module,
    parameters: Mapping[str, torch.Tensor],
    example: torch.Tensor,
) -> FactoredLayers:
    """Which of ``model``'s Linear weights to keep factored for a candidate batch shaped like
    ``example``: a plain ``nn.Linear`` with no forward hook of its own, whose weight is
    matched, not shared with another module, seen once in a forward pass, and whose rank k
    (examples x tokens) makes the factors cheaper than the matrix: k^2 (in + out) < in x out.
    One forward pass on ``example`` (buffers copied, so nothing the server sent changes)
    finds what runs."""
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    # A forward hook of the model's own may change the layer's output, and the probe would
    # then read the gradient at the changed output, not at W a + b: such layers stay formed.
    hooked = bool(nn.modules.module._global_forward_hooks)
    candidates = {
        f"{name}.weight" if name else "weight": module
        for name, module in model.named_modules()
        if type(module).forward is nn.Linear.forward
        and (f"{name}.weight" if name else "weight") in parameters
        and counts[id(module.weight)] == 1
        and not (hooked or module._forward_hooks)
    }
    seen: dict[str, list[tuple[int, ...]]] = {n: [] for n in candidates}

    def recorder(name: str):
        return lambda module, inputs, output: seen[name].append(tuple(output.shape))

    handles = [m.register_forward_hook(recorder(n)) for n, m in candidates.items()]
    try:
        buffers = {n: b.clone() for n, b in model.named_buffers()}
        with torch.no_grad():
            functional_call(model, buffers, (example,), strict=False)
    finally:
        for handle in handles:
            handle.remove()
    modules, outputs = {}, {}
    for name, module in candidates.items():
        if len(seen[name]) != 1:
            continue
        shape = seen[name][0]
        rank = math.prod(shape[:-1])
        if rank * rank * (module.in_features + module.out_features) < (
            module.in_features * module.out_features
        ):
            modules[name], outputs[name] = module, shape
    return FactoredLayers(modules, outputs)


def fedsgd_factored(
    model: nn.Module,
    parameters: Mapping[str, torch.Tensor],
    layers: FactoredLayers,
    images: torch.Tensor,
    labels: torch.Tensor,
    buffers: Mapping[str, torch.Tensor],
    train: bool,
    recording: Recording | None = None,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], Any]:
    """FedSGD's gradient of one candidate batch (``client_update``'s, the mean
    cross-entropy's) with the ``layers``' weights as factors: the other parameters'
    gradients in ``parameters``' order, then per factored weight the loss's gradient at the
    layer's output and the layer's input, each k x features. Runs under ``torch.func.vmap``
    (one row per call) as ``client_update`` with buffers does.

    The output gradient is read as the gradient of a zero probe added to the layer's output
    (a forward hook): the batch loss's gradient there is each example's own, already
    divided by the batch size as the mean loss divides it. Last, what ``recording`` saw in
    the forward (``client.update.recorded_client_update``), empty without one."""
    set_training_mode(model, train)
    names = list(layers.modules)
    fixed = {n: parameters[n] for n in names}
    free = {n: p for n, p in parameters.items() if n not in fixed}
    inputs: dict[str, torch.Tensor] = {}
    probes: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def add_probe(module, args, output):
            inputs[name] = args[0]
            return output + probes[name]

        return add_probe

    def loss_of(weights, probe_values, state):
        probes.update(probe_values)
        with recording_block(recording) as recorded:
            logits = functional_call(model, ({**weights, **fixed, **state},), (images,))
        return classification_loss(logits, labels), (dict(inputs), recorded)

    zeros = {n: images.new_zeros(layers.outputs[n]) for n in names}
    handles = [layers.modules[n].register_forward_hook(hook(n)) for n in names]
    try:
        with exact_batchnorm(model):  # torch.func's own is not exact in a double backward
            (grads, at_output), (seen, recorded) = torch.func.grad(
                loss_of, argnums=(0, 1), has_aux=True
            )(free, zeros, dict(buffers))
    finally:
        for handle in handles:
            handle.remove()
    left = tuple(at_output[n].reshape(-1, at_output[n].shape[-1]) for n in names)
    right = tuple(seen[n].reshape(-1, seen[n].shape[-1]) for n in names)
    return tuple(grads[n] for n in free), left, right, recorded
