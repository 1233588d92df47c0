"""An observed-update bundle: the update one client actually sent, with what the server
knew of the round (docs/OBSERVED.md).

A bundle is a plain folder:

- ``global.safetensors``: the state_dict the round started from (the model the server sent);
- ``client.safetensors``: the state_dict the client returned, or ``delta.safetensors``: its
  difference (client - global), one of the two;
- ``training.json``: how the client trained (``record.TrainingRecord``).

:func:`load_bundle` reads and checks one; :func:`write_bundle` writes one (the capture of a
federation's round uses it). Tensors are read with safetensors only: nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import safetensors.torch
import torch
from torch import nn

from auditlib.client.protocol import ClientProtocol
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model, own_code
from auditlib.models.loading import DEFAULT_MAX_BYTES
from auditlib.models.meta_build import meta_model
from auditlib.models.safetensors_header import declared_state
from auditlib.observed.record import FILE as TRAINING_FILE
from auditlib.observed.record import TrainingRecord
from auditlib.words import MB, size_text

GLOBAL_FILE = "global.safetensors"
CLIENT_FILE = "client.safetensors"
DELTA_FILE = "delta.safetensors"
BUNDLE_FILES = (GLOBAL_FILE, CLIENT_FILE, DELTA_FILE, TRAINING_FILE)
MAX_TRAINING_BYTES = 1 * MB
_EXAMPLES = 3  # mismatching tensors named in a refusal

Shared = Literal["weights", "delta"]
State = dict[str, torch.Tensor]


@dataclass(frozen=True, eq=False)
class ObservedBundle:
    """One client's update as the server received it, checked: every tensor finite, the
    global state the state_dict of the architecture training.json names, the client's state
    of the same model (or the delta of its parameters).

    Floating tensors are held as the model's float32; ``content_sha256`` is the sha256 of
    the bundle's files (names and bytes), which stands for the folder in a run's identity.
    """

    location: str
    training: TrainingRecord
    global_state: Mapping[str, torch.Tensor]
    client_state: Mapping[str, torch.Tensor] | None
    delta: Mapping[str, torch.Tensor] | None
    content_sha256: str

    @property
    def shared(self) -> Shared:
        """What the client sent: its new weights or their difference."""
        return "weights" if self.client_state is not None else "delta"

    @property
    def model_spec(self) -> ModelSpec:
        return self.training.model_spec()

    @property
    def protocol(self) -> ClientProtocol:
        return self.training.protocol(self.shared)

    @property
    def normalization(self) -> str:
        return self.training.normalization

    def build_model(self) -> nn.Module:
        """The architecture training.json names with global.safetensors as its weights."""
        model = build_model(self.model_spec)
        model.load_state_dict(dict(self.global_state), strict=False)  # checked on load
        return model

    def weight_change(self, names: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
        """The client's change of each named parameter (client - global)."""
        if self.delta is not None:
            return tuple(self.delta[n] for n in names)
        assert self.client_state is not None
        return tuple(self.client_state[n] - self.global_state[n] for n in names)

    def observed_update(self, names: tuple[str, ...]) -> tuple[str, tuple[torch.Tensor, ...]]:
        """The observation's kind and tensors for the named trainable parameters, as the
        server reads the update under :attr:`protocol`: the gradient of a one-step update
        (``TrainingRecord.one_gradient``: -change / lr - weight_decay x global weights), the
        new weights, or the weight difference."""
        if self.protocol.algorithm == "fedsgd":
            lr, decay = self.training.lr, self.training.weight_decay
            change = self.weight_change(names)
            return "gradient", tuple(
                -c / lr - decay * self.global_state[n] if decay else -c / lr
                for c, n in zip(change, names, strict=True)
            )
        if self.client_state is not None:
            return "weights", tuple(self.client_state[n].clone() for n in names)
        return "weight_delta", self.weight_change(names)

    def notes(self) -> tuple[str, ...]:
        """What the server knows of this update, in words (the result's threat model)."""
        record = self.training
        origin = ", ".join(
            part
            for part in (
                f"round {record.round}" if record.round is not None else "",
                f"client {record.client_id}" if record.client_id is not None else "",
                f"from {record.source}" if record.source else "",
            )
            if part
        )
        sent = "new weights" if self.shared == "weights" else "weight change"
        notes = [
            f"an update a client sent ({sent}{'; ' + origin if origin else ''}), "
            f"observed, not simulated (bundle {self.content_sha256[:12]})",
            f"the number of examples the client trained on ({record.num_examples})",
        ]
        if record.one_gradient and not record.protocol_assumed:
            notes.append(
                f"one SGD step at lr {record.lr:g} on every example: read back exactly as the "
                "batch's gradient (FedSGD)"
            )
        elif record.one_gradient:
            notes.append(
                f"one SGD step at lr {record.lr:g} on every example, as assumed (the client did "
                f"not report {', '.join(record.protocol_assumed)}): read as the batch's "
                "gradient (FedSGD), exact only if the assumption holds"
            )
        notes += [f"assumed, not reported by the client: {words}" for words in record.assumed_words]
        if record.shuffled:
            notes.append(
                "not the order of the client's mini-batches (it shuffled them): the attacker "
                "simulates them in order"
            )
        return tuple(notes)

    def describe(self) -> dict[str, Any]:
        """The bundle as result.json records it (no tensors)."""
        return {
            "location": self.location,
            "content_sha256": self.content_sha256,
            "shared": self.shared,
            "training": self.training.to_json(),
        }


