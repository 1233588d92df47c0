"""Decoded images to the model's input: crop, resize, channels, normalisation."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from auditlib.data.decode import LUMA
from auditlib.data.normalization import Normalization
from auditlib.errors import AuditInputError


class _ResizedCache:
    """Resized images by content (SHA-256 of the pixels, shape, target size), least recently
    used first out past ``max_bytes``.

    A sample audit builds each update's data prior from every other image of the set, so
    without it each image is resized once per update: 17 bicubic resizes of the bundled
    photographs, 27 ms, per 32 px update against 8 ms of hashing (benchmarks/
    updates_together.py). Keyed by content, not identity: a hit is the same pixels, and
    an image reaches its entry only by being the image.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def resized(self, image: np.ndarray, height: int, width: int) -> np.ndarray:
        if image.shape[:2] == (height, width):
            return image
        pixels = np.ascontiguousarray(image)
        key = (hashlib.sha256(memoryview(pixels).cast("B")).digest(), pixels.shape, height, width)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit
        out = np.array(_resize(pixels, height, width))  # its own pixels, not a crop's view
        out.flags.writeable = False  # shared by every later hit
        with self._lock:
            if key not in self._entries and out.nbytes <= self.max_bytes:
                self._entries[key] = out
                self._bytes += out.nbytes
                while self._bytes > self.max_bytes:
                    _, dropped = self._entries.popitem(last=False)
                    self._bytes -= dropped.nbytes
        return out


# 64 MiB: about 440 RGB images at 224 x 224 (uint8).
_RESIZED = _ResizedCache(64 * 2**20)


def _resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    h, w = image.shape[:2]
    # Centre crop to the target aspect ratio (whole pixels, so nothing cropped away bleeds
    # into the edges through the resize filter), then resize.
    if w * height > width * h:  # too wide
        crop_w = max(1, round(h * width / height))
        left = (w - crop_w) // 2
        image = image[:, left : left + crop_w]
    elif w * height < width * h:  # too tall
        crop_h = max(1, round(w * height / width))
        top = (h - crop_h) // 2
        image = image[top : top + crop_h]
    if image.shape[:2] == (height, width):
        return image
    pil = Image.fromarray(np.ascontiguousarray(image[..., 0] if image.shape[2] == 1 else image))
    out = np.asarray(pil.resize((width, height), Image.Resampling.BICUBIC))
    return out[..., None] if out.ndim == 2 else out


def to_model_batch(
    images: Sequence[np.ndarray],
    input_shape: tuple[int, int, int],
    normalization: Normalization,
) -> torch.Tensor:
    """Turn decoded images into the model's input: a B x C x H x W float32 tensor.

    ``input_shape`` is (C, H, W). Each image is centre-cropped (whole pixels) to the target
    aspect ratio, then resized to H x W with PIL's bicubic filter on the 8-bit pixels (PIL
    widens the filter when shrinking, so it antialiases), scaled to [0, 1], converted to C
    channels (grayscale -> RGB by replication, RGB -> grayscale by ITU-R BT.601 luma
    0.299 R + 0.587 G + 0.114 B) and finally normalised with ``normalization.normalize``.
    """
    channels, height, width = input_shape
    if channels not in (1, 3) or height < 1 or width < 1:
        raise AuditInputError(
            f"model input shape {input_shape} is not supported; expected (C, H, W) with C = 1 or 3"
        )
    if len(normalization.mean) != channels:
        raise AuditInputError(
            f"the normalisation has {len(normalization.mean)} channels but the model takes "
            f"{channels}; expected one mean and std per model input channel"
        )
    if not images:
        raise AuditInputError("no images to convert; expected at least one image")
    batch = np.empty((len(images), channels, height, width), dtype=np.float32)
    for i, image in enumerate(images):
        arr = np.asarray(image)
        if arr.ndim == 2:
            arr = arr[..., None]
        if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] not in (1, 3):
            raise AuditInputError(
                f"image {i + 1} has shape {arr.shape} and type {arr.dtype}; expected "
                "H x W x 1 or H x W x 3 uint8"
            )
        pixels = _RESIZED.resized(arr, height, width).astype(np.float32) / 255.0
        if pixels.shape[2] == 1 and channels == 3:
            pixels = np.repeat(pixels, 3, axis=2)
        elif pixels.shape[2] == 3 and channels == 1:
            pixels = (pixels @ LUMA)[..., None]
        batch[i] = pixels.transpose(2, 0, 1)
    return normalization.normalize(torch.from_numpy(batch))


def content_hashes(
    images: Sequence[np.ndarray], height: int, width: int, *, cached: bool = True
) -> tuple[str, ...]:
    """Each image's content as the model takes it: SHA-256 of its 8-bit pixels centre-cropped
    and resized to ``height`` x ``width`` (:func:`to_model_batch`'s own crop and resize),
    with their shape; an RGB image whose three channels are equal hashes as grey. So the same
    photographs hash alike whatever carried them (a sample set, a folder, an upload, another
    file name or lossless format, or files already cropped and resized the same way), while
    any changed pixel (a lossy re-encoding, another resize) gives another hash. ``cached``:
    keep the resized pixels for :func:`to_model_batch` (false for a set read only here)."""
    hashes = []
    for image in images:
        arr = np.asarray(image)
        arr = arr[..., None] if arr.ndim == 2 else arr
        resized = _RESIZED.resized(arr, height, width) if cached else _resize(arr, height, width)
        pixels = np.ascontiguousarray(resized)
        if pixels.shape[2] == 3 and (pixels == pixels[..., :1]).all():
            pixels = np.ascontiguousarray(pixels[..., :1])
        digest = hashlib.sha256(str(pixels.shape).encode())
        digest.update(memoryview(pixels).cast("B"))
        hashes.append(digest.hexdigest())
    return tuple(hashes)
