"""The layers of a malicious server that knows the client's model check (``server.evading``).

They compute what the built blocks compute (``server.blocks``), in forms the check's weight
signatures and its batch check do not read (``defenses.model_signatures``):

- rows given as a ``Conv2d`` whose kernel covers the whole input (4-D weights: the check
  reads linear layers as 2-D weights only), or as a ``Linear`` with each row jittered;
- ``spread`` with its columns jittered (relative 1e-5: not identical to 1e-6, while each
  image's gradient at the rows stays one number to 1e-5);
- an activation other than a ReLU module or function (``clamp_min(0)``, ``F.threshold``),
  equal to the ReLU on every input but the threshold itself, so the read-back is the same;
- the block after the model's first convolution (``ConvThenBlock``), its rows reading that
  layer's output, which the server inverts to pixels;
- LOKI's client kernels with weight on every tap (``DisguisedClientKernels``), which the
  read-back undoes, the server knowing the kernels it sent.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from auditlib.data.normalization import Normalization
from auditlib.server.blocks import SPREAD, ClientKernels, LokiBlock

Activation = Literal["clamp", "threshold", "relu"]


def activate(x: torch.Tensor, activation: str) -> torch.Tensor:
    """max(x, 0) in the form asked for; ``clamp`` and ``threshold`` are not the ReLU module
    or function the check's batch test watches, and pass the same gradient (1 above 0,
    0 below)."""
    if activation == "clamp":
        return x.clamp_min(0)
    if activation == "threshold":
        return F.threshold(x, 0.0, 0.0)
    return torch.relu(x)


def jittered(values: torch.Tensor, relative: float, generator: torch.Generator) -> torch.Tensor:
    """``values`` times (1 + relative N(0, 1)), entry by entry."""
    noise = torch.randn(values.shape, generator=generator, dtype=torch.float64)
    return (values.double() * (1 + relative * noise)).to(values.dtype)


# A decoy row's bias is this many times the most its weights can reach on an input within the
# bound: it fires for every input there, whatever the image.
DECOY_MARGIN = 1.5


def with_decoys(
    rows: torch.Tensor,
    biases: torch.Tensor,
    count: int,
    bound: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` and ``biases`` with ``count`` decoy rows after them: random directions at the
    rows' own scale, each with a bias above all its weights can reach on an input whose
    entries are within ``bound`` (``DECOY_MARGIN``), so it fires for every image. A decoy's
    gradient is every image's: it splits no batch and no image owns it, which dilutes the
    share of a layer's units the behaviour check finds nested or owned; the read-back skips
    it (``ServerModification.decoys``)."""
    if count == 0:
        return rows, biases
    scale = float(rows.norm(dim=1).mean()) or 1.0
    decoys = torch.randn(count, rows.shape[1], generator=generator)
    decoys *= scale / decoys.norm(dim=1, keepdim=True)
    reach = decoys.abs().sum(1) * bound
    return torch.cat([rows, decoys]), torch.cat([biases, DECOY_MARGIN * reach + 1e-3])


def rows_layer(
    rows: torch.Tensor, biases: torch.Tensor, input_shape: tuple[int, ...], conv: bool
) -> nn.Module:
    """The ``bins`` layer holding ``rows`` (rows x features) and ``biases``: a ``Linear`` on
    the flat input, or (``conv``) a ``Conv2d`` whose one kernel position covers the whole
    C x H x W input, the same function with 4-D weights."""
    count = rows.shape[0]
    if conv:
        channels, height, width = input_shape
        layer = nn.Conv2d(channels, count, kernel_size=(height, width))
        weight = rows.view(count, channels, height, width)
    else:
        layer = nn.Linear(rows.shape[1], count)
        weight = rows
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(biases)
    return layer


def row_count(bins: nn.Module) -> int:
    return bins.out_channels if isinstance(bins, nn.Conv2d) else bins.out_features