def _declared_state(data: bytes, label: str) -> State:
    """The state a safetensors file declares, as meta tensors read from its header alone
    (no tensor is loaded); anything else is refused, never unpickled."""
    state = declared_state(data, label)
    if not state:
        raise AuditInputError(f"{label} holds no tensors; expected a state_dict")
    return _unprefixed(state)


def _read_state(data: bytes, label: str) -> State:
    """A safetensors file's tensors (its header already checked by :func:`_declared_state`)."""
    try:
        state = safetensors.torch.load(data)
    except Exception as exc:  # safetensors raises its own error type for damaged files
        why = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise AuditInputError(f"{label} cannot be read as safetensors ({why})") from None
    return _unprefixed(state)


def _unprefixed(state: Mapping[str, torch.Tensor]) -> State:
    """DataParallel's "module." prefix removed, where every name has it."""
    if all(k.startswith("module.") for k in state):
        return {k.removeprefix("module."): v for k, v in state.items()}
    return dict(state)


def _as_tensors(state: Mapping[str, Any], label: str) -> State:
    """A state_dict of tensors or arrays (a federation framework's numpy weights)."""
    if not isinstance(state, Mapping) or not state:
        raise AuditInputError(f"{label} must be a non-empty mapping of names to tensors")
    out: State = {}
    for name, value in state.items():
        if not isinstance(name, str):
            raise AuditInputError(f"{label}: {name!r} is not a tensor name; expected strings")
        try:
            tensor = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise AuditInputError(
                f"{label}: {name} is a {type(value).__name__}, not a tensor or array"
            ) from None
        out[name] = tensor.detach().cpu().contiguous().clone()
    return _unprefixed(out)


def _check_finite(state: Mapping[str, torch.Tensor], label: str) -> None:
    for name, tensor in state.items():
        if tensor.is_complex():
            raise AuditInputError(f"{label}: {name} is complex; expected real-valued tensors")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise AuditInputError(
                f"{label}: {name} has {bad} NaN or infinite value{'s' if bad != 1 else ''}; "
                "expected finite numbers"
            )


def _shape(tensor: torch.Tensor) -> str:
    return str(list(tensor.shape))


def _differences(
    state: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    *,
    required: frozenset[str] | None = None,
) -> str:
    """The first tensors where ``state`` does not fit ``expected``, in one phrase, or "".

    ``required``: the names ``state`` must hold (default: all of ``expected`` but BatchNorm's
    step counters, which a state may leave out)."""
    if required is None:
        required = frozenset(k for k in expected if not k.endswith(".num_batches_tracked"))
    shapes = [
        f"{k} is {_shape(state[k])} here but {_shape(expected[k])} in the model"
        for k in expected
        if k in state and state[k].shape != expected[k].shape
    ]
    missing = [k for k in expected if k in required and k not in state]
    unexpected = [k for k in state if k not in expected]
    parts = []
    for items, what in ((shapes, "shape"), (missing, "missing"), (unexpected, "unexpected")):
        if not items:
            continue
        more = f" and {len(items) - _EXAMPLES} more" if len(items) > _EXAMPLES else ""
        parts.append(f"{what}: {', '.join(items[:_EXAMPLES])}{more}")
    return "; ".join(parts)


