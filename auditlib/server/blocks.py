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

import copy
import math
from dataclasses import dataclass

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


# A server that knows the client's noise (the twin, ``scale_against_noise``) aims at this
# per-pixel error of a read-back, sqrt(2) s / (c delta) (the noise on the difference of two
# rows over the image's bias step), on the weaker images it expects (the lower decile of
# delta over public images): 1e-3 is 60 dB, so an image whose delta is a hundred times
# smaller still reads back near 20 dB.
NOISE_PIXEL_ERROR = 1e-3
WEAK_QUANTILE = 0.1
# The largest scale: the rows' weights (1 / (c d)) and activations stay far inside float32's
# normal range (smallest 1.2e-38) and the rows' update (c delta u) far below its largest
# (3.4e38) at any input size built here.
MAX_NOISE_SCALE = 1e20
# Under a known clip the block's update is made at least this many times the rest of the
# model's (over 99 % of the clipped norm): beyond that no scale gives the block more of it.
CLIP_DOMINANCE = 10.0


@dataclass(frozen=True)
class NoiseScale:
    """How a server that knows the noise scaled its block (``scale_against_noise``)."""

    factor: float  # c: the rows divided by it, ``spread`` multiplied by it
    weak_delta: float  # the lower decile of delta over public images, before scaling
    # The per-pixel error it expects of such an image's read-back once the clip, if any,
    # has scaled the update down (inf: no public image had a gradient at the rows).
    pixel_error: float


@torch.no_grad()
def scale_against_noise(
    block: ServerBlock,
    model: nn.Module,
    public: torch.Tensor,
    batch: int,
    noise_std: float,
    clip_norm: float | None,
    generator: torch.Generator,
    training: bool = True,
) -> NoiseScale:
    """Scale ``block`` so that its rows' update stands above noise of standard deviation
    ``noise_std`` on every entry: the rows (weights and biases) divided by c, ``spread``
    multiplied by c. The model after the block sees the same input (the activations shrink
    by c, ``spread`` grows by it), while each image's gradient at the rows, delta, and so
    the rows' update grow by c; the read-back, a ratio, is unchanged. Under a known L2 clip
    the scale is raised until the block carries the clipped norm; the clip then caps its
    signal, which the returned ``pixel_error`` says.

    ``public``: public images in model space, through a copy of the model in the mode the
    client trains it in (``training``: a BatchNorm's batch statistics shrink delta by
    orders of magnitude against its running ones), the first ``batch`` of them (the client's
    mean over its batch); labels drawn from ``generator`` (the server does not know the
    client's)."""
    probe = copy.deepcopy(model)  # a BatchNorm's running statistics stay the sent model's
    probe.train(training)
    images = public[:batch]
    rest = [p for p in probe.parameters() if p.requires_grad]
    with torch.enable_grad():
        hidden = torch.relu(block.bins(block.front(images).flatten(1)))
        logits = probe(block.spread(hidden).view(images.shape[0], *block.input_shape))
        labels = torch.randint(logits.shape[1], (images.shape[0],), generator=generator)
        loss = torch.nn.functional.cross_entropy(logits, labels.to(logits.device), reduction="sum")
        grads = torch.autograd.grad(
            loss / batch, [hidden, block.bins.weight, block.bins.bias, *rest], allow_unused=True
        )
    delta = grads[0].abs().amax(dim=1)  # identical columns: one delta per image
    delta = delta[delta > 0]
    if delta.numel() == 0:
        return NoiseScale(1.0, 0.0, math.inf)
    weak = float(torch.quantile(delta.double(), WEAK_QUANTILE))
    factor = math.sqrt(2) * noise_std / (NOISE_PIXEL_ERROR * weak)
    rows = _norm(grads[1:3])
    others = _norm(grads[3:])
    if clip_norm is not None and rows > 0:
        factor = max(factor, CLIP_DOMINANCE * others / rows)
    factor = min(max(factor, 1.0), MAX_NOISE_SCALE)
    block.bins.weight.div_(factor)
    block.bins.bias.div_(factor)
    block.spread.weight.mul_(factor)
    kept = 1.0
    if clip_norm is not None:
        kept = min(1.0, clip_norm / max(math.hypot(factor * rows, others), 1e-30))
    return NoiseScale(factor, weak, math.sqrt(2) * noise_std / (factor * kept * weak))


def _norm(tensors) -> float:
    return math.sqrt(sum(float(t.double().square().sum()) for t in tensors if t is not None))


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
