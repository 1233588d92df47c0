"""Peak memory and time of matching reconstructions to originals (``metrics.matching``).

For batches of 224x224 colour images (B = 8 to 64), the peak of what Python and NumPy
allocate while ``match`` runs (tracemalloc, which NumPy reports to), beside the two float64
B x D copies it needs and the B x B x D array of every pair's difference it avoids.

Writes benchmarks/results/matching.json and the table in docs/PERFORMANCE.md.
Usage: python -m benchmarks.matching_memory
"""

from __future__ import annotations

import json
import time
import tracemalloc

import numpy as np

from auditlib.metrics.matching import match
from benchmarks.common import ROOT, machine, replace_section

SIDE = 224
BATCHES = (8, 16, 32, 64)


def measure(batch: int) -> dict:
    rng = np.random.default_rng(batch)
    originals = rng.random((batch, SIDE, SIDE, 3), dtype=np.float32)
    reconstructions = originals[rng.permutation(batch)] + rng.normal(
        0, 0.05, originals.shape
    ).astype(np.float32)
    values = SIDE * SIDE * 3
    tracemalloc.start()
    start = time.perf_counter()
    try:
        order = match(reconstructions, originals)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    correct = bool((reconstructions[order] - originals).std() < 0.06)
    return {
        "batch": batch,
        "peak_mb": peak / 1e6,
        "float64_copies_mb": 2 * batch * values * 8 / 1e6,
        "pairwise_differences_mb": batch * batch * values * 8 / 1e6,
        "seconds": seconds,
        "matched_correctly": correct,
    }


def render(rows: list[dict]) -> str:
    lines = [
        "| batch (224x224x3) | peak while matching | the two float64 copies | every pair's "
        "difference (not built) | seconds | matched correctly |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['peak_mb']:.0f} MB | {r['float64_copies_mb']:.0f} MB | "
            f"{r['pairwise_differences_mb'] / 1e3:.2f} GB | {r['seconds']:.2f} | "
            f"{'yes' if r['matched_correctly'] else 'no'} |"
        )
    return "\n".join(lines)


def main() -> None:
    rows = [measure(batch) for batch in BATCHES]
    for row in rows:
        print(json.dumps(row), flush=True)
    (ROOT / "benchmarks" / "results" / "matching.json").write_text(
        json.dumps({"machine": machine(), "rows": rows}, indent=2) + "\n"
    )
    text = render(rows) + f"\n\nMeasured on: {machine()}."
    replace_section(ROOT / "docs" / "PERFORMANCE.md", "matching", text)
    print(text)


if __name__ == "__main__":
    main()
