"""Decoding one image a user hands in, completely and safely, or refusing it.

``decode_image`` checks the header against ``ImageLimits`` before anything is decoded
(decompression bombs, odd formats), decodes every pixel, and returns H x W x C uint8; any
failure is a one-line ``AuditInputError`` naming the file.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFile, ImageOps

from auditlib.errors import AuditInputError
from auditlib.words import MB, size_text

# As reported by PIL after opening, not by file extension.
ALLOWED_FORMATS = {"PNG", "JPEG", "BMP", "TIFF", "WEBP"}
FORMATS_TEXT = "PNG, JPEG, BMP, TIFF or WebP"
# ITU-R BT.601 luma weights (the ones PIL's convert("L") uses).
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


@dataclass(frozen=True)
class ImageLimits:
    """What one audit accepts; checked before anything is decoded where possible."""

    max_file_bytes: int = 20 * MB
    max_pixels: int = 40_000_000  # width*height, from the header (decompression bombs)
    # All images of one set together (64 black 6300x6300 PNGs are a few MB and would decode
    # to about 7.6 GB): from the headers, before any is decoded.
    max_total_pixels: int = 160_000_000
    max_side: int = 16384
    max_images: int = 64  # the attacks handle batches up to 64
    min_side: int = 8
    max_archive_bytes: int = 256 * MB  # total uncompressed size of a zip (zip bombs)
    max_archive_members: int = 512  # entries in a zip, directories and junk included


DEFAULT_LIMITS = ImageLimits()


def _open_header(data: bytes) -> tuple[ImageFile.ImageFile | None, bool]:
    """Identify the format and read only the header; no pixel data is decoded.

    Returns the opened image (or None) and whether some format recognised the file's magic
    bytes (then a failure to open means a damaged file rather than a non-image). This is
    ``Image.open`` without PIL's own decompression-bomb check: that check raises a generic
    error above ~179 megapixels before the size can be reported, while we refuse far earlier
    with our own limits and a message that gives the size.
    """
    Image.init()  # register every plugin, so unsupported formats (GIF, ...) can be named
    prefix = data[:16]
    recognised = False
    for fmt in Image.ID:
        factory, accept = Image.OPEN[fmt]
        try:
            verdict = accept(prefix) if accept else True
            if not verdict or isinstance(verdict, str):  # a str is PIL's "maybe" warning
                continue
            # A format with magic bytes matched: if its header fails, the file is damaged.
            recognised = recognised or accept is not None
            return factory(io.BytesIO(data), ""), True
        except (SyntaxError, IndexError, TypeError, struct.error, OSError, ValueError, EOFError):
            continue  # not this format, or a damaged file of it
    return None, recognised


def _check_header(data: bytes, name: str, limits: ImageLimits) -> ImageFile.ImageFile:
    if not data:
        raise AuditInputError(f"{name} is empty (0 bytes); expected a {FORMATS_TEXT} image file")
    if len(data) > limits.max_file_bytes:
        raise AuditInputError(
            f"{name} is {size_text(len(data))}; image files up to "
            f"{size_text(limits.max_file_bytes)} are accepted"
        )
    im, recognised = _open_header(data)
    if im is None and recognised:
        raise AuditInputError(
            f"{name} is truncated or corrupt; expected a complete {FORMATS_TEXT} file"
        )
    if im is None:
        raise AuditInputError(f"{name} is not an image file ({FORMATS_TEXT} expected)")
    # Phones write JPEGs with extra preview frames ("MPO"); the first frame is a plain JPEG.
    fmt = "JPEG" if im.format == "MPO" else str(im.format)
    if fmt not in ALLOWED_FORMATS:
        raise AuditInputError(
            f"{name} is a {fmt} image; only {FORMATS_TEXT} images are accepted (convert it first)"
        )
    width, height = im.size
    if width * height > limits.max_pixels or width > limits.max_side or height > limits.max_side:
        raise AuditInputError(
            f"{name} is {width}x{height} pixels ({width * height:,}); at most "
            f"{limits.max_pixels:,} pixels and {limits.max_side} per side are accepted"
        )
    if width < limits.min_side or height < limits.min_side:
        raise AuditInputError(
            f"{name} is {width}x{height} pixels; at least {limits.min_side} per side is expected"
        )
    return im


def _composite_on_white(values: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    # Models see no alpha channel, and the colour of fully transparent pixels is arbitrary
    # (often black or leftovers). White is what viewers and documents show behind them, so
    # the model sees the image the way the user saw it.
    a = alpha.astype(np.float32)[..., None] / 255.0
    mixed = values.astype(np.float32) * a + 255.0 * (1.0 - a)
    return np.rint(mixed).astype(np.uint8)


def _to_array(im: Image.Image, name: str) -> np.ndarray:
    """Pixels as H x W x 1 or H x W x 3 uint8."""
    mode = im.mode
    if mode == "1":
        im, mode = im.convert("L"), "L"
    elif mode in {"P", "PA"}:
        transparent = mode == "PA" or "transparency" in im.info
        im = im.convert("RGBA" if transparent else "RGB")
        mode = im.mode
    elif mode in {"RGBa", "La"}:  # premultiplied alpha
        im = im.convert(mode[0] + "A" if mode == "La" else "RGBA")
        mode = im.mode
    elif mode in {"CMYK", "YCbCr", "LAB", "HSV", "RGBX"}:
        im, mode = im.convert("RGB"), "RGB"

    arr = np.asarray(im)
    if mode == "L":
        out = arr[..., None]
    elif mode == "LA":
        out = _composite_on_white(arr[..., :1], arr[..., 1])
    elif mode == "RGB":
        out = arr
    elif mode == "RGBA":
        out = _composite_on_white(arr[..., :3], arr[..., 3])
    elif mode.startswith("I"):
        # 16-bit sources (PIL's "I;16*", and "I" for some 16-bit PNG/TIFF): 65535 -> 255.
        values = arr.astype(np.int64)
        if values.min() < 0 or values.max() > 65535:
            raise AuditInputError(
                f"{name} holds integer pixels outside 0-65535 (min {values.min()}, max "
                f"{values.max()}); expected 8-bit or 16-bit images"
            )
        out = np.rint(values / 257.0).astype(np.uint8)[..., None]
    elif mode == "F":
        values = arr.astype(np.float64)
        if not np.isfinite(values).all() or values.min() < 0 or values.max() > 255:
            raise AuditInputError(
                f"{name} holds floating-point pixels outside 0-255 or not finite; expected "
                "8-bit or 16-bit images, or floats in 0-1"
            )
        scale = 255.0 if values.max() <= 1.0 else 1.0  # floats in 0-1 are the usual convention
        out = np.rint(values * scale).astype(np.uint8)[..., None]
    else:
        raise AuditInputError(
            f"{name} uses the pixel mode {mode!r}, which is not supported; expected grayscale, "
            "RGB, RGBA, palette or CMYK images"
        )
    return np.array(out, dtype=np.uint8, order="C")  # an owned, writable copy


def header_pixels(data: bytes, name: str, limits: ImageLimits = DEFAULT_LIMITS) -> int:
    """Width x height of the image in ``data``, from its header alone (checked as
    :func:`decode_image` checks it); nothing is decoded."""
    width, height = _check_header(data, name, limits).size
    return width * height


def decode_image(data: bytes, name: str, limits: ImageLimits = DEFAULT_LIMITS) -> np.ndarray:
    """Decode one image file completely, or refuse it with a one-line ``AuditInputError``.

    Size limits are checked from the header before any pixel is decoded. Multi-frame TIFF and
    WebP files give their first frame; the EXIF orientation is applied. The result is
    H x W x 1 (grayscale, 16-bit scaled to 8-bit) or H x W x 3 (colour) uint8; transparency is
    composited onto white.
    """
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        # A programming error elsewhere in the process, not a user error: with it, a
        # truncated upload would decode into a partly grey image without any complaint.
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES must stay False")
    im = _check_header(data, name, limits)
    try:
        im.load()  # the first frame for multi-frame files (the header leaves us on frame 0)
        im = ImageOps.exif_transpose(im)
        return _to_array(im, name)
    except AuditInputError:
        raise
    except (
        OSError,
        SyntaxError,
        ValueError,
        EOFError,
        struct.error,
        zlib.error,
        Image.DecompressionBombError,
    ) as exc:
        raise AuditInputError(
            f"{name} is truncated or corrupt; expected a complete {FORMATS_TEXT} file"
        ) from exc


# --- collections of images: folder, uploads, zip ------------------------------------------
