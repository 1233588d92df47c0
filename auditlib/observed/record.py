"""training.json of an observed-update bundle: how the client trained, typed and checked.

Every field is documented in docs/OBSERVED.md. A record that exists is valid: the missing
fields are named together in one line, a wrong type or value in one line naming the field.
Numbers must lie in ranges a real client's training falls in; ``source`` and ``client_id``
must be short plain text without markup, and ``extra`` small, printable JSON: the record
reaches the result, the threat card and the report, which a hostile file could otherwise
fill or mark up.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from auditlib.client.protocol import ADAM_BETAS, ADAM_EPS, ClientProtocol
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec
from auditlib.models.own_code import canonical_args

FILE = "training.json"
FORMAT = 1  # the bundle format this code writes and reads ("format" in training.json)
REQUIRED = (
    "model",
    "num_classes",
    "input_size",
    "optimizer",
    "lr",
    "momentum",
    "weight_decay",
    "local_batch_size",
    "num_examples",
    "bn_mode",
)
OPTIONAL = (
    "local_epochs",
    "local_steps",
    "model_args",
    "channels",
    "activation",
    "stem",
    "mean",
    "std",
    "shuffled",
    "round",
    "client_id",
    "source",
    "loss",
    "nesterov",
    "dampening",
    "betas",
    "eps",
    "format",
    "extra",
)
OPTIMIZERS = ("sgd", "adam")
BN_MODES = ("train", "eval")
LOSSES = ("cross_entropy",)

# The ranges a real client's training falls in; beyond them a value is a typo or a hostile
# file. (local_epochs and local_steps are bounded by the simulated client: client.protocol.)
MAX_LOCAL_BATCH_SIZE = 65_536  # 2**16: beyond the largest batches one client trains on
MAX_NUM_EXAMPLES = 10**8  # more examples than any one client of a federation holds
# No trainer's rate is below 1e-12 (FedSGD reads the gradient back as -change / lr, which
# such a rate blows up) or above 10 (the simulated FedAvg client takes at most 10).
MIN_LR, MAX_LR = 1e-12, 10.0
MAX_WEIGHT_DECAY = 1.0  # a decay of 1 removes the whole weight at every step of lr 1
MAX_ROUND = 10**7  # a round a minute for 19 years
# Text: a name or a short note, shown in the threat card and the report.
MAX_TEXT_CHARS = 200
# Strings in extra: a recorder's notes (Flower's quote the values it could not read). They
# reach only result.json and the report's escaped table, never Markdown, so markup stays
# allowed there: the recorders' notes hold shapes ("[10, 768]") and "<12 bytes>".
MAX_EXTRA_TEXT_CHARS = 1_000
MAX_EXTRA_ITEMS = 1_000  # keys and values of extra, all levels together
MAX_EXTRA_DEPTH = 8  # objects and lists inside extra (Flower's recorder nests 3 deep)
# Characters that make Markdown or HTML out of text: emphasis, headings, tables, code, links,
# images, tags, escapes. "(", ")" and "_" stay allowed: without "[" no link can form, and
# the recorders write them ("flower server (auditlib.flower.RecordingStrategy)", node_id).
MARKUP = "<>[]`*#|\\"


def _type_name(value: Any) -> str:
    names = {str: "a string", bool: "a boolean", list: "a list", dict: "an object"}
    return "null" if value is None else names.get(type(value), f"a {type(value).__name__}")


def _refuse(name: str, value: Any, expected: str, *, typed: bool = True) -> AuditInputError:
    """``typed``: the value has the wrong type (named), else a wrong value of the right one."""
    kind = f" ({_type_name(value)})" if typed else ""
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:60] + "..."  # a hostile value may be long
    return AuditInputError(f"{FILE}: {name} must be {expected}, got {shown}{kind}")


def _number(data: Mapping[str, Any], name: str) -> float:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _refuse(name, value, "a number")
    if not math.isfinite(value):
        raise _refuse(name, value, "a finite number", typed=False)
    return float(value)


def _whole(data: Mapping[str, Any], name: str, low: int = 1, high: int | None = None) -> int:
    value = data[name]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(name, value, "a whole number")
    if high is not None and not low <= value <= high:
        raise _refuse(name, value, f"a whole number from {low:,} to {high:,}", typed=False)
    if value < low:
        raise _refuse(name, value, f"a whole number >= {low}", typed=False)
    return value


def _in_range(data: Mapping[str, Any], name: str, low: float, high: float, text: str) -> float:
    """A finite number of ``data[name]`` in [low, high] (``text`` says the range)."""
    value = _number(data, name)
    if not low <= value <= high:
        raise _refuse(name, data[name], text, typed=False)
    return value


def _plain_text(name: str, value: str, limit: int, *, markup: bool = False) -> str:
    """``value``, refused unless it is at most ``limit`` printable characters, without
    markup (:data:`MARKUP`) unless ``markup``."""
    shown = repr(value[:40]) + ("..." if len(value) > 40 else "")
    if len(value) > limit:
        raise AuditInputError(
            f"{FILE}: {name} is {len(value):,} characters long ({shown}); expected at most "
            f"{limit:,} characters of plain text"
        )
    banned = "" if markup else MARKUP
    bad = next((c for c in value if c in banned or not c.isprintable()), None)
    if bad is not None:
        without = (
            "control characters" if markup else f"markup ({' '.join(MARKUP)}) or control characters"
        )
        raise AuditInputError(
            f"{FILE}: {name} holds {bad!r} in {shown}; expected plain text without {without}"
        )
    return value


def _check_extra(extra: Mapping[str, Any]) -> None:
    """Refuse an ``extra`` that is not small, plain JSON: finite numbers, printable text
    (keys also without markup), at most :data:`MAX_EXTRA_DEPTH` levels and
    :data:`MAX_EXTRA_ITEMS` items."""
    pending: list[tuple[str, Any, int]] = [("extra", extra, 0)]
    count = 0
    while pending:
        path, value, depth = pending.pop()
        count += 1
        if count > MAX_EXTRA_ITEMS:
            raise AuditInputError(
                f"{FILE}: extra holds more than {MAX_EXTRA_ITEMS:,} keys and values; expected "
                "a few notes (it is kept in the result and the report)"
            )
        if isinstance(value, Mapping | list | tuple) and depth > MAX_EXTRA_DEPTH:
            raise AuditInputError(
                f"{FILE}: {path} nests objects or lists more than {MAX_EXTRA_DEPTH} levels "
                "deep; expected a few notes"
            )
        if isinstance(value, Mapping):
            for key, item in value.items():
                _plain_text(f"a key of {path}", str(key), MAX_TEXT_CHARS)
                pending.append((f"{path}.{key}", item, depth + 1))
        elif isinstance(value, list | tuple):
            pending += [(f"{path}[{i}]", item, depth + 1) for i, item in enumerate(value)]
        elif isinstance(value, str):
            _plain_text(path, value, MAX_EXTRA_TEXT_CHARS, markup=True)
        elif isinstance(value, float) and not math.isfinite(value):
            raise _refuse(path, value, "a finite number", typed=False)
        elif value is not None and not isinstance(value, bool | int | float):
            raise _refuse(path, value, "text, a number, true, false, null, a list or an object")


def _choice(data: Mapping[str, Any], name: str, allowed: tuple[str, ...]) -> str:
    value = data[name]
    if not isinstance(value, str) or value.strip().lower() not in allowed:
        raise _refuse(name, value, f"one of {', '.join(allowed)}")
    return value.strip().lower()


def _text(data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _refuse(name, value, "a string")
    return _plain_text(name, str(value), MAX_TEXT_CHARS)


def _flag(data: Mapping[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if not isinstance(value, bool):
        raise _refuse(name, value, "true or false")
    return value


def _input_shape(data: Mapping[str, Any]) -> tuple[int, int, int]:
    value = data["input_size"]
    channels = data.get("channels")
    if channels is not None:
        channels = _whole(data, "channels")
    if isinstance(value, list):
        if len(value) != 3:
            raise _refuse("input_size", value, "a side in pixels or [channels, height, width]")
        shape = tuple(_whole({"input_size": v}, "input_size") for v in value)
        if channels is not None and channels != shape[0]:
            raise AuditInputError(
                f"{FILE}: channels is {channels} but input_size {value} has {shape[0]}; "
                "expected one channel count"
            )
        return shape  # type: ignore[return-value]
    side = _whole(data, "input_size")
    return (3 if channels is None else channels, side, side)


def _per_channel(data: Mapping[str, Any], name: str, channels: int) -> tuple[float, ...] | None:
    value = data.get(name)
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if len(values) not in (1, channels):
        raise _refuse(name, value, f"one number or {channels} (one per channel)")
    numbers = tuple(_number({name: v}, name) for v in values)
    return numbers * channels if len(numbers) == 1 else numbers


@dataclass(frozen=True)
class TrainingRecord:
    """How the client trained in the round its update comes from (training.json).

    ``local_epochs`` or ``local_steps``: exactly one is set. The model is a name as
    ``--model`` takes it (``path/to/file.py:ClassName`` for a class of the client's own code,
    built with ``model_args``); its weights are the bundle's global.safetensors.
    """

    model: str
    num_classes: int
    input_shape: tuple[int, int, int]
    optimizer: Literal["sgd", "adam"]
    lr: float
    momentum: float
    weight_decay: float
    local_batch_size: int
    num_examples: int
    bn_mode: Literal["train", "eval"]
    local_epochs: int | None = None
    local_steps: int | None = None
    activation: str | None = None
    stem: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    shuffled: bool = False
    round: int | None = None
    client_id: str | None = None
    source: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    model_args: str | None = None  # canonical JSON of the own class's constructor arguments

    @classmethod
    def from_json(cls, data: Any, *, check_model: bool = True) -> TrainingRecord:
        """The record of training.json's object; refused in one line where it is not one.

        ``check_model=False``: the model's name is checked by the caller (a bundle, which
        names the architectures its tensors fit where the name is not known)."""
        if not isinstance(data, Mapping):
            raise AuditInputError(f"{FILE} must hold a JSON object, got {_type_name(data)}")
        missing = [name for name in REQUIRED if name not in data]
        if "local_epochs" not in data and "local_steps" not in data:
            missing.append("local_epochs (or local_steps)")
        if missing:
            raise AuditInputError(
                f"{FILE} lacks {'field' if len(missing) == 1 else 'fields'} {', '.join(missing)}; "
                "docs/OBSERVED.md lists every field"
            )
        unknown = sorted(set(data) - set(REQUIRED) - set(OPTIONAL))
        if unknown:
            raise AuditInputError(
                f"{FILE} has unknown fields {', '.join(unknown)}; expected only the fields "
                "docs/OBSERVED.md lists (free-form data goes under 'extra')"
            )
        if "local_epochs" in data and "local_steps" in data:
            raise AuditInputError(
                f"{FILE} gives both local_epochs and local_steps; expected one of them"
            )
        model = data["model"]
        if not isinstance(model, str) or not model.strip():
            raise _refuse("model", model, "an architecture name, as --model takes it")
        shape = _input_shape(data)
        lr = _number(data, "lr")
        if lr <= 0:
            raise _refuse("lr", data["lr"], "a learning rate > 0", typed=False)
        if not MIN_LR <= lr <= MAX_LR:
            raise _refuse(
                "lr", data["lr"], f"a learning rate from {MIN_LR:g} to {MAX_LR:g}", typed=False
            )
        momentum = _number(data, "momentum")
        if not 0 <= momentum < 1:
            raise _refuse("momentum", data["momentum"], "a number in [0, 1)", typed=False)
        if momentum and str(data["optimizer"]).strip().lower() == "adam":
            raise _refuse(
                "momentum", data["momentum"], "0 with adam (its beta1 is the momentum)", typed=False
            )
        weight_decay = _in_range(
            data, "weight_decay", 0, MAX_WEIGHT_DECAY, f"a number from 0 to {MAX_WEIGHT_DECAY:g}"
        )
        _check_unsupported(data)
        extra = data.get("extra", {})
        if not isinstance(extra, Mapping):
            raise _refuse("extra", extra, "a JSON object")
        _check_extra(extra)
        record = cls(
            model=model.strip(),
            num_classes=_whole(data, "num_classes", 2),
            input_shape=shape,
            optimizer=_choice(data, "optimizer", OPTIMIZERS),  # type: ignore[arg-type]
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            local_batch_size=_whole(data, "local_batch_size", 1, MAX_LOCAL_BATCH_SIZE),
            num_examples=_whole(data, "num_examples", 1, MAX_NUM_EXAMPLES),
            bn_mode=_choice(data, "bn_mode", BN_MODES),  # type: ignore[arg-type]
            local_epochs=_whole(data, "local_epochs") if "local_epochs" in data else None,
            local_steps=_whole(data, "local_steps") if "local_steps" in data else None,
            activation=_text(data, "activation"),
            stem=_text(data, "stem"),
            mean=_per_channel(data, "mean", shape[0]),
            std=_per_channel(data, "std", shape[0]),
            shuffled=_flag(data, "shuffled"),
            round=_whole(data, "round", 0, MAX_ROUND) if data.get("round") is not None else None,
            client_id=_text(data, "client_id"),
            source=_text(data, "source"),
            extra=dict(extra),
            model_args=_model_args(data.get("model_args")),
        )
        if (record.mean is None) != (record.std is None):
            raise AuditInputError(
                f"{FILE} gives only one of mean and std; expected both or neither"
            )
        if record.std is not None and not all(s > 0 for s in record.std):
            raise _refuse("std", data["std"], "numbers > 0", typed=False)
        # The checks of the model and the protocol, each as one line naming the file.
        if check_model:
            record.model_spec()
        record.protocol("weights")
        return record

    def to_json(self) -> dict[str, Any]:
        """training.json's object for this record (the format this code writes)."""
        data: dict[str, Any] = {
            "format": FORMAT,
            "model": self.model,
            "num_classes": self.num_classes,
            "input_size": list(self.input_shape),
            "optimizer": self.optimizer,
            "lr": self.lr,
            "momentum": self.momentum,
            "weight_decay": self.weight_decay,
            "local_batch_size": self.local_batch_size,
            "num_examples": self.num_examples,
            "bn_mode": self.bn_mode,
            "shuffled": self.shuffled,
        }
        optional = {
            "local_epochs": self.local_epochs,
            "local_steps": self.local_steps,
            "activation": self.activation,
            "stem": self.stem,
            "mean": None if self.mean is None else list(self.mean),
            "std": None if self.std is None else list(self.std),
            "round": self.round,
            "client_id": self.client_id,
            "source": self.source,
            "extra": dict(self.extra) or None,
            "model_args": None if self.model_args is None else json.loads(self.model_args),
        }
        return data | {k: v for k, v in optional.items() if v is not None}

    def model_spec(self) -> ModelSpec:
        """The architecture training.json names (its weights: global.safetensors)."""
        try:
            return ModelSpec(
                architecture=self.model,
                num_classes=self.num_classes,
                input_shape=self.input_shape,
                activation=self.activation,
                stem=self.stem,
                model_args=self.model_args,
            )
        except AuditInputError as exc:
            raise AuditInputError(f"{FILE}: {exc}") from None

    @property
    def assumed(self) -> tuple[tuple[str, str], ...]:
        """The fields the client did not report and its recorder assumed, each with what was
        assumed and why (``extra.assumed``, as the Flower recorders write it)."""
        found = self.extra.get("assumed") if isinstance(self.extra, Mapping) else None
        if not isinstance(found, Mapping):
            return ()
        return tuple((str(k), str(v)) for k, v in found.items())

    @property
    def assumed_words(self) -> tuple[str, ...]:
        """Each assumption as "momentum 0.0: no momentum, ...": the threat card's, the
        page's and the PDF's words for it."""
        return tuple(f"{name} {what}" for name, what in self.assumed)

    @property
    def protocol_assumed(self) -> tuple[str, ...]:
        """The assumed fields that decide how the update is read (the optimiser, its steps,
        batches, decay): where any is, the reading holds only if the assumption does."""
        return tuple(name for name, _ in self.assumed if name in _PROTOCOL_FIELDS)

    @property
    def total_steps(self) -> int:
        """The client's local steps: local_steps, or local_epochs passes over its batches."""
        if self.local_steps is not None:
            return self.local_steps
        assert self.local_epochs is not None
        return self.local_epochs * math.ceil(self.num_examples / self.local_batch_size)

    @property
    def one_gradient(self) -> bool:
        """One SGD step on every example: the update is -lr x (the batch's gradient +
        weight_decay x the global weights), which the server reads back exactly as the
        gradient; the audit is then FedSGD's (docs/OBSERVED.md)."""
        return (
            self.optimizer == "sgd"
            and self.total_steps == 1
            and self.local_batch_size >= self.num_examples
        )

    def protocol(self, shared: Literal["weights", "delta"]) -> ClientProtocol:
        """The client protocol the attacker simulates: FedSGD where the update is
        :attr:`one_gradient`, else FedAvg with the client's optimiser, steps and batches."""
        try:
            if self.one_gradient:  # the lr and what was sent, as recorded (FedSGD ignores them)
                return ClientProtocol(
                    algorithm="fedsgd",
                    local_lr=self.lr,
                    shared=shared,
                    batchnorm_mode=self.bn_mode,
                )
            return ClientProtocol(
                algorithm="fedavg",
                local_steps=self.local_steps or 1,
                local_epochs=self.local_epochs,
                local_lr=self.lr,
                local_batch_size=self.local_batch_size,
                shared=shared,
                batchnorm_mode=self.bn_mode,
                optimizer=self.optimizer,
                momentum=self.momentum,
                weight_decay=self.weight_decay,
                shuffle=self.shuffled,
            )
        except AuditInputError as exc:
            raise AuditInputError(f"{FILE}: {exc}") from None

    @property
    def normalization(self) -> str:
        """The input normalisation as ``Normalization.parse`` reads it: "none" or MEAN/STD."""
        if self.mean is None or self.std is None:
            return "none"
        return f"{','.join(f'{v:g}' for v in self.mean)}/{','.join(f'{v:g}' for v in self.std)}"


