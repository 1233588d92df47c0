"""What a safetensors file declares, read from its header before any tensor is loaded.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON mapping each
tensor's name to its dtype, shape and byte range (plus an optional ``"__metadata__"``), then
the tensors' bytes. safetensors' own loader builds every declared tensor before anything can
be compared with a model: a 20 MB file of 300,000 empty tensors cost 400 MB and 7 s before
its names were refused. :func:`declared_state` reads the header alone, bounded, and returns
the state the file declares as meta tensors (names, shapes and dtypes, no memory), which the
callers compare with the model before they load a byte of it.
"""

from __future__ import annotations

import json
import math

import torch

from auditlib.errors import AuditInputError
from auditlib.words import MB, size_text

# torchvision's largest state_dict (efficientnet_v2_l, 1,548 tensors) declares itself in
# about 180 kB; the built-in models in a few kB. A megabyte leaves room for long names and
# metadata, and bounds what the JSON parser is given.
MAX_HEADER_BYTES = 1 * MB
# The most tensors a state_dict of any model this tool builds has is 1,548 (see above).
MAX_TENSORS = 10_000
MAX_RANK = 8  # torch's layers hold tensors of rank 5 at most (3-D convolutions)
_METADATA = "__metadata__"
# The dtypes safetensors writes, with the size of one element in bytes.
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "F8_E4M3": (torch.float8_e4m3fn, 1),
    "F8_E5M2": (torch.float8_e5m2, 1),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U64": (torch.uint64, 8),
    "U32": (torch.uint32, 4),
    "U16": (torch.uint16, 2),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}
_NOT_SAFETENSORS = (
    "is not a safetensors file; expected a state_dict saved with safetensors.torch.save_file "
    "(pickled files are never loaded)"
)


def _header_length(data: bytes, label: str) -> int:
    if len(data) < 10 or data[8:9] != b"{":
        raise AuditInputError(f"{label} {_NOT_SAFETENSORS}")
    length = int.from_bytes(data[:8], "little")
    if length > MAX_HEADER_BYTES:
        raise AuditInputError(
            f"{label} declares a safetensors header of {size_text(length)}; expected at most "
            f"{size_text(MAX_HEADER_BYTES)} (the header of a state_dict of {MAX_TENSORS:,} "
            "tensors is far smaller)"
        )
    if length > len(data) - 8:
        raise AuditInputError(
            f"{label} declares a {size_text(length)} header but holds "
            f"{size_text(len(data) - 8)} after its length; expected a complete safetensors file"
        )
    return length


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(name: str, entry: object, label: str, size: int) -> tuple[torch.Tensor, int, int]:
    """The meta tensor one header entry declares and its byte range within the ``size``
    bytes after the header; refused where the entry is not a safetensors tensor there."""
    expected = (
        f"expected {{'dtype': one of {', '.join(DTYPES)}, 'shape': [sizes], "
        "'data_offsets': [begin, end]}"
    )
    if not isinstance(entry, dict):
        raise AuditInputError(f"{label}: {name!r} is not a tensor in the header; {expected}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPES:
        raise AuditInputError(f"{label}: {name!r} has dtype {dtype!r}; {expected}")
    if not (isinstance(shape, list) and len(shape) <= MAX_RANK and all(map(_is_count, shape))):
        raise AuditInputError(f"{label}: {name!r} has shape {str(shape)[:80]}; {expected}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))):
        raise AuditInputError(f"{label}: {name!r} has data_offsets {str(offsets)[:80]}; {expected}")
    torch_dtype, itemsize = DTYPES[dtype]
    begin, end = offsets
    if not begin <= end <= size:
        raise AuditInputError(
            f"{label}: {name!r} lies at bytes {begin:,} to {end:,} of the data, which holds "
            f"{size:,}; expected a complete safetensors file"
        )
    if end - begin != math.prod(shape) * itemsize:
        raise AuditInputError(
            f"{label}: {name!r} declares shape {shape} of {dtype} in {end - begin:,} bytes; "
            "expected its elements' bytes exactly"
        )
    try:  # an empty tensor may still declare sizes torch cannot lay out
        return torch.empty(shape, dtype=torch_dtype, device="meta"), begin, end
    except (RuntimeError, ValueError, OverflowError):
        raise AuditInputError(
            f"{label}: {name!r} has shape {str(shape)[:80]}; {expected}"
        ) from None


def declared_state(data: bytes, label: str) -> dict[str, torch.Tensor]:
    """The state a safetensors file declares, as meta tensors, from its header alone.

    Refused in one line where the header is larger than :data:`MAX_HEADER_BYTES`, is not a
    JSON object of tensors, declares more than :data:`MAX_TENSORS` tensors, or where the
    tensors' byte ranges do not tile the bytes after the header exactly (so the elements
    declared are bounded by the file's size: the file holds every byte it declares)."""
    length = _header_length(data, label)
    try:
        header = json.loads(data[8 : 8 + length])
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        raise AuditInputError(
            f"{label}'s safetensors header is not valid JSON; expected a state_dict saved "
            "with safetensors.torch.save_file"
        ) from None
    if not isinstance(header, dict):
        raise AuditInputError(f"{label}'s safetensors header is not a JSON object")
    header.pop(_METADATA, None)
    if len(header) > MAX_TENSORS:
        raise AuditInputError(
            f"{label} declares {len(header):,} tensors; expected a model's state_dict (at "
            f"most {MAX_TENSORS:,} tensors)"
        )
    size = len(data) - 8 - length
    state: dict[str, torch.Tensor] = {}
    ranges: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        state[name], begin, end = _entry(name, entry, label, size)
        ranges.append((begin, end, name))
    # safetensors lays the tensors end to end after the header; so must this file.
    position = 0
    for begin, end, name in sorted(ranges):
        if begin != position:
            raise AuditInputError(
                f"{label}: {name!r} starts at byte {begin:,} of the data, expected {position:,} "
                "(tensors laid end to end, none overlapping)"
            )
        position = end
    if position != size:
        raise AuditInputError(
            f"{label}'s tensors declare {position:,} bytes of data but the file holds "
            f"{size:,}; expected a complete safetensors file"
        )
    return state
