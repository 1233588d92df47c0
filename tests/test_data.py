"""Specification of auditlib.data: what users may hand in, and what they get back.

Why one file over 400 lines: it is the specification of one package or page set, read
from top to bottom; its tests share fixtures and helpers defined here.
"""

from __future__ import annotations

import io
import struct
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from auditlib.data import (
    ALLOWED_FORMATS,
    SAMPLE_SETS,
    ImageLimits,
    LabelledImages,
    Normalization,
    assign_labels,
    check_labels_fit,
    decode_image,
    load_image_folder,
    load_image_uploads,
    load_sample_set,
    load_training_pool,
    load_zip,
    parse_labels_csv,
    samples,
    to_model_batch,
)
from auditlib.errors import AuditInputError

FORMATS_TEXT = "PNG, JPEG, BMP, TIFF or WebP"


def encode(image: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def noise(height: int, width: int, channels: int, seed: int = 0) -> np.ndarray:
    shape = (height, width) if channels == 1 else (height, width, channels)
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def png(height: int = 16, width: int = 16, mode: str = "RGB", value: int = 0) -> bytes:
    return encode(Image.new(mode, (width, height), value), "PNG")


def png_header_only(width: int, height: int) -> bytes:
    """A PNG claiming width x height whose pixel data is garbage: decoding it would fail."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def make_zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


# --- decode_image: bad input gets one clear line -------------------------------------------


def test_text_file_renamed_png_is_not_an_image() -> None:
    with pytest.raises(AuditInputError) as err:
        decode_image(b"name,label\ncat.png,3\n" * 10, "x.png")
    assert str(err.value) == f"x.png is not an image file ({FORMATS_TEXT} expected)"


def test_truncated_jpeg_is_refused() -> None:
    data = encode(Image.fromarray(noise(64, 64, 3)), "JPEG", quality=90)
    for cut in (len(data) // 2, len(data) - 10):
        with pytest.raises(AuditInputError, match=r"^x\.jpg is truncated or corrupt"):
            decode_image(data[:cut], "x.jpg")
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_huge_image_is_refused_from_the_header_without_decoding() -> None:
    data = png_header_only(20000, 20000)  # its pixel data is garbage: decoding would fail
    start = time.perf_counter()
    with pytest.raises(AuditInputError) as err:
        decode_image(data, "big.png")
    assert time.perf_counter() - start < 1.0
    message = str(err.value)
    assert "big.png is 20000x20000 pixels" in message
    assert "40,000,000 pixels" in message and "16384 per side" in message


def test_one_oversized_side_is_refused() -> None:
    with pytest.raises(AuditInputError, match=r"20000x10 pixels.*16384 per side"):
        decode_image(png_header_only(20000, 10), "strip.png")


def test_gif_is_refused_with_the_accepted_formats() -> None:
    data = encode(Image.new("P", (16, 16)), "GIF")
    with pytest.raises(AuditInputError) as err:
        decode_image(data, "anim.png")  # the extension does not matter, the content does
    assert str(err.value).startswith("anim.png is a GIF image")
    assert FORMATS_TEXT in str(err.value)
    assert "GIF" not in ALLOWED_FORMATS


def test_empty_and_oversized_files_are_refused() -> None:
    with pytest.raises(AuditInputError, match=r"^e\.png is empty \(0 bytes\); expected a PNG"):
        decode_image(b"", "e.png")
    limits = ImageLimits(max_file_bytes=100)
    with pytest.raises(AuditInputError, match=r"^p\.png is .* bytes; image files up to 100"):
        decode_image(encode(Image.fromarray(noise(32, 32, 3)), "PNG"), "p.png", limits)


def test_too_small_image_is_refused() -> None:
    with pytest.raises(AuditInputError, match=r"tiny\.png is 4x4 pixels; at least 8 per side"):
        decode_image(png(4, 4), "tiny.png")


# --- decode_image: what comes out --------------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "BMP", "TIFF", "WEBP"])
@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_every_accepted_format_decodes_to_hwc_uint8(fmt: str, mode: str) -> None:
    channels = 1 if mode == "L" else 3
    pixels = noise(20, 30, channels)
    image = decode_image(encode(Image.fromarray(pixels), fmt), f"x.{fmt.lower()}")
    # WebP has no grayscale mode: PIL gives RGB back.
    expected_channels = 3 if fmt == "WEBP" else channels
    assert image.shape == (20, 30, expected_channels)
    assert image.dtype == np.uint8
    if fmt in {"PNG", "BMP", "TIFF"}:  # lossless
        assert np.array_equal(image.reshape(pixels.shape), pixels)


def test_rgba_is_composited_onto_white() -> None:
    rgba = np.zeros((10, 10, 4), dtype=np.uint8)
    rgba[..., 0] = 200
    rgba[:5, :, 3] = 255  # top half opaque red, bottom half fully transparent
    rgba[5:, :, 3] = 0
    image = decode_image(encode(Image.fromarray(rgba, "RGBA"), "PNG"), "a.png")
    assert image.shape == (10, 10, 3)
    assert image[0, 0].tolist() == [200, 0, 0]
    assert image[9, 9].tolist() == [255, 255, 255]


def test_gray_with_alpha_stays_gray_and_half_alpha_mixes() -> None:
    la = Image.new("LA", (10, 10), (0, 128))
    image = decode_image(encode(la, "PNG"), "la.png")
    assert image.shape == (10, 10, 1)
    assert image[0, 0, 0] == round(255 * (1 - 128 / 255))


def test_sixteen_bit_gray_is_scaled_to_eight_bit() -> None:
    row = np.array([0, 257 * 128, 65535] * 4, dtype=np.uint16)
    data = encode(Image.fromarray(np.tile(row, (10, 1))), "PNG")
    image = decode_image(data, "deep.png")
    assert image.shape == (10, 12, 1)
    assert image[0, :3, 0].tolist() == [0, 128, 255]


def test_palette_and_cmyk_become_rgb() -> None:
    assert decode_image(encode(Image.new("P", (9, 9)), "PNG"), "p.png").shape == (9, 9, 3)
    cmyk = Image.new("CMYK", (9, 9), (0, 255, 0, 0))  # magenta
    assert decode_image(encode(cmyk, "JPEG"), "c.jpg")[4, 4].tolist() == [255, 0, 255]


def test_exif_orientation_is_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    data = encode(Image.new("RGB", (40, 20)), "JPEG", exif=exif)
    assert decode_image(data, "phone.jpg").shape == (40, 20, 3)


def test_multi_frame_tiff_gives_the_first_frame() -> None:
    frames = [Image.new("L", (12, 10), v) for v in (10, 100, 200)]
    data = encode(frames[0], "TIFF", save_all=True, append_images=frames[1:])
    image = decode_image(data, "stack.tif")
    assert image.shape == (10, 12, 1)
    assert int(image[0, 0, 0]) == 10


def test_truncated_images_setting_is_guarded() -> None:
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        with pytest.raises(RuntimeError, match="LOAD_TRUNCATED_IMAGES"):
            decode_image(png(), "x.png")
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False


# --- folders ---------------------------------------------------------------------------


def test_flat_folder_is_loaded_sorted_skipping_hidden_files(tmp_path: Path) -> None:
    (tmp_path / "b.png").write_bytes(png(16, 20, "L"))
    (tmp_path / "a.jpg").write_bytes(encode(Image.new("RGB", (24, 12)), "JPEG"))
    (tmp_path / ".DS_Store").write_bytes(b"junk")
    loaded = load_image_folder(tmp_path)
    assert loaded.names == ("a.jpg", "b.png")
    assert [im.shape for im in loaded.images] == [(12, 24, 3), (16, 20, 1)]
    assert loaded.labels is None and loaded.class_names is None
    assert loaded.source == f"folder {tmp_path}"


def test_class_subfolders_give_labels_in_sorted_class_order(tmp_path: Path) -> None:
    for cls, files in {"dog": ["1.png", "2.png"], "cat": ["9.png"]}.items():
        (tmp_path / cls).mkdir()
        for name in files:
            (tmp_path / cls / name).write_bytes(png())
    loaded = load_image_folder(tmp_path)
    assert loaded.class_names == ("cat", "dog")
    assert loaded.names == ("cat/9.png", "dog/1.png", "dog/2.png")
    assert loaded.labels == (0, 1, 1)


def test_labels_csv_with_class_names_wins_over_folder_names(tmp_path: Path) -> None:
    for name in ("a.png", "b.png", "c.png"):
        (tmp_path / name).write_bytes(png())
    text = "\ufefffilename,label\n a.png , zebra\nb.png,ant\n\nc.png,zebra\n"
    (tmp_path / "labels.csv").write_text(text, encoding="utf-8")
    loaded = load_image_folder(tmp_path)
    assert loaded.names == ("a.png", "b.png", "c.png")
    assert loaded.class_names == ("ant", "zebra")
    assert loaded.labels == (1, 0, 1)

    other = tmp_path.parent / "other.csv"
    other.write_text("file,label\na.png,3\nb.png,0\nc.png,7\n", encoding="utf-8")
    explicit = load_image_folder(tmp_path, labels_csv=other)
    assert explicit.labels == (3, 0, 7) and explicit.class_names is None


def test_missing_path_and_file_instead_of_folder(tmp_path: Path) -> None:
    with pytest.raises(AuditInputError, match="does not exist; expected a folder of images"):
        load_image_folder(tmp_path / "nope")
    (tmp_path / "x.png").write_bytes(png())
    with pytest.raises(AuditInputError, match="is a file, not a folder"):
        load_image_folder(tmp_path / "x.png")


def test_folder_with_zero_images(tmp_path: Path) -> None:
    (tmp_path / ".hidden.png").write_bytes(png())
    with pytest.raises(AuditInputError) as err:
        load_image_folder(tmp_path)
    assert str(err.value) == (
        f"no images found in folder {tmp_path}; expected {FORMATS_TEXT} files directly inside "
        "it or in one level of class subfolders"
    )


def test_folder_with_a_non_image_file_names_it(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(png())
    (tmp_path / "notes.txt").write_text("private notes about the batch\n" * 3)
    with pytest.raises(AuditInputError) as err:
        load_image_folder(tmp_path)
    assert str(err.value) == (
        f"in folder {tmp_path}: notes.txt is not an image file ({FORMATS_TEXT} expected)"
    )


def test_folder_with_too_many_images(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"{i}.png").write_bytes(png())
    with pytest.raises(AuditInputError, match="holds 5 images; at most 4 are accepted"):
        load_image_folder(tmp_path, ImageLimits(max_images=4))


def test_folder_mixing_files_and_class_folders_or_nesting_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cat" / "deeper").mkdir(parents=True)
    with pytest.raises(AuditInputError, match=r"nested subfolders \(cat/deeper\)"):
        load_image_folder(tmp_path)
    (tmp_path / "cat" / "deeper").rmdir()
    (tmp_path / "cat" / "1.png").write_bytes(png())
    (tmp_path / "loose.png").write_bytes(png())
    with pytest.raises(
        AuditInputError, match=r"both image files \(loose\.png\) and subfolders \(cat\)"
    ):
        load_image_folder(tmp_path)


# --- uploads and zips --------------------------------------------------------------------


def test_uploads_with_labels_csv() -> None:
    files = [
        ("b.png", png()),
        ("a.png", png(20, 20, "L")),
        ("labels.csv", b"name,label\na.png,1\nb.png,0\n"),
    ]
    loaded = load_image_uploads(files)
    assert loaded.names == ("a.png", "b.png")
    assert loaded.labels == (1, 0)
    assert loaded.source == "upload"
    explicit = load_image_uploads(files, labels_csv_text="filename,label\na.png,5\nb.png,6\n")
    assert explicit.labels == (5, 6)


def test_uploads_refuse_nothing_duplicates_and_non_images() -> None:
    with pytest.raises(AuditInputError, match="no images uploaded"):
        load_image_uploads([])
    with pytest.raises(AuditInputError, match=r"two uploaded files are named a\.png"):
        load_image_uploads([("a.png", png()), ("a.png", png())])
    with pytest.raises(AuditInputError, match=r"readme\.png is not an image file"):
        load_image_uploads([("a.png", png()), ("readme.png", b"hello there " * 10)])


def test_zip_with_wrapper_folder_and_class_subfolders() -> None:
    data = make_zip(
        {
            "set/dog/1.png": png(),
            "set/cat/2.png": png(),
            "__MACOSX/set/cat/._2.png": b"resource fork",
            "set/.DS_Store": b"junk",
        }
    )
    loaded = load_zip(data)
    assert loaded.names == ("cat/2.png", "dog/1.png")
    assert loaded.labels == (0, 1) and loaded.class_names == ("cat", "dog")
    assert loaded.source == "zip upload"


def test_zip_with_path_traversal_member_is_refused() -> None:
    data = make_zip({"a.png": png(), "../../etc/evil.png": png()})
    with pytest.raises(AuditInputError) as err:
        load_zip(data)
    assert "unsafe entry name '../../etc/evil.png'" in str(err.value)
    assert "expected names relative to the archive root" in str(err.value)


def test_zip_bombs_are_refused_before_inflating() -> None:
    bomb = make_zip({"a.png": png(), "zeros.png": b"\x00" * 100_000})
    assert len(bomb) < 5_000
    with pytest.raises(
        AuditInputError, match=r"unpacks to [\d,]+ bytes; at most 50,000 bytes in total"
    ):
        load_zip(bomb, ImageLimits(max_archive_bytes=50_000))
    many = make_zip({f"{i}.png": b"" for i in range(20)})
    with pytest.raises(AuditInputError, match="has 20 entries; at most 10 are accepted"):
        load_zip(many, ImageLimits(max_archive_members=10))
    with pytest.raises(AuditInputError, match="not a readable zip archive"):
        load_zip(b"PK not really a zip")


# --- labels ------------------------------------------------------------------------------


def test_labels_csv_missing_row_is_reported() -> None:
    with pytest.raises(AuditInputError) as err:
        parse_labels_csv("filename,label\na.png,1\n", ["a.png", "b.png", "c.png"])
    assert str(err.value) == "labels.csv has no row for 2 of the 3 images: b.png, c.png"


def test_labels_csv_reports_every_problem_kind_on_one_line() -> None:
    text = "filename,label\na.png,1\na.png,2\nz.png,0\nb.png,-1\n"
    with pytest.raises(AuditInputError) as err:
        parse_labels_csv(text, ["a.png", "b.png", "c.png"])
    message = str(err.value)
    assert "\n" not in message
    assert "lists 1 files more than once: a.png" in message
    assert "no row for 1 of the 3 images: c.png" in message
    assert "not among the images: z.png" in message
    assert "not whole numbers >= 0: '-1' for b.png" in message


def test_labels_csv_bad_header_and_mixed_labels() -> None:
    with pytest.raises(AuditInputError, match="header is 'image,class'; expected 'filename,label'"):
        parse_labels_csv("image,class\na.png,1\n", ["a.png"])
    with pytest.raises(AuditInputError, match="mixes class ids and class names"):
        parse_labels_csv("filename,label\na.png,1\nb.png,cat\n", ["a.png", "b.png"])
    with pytest.raises(AuditInputError, match=r"1 rows with too few values \(lines 4\)"):
        parse_labels_csv("filename,label\na.png,1\n\nb.png\n", ["a.png", "b.png"])


def test_label_outside_the_model_classes() -> None:
    check_labels_fit((0, 9), 10)
    with pytest.raises(AuditInputError) as err:
        check_labels_fit((3, 12), 10, names=("dog.png", "cat.png"))
    assert str(err.value) == "label 12 of cat.png is outside the model's 10 classes (0-9)"


def test_assigned_labels_are_deterministic_independent_draws_kept_by_place() -> None:
    labels = assign_labels(8, 10, seed=3)
    assert labels == assign_labels(8, 10, seed=3)
    assert all(0 <= v < 10 for v in labels)
    assert assign_labels(8, 10, seed=4) != labels
    # An image keeps its label whichever batch holds it (the window from its place).
    assert assign_labels(3, 10, seed=3, first=5) == labels[5:8]
    # Drawn with replacement, so repeats occur (not forced distinct, which would force any
    # 8 distinct guesses of 10 classes to meet them in at least 6).
    many = assign_labels(30, 10, seed=0)
    assert len(many) == 30 and all(0 <= v < 10 for v in many) and len(set(many)) < 30
    assert any(len(set(assign_labels(8, 10, seed=s))) < 8 for s in range(5))


# --- to_model_batch ----------------------------------------------------------------------


def test_model_batch_shapes_channels_and_range() -> None:
    images = [noise(40, 60, 3), noise(30, 30, 1, seed=1)]
    for channels in (1, 3):
        batch = to_model_batch(images, (channels, 32, 32), Normalization.identity(channels))
        assert batch.shape == (2, channels, 32, 32) and batch.dtype == torch.float32
        assert float(batch.min()) >= 0.0 and float(batch.max()) <= 1.0
    gray = to_model_batch([noise(32, 32, 1)], (3, 32, 32), Normalization.identity(3))
    assert torch.equal(gray[:, 0], gray[:, 1]) and torch.equal(gray[:, 0], gray[:, 2])


def test_model_batch_is_exact_at_native_size_and_uses_bt601_luma() -> None:
    rgb = noise(16, 16, 3)
    batch = to_model_batch([rgb], (3, 16, 16), Normalization.identity(3))
    assert torch.allclose(batch[0], torch.from_numpy(rgb).permute(2, 0, 1).float() / 255)
    luma = to_model_batch([rgb], (1, 16, 16), Normalization.identity(1))
    expected = (rgb.astype(np.float32) / 255) @ np.array([0.299, 0.587, 0.114], np.float32)
    assert torch.allclose(luma[0, 0], torch.from_numpy(expected), atol=1e-6)


def test_model_batch_centre_crops_to_the_target_aspect() -> None:
    wide = np.zeros((20, 60, 1), dtype=np.uint8)
    wide[:, 20:40] = 255  # the centre square is white, the sides black
    batch = to_model_batch([wide], (1, 10, 10), Normalization.identity(1))
    assert float(batch.min()) > 0.99


def test_a_resized_image_is_reused_by_content_and_the_cache_stays_in_its_bytes() -> None:
    from auditlib.data.model_input import _resize, _ResizedCache

    cache = _ResizedCache(max_bytes=2 * 8 * 8 * 3)  # room for two 8 x 8 RGB results
    first, second, third = (noise(40, 30, 3, seed=s) for s in (0, 1, 2))
    out = cache.resized(first, 8, 8)
    assert np.array_equal(out, _resize(first, 8, 8)) and not out.flags.writeable
    assert cache.resized(first.copy(), 8, 8) is out  # the same pixels, another array: a hit
    changed = first.copy()
    changed[0, 0, 0] ^= 1  # one bit of one pixel differs: not the same image
    assert cache.resized(changed, 8, 8) is not out
    assert cache.resized(first, 4, 4).shape == (4, 4, 3)  # another size is another entry
    cache.resized(second, 8, 8)
    cache.resized(third, 8, 8)
    assert cache._bytes <= cache.max_bytes and len(cache._entries) == 2
    assert np.array_equal(cache.resized(first, 8, 8), out)  # evicted, recomputed the same
    native = noise(8, 8, 3)
    assert cache.resized(native, 8, 8) is native  # nothing to resize, nothing kept


def test_normalisation_round_trip() -> None:
    norm = Normalization(mean=(0.4914, 0.4822, 0.4465), std=(0.247, 0.243, 0.261))
    images = [noise(24, 24, 3), noise(50, 20, 1, seed=2)]
    batch = to_model_batch(images, (3, 24, 24), norm)
    plain = to_model_batch(images, (3, 24, 24), Normalization.identity(3))
    assert float(batch.mean()) < float(plain.mean())  # it was actually normalised
    assert torch.allclose(norm.denormalize(batch), plain, atol=1e-6)


def test_model_batch_refuses_mismatched_normalisation() -> None:
    with pytest.raises(AuditInputError, match="normalisation has 1 channels but the model takes 3"):
        to_model_batch([noise(8, 8, 3)], (3, 8, 8), Normalization.identity(1))


# --- sample sets ---------------------------------------------------------------------------


def test_sample_set_catalogue() -> None:
    assert set(SAMPLE_SETS) == {"photographs", "faces", "digits", "fashion-mnist"}
    assert SAMPLE_SETS["photographs"].num_classes is None
    assert SAMPLE_SETS["digits"].num_classes == 10


def test_photographs_in_fixed_order_without_cycling() -> None:
    first = load_sample_set("photographs", 3)
    assert first.names == ("astronaut", "chelsea", "coffee")
    assert first.images[0].shape == (512, 512, 3) and first.labels is None
    assert first.source == "sample set 'photographs'"
    gray = load_sample_set("photographs", 1, offset=7)
    assert gray.names == ("camera",) and gray.images[0].shape == (512, 512, 1)
    available = len(samples.PHOTOGRAPHS)
    with pytest.raises(AuditInputError, match=f"has {available} images; asked for 3"):
        load_sample_set("photographs", 3, offset=available - 2)


def test_faces_are_labelled_and_deterministic_for_a_seed() -> None:
    faces = load_sample_set("faces", 16, seed=5)
    assert all(im.shape == (25, 25, 1) and im.dtype == np.uint8 for im in faces.images)
    assert faces.class_names == ("non-face", "face")
    assert faces.labels is not None and set(faces.labels) == {0, 1}
    index = [int(n.split("-")[1]) for n in faces.names]
    assert faces.labels == tuple(int(i < 100) for i in index)  # the first 100 are the faces
    assert load_sample_set("faces", 16, seed=5).names == faces.names
    assert load_sample_set("faces", 16, seed=6).names != faces.names
    later = load_sample_set("faces", 16, seed=5, offset=16)
    assert not set(later.names) & set(faces.names)


def test_digits() -> None:
    digits = load_sample_set("digits", 10, seed=0)
    assert all(im.shape == (8, 8, 1) for im in digits.images)
    assert max(int(im.max()) for im in digits.images) == 255
    assert digits.labels is not None and all(0 <= v <= 9 for v in digits.labels)
    digits.images[0][0, 0, 0] = 1  # callers get copies, not the cached arrays
    pool, labels = load_training_pool("digits", 100, seed=1)
    assert pool.shape == (100, 8, 8, 1) and labels.shape == (100,)


def test_a_worker_decodes_the_default_sample_set_whole_ahead_of_its_first_audit() -> None:
    """The Ray worker's warm-up: every photograph decoded into the process's cache, so the
    first run's victim reads them without decoding (0.30 s to its start message, 0.12 s)."""
    assert samples.DEFAULT_SAMPLE_SET == "photographs"
    samples._decoded_photograph.cache_clear()
    samples.decode_ahead(samples.DEFAULT_SAMPLE_SET)
    assert samples._decoded_photograph.cache_info().currsize == len(samples.PHOTOGRAPHS)
    load_sample_set("photographs", len(samples.PHOTOGRAPHS))
    assert samples._decoded_photograph.cache_info().misses == len(samples.PHOTOGRAPHS)
    samples.decode_ahead("digits")  # a set read whole: read (and cached) by its first load
    assert samples._digits.cache_info().currsize == 1
    with pytest.raises(AuditInputError, match="unknown sample set 'cifar'"):
        samples.decode_ahead("cifar")


def test_unknown_sample_set_and_training_pool() -> None:
    with pytest.raises(AuditInputError, match="unknown sample set 'cifar'; expected one of"):
        load_sample_set("cifar", 4)
    with pytest.raises(AuditInputError, match="'faces' has no training pool"):
        load_training_pool("faces", 4, seed=0)


def test_idx_parser_reads_big_endian_headers() -> None:
    data = bytes([0, 0, 0x08, 2]) + struct.pack(">II", 2, 3) + bytes(range(6))
    assert samples._parse_idx(data, "x").tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(AuditInputError, match="not a valid IDX file"):
        samples._parse_idx(data[:-1], "x")


def test_fashion_mnist_missing_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(samples, "FASHION_MNIST_DIR", tmp_path)
    samples._fashion_mnist.cache_clear()
    try:
        with pytest.raises(AuditInputError, match=r"^Fashion-MNIST is not installed: install"):
            load_sample_set("fashion-mnist", 4)
    finally:
        samples._fashion_mnist.cache_clear()


@pytest.mark.skipif(
    not (samples.FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz").exists(),
    reason="Debian's dataset-fashion-mnist package is not installed",
)
def test_fashion_mnist() -> None:
    test = load_sample_set("fashion-mnist", 12, seed=2)
    assert all(im.shape == (28, 28, 1) for im in test.images)
    assert test.class_names is not None and test.class_names[9] == "Ankle boot"
    assert test.names[0].startswith("fashion-mnist-test-")
    assert load_sample_set("fashion-mnist", 12, seed=2).names == test.names
    pool, labels = load_training_pool("fashion-mnist", 500, seed=0)
    assert pool.shape == (500, 28, 28, 1) and pool.dtype == np.uint8
    assert labels.min() >= 0 and labels.max() <= 9


def test_labelled_images_checks_lengths() -> None:
    with pytest.raises(ValueError, match="2 images but 1 names"):
        LabelledImages((noise(8, 8, 1), noise(8, 8, 1)), ("a",), None, None, "test")
