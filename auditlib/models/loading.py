"""Loading user-supplied weights without ever running code from the file.

Weights come as safetensors or as a PyTorch state_dict read by ``torch.load(...,
weights_only=True)``, whose restricted unpickler only rebuilds tensors and plain containers.
Nothing else is unpickled. Whole-model archives (TorchScript, ``torch.export``) can run code
and are opened only by :func:`load_trusted_archive`.
"""

from __future__ import annotations

import io
import math
import pickle
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

from auditlib.errors import AuditInputError
from auditlib.models.safetensors_header import declared_state
from auditlib.models.shapes import reason
from auditlib.words import MB, size_text

DEFAULT_MAX_BYTES = 500 * MB  # the browser's uploader shows limits above 500 MB as '1GB'
_EXPECTED = "expected a .safetensors file or a PyTorch state_dict saved with torch.save"
_ZIP_MAGIC = b"PK\x03\x04"
# Protocol 2+ pickles start with PROTO (0x80); legacy torch.save files are such pickles.
_PICKLE_MAGIC = b"\x80"
_WRAPPER_KEYS = ("state_dict", "model_state_dict")
_EXAMPLES = 3
_BATCHNORM_NAMES = {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"}


def _check_size(size: int, label: str, max_bytes: int, kind: str) -> None:
    if size == 0:
        raise AuditInputError(f"{label} is empty (0 bytes); expected a non-empty {kind} file")
    if size > max_bytes:
        raise AuditInputError(
            f"{label} is {size_text(size)}, over the {size_text(max_bytes)} limit for {kind} files; "
            "expected a smaller file"
        )


def _read_source(
    source: str | Path | bytes, filename: str | None, max_bytes: int, kind: str
) -> tuple[bytes, str]:
    """The file's bytes and the name to use for it in messages."""
    if isinstance(source, bytes | bytearray | memoryview):
        label = repr(filename) if filename else "the uploaded file"
        _check_size(len(source), label, max_bytes, kind)
        return bytes(source), label
    path = Path(source)
    label = repr(filename or path.name)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "was not found"
        raise AuditInputError(f"{kind} file {str(path)!r} {what}; expected a path to a file")
    # The size is checked before reading, so an oversized file is never held in memory.
    _check_size(path.stat().st_size, label, max_bytes, kind)
    return path.read_bytes(), label


def _is_safetensors(data: bytes) -> bool:
    """safetensors = 8-byte little-endian header length, then a JSON header starting with '{'."""
    if len(data) < 10:
        return False
    header_len = int.from_bytes(data[:8], "little")
    return 2 <= header_len <= len(data) - 8 and data[8:9] == b"{"


def _zip_names(data: bytes) -> list[str]:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return []


def _archive_kind(names: list[str]) -> str | None:
    """'torchscript', 'export' or None, from the member names torch writes.

    Both put everything under one top folder: torch.export writes ``archive_format`` and
    ``models/``, TorchScript writes ``code/`` and ``constants.pkl``. Only the level right
    below that folder is read, since code paths may themselves contain "models".
    """
    top_level = {parts[1] for parts in (n.split("/") for n in names) if len(parts) >= 2}
    if "archive_format" in top_level or "models" in top_level:
        return "export"
    if "code" in top_level or "constants.pkl" in top_level:
        return "torchscript"
    return None


def _read_weights(data: bytes, label: str) -> object:
    if _is_safetensors(data):
        try:
            return safetensors.torch.load(data)
        except Exception as exc:  # safetensors raises its own error type for damaged files
            why = reason(exc)
            raise AuditInputError(
                f"{label} looks like a safetensors file but cannot be read ({why}); {_EXPECTED}"
            ) from None
    if data.startswith(_ZIP_MAGIC):
        kind = _archive_kind(_zip_names(data))
        if kind is not None:
            name = "TorchScript" if kind == "torchscript" else "torch.export"
            raise AuditInputError(
                f"{label} is a {name} archive, not a weights file; such archives can run code "
                f"when loaded and are only opened when marked trusted; {_EXPECTED}"
            )
    elif not data.startswith(_PICKLE_MAGIC):
        raise AuditInputError(
            f"{label} is not a safetensors file or a PyTorch state_dict (its content is not a "
            f"format torch.save writes); {_EXPECTED}"
        )
    try:
        with warnings.catch_warnings():
            # torch warns about pickle protocols it may not support; the refusal says enough.
            warnings.filterwarnings("ignore", message=".*pickle protocol", category=UserWarning)
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:
        raise AuditInputError(
            f"{label} is not a safetensors file or a weights-only PyTorch state_dict (it "
            "contains pickled Python objects, which are never loaded); "
            f"{_EXPECTED} holding only tensors"
        ) from None
    except Exception as exc:  # any other failure of the restricted loader = damaged file
        why = reason(exc)
        raise AuditInputError(
            f"{label} cannot be read as a PyTorch state_dict (damaged or not a torch.save "
            f"file: {why}); {_EXPECTED}"
        ) from None


def _as_state_dict(obj: object, label: str) -> dict[str, torch.Tensor]:
    """A flat ``name -> Tensor`` mapping, unwrapped from a checkpoint and DataParallel."""
    if isinstance(obj, Mapping):
        for key in _WRAPPER_KEYS:
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping):
        raise AuditInputError(
            f"{label} holds a {type(obj).__name__}, not a state_dict; expected a mapping of "
            "parameter names to tensors"
        )
    if not obj:
        raise AuditInputError(f"{label} holds no tensors; expected a non-empty state_dict")
    state: dict[str, torch.Tensor] = {}
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise AuditInputError(
                f"{label} maps {key!r} to a {type(value).__name__}; expected a state_dict that "
                "maps parameter names to tensors only"
            )
        state[key] = value
    # DataParallel / DistributedDataParallel checkpoints prefix every name with "module.".
    if all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}
    return state


