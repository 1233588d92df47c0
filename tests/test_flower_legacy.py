"""RecordingLegacyStrategy without a federation: Flower's legacy FedAvg wrapped, its calls
made by hand as the legacy server loop (``flwr.server.server.Server.fit_round``) and the
SecAgg+ workflow make them. tests/test_flower.py runs the real federations.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.common import Code, FitRes, Parameters, Status, ndarrays_to_parameters
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.strategy import FedAvg
from safetensors.torch import load_file

from auditlib.flower import RecordingLegacyStrategy
from auditlib.models import ModelSpec, build_model
from auditlib.observed import load_bundle

LENET = {"model": "lenet", "num_classes": 10, "input_size": 32}
OK = Status(code=Code.OK, message="")


def _model() -> dict[str, torch.Tensor]:
    return build_model(ModelSpec("lenet", 10, (3, 32, 32), init="uniform")).state_dict()


def _parameters(state: dict[str, torch.Tensor], shift: float = 0.0) -> Parameters:
    return ndarrays_to_parameters([(t + shift).numpy() for t in state.values()])


def _clients(*node_ids: int) -> SimpleClientManager:
    manager = SimpleClientManager()
    for node in node_ids:
        manager.register(GridClientProxy(node, None, 1))  # type: ignore[arg-type]
    return manager


def _fit(strategy, manager, start, server_round=1, shifts=(0.01, 0.02)):
    """configure_fit, each client's FitRes (its model moved by its shift), aggregate_fit."""
    instructions = strategy.configure_fit(server_round, _parameters(start), manager)
    results = [
        (proxy, FitRes(OK, _parameters(start, shift), n + 1, {"lr": 0.1, "batch-size": n + 1}))
        for n, ((proxy, _), shift) in enumerate(zip(instructions, shifts, strict=True))
    ]
    return instructions, results, strategy.aggregate_fit(server_round, results, [])


def test_each_result_is_written_as_a_checked_bundle_and_the_strategy_answers_unchanged(
    tmp_path,
):
    start = _model()
    config = {"lr": 0.1, "local-epochs": 2}
    plain = FedAvg(min_available_clients=2, on_fit_config_fn=lambda _round: dict(config))
    wrapped = RecordingLegacyStrategy(
        FedAvg(min_available_clients=2, on_fit_config_fn=lambda _round: dict(config)),
        tmp_path,
        LENET,
    )
    assert wrapped.min_available_clients == 2  # the wrapped strategy's attributes
    manager = _clients(11, 22)
    instructions, results, aggregated = _fit(wrapped, manager, start)
    assert [ins.config for _, ins in instructions] == [config, config]
    expected = plain.aggregate_fit(1, results, [])
    got = aggregated[0].tensors  # type: ignore[union-attr]
    assert got == expected[0].tensors  # type: ignore[union-attr]
    assert sorted(p.name for p in wrapped.written) == ["client-11", "client-22"]
    for n, (proxy, _) in enumerate(results):
        folder = tmp_path / "round-0001" / f"client-{proxy.cid}"
        bundle = load_bundle(folder)
        assert (bundle.training.lr, bundle.training.num_examples) == (0.1, n + 1)
        assert bundle.training.local_epochs == 2  # the FitIns.config
        assert bundle.training.local_batch_size == n + 1  # the client's metrics
        came = load_file(folder / "client.safetensors")
        assert came.keys() == start.keys()  # positional arrays named after the state_dict
        shift = (0.01, 0.02)[n]
        assert all(torch.equal(came[k], start[k] + shift) for k in start)
        training = json.loads((folder / "training.json").read_text())
        assert training["extra"]["flower"]["node_id"] == int(proxy.cid)
        assert training["extra"]["flower"]["layout"] == "legacy"
    assert wrapped.aggregated_rounds == []


def test_results_that_all_carry_one_aggregate_are_not_recorded(tmp_path):
    """SecAgg+'s workflow hands aggregate_fit every FitRes with the one aggregate."""
    start = _model()
    wrapped = RecordingLegacyStrategy(FedAvg(min_available_clients=2), tmp_path, LENET)
    instructions = wrapped.configure_fit(1, _parameters(start), _clients(1, 2, 3))
    aggregate = _parameters(start, 0.01)
    results = [(proxy, FitRes(OK, aggregate, 1, {"lr": 0.1})) for proxy, _ in instructions]
    parameters, _ = wrapped.aggregate_fit(1, results, [])
    assert parameters is not None
    assert wrapped.written == [] and wrapped.aggregated_rounds == [1]
    assert not (tmp_path / "round-0001").exists()


def test_a_recording_failure_never_stops_the_round_and_rounds_filter(tmp_path, caplog, monkeypatch):
    from auditlib.flower import records

    start = _model()
    wrapped = RecordingLegacyStrategy(FedAvg(min_available_clients=2), tmp_path, LENET, rounds=[2])
    manager = _clients(1, 2)
    _, _, aggregated = _fit(wrapped, manager, start, server_round=1)
    assert aggregated[0] is not None and wrapped.written == []  # round 1 not recorded
    write_round = records.write_round  # the strategies' one write (records.record_client)

    def failing(*args, **kwargs):
        if kwargs["client_id"] == "1":
            raise OSError("disk full")
        return write_round(*args, **kwargs)

    monkeypatch.setattr(records, "write_round", failing)
    _, _, aggregated = _fit(wrapped, manager, start, server_round=2)
    assert aggregated[0] is not None  # the round goes on, aggregated as ever
    assert [p.name for p in wrapped.written] == ["client-2"]
    assert "could not record client 1, round 2" in caplog.text
    assert wrapped._sent == {}  # nothing kept after its round


def test_unnamed_arrays_of_a_model_not_given_are_kept_by_position(tmp_path):
    state = {"a": torch.ones(2, 3), "b": torch.zeros(4)}
    wrapped = RecordingLegacyStrategy(
        FedAvg(min_fit_clients=1, min_available_clients=1), tmp_path, {"lr": 0.1}
    )
    instructions = wrapped.configure_fit(1, _parameters(state), _clients(5))
    results = [(instructions[0][0], FitRes(OK, _parameters(state, 1.0), 3, {}))]
    wrapped.aggregate_fit(1, results, [])
    folder = tmp_path / "round-0001" / "client-5"
    came = load_file(folder / "client.safetensors")
    assert sorted(came) == ["0", "1"] and torch.equal(came["1"], torch.ones(4))
    training = json.loads((folder / "training.json").read_text())
    assert "model" in training["extra"]["missing"] and "unchecked" in training["extra"]
    assert np.isclose(training["lr"], 0.1) and training["num_examples"] == 3