def _as_model_dtype(state: State, expected: Mapping[str, torch.Tensor]) -> State:
    """Floating tensors in the model's dtype (a framework may send float64 arrays)."""
    return {
        k: v.to(expected[k].dtype) if v.is_floating_point() and k in expected else v
        for k, v in state.items()
    }


def _check_fit(
    training: TrainingRecord, global_state: State, update: State, shared: Shared
) -> dict[str, torch.Tensor]:
    """Refuse states whose names or shapes do not fit the model training.json names, and
    return its state_dict. Shapes alone are compared, so the states may be the meta tensors
    their files' headers declare, and the model is built on the meta device: nothing is
    allocated for a model no file fits.

    A class of the client's own code is built only where its code may run (``own_code``):
    elsewhere the update is checked against the global state alone, and the model's fit
    where it is built (the audit's own process reads the bundle again)."""
    model_spec = training.model_spec()
    if model_spec.info.source == own_code.SOURCE and not own_code.allowed():
        return _check_update_only(global_state, update, shared)
    model = meta_model(model_spec)
    expected = model.state_dict()
    problems = _differences(global_state, expected)
    if problems:
        shape = "x".join(str(v) for v in model_spec.input_shape)
        raise AuditInputError(
            f"{GLOBAL_FILE} does not fit {model_spec.architecture} ({model_spec.num_classes} "
            f"classes, input {shape}) that {TRAINING_FILE} names: {problems}; expected the "
            "state_dict of that model"
        )
    if shared == "weights":
        problems = _differences(update, global_state)
        if problems:
            raise AuditInputError(
                f"{CLIENT_FILE} is not a state of the model in {GLOBAL_FILE}: {problems}; "
                "expected the state_dict the client returned for that global model"
            )
    else:
        parameters = frozenset(name for name, _ in model.named_parameters())
        floating = {k: v for k, v in global_state.items() if v.is_floating_point()}
        problems = _differences(update, floating, required=parameters)
        if problems:
            raise AuditInputError(
                f"{DELTA_FILE} is not a difference of the model in {GLOBAL_FILE}: {problems}; "
                "expected client - global for every parameter"
            )
    return expected


def _check_update_only(global_state: State, update: State, shared: Shared) -> State:
    """:func:`_check_fit` without the model: the update fits the global state; the global
    state's floating tensors stand for the model's (float32)."""
    floating = {k: v for k, v in global_state.items() if v.is_floating_point()}
    expected = global_state if shared == "weights" else floating
    problems = _differences(update, expected, required=frozenset(floating))
    if problems:
        name = CLIENT_FILE if shared == "weights" else DELTA_FILE
        raise AuditInputError(
            f"{name} does not fit the model in {GLOBAL_FILE}: {problems}; expected the "
            "client's state (or its change) for that global model"
        )
    return {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in global_state.items()}


def fitting_architectures(training: TrainingRecord, declared: State) -> list[str]:
    """The built-in architectures (and the torchvision models named like training.json's
    model) whose state_dict, at the record's classes and input size, the declared global
    state is: the only ones worth naming as close matches."""
    from auditlib.models import ARCHITECTURES, zoo

    named = [
        zoo.PREFIX + n for n in zoo.close_matches(training.model.lower(), zoo.torchvision_names())
    ]
    fitting = []
    for name in [*ARCHITECTURES, *named]:
        try:
            spec = ModelSpec(name, training.num_classes, training.input_shape)
            expected = meta_model(spec).state_dict()
        except (AuditInputError, RuntimeError, ValueError):  # not at this size or class count
            continue
        if not _differences(declared, expected):
            fitting.append(name)
    return fitting