def _check_values(state: Mapping[str, torch.Tensor], label: str) -> None:
    for name, tensor in state.items():
        if tensor.layout != torch.strided or tensor.is_complex():
            raise AuditInputError(
                f"{label}: {name} is a {tensor.layout} {tensor.dtype} tensor; expected dense "
                "real-valued tensors"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise AuditInputError(
                f"{label}: {name} has {bad} NaN or infinite values; expected finite weights"
            )


def _model_label(model: nn.Module) -> str:
    spec = getattr(model, "spec", None)
    shape = getattr(model, "input_shape", None)
    if spec is not None:
        name = spec.architecture
        num_classes = spec.num_classes
        shape = spec.input_shape
    else:
        name = type(model).__name__
        linear = _find_last_linear(model)
        num_classes = linear[1].out_features if linear else None
    details = []
    if num_classes is not None:
        details.append(f"num_classes={num_classes}")
    if shape is not None:
        details.append("input " + "x".join(str(v) for v in shape))
    return f"{name} ({', '.join(details)})" if details else name


def _shape(t: torch.Tensor) -> str:
    return str(list(t.shape))


def _examples(items: list[str]) -> str:
    more = ", ..." if len(items) > _EXAMPLES else ""
    return ", ".join(items[:_EXAMPLES]) + more


def _natural(key: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key reading a parameter name's numbers as numbers: layer 5 before layer 10."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in key.split("."))


def _fit_problems(state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> str:
    """One line naming the missing keys, unexpected keys and shape mismatches, or ''.

    Each list starts with the first tensors in the model's order (unexpected keys, which the
    model lacks, in the order of their names' layers: a safetensors file keeps no order).
    """
    # A missing BatchNorm step counter is harmless: load_state_dict fills it in.
    missing = [k for k in expected if k not in state and not k.endswith(".num_batches_tracked")]
    unexpected = sorted((k for k in state if k not in expected), key=_natural)
    mismatched = [
        f"{k} is {_shape(state[k])} in the file but {_shape(expected[k])} in the model"
        for k in expected
        if k in state and state[k].shape != expected[k].shape
    ]
    problems = []
    if mismatched:
        noun = "shape mismatch" if len(mismatched) == 1 else "shape mismatches"
        problems.append(f"{len(mismatched)} {noun}, e.g. {', '.join(mismatched[:2])}")
    for items, noun in ((missing, "missing key"), (unexpected, "unexpected key")):
        if items:
            plural = "" if len(items) == 1 else "s"
            problems.append(f"{len(items)} {noun}{plural} ({_examples(items)})")
    return "; ".join(problems)


def _stem_hint(
    model: nn.Module, state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> str:
    """Why a ResNet's first convolution differs, when it does: the stem (3x3 for CIFAR-sized
    inputs, torchvision's 7x7 above that) is chosen from the input size unless set."""
    stem = getattr(model, "stem", None)
    key = "conv1.weight"
    if stem is None or key not in state or key not in expected:
        return ""
    if state[key].shape[-2:] == expected[key].shape[-2:]:
        return ""
    kernel = "x".join(str(v) for v in state[key].shape[-2:])
    other = "imagenet" if stem == "cifar" else "cifar"
    return (
        f". The file's first convolution is {kernel}: it was saved with the {other} stem, and "
        f"this model has the {stem} stem (chosen from the input size: the 3x3 cifar stem up "
        "to 64 pixels, torchvision's 7x7 imagenet stem above). Choose the stem "
        f"'{other}' (Setup: Stem; CLI: --stem {other}) to load it at this input size"
    )


def _classes_hint(
    model: nn.Module, state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> str:
    """Why the last linear layer differs, when only its output count does: the file was
    saved for another number of classes (a torchvision checkpoint has 1000)."""
    found = _find_last_linear(model)
    if found is None:
        return ""
    key = f"{found[0]}.weight" if found[0] else "weight"
    if key not in state or key not in expected or state[key].dim() != 2:
        return ""
    saved, built = state[key].shape, expected[key].shape
    if saved[0] == built[0] or saved[1:] != built[1:]:
        return ""
    return (
        f". The file's last linear layer ({found[0]}) has {saved[0]} outputs: it was saved for "
        f"{saved[0]} classes, and this model has {built[0]}; set the class count to "
        f"{saved[0]} (Setup: Classes; CLI: --num-classes {saved[0]})"
    )


def _image_size_hint(
    model: nn.Module, state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> str:
    """Why a ViT's position embeddings differ: they hold one per patch of the input size it
    was saved at (torchvision's VisionTransformer: ``encoder.pos_embedding``)."""
    patch = getattr(model, "patch_size", None)
    key = "encoder.pos_embedding"
    if not isinstance(patch, int) or key not in state or key not in expected:
        return ""
    saved, built = state[key].shape, expected[key].shape
    if saved == built or len(saved) != 3 or saved[2] != built[2]:
        return ""
    grid = math.isqrt(saved[1] - 1)
    if grid * grid != saved[1] - 1:
        return ""
    side = grid * patch
    return (
        f". The file's position embeddings cover {grid}x{grid} patches of {patch} pixels: it "
        f"was saved at {side}x{side} pixels; set the input size to {side} (Setup: Input size; "
        f"CLI: --input-size {side})"
    )


def _check_fit(
    model: nn.Module,
    state: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    label: str,
) -> None:
    """Refuse a state (loaded, or the meta tensors a header declares) whose names or shapes
    do not fit ``model``, in one line with what would make it fit."""
    problems = _fit_problems(state, expected)
    if problems:
        raise AuditInputError(
            f"weights in {label} do not fit {_model_label(model)}: {problems}; expected a "
            "state_dict saved from the same architecture, class count and input shape"
            + _stem_hint(model, state, expected)
            + _classes_hint(model, state, expected)
            + _image_size_hint(model, state, expected)
        )


def load_weights(
    model: nn.Module,
    source: str | Path | bytes,
    *,
    filename: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> None:
    """Load a safetensors file or a weights-only PyTorch state_dict into ``model`` (strict).

    ``source`` is a path or the uploaded bytes; ``filename`` names it in messages. The format
    is detected from the content, not the extension. Pickled Python objects are refused,
    never loaded. Keys and shapes are compared before anything is copied, so a refused file
    leaves the model unchanged; a safetensors file's are compared from its header, before any
    of its tensors is loaded.
    """
    data, label = _read_source(source, filename, max_bytes, "weights")
    expected = model.state_dict()
    if _is_safetensors(data):  # its header first: what it declares must fit before it loads
        _check_fit(model, _as_state_dict(declared_state(data, label), label), expected, label)
    state = _as_state_dict(_read_weights(data, label), label)
    _check_values(state, label)
    _check_fit(model, state, expected, label)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        why = reason(exc)
        raise AuditInputError(
            f"weights in {label} do not fit {_model_label(model)} ({why}); expected a "
            "state_dict saved from the same architecture"
        ) from None


def load_trusted_archive(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> nn.Module:
    """Load a whole model from a TorchScript archive or a ``torch.export`` (.pt2) archive.

    WARNING: both formats can execute code while they are loaded (TorchScript runs its
    serialized code and both unpickle parts of the archive). Callers must only call this
    inside an isolated worker process, and only after the user has explicitly marked the
    file as trusted. The format is detected from the archive's member names, not the
    extension. TorchScript models come back in eval mode; exported programs keep the mode
    they were exported in (torch cannot switch them).
    """
    data, label = _read_source(path, None, max_bytes, "model archive")
    kind = _archive_kind(_zip_names(data)) if data.startswith(_ZIP_MAGIC) else None
    if kind is None:
        what = "a safetensors weights file" if _is_safetensors(data) else "not a model archive"
        raise AuditInputError(
            f"{label} is {what}; expected a TorchScript archive (torch.jit.save) or a "
            "torch.export archive (torch.export.save, .pt2)"
        )
    try:
        if kind == "torchscript":
            with warnings.catch_warnings():
                # torch.jit is deprecated, but TorchScript files are still what users have.
                warnings.filterwarnings("ignore", category=FutureWarning)
                module = torch.jit.load(io.BytesIO(data), map_location="cpu")
            module.eval()
            return module
        return torch.export.load(io.BytesIO(data)).module()
    except Exception as exc:  # torch raises many types for damaged archives
        why = reason(exc)
        raise AuditInputError(
            f"{label} looks like a {kind} archive but cannot be loaded ({why}); expected "
            "an archive saved by the same or an older torch version"
        ) from None


def _find_last_linear(model: nn.Module) -> tuple[str, nn.Linear] | None:
    found = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            found = (name, module)
    return found


def last_linear(model: nn.Module) -> tuple[str, nn.Linear]:
    """The last ``nn.Linear`` in module order, with its name: the layer label inference reads."""
    found = _find_last_linear(model)
    if found is None:
        raise AuditInputError(
            f"{type(model).__name__} has no nn.Linear layer; expected a classifier that ends in "
            "a linear layer"
        )
    return found


def describe_model(model: nn.Module) -> dict[str, Any]:
    """A JSON-ready summary: parameter counts and shapes, BatchNorm, last linear layer."""
    params = list(model.named_parameters())
    has_batchnorm = any(
        getattr(m, "original_name", type(m).__name__) in _BATCHNORM_NAMES for m in model.modules()
    )
    linear = _find_last_linear(model)
    summary: dict[str, Any] = {
        "num_parameters": sum(p.numel() for _, p in params),
        "num_trainable": sum(p.numel() for _, p in params if p.requires_grad),
        "parameters": [(name, list(p.shape)) for name, p in params],
        "has_batchnorm": has_batchnorm,
        "last_linear": None
        if linear is None
        else {"name": linear[0], "shape": list(linear[1].weight.shape)},
    }
    spec = getattr(model, "spec", None)
    if spec is not None and hasattr(spec, "as_dict"):
        summary["spec"] = spec.as_dict()
    return summary
