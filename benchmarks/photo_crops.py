"""A batch of photographs at a model's input size: square crops of scikit-image's bundled
photographs (``auditlib.data.samples.PHOTOGRAPHS``), for the benchmarks that need more
real images than the 17 photographs themselves.

Each photograph gives up to five crops, centre first, then its four corners; the batch
takes the centre of every photograph, then every top-left corner, and so on, until it
holds ``count``. Grayscale photographs are replicated to three channels. A photograph whose
shorter side is below ``UPSAMPLE`` times ``size`` is first resized (bilinear, its aspect
kept) to that shorter side, so that its corners are different crops and not one image
five times (``microaneurysms`` is 102x102, ``page`` 191 pixels high).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from auditlib.data.samples import PHOTOGRAPHS, load_sample_set

POSITIONS = ("centre", "top-left", "top-right", "bottom-left", "bottom-right")
# A photograph is enlarged so that its shorter side is at least this many crop sides.
UPSAMPLE = 1.5


def _pixels(image: np.ndarray, size: int) -> torch.Tensor:
    """H x W x C uint8 -> 3 x H' x W' float in [0, 1], enlarged where it is too small."""
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
    if pixels.shape[0] == 1:
        pixels = pixels.expand(3, -1, -1)
    shortest = min(pixels.shape[1:])
    least = math.ceil(UPSAMPLE * size)
    if shortest < size:
        scale = least / shortest
        shape = (round(pixels.shape[1] * scale), round(pixels.shape[2] * scale))
        shape = (max(shape[0], least), max(shape[1], least))
        pixels = F.interpolate(pixels[None], size=shape, mode="bilinear", align_corners=False)
        pixels = pixels[0].clamp(0.0, 1.0)
    return pixels.contiguous()


def _crop(pixels: torch.Tensor, size: int, position: str) -> torch.Tensor:
    height, width = pixels.shape[1:]
    top = {"centre": (height - size) // 2, "top-left": 0, "top-right": 0}.get(
        position, height - size
    )
    left = {"centre": (width - size) // 2, "top-left": 0, "bottom-left": 0}.get(
        position, width - size
    )
    return pixels[:, top : top + size, left : left + size]


def photo_crops(count: int, size: int) -> tuple[torch.Tensor, tuple[str, ...]]:
    """``count`` crops of ``size`` x ``size`` pixels: a B x 3 x size x size float tensor in
    [0, 1] and a name per crop (``photograph-position``), in a fixed order."""
    available = len(PHOTOGRAPHS) * len(POSITIONS)
    if not 1 <= count <= available:
        raise ValueError(f"{count} crops asked for; between 1 and {available} can be cut")
    photographs = load_sample_set("photographs", len(PHOTOGRAPHS))
    pictures = [_pixels(image, size) for image in photographs.images]
    crops, names = [], []
    for position in POSITIONS:
        for name, pixels in zip(photographs.names, pictures, strict=True):
            if len(crops) == count:
                break
            crops.append(_crop(pixels, size, position))
            names.append(f"{name}-{position}")
    return torch.stack(crops).contiguous(), tuple(names)
