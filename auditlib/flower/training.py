"""``training.json`` of a bundle recorded from Flower: what the client did in its round,
read from what it reported, what the server asked, what the auditor said, or assumed.

Flower carries no fixed schema for local training: the quickstart sends the learning rate in
the train ConfigRecord (``"lr"``), keeps the epochs and batch size in the run config and
hard-codes the optimiser in the ClientApp. Each field is therefore looked up, in this order:

1. the client's reply (its MetricRecord, or the legacy ``FitRes.metrics``): what it did;
2. the train configuration the server sent (its ConfigRecord, or the legacy ``FitIns.config``):
   what it was asked to do;
3. the ``training`` mapping the auditor gave the recorder: what the client code is known to do
   (the quickstart's ``momentum=0.9``, its batch size from the run config);
4. an assumption (``ASSUMED``), written down in ``training.json``'s ``extra.assumed`` with
   why.

The fields are those of the bundle format (docs/OBSERVED.md); everything else goes under
``extra``: where each value came from (``extra.from``), what was assumed, what no source gave
and nothing could stand in for (``extra.missing``: the model, the learning rate, the number
of examples; such a bundle is still written, to be completed by hand), and the records as
Flower carried them (``extra.flower``). This module imports nothing from Flower.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Each field of training.json and the keys that carry it in Flower's records (compared after
# lower-casing and reading "-" and "." as "_": "local-epochs" and "local_epochs" are one key).
KEYS: dict[str, tuple[str, ...]] = {
    "model": ("model",),
    "num_classes": ("num_classes",),
    "input_size": ("input_size",),
    "channels": ("channels",),
    "activation": ("activation",),
    "stem": ("stem",),
    "optimizer": ("optimizer", "optim"),
    "lr": ("lr", "learning_rate", "local_lr"),
    "momentum": ("momentum",),
    "weight_decay": ("weight_decay", "wd"),
    "local_epochs": ("local_epochs", "epochs"),
    "local_steps": ("local_steps", "steps"),
    "local_batch_size": ("local_batch_size", "batch_size"),
    "num_examples": ("num_examples",),
    "model_args": ("model_args",),
    "bn_mode": ("bn_mode",),
    "shuffled": ("shuffled", "shuffle"),
    "mean": ("mean",),
    "std": ("std",),
}

# What is assumed where nothing says, and why: the plain FedAvg client of the papers.
ASSUMED: dict[str, tuple[Any, str]] = {
    "optimizer": ("sgd", "SGD, the optimiser of the FedAvg papers and Flower's quickstart"),
    "momentum": (0.0, "no momentum, the FedAvg papers' SGD (Flower's quickstart uses 0.9)"),
    "weight_decay": (0.0, "no weight decay"),
    "local_epochs": (1, "one pass over the client's examples"),
    "bn_mode": ("train", "the model in training mode, as torch trains it"),
    "shuffled": (
        False,
        "the examples in their order, a DataLoader's default (Flower's quickstart shuffles "
        "its trainloader; any order is the same with one batch)",
    ),
}
# Fields that nothing can stand in for: written as null and listed under "missing".
REQUIRED = ("model", "num_classes", "input_size", "lr", "num_examples")

_FLOATS = {"lr", "momentum", "weight_decay"}
_INTS = {"local_epochs", "local_steps", "local_batch_size", "num_examples"}
_INTS |= {"num_classes", "channels"}
_TEXTS = {"optimizer", "bn_mode", "model", "activation", "stem"}
_CHOICES = {"optimizer": ("sgd", "adam"), "bn_mode": ("train", "eval")}


def canonical(key: str) -> str:
    return key.strip().lower().replace("-", "_").replace(".", "_")


def _lookup(values: Mapping[str, Any], field: str) -> tuple[str, Any] | None:
    """(the key as the mapping spells it, its value) for ``field``, or None."""
    spelled = {canonical(k): k for k in values}
    for alias in KEYS[field]:
        if alias in spelled:
            return spelled[alias], values[spelled[alias]]
    return None


def _plain(value: Any) -> Any:
    """A value as JSON holds it (numpy scalars and arrays, bytes and tuples included)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _coerce(field: str, value: Any) -> Any:
    """``value`` as ``field`` holds it; ValueError where it cannot be."""
    value = _plain(value)
    if field in _FLOATS:
        return float(value)
    if field in _INTS:
        number = float(value)
        if not number.is_integer() or number < 0:
            raise ValueError(f"{field} must be a whole number >= 0, got {value!r}")
        return int(number)
    if field == "input_size":
        if isinstance(value, list):
            return [int(v) for v in value]
        return _coerce("num_classes", value)
    if field in _TEXTS:
        text = str(value).strip() if field == "model" else str(value).strip().lower()
        if field in _CHOICES and text not in _CHOICES[field]:
            raise ValueError(f"{field} must be one of {', '.join(_CHOICES[field])}, got {value!r}")
        return text
    if field == "shuffled":
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes")
        return bool(value)
    if field == "model_args":
        if not isinstance(value, Mapping):
            raise ValueError(
                f"model_args must be an object of constructor arguments, got {value!r}"
            )
        return {str(k): _plain(v) for k, v in value.items()}
    if field in ("mean", "std"):
        items = value if isinstance(value, list) else [value]
        return [float(v) for v in items]
    return value