# training.json's fields that decide the update's reading (one_gradient, the protocol).
_PROTOCOL_FIELDS = frozenset(
    {"optimizer", "local_epochs", "local_steps", "local_batch_size", "momentum", "weight_decay"}
)


def _model_args(value: Any) -> str | None:
    """model_args (the own class's constructor arguments) as canonical JSON, or None."""
    try:
        return canonical_args(value)
    except AuditInputError as exc:
        raise AuditInputError(f"{FILE}: model_args: {exc}") from None


def _check_unsupported(data: Mapping[str, Any]) -> None:
    """Fields a real client may state that this tool does not simulate otherwise."""
    loss = data.get("loss", "cross_entropy")
    if loss not in LOSSES:
        raise _refuse("loss", loss, f"one of {', '.join(LOSSES)} (the only loss simulated)")
    if _flag(data, "nesterov"):
        raise _refuse("nesterov", True, "false (Nesterov momentum is not simulated)")
    if data.get("dampening", 0) != 0:
        raise _refuse("dampening", data["dampening"], "0 (dampened momentum is not simulated)")
    betas = data.get("betas")
    if betas is not None and (not isinstance(betas, list) or tuple(betas) != ADAM_BETAS):
        raise _refuse("betas", betas, f"{list(ADAM_BETAS)} (torch.optim.Adam's, simulated)")
    eps = data.get("eps")
    if eps is not None and eps != ADAM_EPS:
        raise _refuse("eps", eps, f"{ADAM_EPS:g} (torch.optim.Adam's, simulated)")
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        raise _refuse("format", fmt, f"{FORMAT} (this version reads bundle format {FORMAT})")
