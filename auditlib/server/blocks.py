"""The layers a malicious server puts in front of the model it sends.

Each is a :class:`ServerBlock`: a fixed or per-client ``front`` (the pixels, or LOKI's
client kernels), a linear ``bins`` layer whose rows the client's images imprint, a ReLU, and
a linear ``spread`` back to the input's shape, so any model follows unchanged. Every
column of ``spread`` is the same, so a sample's gradient reaches every row of ``bins`` with
one factor: the difference of two rows' updates over the difference of their biases' is
then exactly the image that lies between them, where one does alone (Fowl et al., ICLR
2022, Sec. 3).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from auditlib.data.normalization import Normalization

# The weight of each row in ``spread``, over the rows: it scales every image's gradient at
# the rows (delta). Under FedSGD any scale reads back exactly (a ratio); under FedAvg the
# server sets it from public data (``calibrate_spread``).
SPREAD = 1e-3
# Under FedAvg, the rows' update per local step, lr x delta, is set to this over the pixel
# count: each weight (1/d) then moves by about 2e-4 of itself times the pixel per step, some
# 1,700 steps of float32's resolution (2^-23 ~ 1.2e-7) when the client adds it to the
# weights, while the mean pixel's threshold drifts by about 0.3 x 2e-4 = 6e-5 per step,
# below a bin's width (about 1e-3 at 512 bins). See docs/ALGORITHMS.md, rtf's FedAvg.
STEP_PER_PIXEL = 2e-4


class ToPixels(nn.Module):
    """Model-space input back to [0, 1] pixels: the server knows the normalisation."""

    def __init__(self, normalization: Normalization) -> None:
        super().__init__()
        shape = (1, len(normalization.mean), 1, 1)
        self.register_buffer("mean", torch.tensor(normalization.mean).view(shape))
        self.register_buffer("std", torch.tensor(normalization.std).view(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.std + self.mean


class ClientKernels(nn.Module):
    """LOKI's per-client convolution: client k's kernels copy its pixels into channel block
    k (the input's C channels times k) and leave every other block zero, so in the sum of
    many clients' updates each block's rows of ``bins`` hold one client's images alone."""

    def __init__(self, normalization: Normalization, clients: int, client: int = 0) -> None:
        super().__init__()
        channels = len(normalization.mean)
        self.channels = channels
        self.clients = clients
        self.conv = nn.Conv2d(channels, channels * clients, kernel_size=3, padding=1)
        self.normalization = normalization
        self.select(client)

    @torch.no_grad()
    def select(self, client: int) -> None:
        """Load client ``client``'s kernels (the model the server sends that client)."""
        if not 0 <= client < self.clients:
            raise ValueError(f"client {client} out of range for {self.clients} clients")
        self.conv.weight.zero_()
        self.conv.bias.zero_()
        for c in range(self.channels):
            out = client * self.channels + c
            # x * std + mean: the pixel of channel c, by a 3x3 kernel with only its centre set
            self.conv.weight[out, c, 1, 1] = self.normalization.std[c]
            self.conv.bias[out] = self.normalization.mean[c]
        self.client = client

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class ServerBlock(nn.Module):
    """front -> flatten -> bins (Linear) -> ReLU -> spread (Linear) -> the input's shape."""

    def __init__(
        self, front: nn.Module, bins: nn.Linear, input_shape: tuple[int, int, int]
    ) -> None:
        super().__init__()
        self.front = front
        self.bins = bins
        self.input_shape = tuple(input_shape)
        self.spread = nn.Linear(bins.out_features, math.prod(input_shape))
        with torch.no_grad():  # identical columns: one factor per sample for every row
            self.spread.weight.fill_(SPREAD / bins.out_features)
            self.spread.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.bins(self.front(x).flatten(1)))
        return self.spread(hidden).view(x.shape[0], *self.input_shape)


