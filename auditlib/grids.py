"""Side-by-side image grids of originals and reconstructions."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image


def image_grid(rows: Sequence[np.ndarray], *, scale: int = 4, gap: int = 2) -> Image.Image:
    """Rows of equally many images (each B x H x W x C in [0, 1]) on a white canvas.

    Upscaled by ``scale`` with nearest-neighbour sampling so single pixels stay visible.
    """
    count, height, width, channels = rows[0].shape
    cell_h, cell_w = height * scale, width * scale
    canvas = np.full(
        (len(rows) * cell_h + (len(rows) + 1) * gap, count * cell_w + (count + 1) * gap, 3),
        255,
        dtype=np.uint8,
    )
    for row, images in enumerate(rows):
        for i in range(count):
            tile = np.clip(np.rint(images[i] * 255), 0, 255).astype(np.uint8)
            if channels == 1:
                tile = np.repeat(tile, 3, axis=-1)
            tile = tile.repeat(scale, axis=0).repeat(scale, axis=1)
            top = gap + row * (cell_h + gap)
            left = gap + i * (cell_w + gap)
            canvas[top : top + cell_h, left : left + cell_w] = tile
    return Image.fromarray(canvas)


def split_grid(
    png: bytes, rows: int, count: int, gap: int = 2, *, scale: int = 1
) -> list[list[np.ndarray]]:
    """The inverse of :func:`image_grid`: the cells of a grid PNG of ``rows`` rows of ``count``
    images, each an H x W x 3 uint8 array, row by row.

    The cell size comes from the PNG's size; ``scale`` > 1 also undoes the upscaling (every
    ``scale``-th pixel), giving back the images as image_grid quantised them. Raises
    ValueError where the PNG cannot be such a grid.
    """
    if rows < 1 or count < 1 or gap < 0 or scale < 1:
        raise ValueError(
            f"a grid needs rows, count, scale >= 1, gap >= 0; got {rows}, {count}, {scale}, {gap}"
        )
    with Image.open(io.BytesIO(png)) as image:
        canvas = np.asarray(image.convert("RGB"))
    height, width = canvas.shape[:2]
    cell_h, rest_h = divmod(height - (rows + 1) * gap, rows)
    cell_w, rest_w = divmod(width - (count + 1) * gap, count)
    if cell_h < 1 or cell_w < 1 or rest_h or rest_w:
        raise ValueError(
            f"a {width} x {height} image is not a grid of {rows} x {count} cells with {gap} px gaps"
        )
    if cell_h % scale or cell_w % scale:
        raise ValueError(f"cells of {cell_w} x {cell_h} px are not a multiple of scale {scale}")
    lefts = [gap + i * (cell_w + gap) for i in range(count)]
    cells = []
    for row in range(rows):
        top = gap + row * (cell_h + gap)
        cells.append(
            [
                np.ascontiguousarray(
                    canvas[top : top + cell_h : scale, left : left + cell_w : scale]
                )
                for left in lefts
            ]
        )
    return cells


def wrapped_grid(
    png: bytes, rows: int, max_width: int, count: int | None = None, gap: int = 2
) -> bytes:
    """A grid PNG of ``rows`` rows of ``count`` images (:func:`image_grid`'s; ``count``
    None: read from the PNG, its cells square) laid out again in blocks no wider than
    ``max_width`` pixels where it can be: each block holds the same columns of every row (an
    original stays above its reconstruction), the blocks one under another, as evenly filled
    as they go. The PNG itself where it fits already; ValueError where it is no such grid."""
    if count is None:
        with Image.open(io.BytesIO(png)) as image:
            width, height = image.size
        cell = (height - (rows + 1) * gap) // rows
        count = max(1, (width - gap) // (cell + gap))
    cells = split_grid(png, rows, count, gap)
    cell_h, cell_w = cells[0][0].shape[:2]
    fits = max(1, (max_width - gap) // (cell_w + gap))
    if fits >= count:
        return png
    blocks = math.ceil(count / fits)
    per_block = math.ceil(count / blocks)  # 16 in blocks of at most 5: 4 of 4, not 5+5+5+1
    block_h = rows * (cell_h + gap) + gap  # a block's rows and one gap more between blocks
    canvas = np.full((blocks * block_h, per_block * (cell_w + gap) + gap, 3), 255, dtype=np.uint8)
    for index in range(count):
        block, column = divmod(index, per_block)
        left = gap + column * (cell_w + gap)
        for row in range(rows):
            top = gap + block * block_h + row * (cell_h + gap)
            canvas[top : top + cell_h, left : left + cell_w] = cells[row][index]
    buffer = io.BytesIO()
    Image.fromarray(canvas).save(buffer, format="PNG")
    return buffer.getvalue()


def comparison_grid(
    originals: np.ndarray, reconstruction: np.ndarray, *, scale: int = 4
) -> Image.Image:
    """Originals in the top row, the matched reconstructions below; the reconstructions
    alone where there are no originals (an unscored run: no private images)."""
    rows = [originals, reconstruction] if len(originals) else [reconstruction]
    return image_grid(rows, scale=scale)


def image_row(images: np.ndarray) -> Image.Image:
    """One row of images, at the scale of :func:`comparison_grid`."""
    return image_grid([images])


def save_comparison_png(
    originals: np.ndarray, reconstruction: np.ndarray, path: str | Path
) -> None:
    comparison_grid(originals, reconstruction).save(path, format="PNG")


def thumbnail(array: np.ndarray, size: int = 96) -> Image.Image:
    """A small preview of a decoded H x W x C uint8 image (tiny images enlarged, not blurred)."""
    image = Image.fromarray(np.ascontiguousarray(array[..., 0] if array.shape[-1] == 1 else array))
    longest = max(image.size)
    if longest < size:
        factor = max(1, size // longest)
        return image.resize((image.width * factor, image.height * factor), Image.Resampling.NEAREST)
    image.thumbnail((size, size))
    return image
