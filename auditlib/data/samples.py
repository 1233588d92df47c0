"""Sample sets that need no download: bundled with installed packages or Debian datasets."""

from __future__ import annotations

import functools
import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from auditlib.data.decode import DEFAULT_LIMITS
from auditlib.data.images import LabelledImages
from auditlib.errors import AuditInputError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
FACES_CLASSES = ("non-face", "face")
# scikit-image's photographs that ship in its wheel (no network needed), colour first, then
# grayscale; returned in this order. Synthetic images (colorwheel, logo, horse, text) are left
# out, as is ``cat`` (the same picture as ``chelsea``).
PHOTOGRAPHS = (
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "immunohistochemistry",
    "hubble_deep_field",
    "retina",
    "camera",
    "moon",
    "coins",
    "clock",
    "page",
    "grass",
    "gravel",
    "brick",
    "cell",
    "microaneurysms",
)
# The set a new audit takes its private images from (the dashboard's Setup), which a Ray
# worker decodes while it warms up (``decode_ahead``).
DEFAULT_SAMPLE_SET = "photographs"


@dataclass(frozen=True)
class SampleSetInfo:
    name: str
    description: str
    num_classes: int | None  # None: the images have no classes
    license_note: str


SAMPLE_SETS: dict[str, SampleSetInfo] = {
    info.name: info
    for info in (
        SampleSetInfo(
            "photographs",
            f"{len(PHOTOGRAPHS)} photographs bundled with scikit-image (7 colour, 10 grayscale; "
            "various sizes), in a fixed order",
            None,
            "scikit-image sample data; public domain, CC0 or no known copyright restrictions "
            "(see the skimage.data docstrings)",
        ),
        SampleSetInfo(
            "faces",
            "200 grayscale 25x25 crops from Labeled Faces in the Wild: 100 faces, 100 non-face "
            "background patches (skimage.data.lfw_subset)",
            2,
            "subset of LFW (Huang et al.) bundled with scikit-image",
        ),
        SampleSetInfo(
            "digits",
            "1797 grayscale 8x8 handwritten digits 0-9 (scikit-learn's load_digits, UCI "
            "optical recognition of handwritten digits)",
            10,
            "UCI ML repository data bundled with scikit-learn (CC BY 4.0)",
        ),
        SampleSetInfo(
            "fashion-mnist",
            "grayscale 28x28 Zalando article images in 10 classes (10000 test, 60000 train), "
            "from Debian's dataset-fashion-mnist package",
            10,
            "Fashion-MNIST by Zalando Research, MIT licence",
        ),
    )
}

_MISSING_FASHION = (
    "Fashion-MNIST is not installed: install Debian's dataset-fashion-mnist package "
    "(make run does it where it can)"
)
# IDX element types: code -> big-endian numpy dtype.
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _parse_idx(data: bytes, what: str) -> np.ndarray:
    """Parse an IDX file: 2 zero bytes, type code, number of dims, big-endian uint32 dims."""
    bad = f"{what} is not a valid IDX file; reinstall Debian's dataset-fashion-mnist package"
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise AuditInputError(bad)
    ndim = data[3]
    header_end = 4 + 4 * ndim
    if len(data) < header_end:
        raise AuditInputError(bad)
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[data[2]])
    if len(data) - header_end != int(np.prod(dims)) * dtype.itemsize:
        raise AuditInputError(bad)
    return np.frombuffer(data, dtype=dtype, offset=header_end).reshape(dims)


def _read_idx_gz(path: Path) -> np.ndarray:
    try:
        data = gzip.decompress(path.read_bytes())
    except FileNotFoundError as exc:
        raise AuditInputError(_MISSING_FASHION) from exc
    except (OSError, EOFError) as exc:
        raise AuditInputError(
            f"{path} cannot be read ({exc}); reinstall Debian's dataset-fashion-mnist package"
        ) from exc
    return _parse_idx(data, str(path))


@functools.lru_cache(maxsize=2)
def _fashion_mnist(split: str) -> tuple[np.ndarray, np.ndarray]:
    """(N x 28 x 28 x 1 uint8, N int64) for "train" or "test", read-only; cached (47 MB train)."""
    prefix = {"train": "train", "test": "t10k"}[split]
    images = _read_idx_gz(FASHION_MNIST_DIR / f"{prefix}-images-idx3-ubyte.gz")
    labels = _read_idx_gz(FASHION_MNIST_DIR / f"{prefix}-labels-idx1-ubyte.gz")
    if images.ndim != 3 or labels.shape != images.shape[:1] or images.dtype != np.uint8:
        raise AuditInputError(
            f"Fashion-MNIST {split} files have unexpected shapes {images.shape} and "
            f"{labels.shape}; reinstall Debian's dataset-fashion-mnist package"
        )
    images = np.ascontiguousarray(images[..., None])
    labels = labels.astype(np.int64)
    images.flags.writeable = False  # shared by every caller through the cache
    labels.flags.writeable = False
    return images, labels


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    """(1797 x 8 x 8 x 1 uint8, 1797 int64), read-only; 0-16 values scaled to 0-255."""
    from sklearn.datasets import load_digits  # imported lazily: sklearn is slow to import

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    labels = bunch.target.astype(np.int64)
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


@functools.lru_cache(maxsize=1)
def _faces() -> tuple[np.ndarray, np.ndarray]:
    """(200 x 25 x 25 x 1 uint8, 200 int64), read-only; label 1 = face, 0 = non-face."""
    from skimage import data

    # lfw_subset returns floats in [0, 1] (its docstring says uint8); the first 100 images
    # are faces and the last 100 background patches, as its docstring says.
    raw = np.asarray(data.lfw_subset(), dtype=np.float64)
    images = np.rint(np.clip(raw, 0.0, 1.0) * 255.0).astype(np.uint8)[..., None]
    labels = np.r_[np.ones(100, dtype=np.int64), np.zeros(len(raw) - 100, dtype=np.int64)]
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


