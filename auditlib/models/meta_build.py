"""The model a spec describes with its weights on torch's meta device: its state_dict's
names, shapes and dtypes without the memory.

What a file of weights must hold is known before the model is built, so a file that cannot
fit is refused before the (possibly large) model is: an ``mlp`` of 100,000 classes at 512
pixels is 227 million parameters, 0.9 GB, for a bundle of a few bytes to name.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from auditlib.models.registry import ModelSpec, checked_spec, construct

# How layers allocate their weights. Only these go to the meta device: a builder that
# computes with tensors (torchvision's RegNet reads its widths back with .tolist()) keeps
# doing so on the CPU, which ``torch.device("meta")`` as a context would refuse.
_ALLOCATIONS = frozenset(
    {
        torch.empty,
        torch.empty_strided,
        torch.zeros,
        torch.ones,
        torch.full,
        torch.rand,
        torch.randn,
        torch.randint,
    }
)


class _WeightsOnMeta(TorchFunctionMode):
    """Allocations that name no device are made on the meta device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = dict(kwargs or {})
        if func in _ALLOCATIONS and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def meta_model(spec: ModelSpec) -> nn.Module:
    """``build_model(spec)``'s architecture with its weights on the meta device (a few small
    buffers, made from computed values, stay on the CPU): its state_dict and parameters say
    what the built model's will hold, in milliseconds and without their memory. Refused as
    ``build_model`` refuses (the same factory and checks)."""
    spec = checked_spec(spec)  # as build_model: the checks, the defaults
    with _WeightsOnMeta():
        model = construct(spec)
    return model.to(dtype=torch.float32)  # build_model's dtype
