"""Victims from torchvision's classification zoo, by name: ``torchvision:NAME``.

Any builder in ``torchvision.models.list_models(module=torchvision.models)`` (ResNet, wide
ResNet, ResNeXt, MobileNet v2/v3, EfficientNet and v2, RegNet, DenseNet, ConvNeXt, ViT, Swin,
MaxViT, ...) is built with ``weights=None`` (nothing is ever downloaded: the auditor's
weights come through ``loading.load_weights``) and ``num_classes``. Inputs are colour
(3 channels): the builders' first convolution and every checkpoint made from them take
three, and grayscale images are repeated to three channels when a model takes them.

Three things differ from calling the builder directly, none of them in the state_dict:

* ViT builders get ``image_size`` (its position embeddings depend on it); MaxViT gets
  ``input_size``; GoogLeNet and Inception v3 are built without their auxiliary classifiers
  (they only add a training loss, and their namedtuple output is not a logits tensor).
* Dropout and stochastic depth are switched off (p = 0). The client's random masks are
  unknown to the attacker and would make the update it observes irreproducible; the audit
  takes the deterministic forward, the worst case for the client.
* Modules whose torch kernel has no double backward, which the optimisation attacks need
  (they differentiate the gradient a second time), compute the same function with ops that
  have one: ``nn.MultiheadAttention`` (ViT) runs scaled-dot-product attention's math kernel
  (the fused flash kernels of CPU and CUDA have none), ``nn.Hardsigmoid`` (MobileNet v3) is
  clamp(x + 3, 0, 6) / 6.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import re
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from auditlib.errors import AuditInputError
from auditlib.models.shapes import SHAPE_ERRORS, meta_forward, reason, smallest_side

PREFIX = "torchvision:"
LIST_HINT = "`python -m auditlib models` lists them all"
CHANNELS = 3
DEFAULT_SIDE = 224  # the side every torchvision classification builder is made for
# Families without BatchNorm: LayerNorm (ViT, Swin, ConvNeXt) or no normalisation at all.
_NO_BATCHNORM = re.compile(r"^(vit_|swin_|convnext_|alexnet$|squeezenet|vgg\d+$)")
_CONVOLUTION_HEAD = re.compile(r"^squeezenet")  # classifier: a 1x1 convolution, then pooling
_VIT = re.compile(r"^vit_[a-z]_(\d+)$")
_NO_AUX = {"googlenet": {"aux_logits": False, "init_weights": True}}
_NO_AUX["inception_v3"] = _NO_AUX["googlenet"]
_CLOSE = 4


@functools.cache
def torchvision_names() -> tuple[str, ...]:
    """The auditable torchvision names (without the prefix): its classification builders."""
    from torchvision import models

    return tuple(sorted(models.list_models(module=models)))


def is_torchvision(architecture: str) -> bool:
    return isinstance(architecture, str) and architecture.strip().lower().startswith(PREFIX)


def close_matches(text: str, names: list[str]) -> list[str]:
    """Up to four of ``names`` that ``text`` may have meant (difflib), best first."""
    return difflib.get_close_matches(text.strip().lower(), names, n=_CLOSE, cutoff=0.6)


def checked_name(architecture: str) -> str:
    """``torchvision:NAME`` normalised (lower case, no spaces), or a refusal naming the close
    matches and how to list every name."""
    name = architecture.strip().lower().removeprefix(PREFIX).strip()
    names = torchvision_names()
    if name in names:
        return PREFIX + name
    matches = close_matches(name, list(names))
    if matches:
        hint = "close matches: " + ", ".join(PREFIX + m for m in matches)
    else:
        hint = f"expected {PREFIX}NAME with NAME a torchvision classification builder"
    raise AuditInputError(
        f"architecture {architecture!r} is not a torchvision classification model; {hint}; "
        f"{LIST_HINT} ({len(names)} torchvision names)"
    )


def bare_name(architecture: str) -> str:
    return architecture.removeprefix(PREFIX)


def has_batchnorm(architecture: str) -> bool:
    """Whether the named torchvision model has BatchNorm layers (by family, without building)."""
    return _NO_BATCHNORM.match(bare_name(architecture)) is None


def ends_in_linear(architecture: str) -> bool:
    """Whether the named torchvision model's classifier is a linear layer (SqueezeNet's is a
    1x1 convolution, so nothing reads labels off a last linear layer there)."""
    return _CONVOLUTION_HEAD.match(bare_name(architecture)) is None


def description(architecture: str) -> str:
    name = bare_name(architecture)
    norm = "BatchNorm" if has_batchnorm(architecture) else "no BatchNorm"
    return (
        f"torchvision's {name} ({norm}), random init (weights=None) or the auditor's weights; "
        f"colour input, made for {DEFAULT_SIDE}x{DEFAULT_SIDE} pixels"
    )


def check_input_shape(architecture: str, input_shape: tuple[int, int, int]) -> None:
    """What can be refused without building: channels, and ViT's square patch grid.

    Other sizes a model cannot take (a feature map that shrinks below a kernel) are refused
    when it is built (:func:`build`), naming the smallest side it takes.
    """
    channels, height, width = input_shape
    if channels != CHANNELS:
        raise AuditInputError(
            f"{architecture} takes colour input (3 channels), got {channels}; expected "
            "input_shape (3, H, W) (CLI: --channels 3): grayscale images are repeated to "
            "three channels for such a model, and the builder's first convolution and its "
            "checkpoints take three"
        )
    vit = _VIT.match(bare_name(architecture))
    if vit is None:
        return
    patch = int(vit.group(1))
    if height != width or height % patch:
        low = max(patch, height // patch * patch)
        sizes = sorted({low, low + patch})
        raise AuditInputError(
            f"{architecture} takes square inputs whose side is a multiple of its {patch}-pixel "
            f"patches, got {height}x{width}; expected e.g. "
            + " or ".join(f"{s}x{s}" for s in sizes)
            + f" (its checkpoints are usually made at {DEFAULT_SIDE}x{DEFAULT_SIDE})"
        )


def builder_kwargs(architecture: str, input_shape: tuple[int, int, int]) -> dict[str, Any]:
    """The keyword arguments, beyond ``weights`` and ``num_classes``, the builder gets."""
    name = bare_name(architecture)
    _, height, width = input_shape
    if _VIT.match(name):
        return {"image_size": height}
    if name.startswith("maxvit"):
        return {"input_size": (height, width)}
    return dict(_NO_AUX.get(name, {}))


class MathAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` whose attention runs the math kernel of scaled-dot-product
    attention, which has a double backward (the fused kernels do not)."""

    def forward(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        with sdpa_kernel([SDPBackend.MATH]):
            return super().forward(*args, **kwargs)


class ClampHardsigmoid(nn.Hardsigmoid):
    """``nn.Hardsigmoid`` as clamp(x + 3, 0, 6) / 6: the same function, but torch's fused
    kernel has no double backward (MobileNet v3's squeeze-excitation gates use it)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.hardtanh(input + 3.0, 0.0, 6.0) / 6.0


# Modules whose kernel has no double backward, and the twice-differentiable subclass that
# computes the same function with the same parameters (swapped in place: the state_dict
# and the module names stay as the builder made them).
TWICE_DIFFERENTIABLE: dict[type[nn.Module], type[nn.Module]] = {
    nn.MultiheadAttention: MathAttention,
    nn.Hardsigmoid: ClampHardsigmoid,
}


def make_deterministic(model: nn.Module) -> nn.Module:
    """Dropout and stochastic depth off, every module twice differentiable (in place)."""
    from torchvision.ops import StochasticDepth

    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd | StochasticDepth):
            module.p = 0.0
        if isinstance(module, nn.MultiheadAttention):
            module.dropout = 0.0
        swapped = TWICE_DIFFERENTIABLE.get(type(module))
        if swapped is not None:
            module.__class__ = swapped
    return model


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # Builders warn about future changes of their defaults; the audit passes what it needs.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def build(
    architecture: str, num_classes: int, input_shape: tuple[int, int, int], max_side: int
) -> nn.Module:
    """The named torchvision model with random weights (from torch's global RNG: the caller
    seeds it), made deterministic and checked to take ``input_shape``."""
    from torchvision import models

    check_input_shape(architecture, input_shape)
    name = bare_name(architecture)
    _, height, width = input_shape
    size = f"{height}x{width}"
    kwargs = builder_kwargs(architecture, input_shape)
    try:
        with _quiet():
            model = models.get_model(name, weights=None, num_classes=num_classes, **kwargs)
    except SHAPE_ERRORS as exc:  # MaxViT checks its partition grid when it is built
        raise AuditInputError(
            f"{architecture} cannot take {size} inputs ({reason(exc)}); expected e.g. "
            f"{DEFAULT_SIDE}x{DEFAULT_SIDE}, the size its builder is made for"
        ) from None
    make_deterministic(model)
    try:
        meta_forward(model, input_shape)
    except SHAPE_ERRORS as exc:
        side = smallest_side(model, CHANNELS, min(height, width) + 1, max_side)
        expected = (
            f"at least {side}x{side} pixels"
            if side is not None
            else f"e.g. {DEFAULT_SIDE}x{DEFAULT_SIDE}, the size its builder is made for"
        )
        raise AuditInputError(
            f"{architecture} cannot take {size} inputs (a feature map shrinks below a kernel: "
            f"{reason(exc)}); expected {expected}"
        ) from None
    return model
