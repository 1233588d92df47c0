"""The terms of FedLeak's objective (Fan et al. 2025), each a plain function on tensors.

Partial gradient matching (Sec. 4.2: the top-R masks and the masked L1 + cosine distance),
gradient regularisation (Sec. 4.3: the look-ahead blend and the ascent probe) and the
activation-sparsity prior (Sec. 4.4: which modules it reads, and their outputs' mean
magnitude). ``fedleak.py`` assembles them into the objective and runs the attack; they live
here so each term reads against its section of the paper on its own. Last, several
updates' objectives as one (updates together: each row its own update's labels and target).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from auditlib.attacks.objectives import RowTargets, cosine_distance, flat_like, restart_buffers
from auditlib.attacks.row_index import RowIndex

Tensors = tuple[torch.Tensor, ...]

# Modules whose outputs are "activation values" for the sparsity prior (Sec. 4.4).
ACTIVATION_TYPES = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.PReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Hardswish,
    nn.Sigmoid,
    nn.Tanh,
    nn.Softplus,
)


# --- Partial gradient matching ---------------------------------------------------------------


def _top_fraction(values: torch.Tensor, ratio: float) -> torch.Tensor:
    """A 0/1 mask (dtype of ``values``) on the ceil(ratio * n) largest of the 1-D ``values``."""
    n = values.numel()
    k = min(n, max(1, math.ceil(ratio * n)))
    if k == n:
        return torch.ones_like(values)
    indices = torch.topk(values, k, sorted=False).indices
    return torch.zeros_like(values).scatter(0, indices, 1.0)  # out of place: runs under vmap


def top_ratio_masks(
    gradients: Tensors, ratio: float, scope: Literal["global", "per_layer"]
) -> Tensors:
    """Masks on the top ``ratio`` of |gradient| elements (the set Lambda, Sec. 4.2).

    ``global`` ranks all elements of all parameters together (the paper's "top R % of g'");
    ``per_layer`` keeps the top ratio of each parameter tensor (the released code's median).
    """
    with torch.no_grad():
        if scope == "per_layer":
            return tuple(_top_fraction(g.abs().flatten(), ratio).view_as(g) for g in gradients)
        flat = torch.cat([g.abs().flatten() for g in gradients])
        parts = _top_fraction(flat, ratio).split([g.numel() for g in gradients])
        return tuple(p.view_as(g) for p, g in zip(parts, gradients, strict=True))


def masked_distance(
    candidate: Tensors,
    target: Tensors,
    masks: Tensors,
    mode: Literal["mean", "sum", "per_layer"] = "mean",
) -> torch.Tensor:
    """L1 + (1 - cos) between the masked gradients (Sec. 4.4, the loss without priors).

    ``mean``: the L1 averaged over the selected elements (Theorem 2's form) plus one cosine
    over all of them; ``sum``: the L1 summed (Eq. D's ||.||_1 read literally; on a ResNet it
    is ~10^4 times the cosine term, which it then drowns);
    ``per_layer``: per parameter tensor, mean L1 over the tensor plus 1 - cos, summed over
    tensors (the released code's ``combine_loss``). ``candidate`` and ``masks`` may be R
    restarts' stacked along a leading dimension (then one value per restart), and
    ``target`` then one per row (``RowTargets``: updates together).
    """
    rows = isinstance(target, RowTargets)  # one target per row (updates together)

    def flat(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1) if rows else flat_like(x, t)

    if mode == "per_layer":
        total = candidate[0].new_zeros(())
        for c, t, m in zip(candidate, target, masks, strict=True):
            l1 = flat(((c - t) * m).abs(), t).mean(-1)
            one = RowTargets([t]) if rows else [t]
            total = total + l1 + cosine_distance([c], one, [m])
        return total
    l1 = candidate[0].new_zeros(())
    for c, t, m in zip(candidate, target, masks, strict=True):
        l1 = l1 + flat(((c - t) * m).abs(), t).sum(-1)
    if mode == "mean":
        chosen = sum(flat(m, t).sum(-1) for m, t in zip(masks, target, strict=True))
        l1 = l1 / chosen.clamp(min=1)
    return l1 + cosine_distance(candidate, target, masks)


# --- Gradient regularisation ----------------------------------------------------------------


def blend_directions(current: torch.Tensor, ahead: torch.Tensor, blend: float) -> torch.Tensor:
    """(1 - lambda') grad J(x') + lambda' grad J(look-ahead point) (Eq. 13)."""
    return current if blend == 0 else (1 - blend) * current + blend * ahead


def ascent_offset(direction: torch.Tensor, k: float) -> torch.Tensor:
    """phi = k' grad / ||grad|| with k' = k sqrt(n): the probe of Eqs. 10-12 along +grad D."""
    norm = direction.norm().clamp(min=1e-12)
    return direction * (k * math.sqrt(direction.numel()) / norm)


# --- Activation prior ------------------------------------------------------------------------


def activation_modules(model: nn.Module, layers: str) -> list[nn.Module]:
    """Modules whose outputs enter beta * sum_l mean|F_l(x')|.

    ``activations``: every activation module (ReLU, sigmoid, ...). ``stages``: the residual
    stages ``layer1..layerN`` of a ResNet, falling back to the activations without them.
    The paper names neither; TorchScript models expose no hookable modules (prior off).
    """
    if isinstance(model, torch.jit.ScriptModule):
        return []
    if layers == "stages":
        stages = [m for name, m in model.named_children() if name.startswith("layer")]
        if stages:
            return stages
    return [m for m in model.modules() if isinstance(m, ACTIVATION_TYPES)]


def keep_output(outputs: list, _index: int, _inputs: Any, output: Any) -> None:
    """The prior's record (``forward_hooks.Record``): each module's output, in call order."""
    outputs.append(output)


def activation_penalty(
    outputs: list[torch.Tensor], passes: int, like: torch.Tensor
) -> torch.Tensor:
    """Sum over captured outputs of mean |output|, per simulated forward pass."""
    total = like.new_zeros(())
    for out in outputs:
        if isinstance(out, torch.Tensor):
            total = total + out.abs().mean()
    return total / passes


# --- Updates together -----------------------------------------------------------------------


class UpdatesObjective:
    """Several updates' FedLeak objectives (``fedleak.Objective``) as one: row k (a start) is
    update ``owners[k]``'s, with its labels and its gradient estimate as the target, in one
    batched pass through the shared model (``attacks.updates.why_updates_apart`` checked
    that they share it)."""

    def __init__(self, objectives: Sequence[Any], owners: list[int]) -> None:
        self.objectives = objectives
        self.owners = owners
        self.labels = torch.stack([objectives[u].labels for u in owners])
        per_parameter = zip(*(o.gradients.target for o in objectives), strict=True)
        self.targets = tuple(torch.stack(ts) for ts in per_parameter)
        self.index = RowIndex(self.labels.device)  # the running rows, once per set

    def at(self, positions) -> UpdateRows:
        return UpdateRows(self, list(positions))


class UpdateRows:
    """Some rows of an :class:`UpdatesObjective`, in that order."""

    def __init__(self, many: UpdatesObjective, positions: list[int]) -> None:
        self.many = many
        self.positions = positions

    def evaluate_together(self, x01: torch.Tensor, masks: Tensors | None = None):
        """``Objective.evaluate_together`` with each row's own labels and target."""
        many, first = self.many, self.many.objectives[0]
        index = many.index(self.positions)
        owners = many.index([many.owners[p] for p in self.positions])
        x01 = x01.detach().requires_grad_(True)
        buffers = restart_buffers(first.gradients.knowledge.model, x01.shape[0])
        labels = many.labels.index_select(0, index)
        candidate, priors = torch.func.vmap(first._update)(x01, buffers, labels)
        target = RowTargets(t.index_select(0, owners) for t in many.targets)
        objective, distance, masks = first._terms(candidate, priors, masks, True, target)
        return first._direction(objective, x01), objective.detach(), distance.detach(), masks

    def score(self, x01: torch.Tensor) -> float:
        (position,) = self.positions
        return self.many.objectives[self.many.owners[position]].score(x01)