class EvadingBlock(nn.Module):
    """front -> bins (Linear or whole-input Conv2d) -> activation -> spread (Linear, its
    columns jittered) -> ``out_shape``: a ``ServerBlock`` in forms the check does not read."""

    def __init__(
        self,
        front: nn.Module,
        bins: nn.Module,
        out_shape: tuple[int, ...],
        activation: str,
        spread_jitter: float,
        generator: torch.Generator,
    ) -> None:
        super().__init__()
        self.front = front
        self.bins = bins
        self.out_shape = tuple(out_shape)
        self.activation = activation
        rows = row_count(bins)
        self.spread = nn.Linear(rows, math.prod(out_shape))
        with torch.no_grad():
            flat = torch.full_like(self.spread.weight, SPREAD / rows)
            self.spread.weight.copy_(jittered(flat, spread_jitter, generator))
            self.spread.bias.zero_()

    def measure(self, x: torch.Tensor) -> torch.Tensor:
        """Each row's pre-activation (batch x rows)."""
        inputs = self.front(x)
        if isinstance(self.bins, nn.Conv2d):
            return self.bins(inputs).flatten(1)
        return self.bins(inputs.flatten(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = activate(self.measure(x), self.activation)
        return self.spread(hidden).view(x.shape[0], *self.out_shape)


class ConvThenBlock(nn.Module):
    """The model's first convolution followed by the block, in that convolution's place: the
    block reads the convolution's output and hands the rest of the model a map of its shape."""

    def __init__(self, conv: nn.Conv2d, block: EvadingBlock) -> None:
        super().__init__()
        self.conv = conv
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.conv(x))


def first_convolution(model: nn.Module) -> tuple[str, nn.Conv2d] | None:
    """The first ``nn.Conv2d`` in registration order (the forward's order in the built-in
    and torchvision models) with its path; None where there is none."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            return name, module
    return None


def conv_before(model: nn.Module, bins_name: str) -> nn.Conv2d | None:
    """The convolution a ``ConvThenBlock`` puts before the block whose rows are
    ``bins_name``; None where the block reads pixels."""
    suffix = ".block.bins"
    if not bins_name.endswith(suffix):
        return None
    holder = model.get_submodule(bins_name[: -len(suffix)])
    return holder.conv if isinstance(holder, ConvThenBlock) else None


# LOKI's kernels: the other taps of a client's kernel share this much of the centre's weight
# in all (``tap_share``): a transmit ratio of 1 / share, the check flagging above 10.
class DisguisedClientKernels(ClientKernels):
    """LOKI's client kernels with weight on every tap of the channel's 3 x 3 window:
    ``taps``: the centre 1 and each other tap ``share`` / 8 of it; ``random``: the centre 1
    and each other tap ``share`` / 8 times |N(0, 1)| drawn per client from the server's seed.
    On pixels u the kernel k gives sum k_t u_t: on model input x = (u - mean) / std its
    weight is k std and its bias mean times the sum of k (the input's zero padding is the
    mean pixel; the server's inversion works on model input and needs no correction)."""

    def __init__(
        self,
        normalization: Normalization,
        clients: int,
        disguise: str,
        share: float,
        seed: int,
    ) -> None:
        self.disguise = disguise
        self.share = share
        self.seed = seed
        super().__init__(normalization, clients)

    def pixel_kernel(self, client: int) -> torch.Tensor:
        """Client ``client``'s 3 x 3 kernel on pixels (one per input channel)."""
        others = torch.full((3, 3), self.share / 8)
        if self.disguise == "random":
            generator = torch.Generator().manual_seed(self.seed * 1009 + client)
            others = torch.randn(3, 3, generator=generator).abs() * (self.share / 8)
        others[1, 1] = 1.0
        return others

    def kernels_of(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight and bias of client ``client``'s convolution (what ``select`` loads)."""
        weight = torch.zeros_like(self.conv.weight)
        bias = torch.zeros_like(self.conv.bias)
        kernel = self.pixel_kernel(client)
        for c in range(self.channels):
            out = client * self.channels + c
            weight[out, c] = kernel * self.normalization.std[c]
            bias[out] = self.normalization.mean[c] * float(kernel.sum())
        return weight, bias

    @torch.no_grad()
    def select(self, client: int) -> None:
        if not hasattr(self, "disguise"):  # the parent's __init__, before ours has run
            super().select(client)
            return
        if not 0 <= client < self.clients:
            raise ValueError(f"client {client} out of range for {self.clients} clients")
        weight, bias = self.kernels_of(client)
        self.conv.weight.copy_(weight)
        self.conv.bias.copy_(bias)
        self.client = client


class EvadingLokiBlock(LokiBlock):
    """LOKI's block with disguised kernels, rows jittered within each client's block (zero
    outside it, so another client's zero block still never fires them), ``spread``'s columns
    jittered, and the activation asked for."""

    def __init__(
        self,
        kernels: DisguisedClientKernels,
        rows: torch.Tensor,
        biases: torch.Tensor,
        input_shape: tuple[int, int, int],
        activation: str,
        spread_jitter: float,
        generator: torch.Generator,
        thresholds: tuple[float, ...],
    ) -> None:
        super().__init__(input_shape, kernels.normalization, kernels.clients, thresholds)
        self.front = kernels
        self.activation = activation
        if rows.shape[0] != self.bins.out_features:  # decoy rows after the clients' own
            self.bins = nn.Linear(rows.shape[1], rows.shape[0])
            self.spread = nn.Linear(rows.shape[0], math.prod(input_shape))
            with torch.no_grad():
                self.spread.weight.fill_(SPREAD / rows.shape[0])
                self.spread.bias.zero_()
        with torch.no_grad():
            self.bins.weight.copy_(rows)
            self.bins.bias.copy_(biases)
            self.spread.weight.copy_(jittered(self.spread.weight, spread_jitter, generator))
        kernels.select(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = activate(self.bins(self.front(x).flatten(1)), self.activation)
        return self.spread(hidden).view(x.shape[0], *self.input_shape)