def _photograph(name: str) -> np.ndarray:
    return np.array(_decoded_photograph(name), order="C")  # the caller's own copy


@functools.cache
def _decoded_photograph(name: str) -> np.ndarray:
    # Decoded once per process: a sample audit's every update reads the set (its images and
    # the prior's pool), and decoding 17 files took 0.08 s per update (benchmarks/
    # updates_together.py).
    from skimage import data

    image = np.asarray(getattr(data, name)(), dtype=np.uint8)
    image = np.array(image[..., None] if image.ndim == 2 else image, order="C")
    image.flags.writeable = False
    return image


def decode_ahead(name: str) -> None:
    """Decode the whole of sample set ``name`` into this process's cache, ahead of the first
    audit that reads it (a Ray worker's warm-up): the first run of a fresh worker paid
    0.25 s of scikit-image's imports and the photographs' decoding before its first word."""
    _check_name(name)
    if name == "photographs":
        for photograph in PHOTOGRAPHS:
            _decoded_photograph(photograph)
    else:
        load_sample_set(name, 1)  # these sets are read (and cached) whole


def _check_name(name: str) -> SampleSetInfo:
    if name not in SAMPLE_SETS:
        raise AuditInputError(
            f"unknown sample set {name!r}; expected one of {', '.join(sorted(SAMPLE_SETS))}"
        )
    return SAMPLE_SETS[name]


def _window(name: str, available: int, count: int, offset: int) -> slice:
    if count < 1:
        raise AuditInputError(f"asked for {count} images from sample set {name!r}; expected >= 1")
    if offset < 0:
        raise AuditInputError(f"offset {offset} for sample set {name!r} is negative; expected >= 0")
    if offset + count > available:
        raise AuditInputError(
            f"sample set {name!r} has {available} images; asked for {count} starting at "
            f"offset {offset}"
        )
    return slice(offset, offset + count)


def sample_set_size(name: str, split: str = "test") -> int:
    """How many images the bundled sample set holds (an audit of the whole sample takes
    them a batch at a time)."""
    _check_name(name)
    if name == "photographs":
        return len(PHOTOGRAPHS)
    if name == "faces":
        return len(_faces()[0])
    if name == "digits":
        return len(_digits()[0])
    return len(_fashion_mnist(split)[0])


def load_sample_set(
    name: str, count: int, *, seed: int = 0, offset: int = 0, split: str = "test"
) -> LabelledImages:
    """``count`` images of a bundled sample set (see ``SAMPLE_SETS``).

    "photographs" come in their fixed order from ``offset`` (``seed`` is not used); the other
    sets are shuffled by a permutation seeded with ``seed`` and the images at positions
    ``offset``..``offset + count - 1`` are taken, so disjoint offsets give disjoint images for
    one seed. Nothing cycles: asking for more than there is raises. ``split`` ("test" or
    "train") only applies to Fashion-MNIST.
    """
    _check_name(name)
    if count > DEFAULT_LIMITS.max_images:
        raise AuditInputError(
            f"asked for {count} images from sample set {name!r}; at most "
            f"{DEFAULT_LIMITS.max_images} are accepted (the attacks handle batches up to that size)"
        )
    if split not in {"test", "train"}:
        raise AuditInputError(f"unknown split {split!r}; expected 'test' or 'train'")
    if split != "test" and name != "fashion-mnist":
        raise AuditInputError(
            f"sample set {name!r} has no {split!r} split; only 'fashion-mnist' has train and "
            "test splits"
        )
    source = f"sample set {name!r}"

    if name == "photographs":
        chosen = PHOTOGRAPHS[_window(name, len(PHOTOGRAPHS), count, offset)]
        images = tuple(_photograph(n) for n in chosen)
        return LabelledImages(images, tuple(chosen), None, None, source)

    if name == "faces":
        images, labels = _faces()
        class_names: tuple[str, ...] = FACES_CLASSES
        prefix = "faces"
    elif name == "digits":
        images, labels = _digits()
        class_names = tuple(str(d) for d in range(10))
        prefix = "digits"
    else:
        images, labels = _fashion_mnist(split)
        class_names = FASHION_MNIST_CLASSES
        prefix = f"fashion-mnist-{split}"
        source = f"sample set {name!r} ({split} split)"
    order = np.random.default_rng(seed).permutation(len(images))
    picked = order[_window(name, len(images), count, offset)]
    width = len(str(len(images) - 1))
    return LabelledImages(
        images=tuple(np.array(images[i]) for i in picked),  # writable copies, not cache views
        names=tuple(f"{prefix}-{i:0{width}d}" for i in picked),
        labels=tuple(int(labels[i]) for i in picked),
        class_names=class_names,
        source=source,
    )


def load_training_pool(name: str, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` labelled images for federated training: (N x H x W x C uint8, N int64 labels).

    Fashion-MNIST draws from its train split (disjoint from the default test split used for
    audits). Digits has no split: the pool comes from the same 1797 images as the "digits"
    sample set, so an audited image may also have been trained on. Seeded permutation, no
    cycling.
    """
    _check_name(name)
    if name == "fashion-mnist":
        images, labels = _fashion_mnist("train")
    elif name == "digits":
        images, labels = _digits()
    else:
        raise AuditInputError(
            f"sample set {name!r} has no training pool; expected 'digits' or 'fashion-mnist'"
        )
    order = np.random.default_rng(seed).permutation(len(images))
    picked = order[_window(name, len(images), count, 0)]
    return images[picked], labels[picked]  # fancy indexing copies: writable, not cache views
