"""The victim's side of one audit round: compute, defend and release the update."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from auditlib.data.normalization import Normalization
from auditlib.defenses.base import Defense
from auditlib.fl.protocol import ClientProtocol
from auditlib.fl.update import client_update, trainable_parameters
from auditlib.threat import AttackerKnowledge, Observation, PrivateBatch


@dataclass(frozen=True, eq=False)
class Release:
    """The outcome of one client round as the server receives it."""

    observation: Observation
    knowledge: AttackerKnowledge
    undefended_norm: float
    defended_norm: float
    privacy: dict[str, Any]


def release_update(
    model: nn.Module,
    batch: PrivateBatch,
    protocol: ClientProtocol,
    defense: Defense,
    *,
    normalization: Normalization,
    num_classes: int,
    labels_known: bool,
    seed: int,
) -> Release:
    """Run the victim client on ``batch`` and hand back only what the server sees.

    The defense acts on the update the client would send (gradient or weight difference);
    when the protocol shares weights, the server receives w0 + defended difference.
    """
    server_model = copy.deepcopy(model)  # the server's copy, untouched by the client
    parameters = trainable_parameters(model)
    update = client_update(
        model, parameters, batch.images, batch.labels, protocol, differentiable=False
    )
    if protocol.observation_kind == "weights":
        update = tuple(w - p.detach() for w, p in zip(update, parameters.values(), strict=True))
    generator = torch.Generator().manual_seed(seed)
    defended = defense.apply(update, generator)
    released = defended
    if protocol.observation_kind == "weights":
        released = tuple(d + p.detach() for d, p in zip(defended, parameters.values(), strict=True))

    observation = Observation(
        kind=protocol.observation_kind,  # type: ignore[arg-type]
        tensors=tuple(t.detach().clone() for t in released),
        parameter_names=tuple(parameters),
    )
    knowledge = AttackerKnowledge(
        model=server_model,
        protocol=protocol,
        batch_size=batch.images.shape[0],
        input_shape=tuple(batch.images.shape[1:]),  # type: ignore[arg-type]
        num_classes=num_classes,
        normalization=normalization,
        labels=batch.labels.clone() if labels_known else None,
    )
    return Release(
        observation=observation,
        knowledge=knowledge,
        undefended_norm=_norm(update),
        defended_norm=_norm(defended),
        privacy=defense.privacy_report(),
    )


def _norm(tensors: tuple[torch.Tensor, ...]) -> float:
    return float(torch.linalg.vector_norm(torch.cat([t.reshape(-1) for t in tensors])))
