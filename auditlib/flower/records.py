"""Reading a train round out of Flower's messages, and writing it as a bundle.

Flower carries a train round in one of two layouts, and both are read:

- the Message API (``flwr.app``, Flower's PyTorch quickstart): the model in an ArrayRecord
  (key ``"arrays"``) built from the state_dict, so its arrays carry the parameter names;
  the train configuration in a ConfigRecord (``"config"``); the reply's metrics, with the
  example count under the strategy's weighting key (``"num-examples"``), in a MetricRecord;
- the legacy layout (``NumPyClient``, ``flwr.server.strategy``, and the SecAgg+ mod and
  workflow, which still speak it): ``"fitins.parameters"`` and ``"fitins.config"`` in,
  ``"fitres.parameters"``, ``"fitres.num_examples"`` and ``"fitres.metrics"`` back, the
  arrays in list order, unnamed: they are named after the audited model's state_dict (the
  order ``model.state_dict().values()`` gives, as the quickstart's ``get_weights``), where
  count and shapes agree.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict

from auditlib.errors import AuditInputError
from auditlib.flower._bundle import write_unchecked
from auditlib.flower.training import canonical, training_record
from auditlib.observed import write_bundle

log = logging.getLogger(__name__)

LEGACY_IN = ("fitins.parameters", "fitins.config")
LEGACY_OUT = ("fitres.parameters", "fitres.num_examples", "fitres.metrics")
# Records that belong to a protocol around the training, not to it (SecAgg+'s stages).
PROTOCOL_RECORDS = ("secaggplus_configs", "secaggplus_state")


@dataclass
class Sent:
    """What the client received for its round: the model and the train configuration."""

    arrays: ArrayRecord | None
    config: dict[str, Any]


@dataclass
class Returned:
    """What the client sent back: its model, its metrics and its example count."""

    arrays: ArrayRecord | None
    metrics: dict[str, Any]
    num_examples: int | None
    layout: str = "message"


def _only_array_record(content: RecordDict, key: str | None) -> ArrayRecord | None:
    records = content.array_records
    if key is not None and key in records:
        return records[key]
    if len(records) == 1:
        return next(iter(records.values()))
    return None


def read_sent(content: RecordDict, array_key: str | None = "arrays") -> Sent:
    """The model and configuration of a train message, in either layout."""
    if LEGACY_IN[0] in content.array_records:
        legacy = content.config_records.get(LEGACY_IN[1])
        return Sent(content.array_records[LEGACY_IN[0]], dict(legacy or {}))
    config: dict[str, Any] = {}
    for name, record in content.config_records.items():
        if name not in PROTOCOL_RECORDS:
            config.update(record)
    return Sent(_only_array_record(content, array_key), config)


def snapshot(sent: Sent) -> Sent:
    """``sent`` with a record of its own: the arrays' bytes are shared (never changed), so
    a ClientApp or a grid that empties the record it was given leaves this one whole."""
    if sent.arrays is None:
        return sent
    return Sent(ArrayRecord.from_array_dict(dict(sent.arrays.items())), dict(sent.config))


def read_returned(
    content: RecordDict, array_key: str | None = "arrays", weight_key: str = "num-examples"
) -> Returned:
    """The model, metrics and example count of a train reply, in either layout."""
    if LEGACY_OUT[0] in content.array_records:
        counted = content.metric_records.get(LEGACY_OUT[1])
        count = None if counted is None else counted.get("num_examples")
        return Returned(
            content.array_records[LEGACY_OUT[0]],
            dict(content.config_records.get(LEGACY_OUT[2]) or {}),
            None if count is None else int(count),
            layout="legacy",
        )
    metrics: dict[str, Any] = {}
    for record in content.metric_records.values():
        metrics.update(record)
    weight = next((v for k, v in metrics.items() if canonical(k) == canonical(weight_key)), None)
    return Returned(
        _only_array_record(content, array_key), metrics, None if weight is None else int(weight)
    )


def model_state_names(given: Mapping[str, Any]) -> list[tuple[str, tuple[int, ...]]] | None:
    """The audited model's state_dict (names and shapes) for naming positional arrays, from
    the recorder's ``training`` (model, num_classes, input_size, channels, model_args); None
    without a model or where it cannot be built."""
    from auditlib.models.own_code import canonical_args

    values = {canonical(k): v for k, v in given.items()}
    if not values.get("model"):
        return None
    size = values.get("input_size") or 32
    shape = (
        tuple(int(v) for v in size)
        if isinstance(size, (list, tuple))
        else (int(values.get("channels") or 3), int(size), int(size))
    )
    try:
        args = canonical_args(values.get("model_args"))
    except AuditInputError as exc:
        log.warning("auditlib.flower: cannot build %s to name the arrays: %s", values["model"], exc)
        return None
    return _state_names(str(values["model"]), int(values.get("num_classes") or 10), shape, args)


@functools.lru_cache(maxsize=8)
def _state_names(
    model: str, num_classes: int, shape: tuple[int, ...], args: str | None
) -> list[tuple[str, tuple[int, ...]]] | None:
    from auditlib.models import ModelSpec, build_model
    from auditlib.models.own_code import own_code_allowed

    try:
        # The recorder runs in the federation the user wrote: a model class of their own
        # code named in its training mapping is built here as their client builds it.
        with own_code_allowed():
            spec = ModelSpec(model, num_classes, shape, model_args=args)  # type: ignore[arg-type]
            state = build_model(spec).state_dict()
    except Exception as exc:  # any model the product cannot build: the arrays keep their keys
        log.warning("auditlib.flower: cannot build %s to name the arrays: %s", model, exc)
        return None
    return [(name, tuple(t.shape)) for name, t in state.items()]


def to_state(
    arrays: ArrayRecord, names: list[tuple[str, tuple[int, ...]]] | None
) -> tuple[dict[str, torch.Tensor], str]:
    """The arrays as a state_dict, and how they were named."""
    tensors = [(k, torch.from_numpy(np.array(a.numpy(), copy=True))) for k, a in arrays.items()]
    if not all(k.isdigit() for k, _ in tensors):
        return dict(tensors), "named by the client"
    shapes = [tuple(t.shape) for _, t in tensors]
    if names is not None and [s for _, s in names] == shapes:
        return {n: t for (n, _), (_, t) in zip(names, tensors, strict=True)}, (
            "positional arrays named after the model's state_dict (same count and shapes)"
        )
    return dict(tensors), (
        "positional arrays kept under their positions: they do not match the model's "
        "state_dict" + ("" if names is not None else " (no model given to name them)")
    )


def bundle_folder(
    out_dir: str | os.PathLike, round: int | None, client_id: str, partition: str | None = None
) -> Path:
    """``round-NNNN/partition-<id>`` where the client's partition-id is known (it names the
    client's data from run to run), else ``round-NNNN/client-<node id>`` (which changes)."""
    part = "round-unknown" if round is None else f"round-{round:04d}"
    name = f"client-{client_id}" if partition is None else f"partition-{partition}"
    return Path(out_dir) / part / name


