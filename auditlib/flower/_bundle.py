"""Writing an observed-update bundle, until ``auditlib.observed.bundle.write_bundle`` lands.

The format is that package's: a folder with ``global.safetensors`` (the state_dict the
round started from), ``client.safetensors`` (the state_dict the client returned) and
``training.json``. Kept private so the switch to the shared writer is one import.
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


def write_bundle(
    path: str | os.PathLike,
    global_state: Mapping[str, torch.Tensor],
    client_state: Mapping[str, torch.Tensor],
    training: Mapping[str, Any],
) -> Path:
    """Write one bundle into ``path`` (created; files in it are replaced) and return it."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(_tensors(global_state), str(folder / "global.safetensors"))
    save_file(_tensors(client_state), str(folder / "client.safetensors"))
    text = json.dumps(dict(training), indent=2, sort_keys=False, allow_nan=False)
    (folder / "training.json").write_text(text + "\n")
    return folder
