"""The victim's side of one audit round: compute, defend and release the update."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import client_update, trainable_parameters
from auditlib.data.normalization import Normalization
from auditlib.defenses.base import ClientContext, Defense, known_defense, model_change
from auditlib.threat import AttackerKnowledge, KnownDefense, Observation, PrivateBatch


@dataclass(frozen=True, eq=False)
class Release:
    """The outcome of one client round as the server receives it."""

    observation: Observation
    knowledge: AttackerKnowledge
    undefended_norm: float
    defended_norm: float
    privacy: dict[str, Any]
    known_defense: KnownDefense | None = None  # what an adaptive attacker knows of it


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
    input_shape = tuple(batch.images.shape[1:])
    change = None
    if hasattr(defense, "change_model"):  # FedKL: the client trains its own locked copy
        change = model_change(defense, copy.deepcopy(model), input_shape, seed)  # type: ignore[arg-type]
    private: frozenset[str] = frozenset()
    if change is not None:
        model, server_model, private = change.client, change.server, change.private
    parameters = trainable_parameters(model)
    generator = torch.Generator().manual_seed(seed)
    update, defended = defended_update(
        model, parameters, batch.images, batch.labels, protocol, defense, generator
    )
    view = getattr(defense, "attacker_view", None)
    if view is not None:  # a protocol (FedBoosting): the attacker gets what it exposes
        defended = view(defended, generator)
    # What leaves the client: every trained parameter but the private ones.
    shared = [i for i, name in enumerate(parameters) if name not in private]
    start = list(parameters.values())
    released = tuple(defended[i] for i in shared)
    if protocol.observation_kind == "weights":
        released = tuple(defended[i] + start[i].detach() for i in shared)
    names = tuple(name for name in parameters if name not in private)

    observation = Observation(
        kind=protocol.observation_kind,  # type: ignore[arg-type]
        tensors=tuple(t.detach().clone() for t in released),
        parameter_names=names,
    )
    knowledge = AttackerKnowledge(
        model=server_model,
        protocol=protocol,
        batch_size=batch.images.shape[0],
        input_shape=tuple(batch.images.shape[1:]),  # type: ignore[arg-type]
        num_classes=num_classes,
        normalization=normalization,
        labels=batch.labels.clone() if labels_known else None,
        notes=change.notes if change is not None else (),
    )
    return Release(
        observation=observation,
        knowledge=knowledge,
        undefended_norm=_norm(tuple(update[i] for i in shared)),
        defended_norm=_norm(tuple(defended[i] for i in shared)),
        privacy=defense.privacy_report(),
        known_defense=known_defense(
            defense, observation, {n: p.detach() for n, p in server_model.named_parameters()}
        ),
    )


def _norm(tensors: tuple[torch.Tensor, ...]) -> float:
    return float(torch.linalg.vector_norm(torch.cat([t.reshape(-1) for t in tensors])))


def defended_update(
    model: nn.Module,
    parameters: dict[str, torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
    protocol: ClientProtocol,
    defense: Defense,
    generator: torch.Generator,
    *,
    round: int = 0,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The client's update before and after its defense: the gradient (FedSGD) or the weight
    difference (FedAvg, also when the protocol shares the new weights).

    The one place where a client defends: the audited victim and every client of federated
    training go through it, so a defense acts identically in both.
    """
    context = ClientContext(
        model=model,
        parameters={n: p.detach() for n, p in parameters.items()},
        images=images,
        labels=labels,
        protocol=protocol,
        round=round,
    )
    update = _difference(model, parameters, images, labels, protocol)
    refuses = getattr(defense, "refuses", None)
    if refuses is not None and refuses(context) is not None:
        # A client-side model check flagged the model: the client does not train on it and
        # sends nothing, which the server receives as an update of zeros.
        return update, tuple(torch.zeros_like(t) for t in update)
    perturb = getattr(defense, "perturb_images", None)
    if perturb is None:
        return update, defense.apply(update, generator, context)
    # A defense on the data (Shadow): the client trains on its perturbed images, and the
    # server receives the update taken on them.
    perturbed = perturb(context, generator).detach()
    released = _difference(model, parameters, perturbed, labels, protocol)
    return update, defense.apply(released, generator, replace(context, images=perturbed))


def _difference(model, parameters, images, labels, protocol) -> tuple[torch.Tensor, ...]:
    update = client_update(model, parameters, images, labels, protocol, differentiable=False)
    if protocol.observation_kind == "weights":
        update = tuple(w - p.detach() for w, p in zip(update, parameters.values(), strict=True))
    return update
