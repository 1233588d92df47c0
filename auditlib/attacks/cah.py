"""When the Curious Abandon Honesty (Boenisch, Dziedzic, Schuster, Shamsabadi, Shumailov,
Papernot, EuroS&P 2023): trap weights in a layer in front of the model; a row fired by one
image alone holds it exactly (``attacks.imprint``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from auditlib.attacks.base import Clock, RunControl, register
from auditlib.attacks.imprint import (
    EMPTY_BIN,
    ReadBack,
    block_update,
    server_attack,
    single_event,
)
from auditlib.config import check_ranges, param
from auditlib.server.build import build_cah
from auditlib.server.modification import BuildContext, ServerModification, rows_within_budget
from auditlib.threat import AttackerKnowledge, Observation

# Read-backs closer than this (relative, on 16 random projections) are one image: rows fired
# by the same image alone agree to float precision.
SAME_IMAGE = 1e-4
PROJECTIONS = 16
# An exact read-back is a picture: pixels in [0, 1] (a mixture with deltas of both signs
# falls outside).
PIXEL_SLACK = 1e-3


@dataclass(frozen=True)
class CahConfig:
    rows: int = param(0, "trap rows; 0: rows_per_image times the batch", low=0, high=4096)
    rows_per_image: int = param(
        8, "trap rows per image of the batch when rows is 0", low=1, high=64
    )
    sigma: float = param(
        0.5, "scale of the trap weights' magnitudes |N(0, sigma)|", low=0, low_open=True, high=10
    )
    scale: float = param(
        0.95,
        "the positive half's magnitudes times this: below 1, a row fires for few images",
        low=0,
        low_open=True,
        high=1,
    )
    calibrate_on: Literal["none", "faces", "fashion-mnist", "digits", "photographs"] = param(
        "none",
        "public data on which each row's bias is set to fire for one image in B (none: the "
        "paper's bias 0)",
    )

    def __post_init__(self) -> None:
        check_ranges(self)

    def rows_for(self, images: int, pixels: int) -> int:
        if self.rows:
            return self.rows
        return rows_within_budget(self.rows_per_image * images, pixels, pixels)


def build(config: CahConfig, context: BuildContext) -> ServerModification:
    size = math.prod(context.input_shape)
    rows = config.rows_for(context.batch_size * context.clients, size)
    calibrate = None if config.calibrate_on == "none" else config.calibrate_on
    return build_cah(context, rows, config.sigma, config.scale, calibrate)


def run_cah(
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: CahConfig,
    control: RunControl,
    seed: int,
):
    clock = Clock(control)
    update = block_update(observation, knowledge)
    bias = update.bias
    scale = float(bias.abs().max())
    fired = (bias.abs() > EMPTY_BIN * scale).nonzero().flatten().tolist() if scale > 0 else []
    reads = [update.row(r) / float(bias[r]) for r in fired]
    groups = _agreeing(reads, seed)
    pictures = [
        (g, reads[g[0]])
        for g in groups
        if float(reads[g[0]].min()) >= -PIXEL_SLACK and float(reads[g[0]].max()) <= 1 + PIXEL_SLACK
    ]
    shape = (-1, *knowledge.input_shape)
    read = ReadBack(
        pixels=torch.stack([p for _, p in pictures]).view(shape)
        if pictures
        else update.bias.new_zeros((0, *knowledge.input_shape)),
        clients=None,
        support=tuple(float(len(g)) for g, _ in pictures),
    )
    inference = {
        "rule": "trap rows' update ratios, grouped where rows agree",
        "rows_fired": len(reads),
    }
    return single_event(read, knowledge, clock, inference)


def _agreeing(reads: list[torch.Tensor], seed: int) -> list[list[int]]:
    """Groups of read-backs that are one image (within ``SAME_IMAGE`` on random projections)."""
    if not reads:
        return []
    generator = torch.Generator().manual_seed(seed)
    directions = torch.randn(reads[0].numel(), PROJECTIONS, generator=generator)
    directions = directions.double().to(reads[0].device)
    keys = torch.stack(reads) @ directions
    size = keys.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
    groups: list[list[int]] = []
    for i in range(len(reads)):
        for group in groups:
            j = group[0]
            if float(((keys[i] - keys[j]).abs() / size[j]).max()) < SAME_IMAGE:
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


register(
    server_attack(
        "cah",
        "Curious Abandon Honesty (Boenisch et al. 2023): trap weights in a layer in front of "
        "the model; a row fired by one image alone holds it exactly.",
        CahConfig,
        run_cah,
        build,
        paper={"rows": 1000, "sigma": 0.5, "scale": 0.95, "calibrate_on": "none"},
        audit={
            "rows": 0,
            "rows_per_image": 8,
            "sigma": 0.5,
            "scale": 0.95,
            "calibrate_on": "faces",
        },
        why="a closed form, so the budget buys rows: 8 trap rows per image of the batch, "
        "each row's bias set on public faces to fire for one image in B (the paper's "
        "bias 0 fires ever more rarely as images grow)",
    )
)