def _model_named(training: TrainingRecord, declared: State) -> None:
    """Refuse a model training.json names that this tool cannot build, naming the
    architectures whose tensors fit global.safetensors (none, for a class of the client's
    own code) and how to name an own class."""
    try:
        training.model_spec()
    except AuditInputError as exc:
        if own_code.is_own_class(training.model) or "is not known" not in str(exc):
            raise
        fitting = fitting_architectures(training, declared)
        fit = (
            f"the architectures whose tensors fit {GLOBAL_FILE}: {', '.join(fitting)}"
            if fitting
            else f"no architecture of this tool fits {GLOBAL_FILE}'s {len(declared)} tensors"
        )
        raise AuditInputError(
            f"{TRAINING_FILE}: model {training.model!r} is not an architecture this tool builds "
            f"({fit}); a model class of the client's own code is named path/to/file.py:"
            f"ClassName, with its constructor arguments as model_args, and audited with "
            "--i-trust-this-file (docs/FLOWER.md)"
        ) from None


def _checked(
    location: str,
    training: TrainingRecord,
    global_state: State,
    update: State,
    shared: Shared,
    content_sha256: str,
) -> ObservedBundle:
    """The bundle, once every tensor is finite and every state fits the named model."""
    update_file = CLIENT_FILE if shared == "weights" else DELTA_FILE
    _check_finite(global_state, GLOBAL_FILE)
    _check_finite(update, update_file)
    expected = _check_fit(training, global_state, update, shared)
    global_state = _as_model_dtype(global_state, expected)
    update = _as_model_dtype(update, global_state)
    return ObservedBundle(
        location=location,
        training=training,
        global_state=global_state,
        client_state=update if shared == "weights" else None,
        delta=update if shared == "delta" else None,
        content_sha256=content_sha256,
    )


def _update_name(names: Collection[str], where: str) -> tuple[str, Shared]:
    """The update's file among ``names`` and what it holds; refused where there is neither
    or both."""
    if CLIENT_FILE in names and DELTA_FILE in names:
        raise AuditInputError(
            f"{where} holds both {CLIENT_FILE} and {DELTA_FILE}; expected one of them (the "
            "client's new weights or their difference)"
        )
    if CLIENT_FILE not in names and DELTA_FILE not in names:
        raise AuditInputError(
            f"{where} holds neither {CLIENT_FILE} nor {DELTA_FILE}; expected one of them (the "
            "client's new weights or their difference)"
        )
    return (CLIENT_FILE, "weights") if CLIENT_FILE in names else (DELTA_FILE, "delta")


def _training(data: bytes) -> TrainingRecord:
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # also a 4,301-digit number, deep nesting
        why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise AuditInputError(f"{TRAINING_FILE} is not valid JSON ({why})") from None
    return TrainingRecord.from_json(parsed, check_model=False)  # checked by _model_named


def _limit(name: str, max_bytes: int) -> tuple[int, str]:
    if name == TRAINING_FILE:
        return MAX_TRAINING_BYTES, "training record"
    return max_bytes, "global weights" if name == GLOBAL_FILE else "client update"


def _check_size(name: str, size: int, max_bytes: int) -> None:
    limit, kind = _limit(name, max_bytes)
    if size == 0:
        raise AuditInputError(f"{name} is empty (0 bytes); expected the bundle's {kind}")
    if size > limit:
        raise AuditInputError(
            f"{name} is {size_text(size)}, over the {size_text(limit)} limit for a bundle's {kind}"
        )


