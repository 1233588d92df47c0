"""A small federated training loop: FedAvg rounds over simulated clients.

Used to put the global model at a later "attack stage" (the model trained N rounds before
the attacked round); converged models leak less (GRNN thesis, Table 3.4). Each client runs
the same :func:`client_update` the victim runs, so there is one definition of local
training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import (
    copy_state,
    load_state,
    set_training_mode,
    trainable_parameters,
)
from auditlib.config import require
from auditlib.data.normalization import Normalization
from auditlib.defenses.base import Defense
from auditlib.errors import AuditInputError
from auditlib.fl.scenario import defended_update


@dataclass(frozen=True)
class FederatedTraining:
    rounds: int
    clients_per_round: int = 4
    examples_per_client: int = 32
    protocol: ClientProtocol = field(
        default_factory=lambda: ClientProtocol(
            algorithm="fedavg", local_epochs=1, local_lr=0.01, local_batch_size=8, shared="delta"
        )
    )

    def __post_init__(self) -> None:
        # The server averages weight differences; other protocols would need other maths.
        require(
            self.protocol.algorithm == "fedavg" and self.protocol.shared == "delta",
            "federated training runs FedAvg clients that share weight differences",
        )
        require(
            self.rounds >= 0 and self.clients_per_round >= 1 and self.examples_per_client >= 1,
            "federated training needs rounds >= 0 and at least one client with one example",
        )


class RoundStopped(Exception):
    """``fedavg_round`` was asked to stop before a client trained; the model is unchanged."""


def fedavg_round(
    model: nn.Module,
    clients: Sequence[tuple[torch.Tensor, torch.Tensor]],
    protocol: ClientProtocol,
    defense: Defense,
    *,
    generator: torch.Generator,
    round: int = 0,
    private_states: Sequence[dict[str, torch.Tensor]] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> float:
    """One FedAvg round on ``model`` in place; returns the clients' mean training loss.

    Each client (images, labels) computes its weight difference from the current weights and
    defends it (:func:`defended_update`, the victim's own path); the server adds the mean of
    the defended differences weighted by example count. BatchNorm running statistics, which
    FedAvg also averages, come from each client's forward passes over its local mini-batches
    at the round's starting weights, averaged the same way (only what a client sends is
    averaged; the statistics are not defended, as in FedAvg implementations).

    ``private_states`` (one per client, FedKL's key and lock): those parameters and buffers
    are loaded into the model before the client trains, updated by the client's own training
    afterwards, and never averaged.

    A defense that is an aggregation protocol (FedBoosting) holds out each client's last
    ``validation_fraction`` of examples and replaces the weighted mean by its ``aggregate``,
    which gets every client's update, training and validation splits, and the generator.

    ``should_stop`` is asked before each client trains (one client's defended training can
    take minutes); when it says stop, the round is abandoned with the model, and every
    client's private part, as they were before it, and ``RoundStopped`` is raised.
    """
    parameters = trainable_parameters(model)
    private = set(private_states[0]) if private_states else set()
    start = copy_state(model, [n for n, _ in model.named_buffers() if n not in private])
    server_private = copy_state(model, private)
    aggregate = getattr(defense, "aggregate", None)  # a protocol's own server step
    clients, validation = _hold_out(clients, getattr(defense, "validation_fraction", None))
    statistics = {n: torch.zeros_like(b, dtype=torch.float64) for n, b in start.items()}
    examples = sum(len(labels) for _, labels in clients)
    shares = [len(labels) / examples for _, labels in clients]
    updates: list[tuple[torch.Tensor, ...]] = []
    losses: list[float] = []
    trained_private: list[tuple[int, str, torch.Tensor]] = []  # applied once the round is done
    for index, (images, labels) in enumerate(clients):
        if should_stop is not None and should_stop():
            load_state(model, start)
            load_state(model, server_private)
            set_training_mode(model, False)
            raise RoundStopped
        with torch.no_grad():
            if private_states:
                load_state(model, private_states[index])
            load_state(model, start)
            set_training_mode(model, protocol.batchnorm_mode == "train")
            windows = protocol.minibatch_slices(len(labels))
            loss = 0.0
            for window in windows:
                logits = model(images[window])
                loss += float(F.cross_entropy(logits, labels[window])) / len(windows)
            losses.append(loss)
            for n, b in model.named_buffers():
                if n in statistics:
                    statistics[n] += shares[index] * b.double()
        _, delta = defended_update(
            model, parameters, images, labels, protocol, defense, generator, round=round
        )
        for i, n in enumerate(parameters):
            if n in private:  # the client keeps its own trained private part
                trained_private.append((index, n, parameters[n].detach() + delta[i]))
        updates.append(tuple(d for n, d in zip(parameters, delta, strict=True) if n not in private))
    for index, n, value in trained_private:
        private_states[index][n] = value  # type: ignore[index]
    shared = {n: p for n, p in parameters.items() if n not in private}
    load_state(model, start)
    if aggregate is not None:
        total = aggregate(model, shared, updates, clients, validation, generator)
    else:
        total = tuple(
            sum(share * u[k] for share, u in zip(shares, updates, strict=True))
            for k in range(len(shared))
        )
    with torch.no_grad():
        for p, t in zip(shared.values(), total, strict=True):
            p.add_(t)
        for n, b in model.named_buffers():
            if n in statistics:
                b.copy_(statistics[n].round() if not b.is_floating_point() else statistics[n])
    load_state(model, server_private)  # the server's own view of the private part is untouched
    set_training_mode(model, False)
    return float(sum(share * loss for share, loss in zip(shares, losses, strict=True)))


def _hold_out(
    clients: Sequence[tuple[torch.Tensor, torch.Tensor]], fraction: float | None
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Each client's data cut into a training part and its last ``fraction`` as validation
    (FedBoosting's cross-validation sets); no cut when ``fraction`` is None."""
    if fraction is None:
        return list(clients), []
    train, validation = [], []
    for images, labels in clients:
        held = max(1, round(fraction * len(labels)))
        if len(labels) - held < 1:
            raise AuditInputError(
                f"a client with {len(labels)} example(s) cannot hold out a validation split; "
                "every client needs at least 2 examples"
            )
        train.append((images[:-held], labels[:-held]))
        validation.append((images[-held:], labels[-held:]))
    return train, validation


def federated_averaging(
    model: nn.Module,
    pool_images: torch.Tensor,
    pool_labels: torch.Tensor,
    training: FederatedTraining,
    seed: int,
) -> list[float]:
    """Train ``model`` in place for ``training.rounds`` FedAvg rounds; returns the mean client
    loss of each round (a cheap training curve).

    Each round samples ``clients_per_round`` disjoint client datasets from the pool, with no
    defense (this puts the global model at a later stage of training before an audit).
    """
    from auditlib.defenses import build_defense

    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    no_defense, _ = build_defense("none")
    losses: list[float] = []
    per_round = training.clients_per_round * training.examples_per_client
    if per_round > len(pool_images):
        raise ValueError(
            f"training pool has {len(pool_images)} examples, a round needs {per_round}"
        )
    for round in range(training.rounds):
        picks = rng.permutation(len(pool_images))[:per_round].reshape(
            training.clients_per_round, -1
        )
        clients = [
            (pool_images[torch.from_numpy(c)], pool_labels[torch.from_numpy(c)]) for c in picks
        ]
        losses.append(
            fedavg_round(
                model, clients, training.protocol, no_defense, generator=generator, round=round
            )
        )
    return losses


def pretraining_pool(
    dataset: str,
    count: int,
    input_shape: tuple[int, int, int],
    num_classes: int,
    normalization: Normalization,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Public training data at the model's input shape, labels folded into its classes."""
    from auditlib.data import load_training_pool, to_model_batch

    images, labels = load_training_pool(dataset, count, seed=seed)
    batch = to_model_batch(list(images), input_shape, normalization)
    return batch, torch.as_tensor(np.asarray(labels) % num_classes, dtype=torch.long)
