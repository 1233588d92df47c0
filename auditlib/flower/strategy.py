"""The server's side: a Flower strategy that records each client's round as a bundle.

``RecordingStrategy(strategy, out_dir, training)`` wraps any strategy of Flower's Message
API (``flwr.serverapp.strategy.Strategy``: FedAvg, FedProx, FedAdam, Krum, ...; the one
Flower's PyTorch quickstart runs with ``strategy.start(grid=..., initial_arrays=...)``) and
behaves exactly as it: every call is passed on and its answer handed back unchanged. On the
way it keeps, per round, the model and train configuration each node was sent
(``configure_train``) and, when the replies come (``aggregate_train``), writes one bundle per
client that answered without an error::

    out_dir/round-0001/client-<node id>/{global,client}.safetensors, training.json

A wrapped strategy's own ``start`` is not called (the base class's loop calls the wrapper's
methods); a strategy that overrides ``start`` is recorded only as far as that loop calls
``configure_train`` and ``aggregate_train``.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import flwr
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from auditlib.flower.records import Sent, read_returned, read_sent, record_client, snapshot

log = logging.getLogger(__name__)

SOURCE = "flower server (auditlib.flower.RecordingStrategy)"


class RecordingStrategy(Strategy):
    """Record each client's train round of ``strategy`` into ``out_dir`` (see module doc).

    ``training``: what the client code does that Flower does not carry (training.json's
    field names: ``model``, ``num_classes``, ``input_size``, ``momentum``,
    ``local_batch_size``, ...); the client's metrics and the train configuration outrank it.
    ``rounds``: the rounds to record (all by default).
    """

    def __init__(
        self,
        strategy: Strategy,
        out_dir: str | os.PathLike,
        training: Mapping[str, Any] | None = None,
        *,
        rounds: Iterable[int] | None = None,
    ) -> None:
        self.strategy = strategy
        self.out_dir = Path(out_dir)
        self.training = dict(training or {})
        self.rounds = None if rounds is None else frozenset(rounds)
        self.written: list[Path] = []
        self._sent: dict[int, dict[int, Sent]] = {}

    def __getattr__(self, name: str) -> Any:
        # Attributes the wrapper does not have (weighted_by_key, fraction_train, ...) are the
        # wrapped strategy's; only called for names not found on the wrapper itself.
        if name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)

    def _records(self, server_round: int) -> bool:
        return self.rounds is None or server_round in self.rounds

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        if self._records(server_round):
            key = getattr(self.strategy, "arrayrecord_key", "arrays")
            sent: dict[int, Sent] = {}
            copies: dict[int, ArrayRecord] = {}
            for message in messages:
                read = read_sent(message.content, key)
                if read.arrays is not None:
                    # A copy of the record (the arrays' bytes are shared, never changed), so
                    # nothing that empties the sent record later empties this one; one copy
                    # per distinct record (FedAvg sends every node the same).
                    own = copies.get(id(read.arrays))
                    if own is None:
                        own = copies[id(read.arrays)] = snapshot(read).arrays
                    read = Sent(own, read.config)
                sent[message.metadata.dst_node_id] = read
            self._sent[server_round] = sent
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)  # read here and by the wrapped strategy
        sent = self._sent.pop(server_round, None)
        if sent is not None:
            self._write(server_round, sent, replies)
        return self.strategy.aggregate_train(server_round, replies)

    def _write(self, server_round: int, sent: dict[int, Sent], replies: list[Message]) -> None:
        key = getattr(self.strategy, "arrayrecord_key", "arrays")
        weight_key = getattr(self.strategy, "weighted_by_key", "num-examples")
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error() or node not in sent:
                continue
            record_client(
                self.written,
                self.out_dir,
                round=server_round,
                client_id=str(node),
                returned=functools.partial(read_returned, reply.content, key, weight_key),
                source=SOURCE,
                sent=sent[node],
                given=self.training,
                extra={
                    "node_id": node,
                    "message_id": reply.metadata.message_id,
                    "strategy": type(self.strategy).__name__,
                    "flwr_version": flwr.__version__,
                },
            )

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.strategy.summary()
        log.info("auditlib.flower: recording client rounds into %s", self.out_dir)