@torch.no_grad()
def calibrate_spread(
    block: ServerBlock, model: nn.Module, public: torch.Tensor, lr: float
) -> float:
    """Scale ``spread`` so that lr x delta, on public images through the model the server
    sends, is ``STEP_PER_PIXEL`` over the pixel count (the median over the images); returns
    the factor applied. ``public`` is in model space."""
    with torch.enable_grad():
        hidden = torch.relu(block.bins(block.front(public).flatten(1))).requires_grad_(True)
        out = block.spread(hidden).view(public.shape[0], *block.input_shape)
        logits = model(out)
        loss = torch.nn.functional.cross_entropy(
            logits, torch.zeros(public.shape[0], dtype=torch.long), reduction="sum"
        )
        (delta,) = torch.autograd.grad(loss, hidden)
    typical = float(delta.abs().amax(dim=1).median())
    if typical == 0.0 or not math.isfinite(typical):
        return 1.0
    factor = STEP_PER_PIXEL / (math.prod(block.input_shape) * lr * typical)
    block.spread.weight.mul_(factor)
    return factor


class ImprintBlock(ServerBlock):
    """Robbing the Fed's imprint: every row of ``bins`` measures the brightness (mean pixel)
    and row k fires above threshold k; thresholds ascend."""

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        normalization: Normalization,
        thresholds: tuple[float, ...],
    ) -> None:
        size = math.prod(input_shape)
        bins = nn.Linear(size, len(thresholds))
        with torch.no_grad():
            bins.weight.fill_(1.0 / size)  # the mean pixel
            bins.bias.copy_(-torch.tensor(thresholds))
        super().__init__(ToPixels(normalization), bins, input_shape)
        self.thresholds = tuple(thresholds)


class TrapBlock(ServerBlock):
    """Curious Abandon Honesty's trap weights (Boenisch et al., EuroS&P 2023): in each row,
    a random half of the pixels gets negative weights |N(0, sigma)| and the other half the
    same magnitudes times ``scale`` < 1, so a row fires for few images of a batch, and a
    row fired by one image holds it exactly."""

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        normalization: Normalization,
        rows: int,
        sigma: float,
        scale: float,
        generator: torch.Generator,
        biases: torch.Tensor | None = None,
    ) -> None:
        size = math.prod(input_shape)
        bins = nn.Linear(size, rows)
        with torch.no_grad():
            bins.weight.copy_(trap_weights(rows, size, sigma, scale, generator))
            bins.bias.zero_()  # the paper's: mu = 0
            if biases is not None:
                bins.bias.copy_(biases)
        super().__init__(ToPixels(normalization), bins, input_shape)


def trap_weights(
    rows: int, size: int, sigma: float, scale: float, generator: torch.Generator
) -> torch.Tensor:
    """The trap rows: per row, half the entries -|N(0, sigma)|, the other half the same
    magnitudes times ``scale``, at random positions."""
    half = size // 2
    weights = torch.zeros(rows, size)
    for row in range(rows):  # a permutation per row: one rows x size argsort is too large
        order = torch.randperm(size, generator=generator)
        magnitude = torch.randn(half, generator=generator).abs() * sigma
        weights[row, order[:half]] = -magnitude
        weights[row, order[half : 2 * half]] = scale * magnitude
    return weights


class LokiBlock(ServerBlock):
    """LOKI (Zhao et al., IEEE S&P 2024): client kernels, then ``bins`` with
    ``per_client`` brightness rows per client, each reading only its client's channel block;
    thresholds ascend within a block and all exceed 0, so another client's zero block never
    fires them."""

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        normalization: Normalization,
        clients: int,
        thresholds: tuple[float, ...],
    ) -> None:
        if min(thresholds) <= 0:
            raise ValueError("LOKI's thresholds must exceed 0: a zero block must stay silent")
        size = math.prod(input_shape)
        per_client = len(thresholds)
        bins = nn.Linear(size * clients, per_client * clients)
        with torch.no_grad():
            bins.weight.zero_()
            for k in range(clients):
                rows = slice(k * per_client, (k + 1) * per_client)
                bins.weight[rows, k * size : (k + 1) * size] = 1.0 / size
                bins.bias[rows] = -torch.tensor(thresholds)
        super().__init__(ClientKernels(normalization, clients), bins, input_shape)
        self.thresholds = tuple(thresholds)
        self.clients = clients

    def select(self, client: int) -> None:
        self.front.select(client)


class MaliciousModel(nn.Module):
    """The model the server sends: its block in front of the global model."""

    def __init__(self, block: ServerBlock, model: nn.Module) -> None:
        super().__init__()
        self.server_block = block.to(device_of(model))
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.server_block(x))


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters(), torch.empty(0)).device