def bundle_from_files(
    files: Mapping[str, bytes], location: str, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> ObservedBundle:
    """The bundle made of ``files`` (file name -> bytes: global.safetensors,
    client.safetensors or delta.safetensors, training.json), read and checked as
    :func:`load_bundle` checks a folder; ``location`` says where it came from."""
    unknown = sorted(set(files) - set(BUNDLE_FILES))
    if unknown:
        raise AuditInputError(
            f"{location} holds {', '.join(unknown)}, which is not a bundle's file; expected "
            f"{GLOBAL_FILE}, {CLIENT_FILE} (or {DELTA_FILE}) and {TRAINING_FILE}"
        )
    for name in (GLOBAL_FILE, TRAINING_FILE):
        if name not in files:
            raise AuditInputError(f"{location} has no {name}; docs/OBSERVED.md describes a bundle")
    update_name, shared = _update_name(files.keys(), location)
    raw = {name: files[name] for name in (TRAINING_FILE, GLOBAL_FILE, update_name)}
    for name, data in raw.items():
        _check_size(name, len(data), max_bytes)
    training = _training(raw[TRAINING_FILE])
    declared_global = _declared_state(raw[GLOBAL_FILE], GLOBAL_FILE)
    _model_named(training, declared_global)
    digest = hashlib.sha256()
    for name in sorted(raw):
        digest.update(f"{name}:{len(raw[name])}:".encode())
        digest.update(raw[name])
    # The headers first: what the files declare must fit the model before a tensor is
    # loaded or the model is built (their bytes bound what a fitting model can hold).
    _check_fit(
        training,
        declared_global,
        _declared_state(raw[update_name], update_name),
        shared,
    )
    return _checked(
        location,
        training,
        _read_state(raw[GLOBAL_FILE], GLOBAL_FILE),
        _read_state(raw[update_name], update_name),
        shared,
        digest.hexdigest(),
    )


def load_bundle(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ObservedBundle:
    """Read and check the bundle in folder ``path``; refused in one line where it is not
    one (docs/OBSERVED.md). Each weights file is bounded as uploaded weights are."""
    folder = Path(path)
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "was not found"
        raise AuditInputError(
            f"observed bundle {str(folder)!r} {what}; expected a folder with {GLOBAL_FILE}, "
            f"{CLIENT_FILE} (or {DELTA_FILE}) and {TRAINING_FILE}"
        )
    present = [name for name in BUNDLE_FILES if (folder / name).exists()]
    for name in (GLOBAL_FILE, TRAINING_FILE):
        if name not in present:
            raise AuditInputError(f"{folder} has no {name}; docs/OBSERVED.md describes a bundle")
    update_name, _ = _update_name(present, str(folder))
    files = {}
    for name in (TRAINING_FILE, GLOBAL_FILE, update_name):
        path_of = folder / name
        if not path_of.is_file():
            raise AuditInputError(f"{path_of} is not a file; expected the bundle's {name}")
        _check_size(name, path_of.stat().st_size, max_bytes)
        files[name] = path_of.read_bytes()
    return bundle_from_files(files, str(folder), max_bytes=max_bytes)


def write_bundle(
    path: str | Path,
    global_state: Mapping[str, Any],
    client_state_or_delta: Mapping[str, Any],
    training: Mapping[str, Any],
    *,
    delta: bool = False,
    overwrite: bool = False,
    complete: bool = True,
) -> Path:
    """Write a bundle into folder ``path`` (created) and return the folder.

    ``global_state``: the state_dict the round started from; ``client_state_or_delta``: the
    state_dict the client returned, or with ``delta=True`` its difference (client - global);
    tensors or numpy arrays. ``training``: training.json's object (docs/OBSERVED.md),
    written as given. Everything :func:`load_bundle` checks is checked before anything is
    written. ``complete=False`` (a capture that could not learn every field): training.json
    may lack fields and only the tensors' finiteness is checked; :func:`load_bundle` names
    what is missing until someone adds it. A folder that already holds a bundle is refused
    unless ``overwrite`` (its files are then replaced).
    """
    if not isinstance(training, Mapping):
        raise AuditInputError(f"{TRAINING_FILE} must be a mapping, got {type(training).__name__}")
    shared: Shared = "delta" if delta else "weights"
    label = DELTA_FILE if delta else CLIENT_FILE
    start = _as_tensors(global_state, GLOBAL_FILE)
    update = _as_tensors(client_state_or_delta, label)
    try:
        text = json.dumps(dict(training), indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as exc:
        raise AuditInputError(f"{TRAINING_FILE} cannot be written as JSON ({exc})") from None
    if complete:  # refuses before anything is written
        _checked(str(path), TrainingRecord.from_json(dict(training)), start, update, shared, "")
    else:
        _check_finite(start, GLOBAL_FILE)
        _check_finite(update, label)
    folder = Path(path)
    present = [n for n in BUNDLE_FILES if (folder / n).exists()]
    if present and not overwrite:
        raise AuditInputError(
            f"{folder} already holds a bundle ({', '.join(present)}); expected an empty or new "
            "folder (or overwrite=True)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    for name in present:
        (folder / name).unlink()
    safetensors.torch.save_file(start, str(folder / GLOBAL_FILE))
    safetensors.torch.save_file(update, str(folder / label))
    (folder / TRAINING_FILE).write_text(text)
    return folder
