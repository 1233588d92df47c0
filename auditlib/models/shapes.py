"""What input shapes and batch sizes a model takes, found on torch's meta device.

A meta forward runs every module's shape logic and torch's own checks (a kernel larger than
its padded input, BatchNorm's "more than 1 value per channel when training") without any
arithmetic, so it costs milliseconds even for a large model and changes nothing in it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call

from auditlib.errors import AuditInputError

# What torch raises for a shape a model cannot take: a feature map smaller than a kernel,
# a builder's size assertion, BatchNorm's check of the values per channel.
SHAPE_ERRORS = (RuntimeError, ValueError, AssertionError, IndexError)
_BATCHNORM = nn.modules.batchnorm._BatchNorm


def reason(exc: BaseException) -> str:
    """The first sentence of an exception message, for a one-line error."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(". ")[0].rstrip(".")[:160]


def meta_forward(
    model: nn.Module, input_shape: Sequence[int], batch: int = 1, *, training: bool = False
) -> None:
    """Run ``model`` on a meta batch with meta copies of its parameters and buffers: shapes
    only, and the model is left as it was (mode included). Raises what the real forward
    would for a shape it cannot take."""
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    meta = {k: torch.empty_like(v, device="meta") for k, v in tensors.items()}
    was_training = model.training
    model.train(training)
    try:
        with torch.no_grad():
            functional_call(model, meta, (torch.empty((batch, *input_shape), device="meta"),))
    finally:
        model.train(was_training)


def smallest_side(
    model: nn.Module, channels: int, low: int, high: int, batch: int = 1, *, training=False
) -> int | None:
    """The smallest square side in [low, high] the model takes, or None (a binary search: a
    model that takes a side takes the larger ones)."""

    def takes(side: int) -> bool:
        try:
            meta_forward(model, (channels, side, side), batch, training=training)
        except SHAPE_ERRORS:
            return False
        return True

    if low > high or not takes(high):
        return None
    while low < high:
        middle = (low + high) // 2
        if takes(middle):
            high = middle
        else:
            low = middle + 1
    return high


def training_batch_problem(
    model: nn.Module, input_shape: tuple[int, int, int], batch: int, max_side: int = 512
) -> str | None:
    """Why ``model`` cannot compute a training-mode update on ``batch`` images of
    ``input_shape``, or None.

    Training-mode BatchNorm normalises each channel over the batch and the feature map; where
    the map has shrunk to 1x1, one image leaves one value per channel and torch refuses it.
    The reason names the layer and what would make the update computable.
    """
    if not any(isinstance(m, _BATCHNORM) for m in model.modules()):
        return None
    seen: list[tuple[str, tuple[int, ...]]] = []
    hooks = [
        m.register_forward_pre_hook(lambda _m, args, n=n: seen.append((n, tuple(args[0].shape))))
        for n, m in model.named_modules()
        if isinstance(m, _BATCHNORM)
    ]
    try:
        meta_forward(model, input_shape, batch, training=True)
    except ValueError as exc:
        if "more than 1 value per channel" not in str(exc) or not seen:
            raise
        name, shape = seen[-1]
    else:
        return None
    finally:
        for hook in hooks:
            hook.remove()
    channels, height, width = input_shape
    map_size = "x".join(str(v) for v in shape[2:]) or "1"
    side = smallest_side(model, channels, max(height, width) + 1, max_side, batch, training=True)
    larger = f", inputs of at least {side}x{side} pixels" if side is not None else ""
    images = "one image" if batch == 1 else f"{batch} images"
    label = getattr(getattr(model, "spec", None), "architecture", type(model).__name__)
    return (
        f"{label} cannot compute a training-mode update on {images} of {height}x{width} "
        f"pixels: its BatchNorm layer {name} sees a {map_size} feature map there, one value "
        "per channel, which it cannot normalise; expected "
        f"a batch of at least 2 images{larger}, or BatchNorm in eval mode (CLI: --bn-mode eval)"
    )


def check_training_batch(
    model: nn.Module, input_shape: tuple[int, int, int], batch: int, max_side: int = 512
) -> None:
    """:func:`training_batch_problem` as a refusal."""
    problem = training_batch_problem(model, input_shape, batch, max_side)
    if problem is not None:
        raise AuditInputError(problem)
