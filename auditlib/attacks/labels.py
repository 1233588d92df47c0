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

from collections.abc import Mapping
from typing import Any, Literal

import torch

from auditlib.client.update import read_as_gradient
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


def gradient_estimate(
    observation: Observation, knowledge: AttackerKnowledge, index: int
) -> torch.Tensor:
    """The observed update of parameter ``index`` read as one gradient of the batch loss
    (:func:`~auditlib.client.update.read_as_gradient`): for FedAvg the mean of the K local
    gradients, each taken at different weights, so an estimate, the one FedLeak (Sec. 4.5)
    and the label rules of the FedAvg papers rely on."""
    name = observation.parameter_names[index]
    update = observation.tensors[index].detach()
    if observation.kind == "gradient":
        return update
    parameter = {name: knowledge.parameters()[name]}
    return read_as_gradient([update], parameter, knowledge.protocol, knowledge.batch_size)[0]


def last_layer_gradient(
    observation: Observation, knowledge: AttackerKnowledge, which: str
) -> torch.Tensor:
    """The last linear layer's ``which`` ("weight"/"bias") update read as a gradient."""
    name = f"{_last_layer_prefix(observation, knowledge)}.{which}"
    if name not in observation.parameter_names:
        raise AttackUnsupportedError(f"the last linear layer has no shared {which} ({name})")
    return gradient_estimate(observation, knowledge, observation.parameter_names.index(name))


def why_not_one_image(observation: Observation, knowledge: AttackerKnowledge) -> str | None:
    """Why the iDLG label rule does not hold here (None: it does): it reads one image's
    label (``AttackInfo.not_applicable``, so a plan leaves it out before it runs)."""
    if knowledge.batch_size == 1:
        return None
    return (
        f"the iDLG label rule holds for one image, the batch has {knowledge.batch_size}; "
        "use batch size 1 or an attack with batch label inference"
    )


def idlg_label(
    observation: Observation, knowledge: AttackerKnowledge, source: LabelSource = "weight"
) -> tuple[int, dict[str, Any]]:
    """The single image's label by the iDLG rule; also a record of how it was found."""
    why = why_not_one_image(observation, knowledge)
    if why is not None:
        raise AttackUnsupportedError(why)
    gradient = last_layer_gradient(observation, knowledge, source)
    scores = gradient.sum(dim=-1) if source == "weight" else gradient
    label = int(torch.argmin(scores))
    negative = int((scores < 0).sum())
    return label, {
        "rule": f"iDLG ({source} gradient of the last layer)",
        "source": source,
        "label": label,
        "negative_entries": negative,
        # More than one negative entry means the rule's premise (non-negative features) failed.
        "unambiguous": negative == 1,
    }


# Defenses that leave the sign of every entry and row sum of the last layer's update as the
# client computed it: none, and clipping of the whole update's norm (a positive scale).
# Noise, quantisation, pruning, value clipping and the rest may not (``idlg_exact``).
_SIGN_KEEPING = "the update is sent as computed"


