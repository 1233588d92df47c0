"""Each image's own weight gradient at every Linear and convolution, per unit, in one backward
pass of the client's summed loss on its own batch (the model check's behaviour signals,
``model_behaviour``).

A forward hook keeps each layer's input and output; one ``torch.autograd.grad`` of the summed
cross-entropy with respect to the outputs gives, in row i, image i's own gradient at that
layer's units, whatever activation follows (it is zero where a ReLU, ``clamp_min(0)`` or a
threshold switched the unit off, small where a leaky or smooth one did). The per-image
weight gradient of a unit (a Linear's row, a convolution's kernel) follows exactly from the
output gradient and the input: ``g_i x_i^T`` for a Linear, ``sum_p g_ip patch_ip^T`` over the
positions p for a convolution (its input unfolded). This costs about one backward pass's
weight-gradient arithmetic (the sum over images of what a weight gradient sums) and holds
images x units x fan-in numbers per layer at once; no parameter's ``.grad`` is touched.

The model is run in eval mode by default (dropout off; BatchNorm on its running statistics,
so an image's row depends on that image alone and no buffer moves); ``train`` mode runs it
as the client trains, with BatchNorm on batch statistics (rows then mix the batch), and puts
every buffer back afterwards. Either way modes, buffers and parameters are left as found.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

# Layers whose per-image weight gradient is computed exactly here. Conv3d and transposed
# convolutions are not judged (named in ``BatchGradients.skipped``).
JUDGED = (nn.Linear, nn.Conv1d, nn.Conv2d)


@dataclass(frozen=True, eq=False)
class LayerGradients:
    """One layer's per-image, per-unit weight-gradient norms on the client's batch."""

    name: str
    kind: str  # "linear" or "conv"
    # images x units: the norm of image i's own weight gradient at unit u (a Linear's row, a
    # convolution's kernel), float64
    per_unit: torch.Tensor
    # units: the norm of the batch's summed weight gradient at each unit (the update's row)
    update_rows: torch.Tensor
    # whether its output is the model's output (the logits): its units are the classes,
    # whose gradient the labels decide
    head: bool = False

    @property
    def per_image(self) -> torch.Tensor:
        """The norm of each image's whole weight gradient at this layer (SEER's D-SNR)."""
        return self.per_unit.square().sum(1).sqrt()


@dataclass(frozen=True, eq=False)
class BatchGradients:
    layers: tuple[LayerGradients, ...]
    skipped: tuple[str, ...]  # convolution layers of a kind not judged here
    why_unavailable: str = ""  # why nothing could be computed ("" where it could)


class _Recorder:
    def __init__(self, model: nn.Module) -> None:
        self.names = {m: n for n, m in model.named_modules() if isinstance(m, JUDGED)}
        self.calls: list[tuple[str, nn.Module, torch.Tensor, torch.Tensor]] = []
        self.seen: dict[str, int] = {}

    def __call__(self, module, inputs, output) -> None:
        if not inputs or not isinstance(output, torch.Tensor) or not output.requires_grad:
            return
        name = self.names[module]
        count = self.seen.get(name, 0) + 1
        self.seen[name] = count
        label = name if count == 1 else f"{name} (call {count})"  # a layer used twice
        self.calls.append((label, module, inputs[0].detach(), output))


def batch_gradients(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, mode: str = "eval"
) -> BatchGradients:
    """Per-image weight-gradient norms at every Linear/Conv1d/Conv2d of ``model`` on the
    batch, from one backward pass of the summed cross-entropy; the model left as found."""
    skipped = tuple(
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.modules.conv._ConvNd) and not isinstance(m, JUDGED)
    )
    recorder = _Recorder(model)
    modes = {m: m.training for m in model.modules()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    hooks = [m.register_forward_hook(recorder) for m in recorder.names]
    try:
        model.train(mode == "train")
        with torch.enable_grad():
            # The input requires grad so that a graph exists even where the parameters are
            # frozen; only the layers' outputs are differentiated, never a parameter.
            logits = model(images.detach().clone().requires_grad_(True))
            if logits.ndim != 2 or logits.shape[0] != images.shape[0]:
                return BatchGradients(
                    (),
                    skipped,
                    f"the model's output has shape {tuple(logits.shape)}, not "
                    "images x classes: no loss to take on the client's labels",
                )
            if int(labels.max()) >= logits.shape[1] or int(labels.min()) < 0:
                return BatchGradients((), skipped, "the labels do not fit the model's classes")
            loss = F.cross_entropy(logits, labels.to(logits.device), reduction="sum")
            outputs = [output for _, _, _, output in recorder.calls]
            grads = torch.autograd.grad(loss, outputs, allow_unused=True) if outputs else ()
        layers = []
        last = len(recorder.calls) - 1
        for k, ((label, module, x, out), g) in enumerate(zip(recorder.calls, grads, strict=True)):
            if g is not None:
                head = out is logits or (k == last and out.shape == logits.shape)
                layers.append(_layer_gradients(label, module, x, g.detach(), head))
        return BatchGradients(tuple(layers), skipped)
    finally:
        for hook in hooks:
            hook.remove()
        for m, training in modes.items():
            m.training = training
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])


def _layer_gradients(
    name: str, module: nn.Module, x: torch.Tensor, g: torch.Tensor, head: bool
) -> LayerGradients:
    found = _linear(name, x, g) if isinstance(module, nn.Linear) else _conv(name, module, x, g)
    return replace(found, head=head)


def _linear(name: str, x: torch.Tensor, g: torch.Tensor) -> LayerGradients:
    images = x.shape[0]
    if x.ndim == 2:
        # g_i x_i^T: row u's norm is |g_iu| ||x_i||; the update's rows are g^T x's.
        per_unit = g.double().abs() * x.double().norm(dim=1, keepdim=True)
        update = (g.T @ x).double().norm(dim=1)
        return LayerGradients(name, "linear", per_unit, update)
    # Tokens or positions before the features: image i's gradient sums over them.
    x3, g3 = x.reshape(images, -1, x.shape[-1]), g.reshape(images, -1, g.shape[-1])
    own = torch.bmm(g3.transpose(1, 2), x3)  # images x out x in
    return LayerGradients(name, "linear", own.double().norm(dim=2), own.sum(0).double().norm(dim=1))


def _conv(name: str, module: nn.Module, x: torch.Tensor, g: torch.Tensor) -> LayerGradients:
    """Image i's kernel gradients: its output gradient times its unfolded input, per group."""
    conv1d = isinstance(module, nn.Conv1d)
    if conv1d:  # a Conv1d is a Conv2d of height 1
        x, g = x.unsqueeze(2), g.unsqueeze(2)
    kernel = (1, *module.kernel_size) if conv1d else module.kernel_size
    stride = (1, *module.stride) if conv1d else module.stride
    dilation = (1, *module.dilation) if conv1d else module.dilation
    mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
    padded = F.pad(x, module._reversed_padding_repeated_twice, mode=mode)
    patches = F.unfold(padded, kernel, dilation=dilation, stride=stride)  # B x (C k) x P
    images, groups = x.shape[0], module.groups
    out = g.shape[1]
    patches = patches.reshape(images, groups, -1, patches.shape[-1])
    g = g.reshape(images, groups, out // groups, -1)
    own = torch.einsum("bgop,bgdp->bgod", g, patches).reshape(images, out, -1)
    return LayerGradients(name, "conv", own.double().norm(dim=2), own.sum(0).double().norm(dim=1))
