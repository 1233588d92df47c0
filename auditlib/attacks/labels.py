"""Label inference from the observed update, reusable by every attack.

iDLG (Zhao et al. 2020, Sec. 3.2): for one image with softmax cross-entropy, the gradient
of the loss wrt the last layer's logit i is p_i - y_i, negative only for the true class.
The last linear layer's weight-gradient row i is (p_i - y_i) * h, where h is the layer's
input; when h is non-negative (sigmoid or ReLU features, as in the paper's LeNet) the row
sum is negative only for the true class, so the label is the row with the smallest sum.
The bias gradient (p_i - y_i) gives the same answer with no assumption on h; it is offered
as ``source="bias"``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from auditlib.errors import AttackUnsupportedError, AuditInputError
from auditlib.models import last_linear
from auditlib.threat import AttackerKnowledge, Observation

LabelSource = Literal["weight", "bias"]


def _last_layer_prefix(observation: Observation, knowledge: AttackerKnowledge) -> str:
    """Name of the classifier layer: the last nn.Linear, or, for archives that expose no
    modules (TorchScript, torch.export), the last parameter of shape [classes, features]."""
    try:
        return last_linear(knowledge.model)[0]
    except AuditInputError:
        pass
    for name, tensor in reversed(
        list(zip(observation.parameter_names, observation.tensors, strict=True))
    ):
        if (
            name.endswith(".weight")
            and tensor.dim() == 2
            and tensor.shape[0] == knowledge.num_classes
        ):
            return name.removesuffix(".weight")
    raise AttackUnsupportedError(
        f"no classifier layer with {knowledge.num_classes} outputs found for the label rule"
    )


def last_layer_gradient(
    observation: Observation, knowledge: AttackerKnowledge, which: str
) -> torch.Tensor:
    """The observed update of the last linear layer's ``which`` ("weight"/"bias") as a gradient.

    Weight differences point against the gradient (w' = w - lr * g), so they are negated;
    after several local steps this is the sum of several gradients, an approximation the
    FedAvg papers accept for label inference.
    """
    name = f"{_last_layer_prefix(observation, knowledge)}.{which}"
    if name not in observation.parameter_names:
        raise AttackUnsupportedError(f"the last linear layer has no shared {which} ({name})")
    index = observation.parameter_names.index(name)
    update = observation.tensors[index].detach()
    if observation.kind == "gradient":
        return update
    if observation.kind == "weight_delta":
        return -update
    initial = knowledge.parameters()[name].detach().to(update.device)
    return -(update - initial)


def idlg_label(
    observation: Observation, knowledge: AttackerKnowledge, source: LabelSource = "weight"
) -> tuple[int, dict[str, Any]]:
    """The single image's label by the iDLG rule; also a record of how it was found."""
    if knowledge.batch_size != 1:
        raise AttackUnsupportedError(
            f"the iDLG label rule holds for one image, the batch has {knowledge.batch_size}; "
            "use batch size 1 or an attack with batch label inference"
        )
    gradient = last_layer_gradient(observation, knowledge, source)
    scores = gradient.sum(dim=-1) if source == "weight" else gradient
    label = int(torch.argmin(scores))
    negative = int((scores < 0).sum())
    return label, {
        "rule": f"iDLG ({source} gradient of the last layer)",
        "label": label,
        "negative_entries": negative,
        # More than one negative entry means the rule's premise (non-negative features) failed.
        "unambiguous": negative == 1,
    }
