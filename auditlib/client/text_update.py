"""The client's update of a text model on its private batch: FedSGD (one gradient) or FedAvg
(local steps of SGD, sent as the weight change), of every weight or of the LoRA adapters'.

A decoder trains next-token prediction (the mean cross-entropy over the real tokens), an
encoder sequence classification.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from auditlib.data.text_samples import TextBatch
from auditlib.errors import AuditInputError
from auditlib.models.text import DECODER, TextModel

FEDSGD, FEDAVG = "fedsgd", "fedavg"


@dataclass(frozen=True, eq=False)
class TextUpdate:
    """What the server receives: per trainable weight, the gradient (FedSGD) or the weight
    change divided by ``-lr * steps`` (FedAvg, so both read as a gradient)."""

    gradients: dict[str, torch.Tensor]
    algorithm: str
    local_steps: int
    learning_rate: float
    adapters_only: bool

    def scaled(self, factor: float) -> TextUpdate:
        grads = {k: v * factor for k, v in self.gradients.items()}
        return TextUpdate(
            grads, self.algorithm, self.local_steps, self.learning_rate, self.adapters_only
        )


def text_loss(model: TextModel, batch: TextBatch) -> torch.Tensor:
    """The training loss of ``batch`` under ``model``."""
    if model.family == DECODER:
        labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
        out = model.module(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels
        )
    else:
        out = model.module(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels
        )
    return out.loss


def trainable(model: TextModel) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.module.named_parameters() if p.requires_grad}


def text_update(
    model: TextModel,
    batch: TextBatch,
    algorithm: str = FEDSGD,
    local_steps: int = 1,
    learning_rate: float = 1e-4,
) -> TextUpdate:
    """The client's update; the model's weights are left as they were."""
    if algorithm not in (FEDSGD, FEDAVG):
        raise AuditInputError(f"algorithm {algorithm!r}; expected 'fedsgd' or 'fedavg'")
    if algorithm == FEDAVG and not (1 <= local_steps <= 100 and learning_rate > 0):
        raise AuditInputError(
            f"FedAvg with {local_steps} steps at rate {learning_rate}; expected 1-100 steps "
            "and a positive rate"
        )
    if batch.length > model.max_positions:
        raise AuditInputError(
            f"sequences of {batch.length} tokens; the model has {model.max_positions} positions"
        )
    params = trainable(model)
    if algorithm == FEDSGD:
        grads = torch.autograd.grad(text_loss(model, batch), list(params.values()))
        return TextUpdate(
            {n: g.detach() for n, g in zip(params, grads, strict=True)},
            FEDSGD, 1, 0.0, model.lora_rank is not None,
        )  # fmt: skip
    start = {n: p.detach().clone() for n, p in params.items()}
    try:
        for _ in range(local_steps):
            grads = torch.autograd.grad(text_loss(model, batch), list(params.values()))
            with torch.no_grad():
                for p, g in zip(params.values(), grads, strict=True):
                    p -= learning_rate * g
        scale = -1.0 / (learning_rate * local_steps)
        change = {n: (p.detach() - start[n]) * scale for n, p in params.items()}
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(start[n])
    return TextUpdate(change, FEDAVG, local_steps, learning_rate, model.lora_rank is not None)
