"""LPIPS (Zhang et al. 2018) from the ``lpips`` package, strictly offline.

The ``lpips`` wheel ships its linear calibration layers, but the AlexNet and VGG-16
backbones are torchvision's ImageNet weights, which it would download. We never download:
the backbone file must already be on disk, in ``AUDIT_LPIPS_WEIGHTS_DIR`` or torch's hub
cache (``$TORCH_HOME/hub/checkpoints``). When it is not, LPIPS is reported unavailable with
that reason, never approximated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

BACKBONE_FILES = {"alex": "alexnet-owt-7be5be79.pth", "vgg": "vgg16-397923af.pth"}


def weight_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("AUDIT_LPIPS_WEIGHTS_DIR"):
        dirs.append(Path(os.environ["AUDIT_LPIPS_WEIGHTS_DIR"]))
    dirs.append(Path(torch.hub.get_dir()) / "checkpoints")
    return dirs


def backbone_path(net: str) -> Path | None:
    for directory in weight_dirs():
        candidate = directory / BACKBONE_FILES[net]
        if candidate.is_file():
            return candidate
    return None


@dataclass(frozen=True)
class LpipsAvailability:
    available: bool
    reason: str | None
    path: str | None


def availability(net: str) -> LpipsAvailability:
    """Whether LPIPS-``net`` can be computed here. The reason names every backbone that is
    missing, so the two LPIPS variants share one reason when both are (said once, not twice)."""
    path = backbone_path(net)
    if path is None:
        missing = [n for n in BACKBONE_FILES if backbone_path(n) is None]
        searched = ", ".join(str(d) for d in weight_dirs())
        return LpipsAvailability(
            False,
            f"LPIPS-{'/'.join(missing)} unavailable: backbone weights "
            f"{', '.join(BACKBONE_FILES[n] for n in missing)} are not on this machine "
            f"(searched {searched}); set AUDIT_LPIPS_WEIGHTS_DIR to a folder holding them",
            None,
        )
    return LpipsAvailability(True, None, str(path))


@lru_cache(maxsize=4)
def _model(net: str, path: str):
    import lpips
    import torchvision

    # pnet_rand=True builds the trunk without touching the network; the real ImageNet weights
    # are then copied in from the local file, and the wheel's linear layers stay as loaded.
    metric = lpips.LPIPS(net=net, pretrained=True, pnet_rand=True, verbose=False)
    trunk = torchvision.models.alexnet() if net == "alex" else torchvision.models.vgg16()
    trunk.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    features = trunk.features
    for slice_module in (getattr(metric.net, f"slice{i}") for i in range(1, 6)):
        for index, layer in slice_module.named_children():
            layer.load_state_dict(features[int(index)].state_dict())
    return metric.eval()


def lpips_distances(net: str, reconstructions: np.ndarray, originals: np.ndarray) -> list[float]:
    """Per-pair LPIPS; arrays N x H x W x C in [0, 1] (grey images are repeated to RGB)."""
    state = availability(net)
    if not state.available:
        raise RuntimeError(state.reason)
    metric = _model(net, state.path)

    def to_tensor(batch: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(batch)).float().permute(0, 3, 1, 2)
        return t.repeat(1, 3, 1, 1) if t.shape[1] == 1 else t

    with torch.no_grad():
        values = metric(to_tensor(reconstructions), to_tensor(originals), normalize=True)
    return [float(v) for v in values.reshape(-1)]
