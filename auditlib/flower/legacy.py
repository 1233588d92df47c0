"""The server's side, for Flower's legacy strategies: a wrapper that records each client's
round as a bundle.

Many federations still run the legacy strategy API (``flwr.server.strategy.Strategy``:
FedAvg, FedProx, FedAdam, Krum, ...), started by ``ServerApp(server_fn=...)`` returning
``ServerAppComponents(strategy=..., config=ServerConfig(num_rounds=...))``, with
``NumPyClient`` clients. ``RecordingLegacyStrategy(strategy, out_dir, training)`` wraps such a
strategy and behaves exactly as it: every call is passed on and its answer handed back
unchanged. On the way it keeps, per round, the global parameters and the ``FitIns.config``
each client was sent (``configure_fit``) and, when the results come (``aggregate_fit``),
writes one bundle per successful result, before the wrapped strategy aggregates them::

    out_dir/round-0001/client-<cid>/{global,client}.safetensors, training.json

``cid`` is the ClientProxy's id (under ``ServerApp`` the node id). The arrays are Flower's
``Parameters``, a list in the order the client's ``get_parameters`` gives them: they are named
after the audited model's state_dict when ``training`` names the model and count and shapes
agree (``records.to_state``); ``FitRes.num_examples`` is the example count, ``FitRes.metrics``
what the client reported of its training.

Under secure aggregation (``SecAggPlusWorkflow``, ``SecAggWorkflow``) the strategy never sees
a client's update: those workflows hand ``aggregate_fit`` every client's ``FitRes`` with its
parameters replaced by the one unmasked aggregate, the same object for all. Such a round is
not recorded here (``aggregated_rounds`` lists it, and a warning says why): record on the
clients, with ``record_updates`` after ``secaggplus_mod``.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import flwr
from flwr.app import ArrayRecord
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from auditlib.flower.records import Returned, Sent, record_client

log = logging.getLogger(__name__)

SOURCE = "flower server, legacy strategy (auditlib.flower.RecordingLegacyStrategy)"


def _arrays(parameters: Parameters) -> ArrayRecord:
    """The parameters as an ArrayRecord of positional arrays ("0", "1", ...), copied."""
    return ArrayRecord(parameters_to_ndarrays(parameters))


def _client_id(proxy: ClientProxy) -> str:
    return str(proxy.cid)


class RecordingLegacyStrategy(Strategy):
    """Record each client's fit round of the legacy ``strategy`` into ``out_dir`` (see the
    module doc).

    ``training``: what the client code does that Flower does not carry (training.json's field
    names: ``model``, ``num_classes``, ``input_size``, ``momentum``, ``local_batch_size``,
    ...); the client's ``FitRes.metrics`` and the ``FitIns.config`` outrank it. ``rounds``:
    the rounds to record (all by default). ``written`` lists the bundles written;
    ``aggregated_rounds`` the rounds whose results carried only the aggregate (secure
    aggregation), not recorded.
    """

    def __init__(
        self,
        strategy: Strategy,
        out_dir: str | os.PathLike,
        training: Mapping[str, Any] | None = None,
        *,
        rounds: Iterable[int] | None = None,
    ) -> None:
        super().__init__()
        self.strategy = strategy
        self.out_dir = Path(out_dir)
        self.training = dict(training or {})
        self.rounds = None if rounds is None else frozenset(rounds)
        self.written: list[Path] = []
        self.aggregated_rounds: list[int] = []
        self._sent: dict[int, dict[str, Sent]] = {}

    def __getattr__(self, name: str) -> Any:
        # Attributes the wrapper does not have (fraction_fit, initial_parameters, ...) are
        # the wrapped strategy's; only called for names not found on the wrapper itself.
        if name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)

    def __repr__(self) -> str:
        return f"RecordingLegacyStrategy({self.strategy!r}, out_dir={str(self.out_dir)!r})"

    def _records(self, server_round: int) -> bool:
        return self.rounds is None or server_round in self.rounds

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.strategy.initialize_parameters(client_manager)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        instructions = self.strategy.configure_fit(server_round, parameters, client_manager)
        if self._records(server_round):
            try:
                self._sent[server_round] = self._keep(instructions)
            except Exception:  # a recording failure never stops the federation
                log.exception("auditlib.flower: could not keep round %s's fit", server_round)
        return instructions

    @staticmethod
    def _keep(instructions: list[tuple[ClientProxy, FitIns]]) -> dict[str, Sent]:
        sent: dict[str, Sent] = {}
        copies: dict[int, ArrayRecord] = {}  # one copy per distinct Parameters (FedAvg: one)
        for proxy, fitins in instructions:
            arrays = copies.get(id(fitins.parameters))
            if arrays is None:
                arrays = copies[id(fitins.parameters)] = _arrays(fitins.parameters)
            sent[_client_id(proxy)] = Sent(arrays, dict(fitins.config))
        return sent

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        sent = self._sent.pop(server_round, None)
        if sent is not None:
            self._write(server_round, sent, results)
        return self.strategy.aggregate_fit(server_round, results, failures)

    def _write(
        self,
        server_round: int,
        sent: dict[str, Sent],
        results: list[tuple[ClientProxy, FitRes]],
    ) -> None:
        shared = {id(fitres.parameters) for _, fitres in results}
        if len(results) > 1 and len(shared) == 1:
            # Secure aggregation: every result carries the one aggregate, no client's own.
            self.aggregated_rounds.append(server_round)
            log.warning(
                "auditlib.flower: round %s's %s results all carry one same set of parameters, "
                "the aggregate of a secure-aggregation workflow (SecAgg+), not any client's "
                "update: nothing recorded on the server. Record on the clients: "
                "record_updates after secaggplus_mod",
                server_round,
                len(results),
            )
            return
        for proxy, fitres in results:
            client = _client_id(proxy)
            if client not in sent:
                continue
            record_client(
                self.written,
                self.out_dir,
                round=server_round,
                client_id=client,
                returned=functools.partial(_returned, fitres),
                source=SOURCE,
                sent=sent[client],
                given=self.training,
                extra={
                    "cid": client,
                    "node_id": getattr(proxy, "node_id", None),
                    "strategy": type(self.strategy).__name__,
                    "flwr_version": flwr.__version__,
                },
            )

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return self.strategy.evaluate(server_round, parameters)


def _returned(fitres: FitRes) -> Returned:
    """What a legacy client returned, as the recorder reads a reply."""
    return Returned(
        _arrays(fitres.parameters),
        dict(fitres.metrics or {}),
        int(fitres.num_examples),
        layout="legacy",
    )
