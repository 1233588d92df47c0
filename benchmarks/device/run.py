"""Run ``python -m MODULE ARGS...`` (a benchmark, pytest) or a script on a lent GPU machine,
with the bundled data from ``.gpu/`` (``benchmarks/device/pack.py``) in place of what that
machine's scikit-image would fetch.

Usage there: python3 benchmarks/device/run.py MODULE|SCRIPT.py [ARGS...]
"""

import runpy
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # our benchmarks, not a package's (opacus ships one)

import skimage  # noqa: E402
import torch  # noqa: E402

import auditlib.data.samples as samples  # noqa: E402

CARRY = ROOT / ".gpu"
PHOTOS = np.load(CARRY / "photos" / "photographs.npz")
FACES = np.load(CARRY / "photos" / "lfw_subset.npy")
samples._photograph = lambda name: np.array(PHOTOS[name], order="C")
samples.FASHION_MNIST_DIR = CARRY / "fmnist"
skimage.data.lfw_subset = lambda: FACES

print(
    "torch", torch.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0)
)
target, sys.argv = sys.argv[1], sys.argv[1:]
if target.endswith(".py"):
    runpy.run_path(target, run_name="__main__")
else:
    runpy.run_module(target, run_name="__main__", alter_sys=True)
