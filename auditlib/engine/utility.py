"""The defense's cost: the audited model trained with FedAvg under the run's defense,
round by round, against its own time budget (``RunSpec.utility``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, replace

from auditlib.data import Normalization
from auditlib.data.training_sets import bundled_sets
from auditlib.defenses import build_defense
from auditlib.engine.device import resolve_device
from auditlib.engine.victim import build_audited_model
from auditlib.fl.federated import train_federated, utility_tensors
from auditlib.result import UtilityRecord, UtilityRound
from auditlib.spec import RunSpec


@dataclass(frozen=True)
class UtilityProgress:
    """Yielded after each round of the utility training (round 0: before training)."""

    round: int
    rounds: int  # planned
    accuracy: float
    elapsed_s: float
    budget_s: float


def measure_utility(
    spec: RunSpec,
    *,
    allow_trusted_archive: bool = False,
    assets: Mapping[str, bytes] | None = None,
    is_cancelled: Callable[[], bool] = lambda: False,
) -> UtilityRecord:
    """``iter_utility`` run to its end: the utility record alone."""
    rounds = iter_utility(
        spec, allow_trusted_archive=allow_trusted_archive, assets=assets, is_cancelled=is_cancelled
    )
    while True:
        try:
            next(rounds)
        except StopIteration as done:
            return done.value


def iter_utility(
    spec: RunSpec,
    *,
    allow_trusted_archive: bool = False,
    assets: Mapping[str, bytes] | None = None,
    is_cancelled: Callable[[], bool] = lambda: False,
) -> Generator[UtilityProgress, None, UtilityRecord]:
    """The defense's cost: the audited model trained with FedAvg under a fresh instance of
    the run's defense (``spec.utility``), yielding its progress after every round and
    returning the utility record.

    Training starts from the uploaded weights where there are any (before any attack-stage
    pretraining). A built-in model without weights starts from the initialisation that
    trains its activation: DLG's uniform U(-0.5, 0.5) for sigmoid networks (the lab's
    default LeNet), under which it is the very model audited, and PyTorch's default for
    the others. PyTorch's default shrinks a sigmoid network's signal about fourfold per layer
    (the default LeNet's last features vary by ~4e-4 across images), and SGD, with or
    without momentum, stays at chance level; the uniform one makes ReLU activations blow up
    and stall. Either way every defense would seem to cost nothing.

    ``chance_accuracy`` is always predicting the test split's most frequent class;
    ``learned`` says whether the final accuracy clearly beats it (``LEARNED_MARGIN``), so a
    defense's cost is only read off a training that learned. The training stops at its time
    budget (``UtilitySpec.seconds``) or a cancellation, before the next client trains; the
    record then holds the rounds done, ``complete`` false and ``stop_reason`` saying why.
    """
    from auditlib.fl.federated import chance_accuracy, learned
    from auditlib.models.registry import trainable_init

    utility = spec.utility
    assert utility is not None
    started = time.perf_counter()
    model_spec = spec.model.spec
    device = resolve_device(spec.device)
    normalization = Normalization.parse(spec.data.normalization, model_spec.input_shape[0])
    sets = bundled_sets(utility.dataset, utility.train, utility.test, utility.federation.seed)
    train, test = utility_tensors(
        sets, model_spec.input_shape, model_spec.num_classes, normalization
    )
    train = (train[0].to(device), train[1].to(device))
    test = (test[0].to(device), test[1].to(device))
    from_weights = spec.model.weights or spec.model.weights_asset or spec.model.trusted_archive
    if not from_weights:
        init = trainable_init(model_spec)
        spec = replace(spec, model=replace(spec.model, spec=replace(model_spec, init=init)))
    model = build_audited_model(
        spec, allow_trusted_archive=allow_trusted_archive, assets=assets
    ).to(device)
    defense, _ = build_defense(spec.defense.name, spec.defense.params_dict())
    deadline = started + utility.seconds

    def should_stop() -> bool:
        return is_cancelled() or time.perf_counter() >= deadline

    rounds: list[UtilityRound] = []
    planned = utility.federation.rounds
    for result in train_federated(model, train, test, utility.federation, defense, should_stop):
        rounds.append(UtilityRound(**result.__dict__))
        yield UtilityProgress(
            result.round, planned, result.accuracy, time.perf_counter() - started, utility.seconds
        )
    last = rounds[-1]
    if last.round == planned:
        stop_reason = "completed"
    else:
        stop_reason = "cancelled" if is_cancelled() else "time budget"
    chance = chance_accuracy(test[1])
    if from_weights:
        starts_from = "the uploaded weights"
    elif trainable_init(model_spec) == "uniform":
        starts_from = "DLG's uniform initialisation U(-0.5, 0.5) of the architecture"
    else:
        starts_from = "PyTorch's default initialisation of the architecture"
    return UtilityRecord(
        dataset=sets.source,
        train_examples=len(train[1]),
        test_examples=len(test[1]),
        federation=utility.federation,
        starts_from=starts_from,
        rounds=tuple(rounds),
        rounds_completed=last.round,
        complete=stop_reason == "completed",
        stop_reason=stop_reason,
        budget_s=utility.seconds,
        accuracy=last.accuracy,
        macro_f1=last.macro_f1,
        accuracy_without_key=last.accuracy_without_key,
        initial_accuracy=rounds[0].accuracy,
        chance_accuracy=chance,
        learned=learned(last.accuracy, chance),
        privacy=defense.privacy_report(),
        seconds=time.perf_counter() - started,
    )
