"""The victim's side of one audit round: compute, defend and release the update."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import client_update, trainable_parameters
from auditlib.data.normalization import Normalization
from auditlib.defenses.base import ClientContext, Defense, known_defense, model_change
from auditlib.errors import AuditInputError
from auditlib.seeds import derive_seed
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
    # Why a client refused to train on the model it received (its model check), if one did.
    refused: str = ""


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
    flagged = len(getattr(defense, "flagged", ()))  # refusals before this round's
    update, defended = defended_update(
        model,
        parameters,
        batch.images,
        batch.labels,
        protocol,
        defense,
        generator,
        order_seed=derive_seed(seed, "client order"),
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
        refused=refusal(defense, since=flagged),
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
    order_seed: int | None = None,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The client's update before and after its defense: the gradient (FedSGD) or the weight
    difference (FedAvg, also when the protocol shares the new weights).

    The one place where a client defends: the audited victim and every client of federated
    training go through it, so a defense acts identically in both. ``order_seed``: the
    client's own seed for the order of its mini-batches, where the protocol shuffles them
    (``client_update``); None: in order.
    """
    context = ClientContext(
        model=model,
        parameters={n: p.detach() for n, p in parameters.items()},
        images=images,
        labels=labels,
        protocol=protocol,
        round=round,
    )
    update = _difference(model, parameters, images, labels, protocol, order_seed)
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
    released = _difference(model, parameters, perturbed, labels, protocol, order_seed)
    return update, defense.apply(released, generator, replace(context, images=perturbed))


def _difference(
    model, parameters, images, labels, protocol, order_seed=None
) -> tuple[torch.Tensor, ...]:
    update = client_update(
        model, parameters, images, labels, protocol, differentiable=False, order_seed=order_seed
    )
    if protocol.observation_kind == "weights":
        update = tuple(w - p.detach() for w, p in zip(update, parameters.values(), strict=True))
    return update


def release_aggregate(
    model_for: Callable[[int], nn.Module],
    batches: Sequence[PrivateBatch],
    protocol: ClientProtocol,
    defense: Defense,
    *,
    normalization: Normalization,
    num_classes: int,
    labels_known: bool,
    seed: int,
) -> Release:
    """Secure aggregation: each client k trains the model it received (``model_for(k)``) on
    its batch and defends its update; the server learns only the example-weighted sum of
    the updates (FedAvg's weighting, n_k / n), the weights each client started from summed
    alike where the protocol shares weights.

    For FedSGD the sum is exactly the union batch's mean gradient, so an honest-server attack
    takes it as one client's update of every image; with several local steps it is not, and
    the attack's model of it is an approximation (docs/ALGORITHMS.md).
    """
    for hook in ("change_model", "attacker_view", "perturb_images"):
        if hasattr(defense, hook):
            raise AuditInputError(
                f"{type(defense).__name__} is not combined with secure aggregation here: it changes the "
                "model, the protocol or the images per client; audit it without aggregation"
            )
    total = sum(int(b.images.shape[0]) for b in batches)
    server_model = copy.deepcopy(model_for(0))
    flagged = len(getattr(defense, "flagged", ()))  # refusals before this round's
    summed = undefended = None
    names: tuple[str, ...] = ()
    for k, batch in enumerate(batches):
        model = model_for(k)
        parameters = trainable_parameters(model)
        names = tuple(parameters)
        generator = torch.Generator().manual_seed(derive_seed(seed, f"client {k}"))
        update, defended = defended_update(
            model,
            parameters,
            batch.images,
            batch.labels,
            protocol,
            defense,
            generator,
            order_seed=derive_seed(seed, f"client {k} order"),
        )
        weight = batch.images.shape[0] / total
        if protocol.observation_kind == "weights":
            defended = tuple(
                d + p.detach() for d, p in zip(defended, parameters.values(), strict=True)
            )
        summed = _accumulate(summed, defended, weight)
        undefended = _accumulate(undefended, update, weight)
    assert summed is not None and undefended is not None
    observation = Observation(
        kind=protocol.observation_kind,  # type: ignore[arg-type]
        tensors=tuple(t.detach().clone() for t in summed),
        parameter_names=names,
    )
    labels = torch.cat([b.labels for b in batches])
    knowledge = AttackerKnowledge(
        model=server_model,
        protocol=protocol,
        batch_size=total,
        input_shape=tuple(batches[0].images.shape[1:]),  # type: ignore[arg-type]
        num_classes=num_classes,
        normalization=normalization,
        labels=labels.clone() if labels_known else None,
        notes=(
            f"the example-weighted sum of {len(batches)} clients' updates (secure aggregation)",
        ),
        clients=len(batches),
    )
    defended_sum = summed
    if protocol.observation_kind == "weights":
        start = trainable_parameters(server_model).values()
        defended_sum = tuple(s - p.detach() for s, p in zip(summed, start, strict=True))
    return Release(
        observation=observation,
        knowledge=knowledge,
        undefended_norm=_norm(undefended),
        defended_norm=_norm(defended_sum),
        privacy=defense.privacy_report(),
        known_defense=None,  # no adaptive attacker is offered under secure aggregation
        # Refused only where every client refused: else the server received the others' sum.
        refused=refusal(defense, since=flagged)
        if len(getattr(defense, "flagged", ())) - flagged == len(batches)
        else "",
    )


def refusal(defense: Defense, since: int = 0) -> str:
    """The last reason the client gave for refusing a model (``flagged`` of a defense that
    ``refuses``) after its first ``since`` refusals, or "" where it refused none since: one
    defense checks every attack's model in turn, and one model's refusal is not another's."""
    flagged = getattr(defense, "flagged", ())
    return flagged[-1] if len(flagged) > since else ""


def _accumulate(total, tensors, weight):
    scaled = tuple(weight * t.detach() for t in tensors)
    return scaled if total is None else tuple(a + b for a, b in zip(total, scaled, strict=True))
