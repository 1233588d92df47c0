"""The default utility training learns (issue 21, item 5): the defense's cost is read off a
model that left chance level, and chance level travels with every figure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from auditlib.engine.utility import measure_utility
from auditlib.fl.federated import LEARNED_MARGIN, chance_accuracy, learned
from auditlib.models import ModelSpec
from auditlib.spec import (
    Budget,
    ComponentSpec,
    DataSpec,
    ModelRef,
    RunSpec,
    ScenarioSpec,
    UtilitySpec,
)

torch.set_num_threads(1)


def test_chance_accuracy_is_the_share_of_the_most_frequent_class():
    assert chance_accuracy(torch.tensor([0, 1, 1, 2, 1, 0, 3, 1])) == 0.5
    assert chance_accuracy(np.array([7])) == 1.0
    assert chance_accuracy([2, 2, 5, 5, 9]) == pytest.approx(0.4)  # a tie counts once
    assert chance_accuracy(torch.arange(10)) == pytest.approx(0.1)


def test_learned_means_clearly_above_chance():
    assert LEARNED_MARGIN == 0.05
    assert learned(0.72, 0.117)
    assert learned(0.117 + LEARNED_MARGIN, 0.117)
    assert not learned(0.152, 0.117)  # dp-gaussian's 15.2 % "beating" none in issue 21
    assert not learned(0.10, 0.117)


def test_default_utility_trains_the_default_lenet_above_chance():
    # The lab's default victim: DLG's LeNet (sigmoid), 10 classes, 3x32x32, uniform init.
    spec = RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 32, 32), init="uniform")),
        data=DataSpec("samples", "photographs", batch_size=1),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(5),
        utility=UtilitySpec(),
    )
    result = measure_utility(spec)
    assert result.complete and result.rounds_completed == 5
    assert 0.1 <= result.chance_accuracy < 0.2  # 10 Fashion-MNIST classes, 1000 tests
    assert result.learned is True
    # Measured 0.724 (chance 0.117); PyTorch's default init stayed at 0.112.
    assert result.accuracy >= result.chance_accuracy + 0.3
    assert result.accuracy > result.initial_accuracy + 0.3
    assert result.starts_from.startswith("DLG's uniform initialisation")
