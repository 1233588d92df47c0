"""Pack what a lent GPU machine lacks into ``.gpu/`` (ignored by git; name it in the device
tool's ``carry``): the bundled photographs and faces as arrays (that machine's scikit-image
may have to fetch some of them, and nothing can be fetched there) and Fashion-MNIST's test
files. ``benchmarks/device/run.py`` reads them back there.

Usage: python -m benchmarks.device.pack
"""

from __future__ import annotations

import shutil

import numpy as np
import skimage

from auditlib.data import samples
from auditlib.data.samples import PHOTOGRAPHS
from benchmarks.common import ROOT

CARRY = ROOT / ".gpu"


def main() -> None:
    photos = CARRY / "photos"
    photos.mkdir(parents=True, exist_ok=True)
    np.savez(photos / "photographs.npz", **{n: samples._photograph(n) for n in PHOTOGRAPHS})
    np.save(photos / "lfw_subset.npy", skimage.data.lfw_subset())
    fmnist = CARRY / "fmnist"
    fmnist.mkdir(exist_ok=True)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(samples.FASHION_MNIST_DIR / name, fmnist / name)
    print(f"packed {CARRY}")


if __name__ == "__main__":
    main()