def idlg_exact(
    record: Mapping[str, Any],
    *,
    classes: int,
    steps: int,
    optimizer: str,
    weight_decay: float,
    defense: str,
    defense_params: Mapping[str, str],
    honest_server: bool,
    observed: bool,
) -> tuple[bool, str]:
    """Whether the iDLG rule's label (``idlg_label``'s ``record``) is exact by construction
    here, and why (or why not), in words.

    For one image under cross-entropy the last layer's bias gradient is p - y: negative for
    the true class alone. Its weight gradient's row i is (p_i - y_i) h, whose sum has the
    sign of p_i - y_i times that of sum(h): one negative row among C >= 3 can only be the
    true class (were sum(h) negative, C - 1 rows would be). So the label is the truth, not a
    guess, when the record shows exactly one negative entry and the update keeps those
    signs: sent as computed or its norm clipped (a positive scale), a server that sent the
    model it trained (not a malicious one), a simulated client (an observed update may have
    been changed in ways not recorded), and local training that adds gradients of that sign
    pattern: SGD without weight decay (the bias; momentum only adds them with positive
    weights), or one step (the weight rule, whose row sums mix steps of different h).
    Anything else, noise, quantisation or pruning, makes it a guess that the label test
    weighs (``metrics.risk.label_test``)."""
    source = record.get("source")
    if source is None:  # recorded before the source was: read from the rule's words
        source = "bias" if "bias" in str(record.get("rule", "")) else "weight"
    negative = record.get("negative_entries")
    why_not = None
    if not record.get("unambiguous"):
        why_not = (
            f"{negative} entries of the last layer's {source} update are negative, not one: "
            "the rule's premise failed"
        )
    elif defense not in ("none", "clip") or (
        defense == "clip" and defense_params.get("mode", "norm") != "norm"
    ):
        why_not = f"the defense ({defense}) changes the last layer's update"
    elif not honest_server:
        why_not = "a malicious server's model"
    elif observed:
        why_not = "an observed update, which the client may have changed in ways not recorded"
    elif optimizer != "sgd" or weight_decay:
        why_not = "the client's local optimiser (Adam or weight decay) mixes the signs"
    elif source == "weight" and steps != 1:
        why_not = (
            f"the client's {steps} local steps: the weight rule's row sums hold for one "
            "gradient (the bias rule holds for any number of SGD steps)"
        )
    elif source == "weight" and classes < 3:
        why_not = "with 2 classes one negative row does not say which"
    if why_not is not None:
        return False, f"iDLG's label rule is not exact here ({why_not})"
    kept = _SIGN_KEEPING if defense == "none" else "clipping its norm only rescales the update"
    if source == "bias":
        because = (
            "the last layer's bias gradient is p - y, negative for the true class alone, and "
            f"exactly 1 of its {classes} entries is negative"
        )
    else:
        because = (
            "each row sum of the last layer's weight gradient is p_i - y_i times the sum of "
            f"the layer's input, so the one negative row of {classes}, as here, is the true "
            "class"
        )
    return True, (
        f"class {record.get('label')}, read by iDLG's rule, exact for one image under "
        f"cross-entropy: {because}; {kept}, so it is no guess and needs no test against chance"
    )


# --- Batch rules --------------------------------------------------------------------------

BatchRule = Literal["auto", "distinct", "counts", "bias-counts"]
ClassReduce = Literal["sum", "min"]


def class_scores(
    observation: Observation, knowledge: AttackerKnowledge, reduce: ClassReduce = "sum"
) -> torch.Tensor:
    """One score per class from the last layer's weight gradient (N classes x K features).

    Row i is sum_b (p_bi - y_bi) h_b / B: with non-negative features h it is most negative
    for the classes in the batch. ``sum`` adds the row (iDLG, FedLeak Sec. 5); ``min`` takes
    its most negative entry (GradInversion, Yin et al. 2021, Sec. 3.2).
    """
    gradient = last_layer_gradient(observation, knowledge, "weight")
    return gradient.sum(dim=-1) if reduce == "sum" else gradient.min(dim=-1).values


