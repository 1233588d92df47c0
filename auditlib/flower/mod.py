"""The client's side: a Flower client mod that records its own rounds as bundles.

Under secure aggregation (SecAgg+) the server only ever sees the masked sum, so the
individual update can be recorded only on the client, before it is masked. A Flower client
mod sees every message the ClientApp receives and what it answers:
``Callable[[Message, Context, ClientAppCallable], Message]``. Mods run in list order, the
first outermost, so the recording mod goes after ``secaggplus_mod``: it then sees the plain
train reply that ``secaggplus_mod`` masks afterwards::

    from flwr.client.mod import secaggplus_mod
    app = ClientApp(mods=[secaggplus_mod, record_updates("bundles", {"model": "lenet"})])

Without secure aggregation it goes anywhere in the list (or on ``@app.train(mods=[...])``).
Each train round is written as ``out_dir/round-NNNN/client-<node id>`` with the bundle format
of ``RecordingStrategy``; the reply is handed on unchanged. The round is the train
configuration's ``server-round`` (Message API strategies send it), else the message's group
id where it is a number (the legacy workflows), else this node's count of train rounds
(kept in the Context's state).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import flwr
from flwr.app import ConfigRecord, Context, Message
from flwr.app.message_type import MessageType
from flwr.clientapp.typing import ClientAppCallable, Mod

from auditlib.flower.records import read_returned, read_sent, snapshot, write_round
from auditlib.flower.training import canonical

log = logging.getLogger(__name__)

SOURCE = "flower client mod (auditlib.flower.record_updates)"
STATE_KEY = "auditlib.flower"


def _round(config: Mapping[str, Any], message: Message, context: Context) -> int:
    for key, value in config.items():
        if canonical(key) == "server_round":
            return int(value)
    group = message.metadata.group_id
    if group.isdigit():
        return int(group)
    records = context.state.config_records
    counted = records.get(STATE_KEY) or ConfigRecord({"train_rounds": 0})
    count = int(counted.get("train_rounds", 0)) + 1
    records[STATE_KEY] = ConfigRecord({"train_rounds": count})
    return count


def record_updates(
    out_dir: str | os.PathLike,
    training: Mapping[str, Any] | None = None,
    *,
    array_key: str = "arrays",
    weight_key: str = "num-examples",
) -> Mod:
    """A client mod that writes each train round of this client as a bundle into ``out_dir``.

    ``training``: what the client code does that its messages do not say (training.json's
    field names, as for ``RecordingStrategy``). ``array_key`` and ``weight_key``: where the
    Message API reply holds the model and the example count (the quickstart's keys).
    """
    folder = Path(out_dir)
    given = dict(training or {})

    def mod(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if message.metadata.message_type.split(".")[0] != MessageType.TRAIN:
            return call_next(message, context)
        sent = read_sent(message.content, array_key)
        if sent.arrays is None:  # a protocol stage around the training (SecAgg+'s setup)
            return call_next(message, context)
        sent = snapshot(sent)  # the ClientApp may empty the record it trains from
        reply = call_next(message, context)
        if reply.has_error():
            return reply
        try:
            write_round(
                folder,
                round=_round(sent.config, message, context),
                client_id=str(context.node_id),
                source=SOURCE,
                sent=sent,
                returned=read_returned(reply.content, array_key, weight_key),
                given=given,
                extra={
                    "node_id": context.node_id,
                    "node_config": {k: v for k, v in context.node_config.items()},
                    "message_id": message.metadata.message_id,
                    "flwr_version": flwr.__version__,
                },
            )
        except Exception:  # a recording failure never stops the client
            log.exception("auditlib.flower: could not record node %s's round", context.node_id)
        return reply

    return mod
