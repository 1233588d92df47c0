"""Malicious servers that know the client's model check (``rtf-evading``, ``cah-evading``,
``loki-evading``): each builds its attack's block in a form the check does not flag
(``server.evading``) and reads the update back as its built server does
(``attacks.imprint``), undoing what the disguise put between the pixels and the rows (the
model's first convolution, or LOKI's client kernels with weight on every tap) by conjugate
gradients on that convolution's normal equations. Under a model check the engine tries each
beside the built server it stands in for (``AttackInfo.stands_in_for``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from auditlib.attacks.base import Clock, RunControl, register
from auditlib.attacks.cah import run_cah
from auditlib.attacks.imprint import (
    ReadBack,
    block_update,
    noise_floor,
    read_bins,
    server_attack,
    single_event,
)
from auditlib.attacks.rtf import Prior
from auditlib.config import check_ranges, param
from auditlib.server.evading import build_cah_evading, build_loki_evading, build_rtf_evading
from auditlib.server.evading_blocks import Activation, conv_before
from auditlib.server.modification import (
    BuildContext,
    ServerModification,
    pixels,
    rows_within_budget,
)
from auditlib.threat import AttackerKnowledge, Observation

ACTIVATION = "max(x, 0) in the form the rows use: clamp (clamp_min(0)) or threshold "
ACTIVATION += "(F.threshold), which the batch check does not watch, or relu"
SPREAD_JITTER = "relative jitter of spread's columns (identical to 1e-6 is flagged)"
DECOYS = (
    "decoy rows per row of the attack, each firing for every image and never read: they "
    "dilute the share of units the behaviour check finds nested or owned (1.5: 0.9 of the "
    "rows becomes 0.36); 0: none"
)


def decoys_param():
    return param(1.5, DECOYS, low=0, high=4)


def decoy_count(decoys: float, rows: int) -> int:
    return round(decoys * rows)


def split_budget(wanted: int, decoys: float, in_features: int, out_features: int) -> int:
    """The attack's own rows, up to ``wanted``, such that they and their decoys stay within
    the largest block built here (``rows_within_budget``)."""
    total = rows_within_budget(round(wanted * (1 + decoys)), in_features, out_features)
    return max(1, min(wanted, int(total / (1 + decoys))))


# Conjugate gradients on a convolution's normal equations stop where the residual of every
# image is this far below its right-hand side (float64), or after ``CG_STEPS``.
CG_TOLERANCE = 1e-12
CG_STEPS = 2000


@dataclass(frozen=True)
class RtfEvadingConfig:
    bins: int = param(0, "rows of the imprint; 0: bins_per_image times the batch", low=0, high=4096)
    bins_per_image: int = param(8, "bins per image of the batch when bins is 0", low=1, high=64)
    prior: Prior = param("faces", "public data the server fits its thresholds on")
    disguise: Literal["conv", "jitter", "after-conv"] = param(
        "conv",
        "conv: the rows a Conv2d over the whole image (exact); jitter: a Linear with each "
        "row jittered (some bins lose exactness); after-conv: a Conv2d behind the model's "
        "first convolution, inverted to pixels by the server",
    )
    activation: Activation = param("clamp", ACTIVATION)
    jitter: float = param(
        0.2, "relative jitter of each row (disguise jitter)", low=0, low_open=True, high=1
    )
    spread_jitter: float = param(1e-5, SPREAD_JITTER, low=0, low_open=True, high=1e-2)
    decoys: float = decoys_param()

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class CahEvadingConfig:
    rows: int = param(0, "trap rows; 0: rows_per_image times the batch", low=0, high=4096)
    rows_per_image: int = param(8, "trap rows per image when rows is 0", low=1, high=64)
    sigma: float = param(
        0.5, "scale of the magnitudes |N(0, sigma)|", low=0, low_open=True, high=10
    )
    disguise: Literal["balanced", "noisy"] = param(
        "balanced",
        "balanced: mirror factor 1, rows summing near zero (passes the row-sum test at any "
        "size); noisy: the paper's factor 0.95 (caught by the row-sum test at 224 px)",
    )
    activation: Activation = param("clamp", ACTIVATION)
    mirror_noise: float = param(
        1e-2,
        "positive magnitudes times 1 + mirror_noise N(0, 1), so the mirror test (tolerance "
        "1e-4) fails: 1e-3 suffices at 32 px, not at 224 px (measured)",
        low=0,
        low_open=True,
        high=0.5,
    )
    spread_jitter: float = param(1e-5, SPREAD_JITTER, low=0, low_open=True, high=1e-2)
    decoys: float = decoys_param()
    calibrate_on: Prior = param(
        "faces", "public data on which each row's bias is set to fire for one image in B"
    )

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class LokiEvadingConfig:
    bins: int = param(0, "rows per client; 0: bins_per_image times its batch", low=0, high=4096)
    bins_per_image: int = param(8, "rows per image of a client's batch", low=1, high=64)
    prior: Prior = param("faces", "public data the server fits its thresholds on")
    disguise: Literal["taps", "random"] = param(
        "taps",
        "taps: tap_share / 8 of the centre on each other tap of a client's kernel; random: "
        "random taps of about that total",
    )
    activation: Activation = param("clamp", ACTIVATION)
    jitter: float = param(0.2, "relative jitter of each row", low=0, low_open=True, high=1)
    spread_jitter: float = param(1e-5, SPREAD_JITTER, low=0, low_open=True, high=1e-2)
    decoys: float = decoys_param()
    tap_share: float = param(
        0.2,
        "the other taps' total weight over the centre's (transmit ratio 1 / tap_share; the "
        "check flags above 10)",
        low=0.1,
        low_open=True,
        high=1,
    )

    def __post_init__(self) -> None:
        check_ranges(self)


def _images(context: BuildContext) -> int:
    return context.batch_size * context.clients


def build_rtf(config: RtfEvadingConfig, context: BuildContext) -> ServerModification:
    size = pixels(context.input_shape)
    wanted = config.bins or split_budget(
        config.bins_per_image * _images(context), config.decoys, size, size
    )
    return build_rtf_evading(
        context,
        wanted,
        config.prior,
        config.disguise,
        config.activation,
        config.jitter,
        config.spread_jitter,
        decoy_count(config.decoys, wanted),
    )


def build_cah(config: CahEvadingConfig, context: BuildContext) -> ServerModification:
    size = pixels(context.input_shape)
    rows = config.rows or split_budget(
        config.rows_per_image * _images(context), config.decoys, size, size
    )
    return build_cah_evading(
        context,
        rows,
        config.sigma,
        config.disguise,
        config.activation,
        config.mirror_noise,
        config.spread_jitter,
        config.calibrate_on,
        decoy_count(config.decoys, rows),
    )


def build_loki(config: LokiEvadingConfig, context: BuildContext) -> ServerModification:
    size, clients = pixels(context.input_shape), context.clients
    wanted = config.bins_per_image * context.batch_size * clients
    per_client = config.bins or max(
        1, split_budget(wanted, config.decoys, size * clients, size) // clients
    )
    return build_loki_evading(
        context,
        per_client,
        config.prior,
        config.disguise,
        config.activation,
        config.jitter,
        config.spread_jitter,
        config.tap_share,
        decoy_count(config.decoys, per_client * clients),
    )


@torch.no_grad()
def invert_convolution(
    outputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv: nn.Conv2d, shape
) -> tuple[torch.Tensor, float]:
    """The inputs (N x C x H x W) whose convolution by ``weight`` (+ ``bias``), with
    ``conv``'s stride, padding, dilation and groups, is ``outputs``: least squares by
    conjugate gradients on the normal equations A^T A x = A^T y in float64 (exact where A
    has full column rank); and the largest relative residual ||A x - y|| / ||y||."""
    w = weight.detach().double().to(outputs.device)
    y = outputs.double()
    if bias is not None:
        y = y - bias.detach().double().to(y.device).view(1, -1, 1, 1)
    count = y.shape[0]

    def forward(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, None, conv.stride, conv.padding, conv.dilation, conv.groups)

    def adjoint(v: torch.Tensor) -> torch.Tensor:
        probe = torch.zeros((count, *shape), dtype=torch.float64, device=y.device)
        with torch.enable_grad():
            probe.requires_grad_(True)
            (grad,) = torch.autograd.grad(forward(probe), probe, v)
        return grad

    def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).flatten(1).sum(1).view(-1, 1, 1, 1)

    rhs = adjoint(y)
    x = torch.zeros_like(rhs)
    r, p = rhs.clone(), rhs.clone()
    rs = dot(r, r)
    target = CG_TOLERANCE**2 * rs.clamp_min(1e-300)
    for _ in range(CG_STEPS):
        ap = adjoint(forward(p))
        alpha = rs / dot(p, ap).clamp_min(1e-300)
        x += alpha * p
        r -= alpha * ap
        new = dot(r, r)
        if bool((new <= target).all()):
            break
        p = r + (new / rs.clamp_min(1e-300)) * p
        rs = new
    misfit = (forward(x) - y).flatten(1).norm(dim=1) / y.flatten(1).norm(dim=1).clamp_min(1e-300)
    return x, float(misfit.max()) if count else 0.0


def _to_pixels(x: torch.Tensor, knowledge: AttackerKnowledge) -> torch.Tensor:
    norm = knowledge.normalization
    mean = torch.tensor(norm.mean, dtype=torch.float64, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(norm.std, dtype=torch.float64, device=x.device).view(1, -1, 1, 1)
    return (x * std + mean).clamp(0, 1)


def run_rtf_evading(
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: RtfEvadingConfig,
    control: RunControl,
    seed: int,
):
    clock = Clock(control)
    server = knowledge.server
    update = block_update(observation, knowledge)
    conv = conv_before(server.model, server.bins_name)
    by_bias = observation.kind == "gradient"
    floor = noise_floor(observation, knowledge)
    bins = read_bins(update, 0, server.thresholds, by_bias, floor, pixels=conv is None)
    shape = knowledge.input_shape
    inference = {"rule": f"Robbing the Fed's bins read back ({config.disguise} disguise)"}
    if not bins:
        found = update.bias.new_zeros((0, *shape))
    elif conv is None:
        found = torch.stack([p for _, p in bins]).view(-1, *shape)
    else:
        features = torch.stack([p for _, p in bins])
        with torch.no_grad():
            probe = torch.zeros(1, *shape, device=conv.weight.device, dtype=conv.weight.dtype)
            maps = features.view(len(bins), *conv(probe).shape[1:])
        x, misfit = invert_convolution(maps, conv.weight, conv.bias, conv, shape)
        found = _to_pixels(x, knowledge)
        inference["inversion_residual"] = misfit
    read = ReadBack(found, None, tuple(s for s, _ in bins))
    return single_event(read, knowledge, clock, inference)


def run_loki_evading(
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: LokiEvadingConfig,
    control: RunControl,
    seed: int,
):
    clock = Clock(control)
    server = knowledge.server
    update = block_update(observation, knowledge)
    kernels = server.model.server_block.front
    shape = knowledge.input_shape
    size, channels = pixels(shape), shape[0]
    by_bias = observation.kind == "gradient"
    floor = noise_floor(observation, knowledge)
    found, clients, support, misfits = [], [], [], [0.0]
    for client in range(server.clients):
        reads = read_bins(
            update, client * server.rows, server.thresholds, by_bias, floor, pixels=False
        )
        if not reads:
            continue
        maps = torch.stack([flat[client * size : (client + 1) * size] for _, flat in reads])
        weight, bias = kernels.kernels_of(client)
        block = slice(client * channels, (client + 1) * channels)
        x, misfit = invert_convolution(
            maps.view(-1, *shape), weight[block], bias[block], kernels.conv, shape
        )
        found.append(_to_pixels(x, knowledge))
        clients += [client] * len(reads)
        support += [s for s, _ in reads]
        misfits.append(misfit)
    read = ReadBack(
        torch.cat(found) if found else update.bias.new_zeros((0, *shape)),
        tuple(clients),
        tuple(support),
    )
    inference = {
        "rule": "LOKI's per-client bins, each read-back inverted through its client's kernels",
        "inversion_residual": max(misfits),
    }
    return single_event(read, knowledge, clock, inference)


EVADES = "built to pass the client's model check (evading): "
register(
    server_attack(
        "rtf-evading",
        EVADES + "Robbing the Fed's bins as a whole-image Conv2d, jittered rows, or behind "
        "the model's first convolution, spread jittered, a non-ReLU activation.",
        RtfEvadingConfig,
        run_rtf_evading,
        build_rtf,
        paper={"bins": 0, "bins_per_image": 8, "prior": "faces", "disguise": "jitter"},
        audit={"bins": 0, "bins_per_image": 8, "prior": "faces", "disguise": "conv"},
        why="a closed form: 8 bins per image; the disguise that passes every check at no "
        "cost to exactness (conv rows, spread jittered by 1e-5, clamp_min activation)",
        stands_in_for=frozenset({"rtf"}),
    )
)
register(
    server_attack(
        "cah-evading",
        EVADES + "Curious Abandon Honesty's trap rows with noisy or balanced mirrors, "
        "biases set on public data, spread jittered, a non-ReLU activation.",
        CahEvadingConfig,
        run_cah,
        build_cah,
        paper={"rows": 0, "rows_per_image": 8, "disguise": "noisy", "calibrate_on": "faces"},
        audit={"rows": 0, "rows_per_image": 8, "disguise": "balanced", "calibrate_on": "faces"},
        why="a closed form: 8 trap rows per image, balanced (passes the row-sum test at any "
        "size), biases set on public faces",
        stands_in_for=frozenset({"cah"}),
    )
)
register(
    server_attack(
        "loki-evading",
        EVADES + "LOKI with client kernels weighted on every tap (undone by the server), "
        "rows jittered within each client's block, spread jittered, a non-ReLU activation.",
        LokiEvadingConfig,
        run_loki_evading,
        build_loki,
        paper={"bins": 0, "bins_per_image": 8, "prior": "faces", "disguise": "random"},
        audit={"bins": 0, "bins_per_image": 8, "prior": "faces", "disguise": "taps"},
        why="a closed form: 8 bins per image of a client's batch, kernels with a fifth of "
        "the centre's weight on the other taps (transmit ratio 5)",
        stands_in_for=frozenset({"loki"}),
    )
)
