"""Labelled train/test sets for measuring utility (federated training, then accuracy).

Either a bundled set (Fashion-MNIST: its own train and test splits; digits: one seeded
permutation cut into disjoint train and test parts) or the auditor's labelled images (a
folder or zip loaded by ``auditlib.data.images``), cut the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from auditlib.data.images import LabelledImages
from auditlib.data.samples import FASHION_MNIST_CLASSES, _check_name, _digits, _fashion_mnist
from auditlib.errors import AuditInputError

MAX_EXAMPLES = 60_000


@dataclass(frozen=True, eq=False)
class TrainTestSets:
    train_images: tuple[np.ndarray, ...]  # each H x W x C uint8
    train_labels: np.ndarray  # int64
    test_images: tuple[np.ndarray, ...]
    test_labels: np.ndarray
    class_names: tuple[str, ...] | None
    source: str


def _check_counts(train: int, test: int, available: int | None, what: str) -> None:
    if train < 1 or test < 1:
        raise AuditInputError(
            f"asked for {train} training and {test} test examples of {what}; expected >= 1 each"
        )
    if train + test > MAX_EXAMPLES:
        raise AuditInputError(
            f"asked for {train + test} examples of {what}; at most {MAX_EXAMPLES} are used"
        )
    if available is not None and train + test > available:
        raise AuditInputError(
            f"{what} has {available} labelled examples; asked for {train} training and "
            f"{test} test examples"
        )


def bundled_sets(name: str, train: int, test: int, seed: int) -> TrainTestSets:
    """``train`` and ``test`` disjoint examples of a bundled labelled set, seeded."""
    _check_name(name)
    rng = np.random.default_rng(seed)
    if name == "fashion-mnist":
        _check_counts(train, test, None, "fashion-mnist")
        train_x, train_y = _fashion_mnist("train")
        test_x, test_y = _fashion_mnist("test")
        if train > len(train_x) or test > len(test_x):
            raise AuditInputError(
                f"Fashion-MNIST has {len(train_x)} training and {len(test_x)} test images; "
                f"asked for {train} and {test}"
            )
        tr = rng.permutation(len(train_x))[:train]
        te = rng.permutation(len(test_x))[:test]
        return TrainTestSets(
            tuple(train_x[tr]),
            np.array(train_y[tr]),
            tuple(test_x[te]),
            np.array(test_y[te]),
            FASHION_MNIST_CLASSES,
            "fashion-mnist (train split for clients, test split held out)",
        )
    if name == "digits":
        images, labels = _digits()
        _check_counts(train, test, len(images), "digits")
        order = rng.permutation(len(images))
        tr, te = order[:train], order[train : train + test]
        return TrainTestSets(
            tuple(images[tr]),
            np.array(labels[tr]),
            tuple(images[te]),
            np.array(labels[te]),
            tuple(str(d) for d in range(10)),
            "digits (one seeded permutation, disjoint train and test parts)",
        )
    raise AuditInputError(
        f"sample set {name!r} cannot train a model; expected 'fashion-mnist' or 'digits', or "
        "labelled images of your own"
    )


def labelled_sets(images: LabelledImages, test_fraction: float, seed: int) -> TrainTestSets:
    """The auditor's labelled images cut into a training part and a held-out test part."""
    if images.labels is None:
        raise AuditInputError(
            f"{images.source} has no labels; utility needs labelled images (class subfolders "
            "or a labels.csv)"
        )
    if not 0 < test_fraction < 1:
        raise AuditInputError(f"test fraction must be in (0, 1), got {test_fraction}")
    test = round(test_fraction * len(images))
    _check_counts(len(images) - test, test, len(images), images.source)
    order = np.random.default_rng(seed).permutation(len(images))
    te, tr = order[:test], order[test:]
    labels = np.asarray(images.labels, dtype=np.int64)
    return TrainTestSets(
        tuple(images.images[i] for i in tr),
        labels[tr],
        tuple(images.images[i] for i in te),
        labels[te],
        images.class_names,
        f"{images.source} ({len(tr)} for clients, {len(te)} held out)",
    )
