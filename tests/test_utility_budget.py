"""The utility training after the attack has a time budget, shows its progress and stops on
cancel (issue 21, item 7: Soteria's training held a finished run at "step 300" for 31
minutes, and its cancel was reported as "before the attack could finish")."""

from __future__ import annotations

import dataclasses

import torch

from auditlib.defenses import build_defense
from auditlib.engine.messages import UtilityMessage, from_wire
from auditlib.engine.stream import audit_messages
from auditlib.engine.utility import measure_utility
from auditlib.fl.federated import FederationSpec, train_federated
from auditlib.models import ModelSpec
from auditlib.report.subject import utility_cut_short
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


def _points(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two Gaussian clusters in 8 dimensions, as 1 x 2 x 4 images."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 2
    return (torch.randn(n, 8, generator=g) + 3 * labels[:, None]).view(n, 1, 2, 4), labels


def _spec(utility: UtilitySpec) -> RunSpec:
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 32, 32), init="uniform")),
        data=DataSpec("samples", "photographs", batch_size=1),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(2),
        utility=utility,
    )


def test_a_round_asked_to_stop_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 2))
    before = {n: t.clone() for n, t in model.state_dict().items()}
    asked = []

    def stop_at_the_second_client() -> bool:
        asked.append(1)
        return len(asked) >= 2

    federation = FederationSpec(clients=2, rounds=3, local_epochs=1)
    rounds = list(
        train_federated(
            model,
            _points(200, 1),
            _points(100, 2),
            federation,
            build_defense("none")[0],
            should_stop=stop_at_the_second_client,
        )
    )
    assert [r.round for r in rounds] == [0]  # round 1 was abandoned after its first client
    assert len(asked) == 2
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_the_utility_training_stops_at_its_time_budget():
    # The default training (5 rounds, 3000 examples) takes about 7 s here; 1 s stops it.
    result = measure_utility(_spec(UtilitySpec(seconds=1)))
    assert result.complete is False and result.stop_reason == "time budget"
    assert result.rounds_completed < 5 and result.budget_s == 1
    assert result.seconds < 5
    # Tables and reports say so beside the accuracy.
    done = result.rounds_completed
    assert utility_cut_short(result) == f"{done} of 5 rounds, time budget"
    assert utility_cut_short(dataclasses.replace(result, complete=True)) is None


def test_a_cancelled_utility_training_says_so():
    result = measure_utility(_spec(UtilitySpec(train=200, test=100)), is_cancelled=lambda: True)
    assert result.stop_reason == "cancelled" and result.rounds_completed == 0
    assert result.complete is False


def test_a_complete_training_says_completed():
    tiny = UtilitySpec(train=200, test=100, federation=FederationSpec(clients=2, rounds=2))
    result = measure_utility(_spec(tiny))
    assert result.complete is True and result.stop_reason == "completed"
    assert result.rounds_completed == 2 and result.budget_s == 300


def test_the_stream_reports_every_round_of_the_utility_training_before_the_result():
    tiny = UtilitySpec(train=200, test=100, federation=FederationSpec(clients=2, rounds=2))
    messages = [from_wire(m) for m in audit_messages(_spec(tiny), emit_every=1, lpips_nets=())]
    kinds = [m.kind for m in messages]
    assert kinds[-1] == "result"
    utility = [m for m in messages if isinstance(m, UtilityMessage)]
    assert [m.round for m in utility] == [0, 1, 2]
    assert {m.rounds for m in utility} == {2} and {m.budget for m in utility} == {300}
    last_event = max(i for i, k in enumerate(kinds) if k == "event")
    assert kinds.index("utility") > last_event  # after the attack
    assert utility[1].stage().startswith("utility training: 1 of 2 rounds done, ")
    assert utility[1].stage().endswith("s of its 300 s budget")


def test_the_utility_budget_is_validated():
    import pytest

    from auditlib.errors import AuditInputError

    with pytest.raises(AuditInputError, match=r"time budget must be in \[1, 86400\] seconds"):
        UtilitySpec(seconds=0)
