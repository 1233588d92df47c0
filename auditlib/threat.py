"""The threat-model boundary: what the server sees versus what only the evaluator sees.

An attack receives an :class:`Observation` and an :class:`AttackerKnowledge`, nothing else.
The :class:`PrivateBatch` (the client's images and labels) goes only to ``metrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from auditlib.client.protocol import ClientProtocol
from auditlib.data.normalization import Normalization
from auditlib.likelihoods import Likelihood
from auditlib.server.modification import ServerModification

ObservationKind = Literal["gradient", "weight_delta", "weights"]


@dataclass(frozen=True, eq=False)
class PrivateBatch:
    """The victim client's data. Never handed to an attack."""

    images: torch.Tensor  # B x C x H x W in model (normalised) space
    labels: torch.Tensor  # B, long
    names: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Observation:
    """What leaves the client after any defense: one tensor per trainable parameter."""

    kind: ObservationKind
    tensors: tuple[torch.Tensor, ...]
    parameter_names: tuple[str, ...]

    def to(self, device: torch.device | str) -> Observation:
        return Observation(
            self.kind, tuple(t.to(device) for t in self.tensors), self.parameter_names
        )


Tensors = tuple[torch.Tensor, ...]


@dataclass(frozen=True, eq=False)
class KnownDefense:
    """What an adaptive attacker knows of the defense, and how it matches through it.

    It knows the defense's mechanism and public parameters, never its secret randomness or
    keys; what it can see of the defense's action it reads off the observation (the zeros
    that pruning leaves). An attack then compares only the ``mask``ed coordinates, passes its
    candidate's update through ``transform`` (the defense's deterministic part, on the update
    the client would send: gradient or weight difference) and, where the defense draws at
    random, matches with the release's ``noise`` likelihood (``auditlib.likelihoods``) plus
    the image prior it weighs (the posterior mode under a fixed prior, Balunovic et al.'s
    Bayesian attacker), instead of its own distance.
    """

    name: str
    summary: str  # plain words: what the attacker knows and what it does with it
    mask: Tensors | None = None  # per observed tensor: 1.0 where compared, 0.0 where not
    transform: Callable[[Tensors], Tensors] | None = None  # differentiable
    # The transform multiplies the whole update by one positive number (norm clipping): a
    # scale-invariant distance (cosine) then matches through it as it matches without it.
    rescales: bool = False
    noise: Likelihood | None = None
    # Where the defense adds independent noise of a known scale to every entry of the update
    # the client computed (DP's): its standard deviation, and the L2 bound the whole update
    # was scaled down to first (None: no L2 clip). What a malicious server that knows the
    # defense sets its block's scale against (``attacks.imprint``, ``server.blocks``).
    entry_noise_std: float | None = None
    clip_norm: float | None = None
    # Model parameters the attacker cannot know and fits jointly with its images (FedKL's
    # lock): called on the attacker's own copy of the model, returns the tensors to fit.
    unknowns: Callable[[nn.Module], Tensors] | None = None
    # The attacker's undoing of a defense that acted on the images (Shadow): maps each
    # candidate the attack ends with (model space, its labels or None) to its estimate of
    # the client's own images, given what the server knows.
    postprocess: (
        Callable[[torch.Tensor, torch.Tensor | None, AttackerKnowledge], torch.Tensor] | None
    ) = None

    @property
    def distance(self) -> str | None:
        """The noise's likelihood as a plain distance ("l2", "l1"), where it is one."""
        return None if self.noise is None else self.noise.distance

    def needs(self) -> frozenset[str]:
        """What an attack must support to match through this defense: "distance" where the
        noise's likelihood is a plain distance (an attack without an image prior takes its
        shape), "likelihood" where it is not one."""
        noise = self.noise
        parts = {
            "mask": self.mask,
            "transform": self.transform,
            "distance": noise if noise is not None and noise.distance is not None else None,
            "likelihood": noise if noise is not None and noise.distance is None else None,
            "unknowns": self.unknowns,
            "postprocess": self.postprocess,
        }
        return frozenset(name for name, part in parts.items() if part is not None)


# What an attack that matches through ``ThroughDefense`` supports of a ``KnownDefense``
# (a post-processing step is the engine's, after any attack).
MATCHES_THROUGH = frozenset(
    {"mask", "transform", "distance", "likelihood", "unknowns", "postprocess"}
)


@dataclass(frozen=True, eq=False)
class AttackerKnowledge:
    """What an honest-but-curious server knows besides the observation.

    The server chose the global model, so it knows its architecture and parameters; it knows
    the protocol (local steps, learning rate) it asked the client to run and the input
    pre-processing; FedAvg's weighting tells it the number of examples. Labels are known only
    when the scenario says the client shares them (``labels`` is otherwise None).
    """

    model: nn.Module  # the server's own copy of the global model, as sent to the client
    protocol: ClientProtocol
    batch_size: int
    input_shape: tuple[int, int, int]
    num_classes: int
    normalization: Normalization
    labels: torch.Tensor | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    defense: KnownDefense | None = None  # set for an adaptive attacker only
    # What a malicious server built into the model it sent (``auditlib.server``), for the
    # attack that built it; None under the honest-but-curious threat model.
    server: ServerModification | None = None
    # Clients whose updates the observation sums (secure aggregation); 1: one client's.
    clients: int = 1

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def parameters(self) -> dict[str, torch.Tensor]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}
