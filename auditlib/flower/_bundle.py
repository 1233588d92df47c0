"""Writing a bundle that ``auditlib.observed.write_bundle`` would refuse.

A recorded round whose training.json lacks a field nothing gave (the learning rate, the
model's name) or whose arrays do not fit the model named cannot be checked, but it cannot be
captured again either: it is written in the bundle's layout (``global.safetensors``,
``client.safetensors``, ``training.json``) without the checks, for training.json to be
completed by hand; ``load_bundle`` checks it then.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file


def _tensors(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu().contiguous().clone() for name, t in state.items()}


def write_unchecked(
    path: str | os.PathLike,
    global_state: Mapping[str, torch.Tensor],
    client_state: Mapping[str, torch.Tensor],
    training: Mapping[str, Any],
) -> Path:
    """Write the files into ``path`` (created; files in it are replaced) and return it."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(_tensors(global_state), str(folder / "global.safetensors"))
    save_file(_tensors(client_state), str(folder / "client.safetensors"))
    text = json.dumps(dict(training), indent=2, sort_keys=False, allow_nan=False)
    (folder / "training.json").write_text(text + "\n")
    return folder
