"""Pack what a lent GPU machine lacks into ``.gpu/`` (ignored by git; name it in the device
tool's ``carry``): the bundled photographs and faces as arrays (that machine's scikit-image
may have to fetch some of them, and nothing can be fetched there), Fashion-MNIST's test
files, and the text audit's demo text (the ``bible`` program's lines: that machine lacks
Debian's bible-kjv) and LAMP's prior on each demo tokenizer as trained here (the
tokenizers travel with the tree: ``assets/tokenizers/``). ``benchmarks/device/run.py`` reads them back.

Usage: python -m benchmarks.device.pack
"""

from __future__ import annotations

import shutil

import numpy as np
import skimage

from auditlib.attacks.text.lamp import LampConfig
from auditlib.attacks.text.lm_prior import _cache_path, public_text_prior
from auditlib.data import demo_text, samples
from auditlib.data.samples import PHOTOGRAPHS
from auditlib.data.text_tokenizer import demo_tokenizer
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
    text = CARRY / "text"
    (text / "cache").mkdir(parents=True, exist_ok=True)
    (text / "bible.txt").write_text("\n".join(demo_text._bible_lines()) + "\n")
    defaults = LampConfig()
    for kind in ("bpe", "wordpiece"):  # LAMP's default prior on each demo tokenizer
        tok = demo_tokenizer(kind)
        public_text_prior(tok, defaults.prior_steps, defaults.prior_seconds)  # trained, or read
        made = _cache_path(tok, defaults.prior_steps, defaults.prior_seconds, 0)
        shutil.copy(made, text / "cache" / made.name)
    print(f"packed {CARRY}")


if __name__ == "__main__":
    main()
