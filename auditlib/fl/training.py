"""A small federated training loop: FedAvg rounds over simulated clients.

Used to put the global model at a later "attack stage" (the model trained N rounds before
the attacked round); converged models leak less (GRNN thesis, Table 3.4). Each client runs
the same :func:`client_update` the victim runs, so there is one definition of local
training.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from auditlib.config import require
from auditlib.data.normalization import Normalization
from auditlib.fl.protocol import ClientProtocol
from auditlib.fl.update import client_update, set_training_mode, trainable_parameters


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


def federated_averaging(
    model: nn.Module,
    pool_images: torch.Tensor,
    pool_labels: torch.Tensor,
    training: FederatedTraining,
    seed: int,
) -> list[float]:
    """Train ``model`` in place for ``training.rounds`` FedAvg rounds; returns the mean client
    loss before each round's update (a cheap training curve).

    Each round samples ``clients_per_round`` disjoint client datasets from the pool and
    averages their weight differences, weighted by example count (equal here).
    """
    rng = np.random.default_rng(seed)
    losses: list[float] = []
    per_round = training.clients_per_round * training.examples_per_client
    if per_round > len(pool_images):
        raise ValueError(
            f"training pool has {len(pool_images)} examples, a round needs {per_round}"
        )
    for _ in range(training.rounds):
        picks = rng.permutation(len(pool_images))[:per_round].reshape(
            training.clients_per_round, -1
        )
        parameters = trainable_parameters(model)
        total = [torch.zeros_like(p) for p in parameters.values()]
        round_loss = 0.0
        for client in picks:
            index = torch.from_numpy(client)
            images, labels = pool_images[index], pool_labels[index]
            with torch.no_grad():
                # In train mode this forward pass also moves BatchNorm's running statistics
                # toward the clients' data, as the clients' own training would.
                set_training_mode(model, training.protocol.batchnorm_mode == "train")
                round_loss += float(nn.functional.cross_entropy(model(images), labels))
            delta = client_update(
                model, parameters, images, labels, training.protocol, differentiable=False
            )
            total = [t + d for t, d in zip(total, delta, strict=True)]
        with torch.no_grad():
            for p, t in zip(parameters.values(), total, strict=True):
                p.add_(t / training.clients_per_round)
        losses.append(round_loss / training.clients_per_round)
    set_training_mode(model, False)
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