def training_record(
    *,
    reported: Mapping[str, Any],
    config: Mapping[str, Any],
    given: Mapping[str, Any],
    num_examples: int | None,
    round: int | None,
    client_id: str,
    source: str,
    flower: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``training.json`` of one client's round.

    ``reported``: the client's metrics; ``config``: the train configuration it received;
    ``given``: the auditor's ``training`` mapping (field names of training.json, or any key
    of ``KEYS``); ``num_examples``: the count the client returned beside its update (legacy
    ``FitRes.num_examples``, or the strategy's weighting key), which outranks the others.
    ``flower`` is kept under ``extra.flower`` beside the records as they came (node and
    message ids). A field nothing gave is left out and named in ``extra.missing`` (the
    bundle is still written: add it by hand before auditing).
    """
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    assumed: dict[str, str] = {}
    problems: list[str] = []
    sources = (
        ("client metrics", reported),
        ("train config", config),
        ("recorder's training", given),
    )
    for field in KEYS:
        if field == "num_examples" and num_examples is not None:
            out[field], origin[field] = int(num_examples), "client reply (num_examples)"
            continue
        for where, values in sources:
            found = _lookup(values, field)
            if found is None:
                continue
            key, value = found
            try:
                out[field] = _coerce(field, value)
            except (TypeError, ValueError) as exc:
                problems.append(f"{where} {key!r}: {exc}")
                continue
            origin[field] = f"{where} {key!r}"
            break
    if "local_steps" not in out and "local_epochs" not in out:
        value, why = ASSUMED["local_epochs"]
        out["local_epochs"], origin["local_epochs"] = value, "assumed"
        assumed["local_epochs"] = f"{value}: {why}"
    for field, (value, why) in ASSUMED.items():
        if field not in out and field != "local_epochs":
            out[field], origin[field] = value, "assumed"
            assumed[field] = f"{value}: {why}"
    if "local_batch_size" not in out and out.get("num_examples") is not None:
        out["local_batch_size"], origin["local_batch_size"] = out["num_examples"], "assumed"
        assumed["local_batch_size"] = (
            f"{out['num_examples']}: the client's examples in one batch (num_examples)"
        )
    if "local_steps" in out and "local_epochs" in out:
        # Both said: the count of steps is the exact one; the epochs stay in "extra".
        both = f"local_steps {out['local_steps']} kept; local_epochs {out.pop('local_epochs')}"
        origin["local_epochs"] = both
    missing = [f for f in (*REQUIRED, "local_batch_size") if out.get(f) is None]
    for name in missing:
        out.pop(name, None)
    extra: dict[str, Any] = {
        "from": origin,
        "assumed": assumed,
        "missing": missing,
    }
    if problems:
        extra["unreadable"] = problems
    extra["flower"] = {
        "metrics": {k: _plain(v) for k, v in reported.items()},
        "train_config": {k: _plain(v) for k, v in config.items()},
        **(dict(flower) if flower else {}),
    }
    order = list(KEYS)
    record: dict[str, Any] = {
        **dict(sorted(out.items(), key=lambda item: order.index(item[0]))),
        "client_id": client_id,
        "source": source,
        "extra": extra,
    }
    if round is not None:
        record["round"] = round
    return record
