"""Hostile inputs of issue 51, built in memory: shared by ``test_hostile_inputs.py`` and the
security probe (``benchmarks/security_probe.py``), which uploads them to a real server."""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
from PIL import Image

# A client's training.json as a real FedAvg client could have written it.
TRAINING = {
    "model": "lenet",
    "num_classes": 10,
    "input_size": 32,
    "optimizer": "sgd",
    "lr": 0.05,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "local_epochs": 2,
    "local_batch_size": 2,
    "num_examples": 4,
    "bn_mode": "train",
}


def lying_zip(members: dict[str, bytes], liar: str, inflated: int, declared: int) -> bytes:
    """A zip of ``members`` and, last, ``liar``: ``inflated`` zero bytes deflated (about a
    thousandth of that), whose local header and central directory both declare
    ``declared`` bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        info = zipfile.ZipInfo(liar, date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        with archive.open(info, "w", force_zip64=False) as member:
            for _ in range(inflated // 2**20):
                member.write(bytes(2**20))
    data = bytearray(buffer.getvalue())
    struct.pack_into("<I", data, info.header_offset + 22, declared)  # local header
    central = data.rfind(b"PK\x01\x02")  # the liar's entry: written last
    struct.pack_into("<I", data, central + 24, declared)  # central directory
    return bytes(data)


def empty_tensors(count: int) -> bytes:
    """A safetensors file that declares ``count`` empty float32 tensors t0, t1, ..."""
    entries = ",".join(
        f'"t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}' for i in range(count)
    )
    header = ("{" + entries + "}").encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header


def png(side: int = 8) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((side, side, 3), np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()