def partition_of(metrics: Mapping[str, Any], node_config: Mapping[str, Any]) -> str | None:
    """The client's partition-id: its node config's (the client mod sees it), else what the
    client reported in its metrics (the server's recorders see only those); None unknown."""
    for values in (node_config, metrics):
        for key, value in values.items():
            if canonical(key) == "partition_id" and str(value).isdigit():
                return str(value)
    return None


def write_round(
    out_dir: str | os.PathLike,
    *,
    round: int | None,
    client_id: str,
    source: str,
    sent: Sent,
    returned: Returned,
    given: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> Path | None:
    """Write one client's round as a bundle; None (and a warning) where it carries no model.

    ``extra``: kept in training.json under ``extra.flower`` (node and message ids)."""
    if sent.arrays is None or returned.arrays is None or len(returned.arrays) == 0:
        log.warning(
            "auditlib.flower: round %s of client %s carries no model to record (sent: %s, "
            "returned: %s); under SecAgg+ put the recording mod after secaggplus_mod",
            round,
            client_id,
            sent.arrays is not None,
            returned.arrays is not None and len(returned.arrays) > 0,
        )
        return None
    from auditlib.models.own_code import own_code_allowed

    names = model_state_names(given)
    global_state, global_naming = to_state(sent.arrays, names)
    client_state, client_naming = to_state(returned.arrays, names)
    partition = partition_of(returned.metrics, (extra or {}).get("node_config") or {})
    training = training_record(
        reported=returned.metrics,
        config=sent.config,
        given=given,
        num_examples=returned.num_examples,
        round=round,
        client_id=client_id if partition is None else f"partition-id {partition}, node {client_id}",
        source=source,
        flower={
            "partition_id": None if partition is None else int(partition),
            "layout": returned.layout,
            "array_names": global_naming
            if global_naming == client_naming
            else f"sent: {global_naming}; returned: {client_naming}",
            **(dict(extra) if extra else {}),
        },
    )
    folder = bundle_folder(out_dir, round, client_id, partition)
    missing = training["extra"]["missing"]
    if not missing:
        try:
            with own_code_allowed():  # as above: checked against the user's own class
                write_bundle(folder, global_state, client_state, training, overwrite=True)
            return folder
        except AuditInputError as exc:  # e.g. the arrays do not fit the model named
            why = str(exc)
    else:
        why = (
            f"no {', '.join(missing)}: neither the client's metrics, the train config nor "
            "the recorder's training gave it"
        )
    # The update is kept all the same (a round cannot be captured again): the bundle's
    # files, unchecked, for training.json to be completed by hand (docs/FLOWER.md).
    log.warning(
        "auditlib.flower: round %s of client %s is recorded unchecked in %s (%s); complete "
        "training.json before auditing it",
        round,
        client_id,
        folder,
        why,
    )
    training["extra"]["unchecked"] = why
    return write_unchecked(folder, global_state, client_state, training)


def record_client(
    written: list[Path],
    out_dir: str | os.PathLike,
    *,
    round: int | None,
    client_id: str,
    returned: Callable[[], Returned],
    **bundle: Any,
) -> None:
    """The strategies' write of one client's round (:func:`write_round` with the rest of
    ``bundle``); the folder goes to ``written``. A recording failure never stops the
    federation: it is logged and the round goes on (``returned`` is read inside, so a reply
    that cannot be read is one such failure)."""
    try:
        folder = write_round(
            out_dir, round=round, client_id=client_id, returned=returned(), **bundle
        )
    except Exception:
        log.exception("auditlib.flower: could not record client %s, round %s", client_id, round)
        return
    if folder is not None:
        written.append(folder)
