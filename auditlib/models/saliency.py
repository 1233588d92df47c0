"""Grad-CAM++ saliency (Chattopadhay et al., WACV 2018) at one convolution of any model.

The Shadow defense uses it to find the task-relevant foreground it should spare. Written
here (about twenty lines) rather than taken from the ``grad-cam`` package, which pulls in
OpenCV and scikit-learn for the same arithmetic.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from auditlib.errors import AuditInputError


def last_convolution(model: nn.Module) -> str:
    """Name of the last ``nn.Conv2d`` registered in ``model`` (the usual CAM layer)."""
    names = [name for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    if not names:
        raise AuditInputError("Grad-CAM++ needs a model with at least one nn.Conv2d layer")
    return names[-1]


def grad_cam_plus_plus(
    model: nn.Module, images: torch.Tensor, classes: torch.Tensor, layer: str
) -> torch.Tensor:
    """Saliency of ``classes`` (one per image) at ``layer``, upsampled to the images' size
    and min-max scaled to [0, 1] per image; shape (B, H, W). The model's parameters and
    buffers are left as they were (the forward runs in eval mode, then the mode is restored).
    """
    modules = dict(model.named_modules())
    if layer not in modules:
        raise AuditInputError(f"Grad-CAM++ layer {layer!r} is not a module of the model")
    captured: list[torch.Tensor] = []
    handle = modules[layer].register_forward_hook(lambda m, i, out: captured.append(out))
    training = model.training
    with contextlib.suppress(NotImplementedError):  # torch.export modules fix their mode
        model.eval()
    try:
        with torch.enable_grad():
            logits = model(images.detach())
            score = logits.gather(1, classes.view(-1, 1)).sum()
            activations = captured[0]
            (grads,) = torch.autograd.grad(score, activations)
    finally:
        handle.remove()
        with contextlib.suppress(NotImplementedError):
            model.train(training)
    activations = activations.detach()
    # Second- and third-order terms of exp(score) reduce to powers of the first-order
    # gradient (the paper's Eq. 19, as implemented by pytorch-grad-cam).
    squared = grads.pow(2)
    denominator = 2 * squared + activations.sum(dim=(2, 3), keepdim=True) * grads.pow(3)
    alpha = torch.where(grads != 0, squared / (denominator + 1e-7), torch.zeros_like(grads))
    weights = (alpha * grads.clamp(min=0)).sum(dim=(2, 3), keepdim=True)
    cam = F.relu((weights * activations).sum(dim=1, keepdim=True))
    cam = F.interpolate(cam, size=images.shape[-2:], mode="bilinear", align_corners=False)[:, 0]
    low = cam.flatten(1).min(dim=1).values.view(-1, 1, 1)
    high = cam.flatten(1).max(dim=1).values.view(-1, 1, 1)
    return (cam - low) / (high - low).clamp(min=1e-12)
