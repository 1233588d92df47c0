"""Run ``python -m MODULE ARGS...`` (a benchmark, pytest) or a script on a lent GPU machine,
with the bundled data from ``.gpu/`` (``benchmarks/device/pack.py``) in place of what that
machine's scikit-image would fetch, and the text audit's demo text, tokenizers and prior in
place of Debian's bible-kjv (a data folder of its own, under /tmp).

Usage there: python3 benchmarks/device/run.py MODULE|SCRIPT.py [ARGS...]
"""

import os
import runpy
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # our benchmarks, not a package's (opacus ships one)

import skimage  # noqa: E402
import torch  # noqa: E402

import auditlib.data.demo_text as demo_text  # noqa: E402
import auditlib.data.samples as samples  # noqa: E402

CARRY = ROOT / ".gpu"
PHOTOS = np.load(CARRY / "photos" / "photographs.npz")
FACES = np.load(CARRY / "photos" / "lfw_subset.npy")
samples._photograph = lambda name: np.array(PHOTOS[name], order="C")
samples.FASHION_MNIST_DIR = CARRY / "fmnist"
skimage.data.lfw_subset = lambda: FACES
TEXT = CARRY / "text"
if TEXT.exists():  # packed by a tree with the text audit
    BIBLE = (TEXT / "bible.txt").read_text().splitlines()
    demo_text._bible_lines = lambda: list(BIBLE)
    data = Path(tempfile.mkdtemp(prefix="audit-data-"))
    shutil.copytree(TEXT / "cache", data / "cache" / "text")
    os.environ["AUDIT_DATA_DIR"] = str(data)

print(
    "torch", torch.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0)
)
target, sys.argv = sys.argv[1], sys.argv[1:]
if target.endswith(".py"):
    runpy.run_path(target, run_name="__main__")
else:
    runpy.run_module(target, run_name="__main__", alter_sys=True)
