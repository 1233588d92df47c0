"""auditlib.flower without a federation: training.json's sources and assumptions, the legacy
layout that SecAgg+ and NumPyClient speak, the client mod around a SecAgg+ stage, what is
kept when a round cannot be checked, and the strategy wrapper's hand-over. Messages are
built by hand (Flower's task identity set for the test); tests/test_flower.py runs the
real federation.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from auditlib.errors import AuditInputError
from auditlib.flower import RecordingStrategy, record_updates, training_record
from auditlib.models import ModelSpec, build_model
from auditlib.observed import load_bundle

LENET = {"model": "lenet", "num_classes": 10, "input_size": 32}


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """The ids Flower's runtime gives a process, so that messages can be built here."""
    for name, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _model() -> dict[str, torch.Tensor]:
    return build_model(ModelSpec("lenet", 10, (3, 32, 32), init="uniform")).state_dict()


def _trained(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v + 0.01 for k, v in state.items()}


def _context(node: int = 7) -> Context:
    return Context(
        run_id=1, node_id=node, node_config={"partition-id": 0}, state=RecordDict(), run_config={}
    )


def test_a_field_comes_from_the_client_then_the_config_then_the_recorder_else_it_is_assumed():
    record = training_record(
        reported={"lr": 0.05, "num-examples": 4, "local-steps": 3, "epochs": 1},
        config={"lr": 0.1, "batch-size": 2, "server-round": 2},
        given={**LENET, "momentum": 0.9, "batch_size": 8},
        num_examples=None,
        round=2,
        client_id="7",
        source="test",
    )
    assert (record["lr"], record["local_batch_size"], record["momentum"]) == (0.05, 2, 0.9)
    origin = record["extra"]["from"]
    assert origin["lr"] == "client metrics 'lr'"
    assert origin["local_batch_size"] == "train config 'batch-size'"
    assert origin["momentum"] == "recorder's training 'momentum'"
    # Steps and epochs both reported: the exact count of steps is kept.
    assert record["local_steps"] == 3 and "local_epochs" not in record
    assert set(record["extra"]["assumed"]) == {"optimizer", "weight_decay", "bn_mode", "shuffled"}
    assert record["extra"]["missing"] == []


def test_what_nothing_gives_is_named_missing_and_never_invented():
    record = training_record(
        reported={},
        config={},
        given={},
        num_examples=3,
        round=None,
        client_id="7",
        source="test",
    )
    assert record["extra"]["missing"] == ["model", "num_classes", "input_size", "lr"]
    assert not {"model", "lr"} & set(record) and "round" not in record
    assert record["local_epochs"] == 1 and record["local_batch_size"] == 3
    assert record["extra"]["assumed"]["local_batch_size"].startswith("3:")


def _legacy_train(state: dict[str, torch.Tensor], group: str = "3") -> Message:
    """A train message as the legacy workflows (and SecAgg+) send it: positional arrays."""
    content = RecordDict(
        {
            "fitins.parameters": ArrayRecord([v.numpy() for v in state.values()]),
            "fitins.config": ConfigRecord({"learning-rate": 0.1, "epochs": 1}),
            "secaggplus_configs": ConfigRecord({"stage": "collect_masked_vectors"}),
        }
    )
    return Message(content=content, dst_node_id=7, message_type="train", group_id=group)


def _legacy_reply(message: Message, state: dict[str, torch.Tensor], n: int) -> Message:
    content = RecordDict(
        {
            "fitres.parameters": ArrayRecord([v.numpy() for v in state.values()]),
            "fitres.num_examples": MetricRecord({"num_examples": n}),
            "fitres.metrics": ConfigRecord({"batch_size": n}),
        }
    )
    return Message(content, reply_to=message)


