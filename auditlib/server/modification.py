"""What a malicious server built, and what it knows of it: a :class:`ServerModification`.

The attacks that read a modified model's update get this (``AttackerKnowledge.server``) and
nothing of the client's: the model the server sent, its thresholds, how many images the
block can separate, and in words what it changed and whether a client could have noticed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from auditlib.data.normalization import Normalization
from auditlib.errors import AuditInputError
from auditlib.server.bins import AuditedPixels, MeasurePrior
from auditlib.server.blocks import LokiBlock

# The largest inserted block built here (parameters of ``bins`` and ``spread`` together):
# 400 M float32 parameters are 1.6 GB, and the client's update and the server's copy as much
# again each.
MAX_BLOCK_PARAMETERS = 400_000_000
# The prefix of the inserted layer's parameters in the update (``MaliciousModel``).
BINS = "server_block.bins"


@dataclass(frozen=True, eq=False)
class BuildContext:
    """What the server knows when it builds the model it sends."""

    model: nn.Module  # the global model, as it would have been sent
    input_shape: tuple[int, int, int]
    batch_size: int  # images per client (the protocol's batch size)
    clients: int  # clients whose updates the server sees summed (1: no secure aggregation)
    normalization: Normalization
    audited_source: str | None  # the sample set the audited images come from, if one
    seed: int
    local_lr: float | None = None  # FedAvg's learning rate, which the server set; None: FedSGD
    # What the server knows of the client's defense, where it knows it (the twin): the
    # noise's standard deviation on each entry of the update, and the L2 bound the whole
    # update is clipped to first (``KnownDefense.entry_noise_std``, ``clip_norm``).
    noise_std: float | None = None
    clip_norm: float | None = None
    # The audited images' content hashes: a public set holding any of them is refused as the
    # server's prior (``bins.public_prior``). None: nothing to compare with.
    audited_pixels: AuditedPixels | None = None
    # Whether the client trains the model in training mode (the protocol's BatchNorm mode:
    # batch statistics), as the server that sets the protocol knows.
    training: bool = True


@dataclass(frozen=True, eq=False)
class ServerModification:
    attack: str
    # Client 0's model; ``model_for`` gives another client's. A built block's model is a
    # ``MaliciousModel``; a server that hides its block elsewhere (an evading or a disguised
    # server) sends any module and names the layer it reads in ``bins_name``.
    model: nn.Module
    clients: int
    capacity: int  # the most images per client its block can separate
    rows: int  # rows of the inserted ``bins`` layer (per client for LOKI)
    thresholds: tuple[float, ...] | None  # ascending brightness thresholds of one client's rows
    prior: MeasurePrior | None  # where the thresholds come from
    what_changed: str  # in words, for the threat card
    noticeable: str  # in words: whether and how a client could have noticed
    # The prefix of the parameters the attack reads (``{bins_name}.weight``, ``.bias``).
    bins_name: str = BINS
    # Evading and disguised servers: what it does to pass the client's model check and what
    # that costs the attack, in words ("" for a server that does not try to pass it).
    evasion: str = ""
    # Rows after the attack's own in the read layer, there only to dilute what the client's
    # behaviour check reads (each fires for every image); the read-back never reads them.
    decoys: int = 0

    def model_for(self, client: int) -> nn.Module:
        """The model client ``client`` receives (LOKI loads that client's kernels)."""
        block = getattr(self.model, "server_block", None)
        if isinstance(block, LokiBlock):
            block.select(client)
        elif not 0 <= client < self.clients:
            raise ValueError(f"client {client} out of range for {self.clients} clients")
        return self.model

    @property
    def parameter_names(self) -> tuple[str, str]:
        return f"{self.bins_name}.weight", f"{self.bins_name}.bias"


def rows_within_budget(wanted: int, in_features: int, out_features: int) -> int:
    """The most rows up to ``wanted`` whose block stays within ``MAX_BLOCK_PARAMETERS``."""
    per_row = in_features + 1 + out_features
    return max(1, min(wanted, (MAX_BLOCK_PARAMETERS - out_features) // per_row))


def refuse_unwrappable(model: nn.Module, attack: str) -> None:
    """A block cannot go in front of a model whose graph is fixed (TorchScript, torch.export)."""
    fixed = [
        type(m).__name__
        for m in model.modules()
        if isinstance(m, torch.jit.ScriptModule) or type(m).__name__ == "GraphModule"
    ]
    if fixed:
        raise AuditInputError(
            f"{attack} puts a layer in front of the model, which a {fixed[0]} archive does not "
            "allow (its graph is fixed); audit a built-in architecture or weights file"
        )


def refuse_too_large(attack: str, in_features: int, rows: int, out_features: int) -> None:
    count = in_features * rows + rows + rows * out_features + out_features
    if count > MAX_BLOCK_PARAMETERS:
        raise AuditInputError(
            f"{attack}'s block would hold {count / 1e6:.0f} M parameters ({rows} rows on "
            f"{in_features} inputs), more than the {MAX_BLOCK_PARAMETERS / 1e6:.0f} M built "
            "here: use fewer bins, fewer clients or smaller images"
        )


def refuse_over_capacity(attack: str, batch_size: int, capacity: int, what: str) -> None:
    if batch_size > capacity:
        raise AuditInputError(
            f"{attack} with {what} separates at most {capacity} images per client; the "
            f"batch has {batch_size}: raise it to at least {batch_size} (the audit preset "
            "sizes it from the batch), or audit a smaller batch"
        )


def pixels(shape: tuple[int, int, int]) -> int:
    return math.prod(shape)
