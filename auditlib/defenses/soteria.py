"""Soteria (Sun et al., CVPR 2021): perturb the representation's share of the update.

For the input r of a chosen fully connected layer (the "representation"), each feature f
gets the score sum_b ||d r_{b,f} / d x_b||_2 / (r_{b,f} + 0.1), as the public code computes it
(``Defend_DLG.ipynb``: one backward pass per feature with a one-hot output gradient, the
batch summed). The ``ratio`` fraction of features with the smallest |score| are pruned: their
columns of that layer's weight update are zeroed; nothing else in the update changes (the
paper's defense touches only that one layer, which is why BN-statistics attacks get round
it). The public code hard-wires the layer (LeNet's fc input, ConvNet's last layer); here any
``nn.Linear`` of the model can be chosen by name, the last one by default.

The scores cost one backward pass per feature over every scored image. The public code
scores the one batch whose gradient is shared; a FedAvg client of the utility training
shares an update over its whole local data (1000 images here: about 3 minutes per client
on 2 cores for LeNet's 768 features), so at most ``score_examples`` of them, drawn with the
client's generator, are scored (64 by default; 0 scores all). Audited batches are smaller,
so the attack faces the defense exactly as the public code computes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from auditlib.client.update import set_training_mode
from auditlib.config import check_ranges, param
from auditlib.defenses.base import (
    ClientContext,
    DefenseInfo,
    register,
    require_context,
    visible_survivors,
)
from auditlib.errors import AuditInputError
from auditlib.threat import KnownDefense

_SCORE_OFFSET = 0.1  # the public code's denominator r_f + 0.1
_CHUNK = 64  # features back-propagated together (bounds memory: chunk x batch x image)


@dataclass(frozen=True)
class SoteriaConfig:
    ratio: float = param(
        0.5,
        "fraction of the representation's features pruned (their columns of the layer's "
        "weight update zeroed), those of smallest score",
        low=0,
        high=1,
        high_open=True,
    )
    layer: str | None = param(
        None,
        "module name of the nn.Linear whose input is the representation; empty: the last one",
    )
    score_examples: int = param(
        64,
        "images scored at most (a random sample of larger client data); 0: all",
        low=0,
    )

    def __post_init__(self) -> None:
        check_ranges(self)


def representation_layer(model: nn.Module, name: str | None) -> tuple[str, nn.Linear]:
    """The fully connected layer whose input is the defended representation."""
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise AuditInputError("soteria needs a model with a fully connected (nn.Linear) layer")
    if name is None:
        return linears[-1]
    for n, m in linears:
        if n == name:
            return n, m
    raise AuditInputError(
        f"soteria: layer {name!r} is not an nn.Linear of this model; expected one of "
        + ", ".join(n for n, _ in linears)
    )


def feature_scores(
    model: nn.Module,
    layer: nn.Linear,
    context: ClientContext,
    score_examples: int = 0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Soteria's score of each input feature of ``layer`` on the client's batch, or on a
    random ``score_examples`` of it where it holds more (0: all)."""
    captured: list[torch.Tensor] = []
    hook = layer.register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0]))
    saved = {n: b.clone() for n, b in model.named_buffers()}
    images = context.images.detach()
    if 0 < score_examples < len(images):
        picked = torch.randperm(len(images), generator=generator)[:score_examples]
        images = images[picked.to(images.device)]
    images = images.clone().requires_grad_()
    try:
        set_training_mode(model, context.protocol.batchnorm_mode == "train")
        model(images)
        return _scores(captured[0].reshape(images.shape[0], -1), images)
    finally:
        hook.remove()
        # Restored only after the backward passes, which read the saved statistics.
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved[n])


def _scores(r: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    features = r.shape[1]
    norms = torch.empty_like(r.detach())
    for start in range(0, features, _CHUNK):
        stop = min(start + _CHUNK, features)
        # One one-hot output gradient per feature; batched through vmap where possible.
        tangents = torch.zeros(stop - start, *r.shape, dtype=r.dtype, device=r.device)
        tangents[torch.arange(stop - start), :, torch.arange(start, stop)] = 1
        try:
            (grads,) = torch.autograd.grad(
                r, images, grad_outputs=tangents, retain_graph=True, is_grads_batched=True
            )
        except RuntimeError:  # an op without a batching rule: one backward pass per feature
            grads = torch.stack(
                [torch.autograd.grad(r, images, t, retain_graph=True)[0] for t in tangents]
            )
        norms[:, start:stop] = grads.flatten(2).norm(dim=2).T
    return (norms / (r.detach() + _SCORE_OFFSET)).sum(dim=0)


class Soteria:
    def __init__(self, config: SoteriaConfig) -> None:
        self.config = config

    def apply(self, update, generator, context=None):
        context = require_context(context, "soteria")
        name, layer = representation_layer(context.model, self.config.layer)
        key = f"{name}.weight" if name else "weight"
        names = list(context.parameters)
        if key not in names:
            raise AuditInputError(f"soteria: the weight of layer {name!r} is not trained")
        scores = feature_scores(
            context.model, layer, context, self.config.score_examples, generator
        ).abs()
        pruned = int(self.config.ratio * scores.numel() + 0.5)
        mask = torch.ones_like(scores)
        if pruned:
            mask[torch.topk(scores, pruned, largest=False).indices] = 0
        index = names.index(key)
        return tuple(
            t * mask.to(t.dtype) if i == index else t.clone() for i, t in enumerate(update)
        )

    def known_to_attacker(self, observation, weights):
        return KnownDefense(
            "soteria",
            f"knows Soteria pruned {self.config.ratio:.0%} of the representation's columns of "
            "one layer's update: compares only what survived (the pruned columns are visible "
            "as exact zeros), the rest of the update being untouched (Huang et al., NeurIPS "
            "2021, leave the defended layer out)",
            mask=visible_survivors(observation),
        )

    def privacy_report(self) -> dict[str, Any]:
        return {
            "epsilon": None,
            "epsilon_unavailable_reason": "Soteria's guarantee is a certified bound on the "
            "reconstruction of one layer's input, not differential privacy",
        }


register(
    DefenseInfo(
        "soteria",
        "Prune the representation features that reveal the input most: zero `ratio` of the "
        "columns of one fully connected layer's weight update (the last, or `layer`).",
        SoteriaConfig,
        Soteria,
        strength="ratio",
    )
)