def test_the_mod_records_a_legacy_round_under_secagg_naming_the_arrays_after_the_model(tmp_path):
    start = _model()
    mod = record_updates(tmp_path, LENET)
    replies = []

    def client_app(message: Message, context: Context) -> Message:
        # The ClientApp empties the record it trains from (keep_input=False), as Flower's own
        # conversions may: the mod's copy must not care.
        message.content["fitins.parameters"].to_numpy_ndarrays(keep_input=False)
        replies.append(_legacy_reply(message, _trained(start), 5))
        return replies[-1]

    message = _legacy_train(start)
    assert mod(message, _context(), client_app) is replies[0]  # handed on unchanged
    # Named by the node's partition-id (its node config), the node id kept in client_id.
    bundle = load_bundle(tmp_path / "round-0003" / "partition-0")
    assert bundle.training.client_id == "partition-id 0, node 7"
    assert bundle.training.extra["flower"]["partition_id"] == 0
    assert bundle.training.num_examples == 5 and bundle.training.lr == 0.1
    assert bundle.training.round == 3 and bundle.training.local_batch_size == 5
    assert set(bundle.global_state) == set(start)
    assert all(torch.equal(bundle.global_state[k], start[k].float()) for k in start)
    extra = bundle.training.extra
    assert extra["flower"]["layout"] == "legacy"
    assert extra["flower"]["array_names"].startswith("positional arrays named after")
    assert "secaggplus_configs" not in extra["flower"]["train_config"]


def test_the_mod_passes_a_protocol_stage_without_a_model_untouched(tmp_path):
    mod = record_updates(tmp_path, LENET)
    setup = Message(
        content=RecordDict({"secaggplus_configs": ConfigRecord({"stage": "setup"})}),
        dst_node_id=7,
        message_type="train",
    )
    reply = Message(RecordDict(), reply_to=setup)
    assert mod(setup, _context(), lambda m, c: reply) is reply
    evaluate = Message(
        content=RecordDict({"arrays": ArrayRecord(_model())}),
        dst_node_id=7,
        message_type="evaluate",
    )
    assert mod(evaluate, _context(), lambda m, c: reply) is reply
    assert not any(tmp_path.iterdir())


def test_a_round_without_a_learning_rate_is_kept_unchecked_and_refused_until_completed(tmp_path):
    start = _model()
    message = Message(
        content=RecordDict({"arrays": ArrayRecord(start), "config": ConfigRecord({})}),
        dst_node_id=7,
        message_type="train",
    )
    reply = Message(
        RecordDict(
            {
                "arrays": ArrayRecord(_trained(start)),
                "metrics": MetricRecord({"num-examples": 2}),
            }
        ),
        reply_to=message,
    )
    mod = record_updates(tmp_path, LENET)
    assert mod(message, _context(), lambda m, c: reply) is reply
    # No server round, no group id: this node's first train round.
    folder = tmp_path / "round-0001" / "partition-0"
    training = json.loads((folder / "training.json").read_text())
    assert training["extra"]["missing"] == ["lr"] and "unchecked" in training["extra"]
    with pytest.raises(AuditInputError, match="lr"):
        load_bundle(folder)
    training["lr"] = 0.1  # completed by hand, as docs/FLOWER.md says
    (folder / "training.json").write_text(json.dumps(training))
    assert load_bundle(folder).training.lr == 0.1


class _Inner:
    """A stand-in for a Message-API strategy: what the wrapper hands over and back."""

    weighted_by_key = "num-examples"
    arrayrecord_key = "arrays"

    def __init__(self, start: dict[str, torch.Tensor]) -> None:
        self.start = start
        self.aggregated = None

    def configure_train(self, server_round, arrays, config, grid):
        config["server-round"] = server_round
        content = RecordDict({"arrays": arrays, "config": config})
        return (Message(content=content, dst_node_id=n, message_type="train") for n in (5, 6))

    def aggregate_train(self, server_round, replies):
        self.aggregated = replies
        return None, None


def test_the_strategy_wrapper_records_each_reply_and_hands_the_same_replies_on(tmp_path):
    start = _model()
    inner = _Inner(start)
    strategy = RecordingStrategy(inner, tmp_path, LENET)
    assert strategy.weighted_by_key == "num-examples"  # the wrapped strategy's attributes
    sent = list(strategy.configure_train(1, ArrayRecord(start), ConfigRecord({"lr": 0.1}), None))
    replies = []
    for message in sent:
        content = RecordDict(
            {
                "arrays": ArrayRecord(_trained(start)),
                "metrics": MetricRecord({"num-examples": 3, "batch-size": 3}),
            }
        )
        replies.append(Message(content, reply_to=message))
    strategy.aggregate_train(1, iter(replies))  # a generator, read by both
    assert inner.aggregated == replies
    assert sorted(p.name for p in strategy.written) == ["client-5", "client-6"]
    for folder in strategy.written:
        bundle = load_bundle(folder)
        assert bundle.training.round == 1 and bundle.training.num_examples == 3
        assert bundle.training.source.startswith("flower server")