def distinct_labels(
    observation: Observation, knowledge: AttackerKnowledge, reduce: ClassReduce = "sum"
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The B classes with the most negative scores; assumes no label repeats (B <= classes)."""
    batch, classes = knowledge.batch_size, knowledge.num_classes
    if batch > classes:
        raise AttackUnsupportedError(
            f"{batch} images cannot have distinct labels among {classes} classes; "
            "use a counting rule (labels=counts)"
        )
    scores = class_scores(observation, knowledge, reduce).cpu()
    labels = torch.argsort(scores)[:batch].sort().values
    return labels, {
        "rule": f"distinct labels: the {batch} most negative last-layer class scores ({reduce})",
        "labels": labels.tolist(),
    }


def _fill(counts: torch.Tensor, batch: int, order: torch.Tensor) -> torch.Tensor:
    """Adds the missing samples one at a time to the classes in ``order`` (cycling)."""
    counts = counts.clone()
    missing = batch - int(counts.sum())
    for i in range(missing):
        counts[order[i % len(order)]] += 1
    return counts


def _labels_from_counts(counts: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(counts)), counts)


CountFill = Literal["largest-remainder", "lowest-class"]


def counted_labels(
    observation: Observation, knowledge: AttackerKnowledge, fill: CountFill = "largest-remainder"
) -> tuple[torch.Tensor, dict[str, Any]]:
    """FedLeak's count estimate for batches that must repeat labels (Sec. 5, Appendix F).

    c_j = floor(B * sum_i (dW[j, i] - max dW) / sum_j sum_i (dW[j, i] - max dW)), where
    "max W" is read as the largest entry of the weight gradient dW, so every term is <= 0
    and classes with more negative rows get larger shares. The paper gives the samples the
    floors leave missing to "the class with the lowest gradient strength"; ``lowest-class``
    reads that literally (all to the most negative row sum), ``largest-remainder`` (default)
    gives them one each to the largest fractional shares (compared in docs/REPRODUCTION.md).
    """
    gradient = last_layer_gradient(observation, knowledge, "weight").double().cpu()
    shifted = (gradient - gradient.max()).sum(dim=-1)
    batch = knowledge.batch_size
    total = shifted.sum()
    if not bool(total < 0):
        raise AttackUnsupportedError("the last layer's update is zero; labels cannot be counted")
    share = batch * shifted / total
    counts = torch.floor(share).long()
    if fill == "lowest-class":
        order = torch.argsort(gradient.sum(dim=-1))[:1]
    else:
        order = torch.argsort(share - counts, descending=True)
    counts = _fill(counts, batch, order)
    labels = _labels_from_counts(counts)
    return labels, {
        "rule": f"FedLeak count estimate from the last-layer weight gradient ({fill} fill)",
        "counts": {int(c): int(n) for c, n in enumerate(counts) if n > 0},
    }


def bias_counted_labels(
    observation: Observation, knowledge: AttackerKnowledge
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Counts from the bias gradient g_j = mean_b (p_bj - y_bj), so n_j = B (p_j - g_j).

    The mean prediction p_j is unknown to the server; it is taken as 1/N, which holds for an
    untrained model (the LLG-style estimate of Wainakh et al. 2022); counts are rounded by
    largest remainder so they sum to B.
    """
    gradient = last_layer_gradient(observation, knowledge, "bias").double().cpu()
    batch, classes = knowledge.batch_size, knowledge.num_classes
    estimate = (batch * (1.0 / classes - gradient)).clamp(min=0)
    if float(estimate.sum()) <= 0:
        raise AttackUnsupportedError("the bias update gives no positive class count")
    estimate = estimate * batch / estimate.sum()
    counts = torch.floor(estimate).long()
    counts = _fill(counts, batch, torch.argsort(estimate - counts, descending=True))
    labels = _labels_from_counts(counts)
    return labels, {
        "rule": "counts from the last-layer bias gradient (mean prediction taken as 1/N)",
        "counts": {int(c): int(n) for c, n in enumerate(counts) if n > 0},
    }


def infer_batch_labels(
    observation: Observation,
    knowledge: AttackerKnowledge,
    rule: BatchRule = "auto",
    reduce: ClassReduce = "sum",
    fill: CountFill = "largest-remainder",
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Class ids for the whole batch (length B, sorted), and a record of how they were found.

    ``auto`` uses distinct labels while the batch fits in the classes, else FedLeak's counts.
    Label order carries no information; metrics match labels as a multiset.
    """
    if rule == "auto":
        rule = "distinct" if knowledge.batch_size <= knowledge.num_classes else "counts"
    if rule == "distinct":
        return distinct_labels(observation, knowledge, reduce)
    if rule == "counts":
        return counted_labels(observation, knowledge, fill)
    if rule == "bias-counts":
        return bias_counted_labels(observation, knowledge)
    raise AuditInputError(
        f"unknown label rule {rule!r}; expected auto, distinct, counts or bias-counts"
    )
