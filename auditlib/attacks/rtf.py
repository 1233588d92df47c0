"""Robbing the Fed (Fowl, Geiping, Czaja, Goldblum, Goldstein, ICLR 2022): the server puts an
imprint block in front of the model and reads each image alone in its brightness bin back
from the difference of neighbouring rows' updates (``attacks.imprint``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from auditlib.attacks.base import Clock, RunControl, register
from auditlib.attacks.imprint import (
    NOISE_STEPS,
    ReadBack,
    binning_twin,
    block_update,
    noise_floor,
    read_bins,
    server_attack,
    single_event,
)
from auditlib.config import check_ranges, param
from auditlib.server.bins import public_prior
from auditlib.server.build import build_rtf
from auditlib.server.modification import BuildContext, ServerModification, rows_within_budget
from auditlib.threat import AttackerKnowledge, Observation

Prior = Literal["faces", "fashion-mnist", "digits", "photographs"]


@dataclass(frozen=True)
class RtfConfig:
    bins: int = param(
        0,
        "rows of the imprint layer; 0: bins_per_image times the batch, as many as the "
        "largest block built here holds",
        low=0,
        high=4096,
    )
    bins_per_image: int = param(
        8,
        "bins per image of the batch when bins is 0: an image is read back when alone in its "
        "bin, which more bins make likelier",
        low=1,
        high=64,
    )
    prior: Prior = param(
        "faces",
        "public data the server fits its brightness prior on (never the audited images)",
    )

    def __post_init__(self) -> None:
        check_ranges(self)

    def bins_for(self, images: int, pixels: int) -> int:
        """The bins asked for; 0: bins_per_image per image, as many as the largest block
        built here holds (``MAX_BLOCK_PARAMETERS``)."""
        if self.bins:
            return self.bins
        return rows_within_budget(self.bins_per_image * images, pixels, pixels)


def build(config: RtfConfig, context: BuildContext) -> ServerModification:
    prior = public_prior(config.prior, context.audited_source, context.audited_pixels)
    size = math.prod(context.input_shape)
    bins = config.bins_for(context.batch_size * context.clients, size)
    return build_rtf(context, bins, prior, config.prior)


def run_rtf(
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: RtfConfig,
    control: RunControl,
    seed: int,
):
    clock = Clock(control)
    update = block_update(observation, knowledge)
    server = knowledge.server
    by_bias = observation.kind == "gradient"
    floor = noise_floor(observation, knowledge)
    # The twin knows the noise on each entry: a bin holds images only above it.
    known = knowledge.defense
    entry_noise = known.entry_noise_std if known is not None else None
    bins = read_bins(update, 0, server.thresholds, by_bias, floor, entry_noise or 0.0)
    read = ReadBack(
        pixels=stack_pixels([p for _, p in bins], (-1, *knowledge.input_shape), update.bias),
        clients=None,
        support=tuple(strength for strength, _ in bins),
    )
    inference = {
        "rule": "Robbing the Fed: neighbouring rows' update differences, the bins ranked by "
        "their step (the sum of the deltas of the images in them)"
        + (
            f", those within {NOISE_STEPS:g} standard deviations of the known noise left out"
            if entry_noise
            else ""
        )
    }
    return single_event(read, knowledge, clock, inference)


def stack_pixels(rows: list[torch.Tensor], shape: tuple[int, ...], like: torch.Tensor):
    """Read-back rows (flat pixels) as images; an empty stack where none came back."""
    if not rows:
        return like.new_zeros((0, *shape[1:]))
    return torch.stack(rows).view(shape)


register(
    server_attack(
        "rtf",
        "Robbing the Fed (Fowl et al. 2022): an imprint block of brightness bins in "
        "front of the model; an image alone in its bin is read back exactly.",
        RtfConfig,
        run_rtf,
        build,
        paper={"bins": 128, "prior": "faces"},
        audit={"bins": 0, "bins_per_image": 8, "prior": "faces"},
        why="a closed form, so the budget buys bins: 8 per image of the batch leave "
        "about 1 - e^(-1/8) = 12 % of images sharing a bin when the prior fits",
        twin=binning_twin("rtf"),
    )
)
