"""Utility: how well the model trains under a defense (FedAvg over simulated clients).

The auditor's second question after "does the attack work" is "what does the defense cost
the model". :func:`train_federated` answers it: N clients hold an IID or Dirichlet non-IID
split of a labelled image set, every round each selected client trains locally and defends
its weight difference exactly as the audited victim does (:func:`fedavg_round`), and the
global model's accuracy and macro F1 on a held-out split are reported after every round.
The model is trained in place, so the caller also has it at any chosen round (to attack it
"late in training").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from auditlib.client.update import copy_state, load_state, set_training_mode
from auditlib.data.labels import check_labels_fit
from auditlib.data.model_input import to_model_batch
from auditlib.data.normalization import Normalization
from auditlib.data.training_sets import TrainTestSets
from auditlib.defenses.base import Defense, model_change
from auditlib.errors import AuditInputError
from auditlib.fl.federation import FederationSpec, Split
from auditlib.fl.training import RoundStopped, fedavg_round
from auditlib.seeds import derive_seed


def split_clients(
    labels: np.ndarray, clients: int, split: Split, alpha: float, seed: int
) -> list[np.ndarray]:
    """Indices of each client's examples; every client gets at least one.

    IID: a seeded permutation cut into near-equal parts. Dirichlet (Hsu et al. 2019): for
    each class, proportions p ~ Dir(alpha, ..., alpha) over clients, and the class's
    examples are cut at the cumulative proportions; redrawn (up to 100 times) until no
    client is empty.
    """
    labels = np.asarray(labels)
    if len(labels) < clients:
        raise AuditInputError(
            f"{len(labels)} training examples cannot be split over {clients} clients; "
            "expected at least one example per client"
        )
    rng = np.random.default_rng(seed)
    if split == "iid":
        return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), clients)]
    for _ in range(100):
        parts: list[list[int]] = [[] for _ in range(clients)]
        for label in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == label))
            proportions = rng.dirichlet(np.full(clients, alpha))
            cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(int)
            for client, piece in enumerate(np.split(members, cuts)):
                parts[client].extend(piece.tolist())
        if all(parts):
            return [np.sort(np.array(p, dtype=np.int64)) for p in parts]
    raise AuditInputError(
        f"a Dirichlet split with alpha {alpha} left a client without data in 100 draws; "
        "use more examples, fewer clients or a larger alpha"
    )


@dataclass(frozen=True)
class Utility:
    """The global model on the held-out split after a round (round 0: before training).

    Under a defense that gives each client a private part (FedKL), ``accuracy`` and
    ``macro_f1`` are the mean over clients of each client's own model (shared weights with
    its key and lock, as the FedKL paper reports), and the ``*_without_key`` fields score
    the shared weights with a random key and the initial lock (the paper's Table III).
    """

    round: int
    accuracy: float
    macro_f1: float
    train_loss: float | None  # the clients' mean loss during the round (None at round 0)
    seconds: float  # wall time of the round's training (0 at round 0)
    accuracy_without_key: float | None = None
    macro_f1_without_key: float | None = None


# A training "learned" when its final test accuracy beats chance level (always predicting the
# test split's most frequent class) by at least this much. Below it the accuracy is noise
# around chance, and a defense's "cost" read off it would mean nothing (issue 21: every
# defense at ~11 % on 10-class Fashion-MNIST, one of them "beating" no defense).
LEARNED_MARGIN = 0.05


def chance_accuracy(labels: torch.Tensor | np.ndarray | list[int]) -> float:
    """Accuracy of always predicting the most frequent class of ``labels`` (chance level)."""
    values = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels).ravel()
    if values.size == 0:
        raise AuditInputError("chance level needs at least one label")
    return float(np.bincount(values.astype(np.int64)).max() / values.size)


def learned(accuracy: float, chance: float) -> bool:
    """Whether ``accuracy`` is clearly above ``chance`` (by :data:`LEARNED_MARGIN`)."""
    return accuracy >= chance + LEARNED_MARGIN


@torch.no_grad()
def evaluate(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 256
) -> tuple[float, float]:
    """Accuracy and macro F1 (over the classes present in ``labels``) in eval mode."""
    set_training_mode(model, False)
    predictions = torch.cat(
        [model(images[i : i + batch_size]).argmax(1) for i in range(0, len(images), batch_size)]
    )
    truth = labels.cpu().numpy()
    guess = predictions.cpu().numpy()
    accuracy = float((truth == guess).mean())
    # Imported here: sklearn is half a second of every worker's start, for utility runs only.
    from sklearn.metrics import f1_score

    macro_f1 = float(
        f1_score(truth, guess, labels=np.unique(truth), average="macro", zero_division=0)
    )
    return accuracy, macro_f1


def train_federated(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    federation: FederationSpec,
    defense: Defense,
    should_stop: Callable[[], bool] | None = None,
) -> Iterator[Utility]:
    """Train ``model`` in place with FedAvg under ``defense``; yield its utility per round.

    The first item is round 0 (the model as given). Stop iterating at any round to keep the
    model as it stands after that round. ``should_stop`` (a time budget, a cancellation) is
    asked before every client's training: when it says stop, the round under way is
    abandoned and the iteration ends, the model as it was after the last round yielded.
    A defense that changes the model (FedKL) changes ``model`` in place first (the lock is
    inserted); each client then keeps its own key and lock, and ``model`` holds the shared
    weights with the initial lock and a random key.
    """
    images, labels = train
    parts = split_clients(
        labels.cpu().numpy(),
        federation.clients,
        federation.split,
        federation.alpha,
        federation.seed,
    )
    protocol = federation.protocol()
    rng = np.random.default_rng(federation.seed + 1)
    generator = torch.Generator().manual_seed(federation.seed + 2)
    states = _private_states(model, tuple(images.shape[1:]), federation, defense)
    yield _utility(model, test, states, 0, None, 0.0)
    for round in range(1, federation.rounds + 1):
        start = time.perf_counter()
        chosen = list(range(federation.clients))
        if federation.clients_per_round is not None:
            picked = rng.choice(federation.clients, federation.clients_per_round, False)
            chosen = sorted(int(c) for c in picked)
        clients = []
        for c in chosen:
            index = torch.from_numpy(parts[c]).to(images.device)
            clients.append((images[index], labels[index]))
        try:
            loss = fedavg_round(
                model,
                clients,
                protocol,
                defense,
                generator=generator,
                round=round - 1,
                private_states=[states[c] for c in chosen] if states else None,
                should_stop=should_stop,
            )
        except RoundStopped:
            return
        seconds = time.perf_counter() - start
        yield _utility(model, test, states, round, loss, seconds)


def _private_states(
    model: nn.Module, input_shape, federation: FederationSpec, defense: Defense
) -> list[dict[str, torch.Tensor]] | None:
    """Each client's private part (FedKL: its own key, the common initial lock), or None.

    ``model`` is changed in place and then holds the server's view of the private part
    (FedKL: the initial lock with a key of the server's own), the "no key" model.
    """
    change = model_change(defense, model, input_shape, federation.seed)
    if change is None:
        return None
    states = [
        defense.client_state(model, change, derive_seed(federation.seed, f"client-{c}"))  # type: ignore[attr-defined]
        for c in range(federation.clients)
    ]
    load_state(model, copy_state(change.server, change.private))
    return states


def _utility(model, test, states, round, loss, seconds) -> Utility:
    if not states:
        return Utility(round, *evaluate(model, *test), train_loss=loss, seconds=seconds)
    without_key = evaluate(model, *test)
    server_state = copy_state(model, states[0])
    scores = []
    for state in states:
        load_state(model, state)
        scores.append(evaluate(model, *test))
    load_state(model, server_state)
    return Utility(
        round,
        float(np.mean([a for a, _ in scores])),
        float(np.mean([f for _, f in scores])),
        train_loss=loss,
        seconds=seconds,
        accuracy_without_key=without_key[0],
        macro_f1_without_key=without_key[1],
    )


def utility_tensors(
    sets: TrainTestSets,
    input_shape: tuple[int, int, int],
    num_classes: int,
    normalization: Normalization,
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The train and test parts as model inputs and label tensors (labels checked to fit)."""
    parts = []
    for images, labels in (
        (sets.train_images, sets.train_labels),
        (sets.test_images, sets.test_labels),
    ):
        check_labels_fit(labels.tolist(), num_classes)
        x = to_model_batch(list(images), input_shape, normalization)
        parts.append((x, torch.as_tensor(labels, dtype=torch.long)))
    return parts[0], parts[1]
