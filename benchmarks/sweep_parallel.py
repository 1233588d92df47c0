"""Wall time of a 5-point DP sweep on LeNet with one Ray worker and with two.

The sweep is what the Trade-off page starts: five ordinary runs (DLG on LeNet 32x32, one
photograph, then the default utility training: 3 clients x 5 rounds on 3000 Fashion-MNIST
images), Gaussian noise sigma in {0, 1e-4, 1e-3, 1e-2, 1e-1} with clip 1, launched as a
batch through the RunManager on an embedded Ray. Each configuration runs in a fresh
process (its own Ray), timed from launch to the last run's result in the store, after Ray
is up and one worker is warm (as in the dashboard, which warms one on the first view):

- 1 worker x 1 thread (AUDIT_RAY_NUM_CPUS=1): the runs one after another;
- 2 workers x 1 thread (AUDIT_RAY_NUM_CPUS=2, the default on this machine): two at once;
- 1 worker x 2 threads (AUDIT_RAY_NUM_CPUS=2, AUDIT_RAY_CPUS_PER_RUN=2): one at a time,
  each with both cores.

Writes benchmarks/results/sweep_parallel.json and the table in docs/PERFORMANCE.md.
Usage: python -m benchmarks.sweep_parallel (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import ROOT, machine, replace_section

ITERATIONS = 100
SIGMAS = (0.0, 1e-4, 1e-3, 1e-2, 1e-1)
CONFIGS = (
    ("1 worker x 1 thread", {"AUDIT_RAY_NUM_CPUS": "1", "AUDIT_RAY_CPUS_PER_RUN": "1"}),
    ("2 workers x 1 thread", {"AUDIT_RAY_NUM_CPUS": "2", "AUDIT_RAY_CPUS_PER_RUN": "1"}),
    ("1 worker x 2 threads", {"AUDIT_RAY_NUM_CPUS": "2", "AUDIT_RAY_CPUS_PER_RUN": "2"}),
)


def child() -> None:
    """One configuration (from the environment): run the sweep, print a JSON line."""
    import dataclasses

    import ray

    from auditlib.engine import batches, ray_backend
    from auditlib.engine.runs import RunManager
    from auditlib.spec import UtilitySpec
    from auditlib.store import Store
    from benchmarks.common import lenet_spec

    base = dataclasses.replace(
        lenet_spec("dlg", iterations=ITERATIONS, num_classes=10), utility=UtilitySpec()
    )
    curve = batches.SweepCurve("dp-gaussian", SIGMAS, params=(("clip", "1"),))
    with tempfile.TemporaryDirectory() as folder, Store(f"sqlite:///{folder}/s.db") as store:
        manager = RunManager(store)
        ray_backend.ensure_ray()
        ray.get(ray_backend.warm_up.remote())  # one warm worker, as the dashboard has
        members = batches.sweep_members(base, [curve])
        batch = store.get_batch(batches.record_batch(store, "sweep", "bench", members))
        started = time.perf_counter()
        run_ids = batches.launch(manager, batch)
        for run_id in run_ids:
            manager.wait(run_id, 1800)
        wall = time.perf_counter() - started
        runs = [store.get_run(r) for r in run_ids]
        assert all(r.status == "completed" for r in runs), [(r.status, r.error) for r in runs]
        attack = [r.summary["timing"]["seconds"] for r in runs]
        utility = [r.summary["utility"]["seconds"] for r in runs]
        print(
            json.dumps(
                {
                    "wall_s": wall,
                    "attack_s": attack,
                    "utility_s": utility,
                    "psnr": [r.psnr_mean for r in runs],
                    "accuracy": [r.summary["utility"]["accuracy"] for r in runs],
                }
            )
        )
        ray.shutdown()


def main() -> None:
    results = []
    for label, env in CONFIGS:
        output = subprocess.run(
            [sys.executable, "-m", "benchmarks.sweep_parallel", "--child"],
            cwd=ROOT,
            env={**os.environ, **env, "RAY_USAGE_STATS_ENABLED": "0"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        row = json.loads(output.strip().splitlines()[-1])
        row["config"] = label
        results.append(row)
        print(f"{label}: {row['wall_s']:.1f} s", flush=True)
    serial = results[0]["wall_s"]
    out = ROOT / "benchmarks" / "results" / "sweep_parallel.json"
    out.write_text(json.dumps({"machine": machine(), "results": results}, indent=2) + "\n")
    lines = [
        f"5-point DP sweep (dp-gaussian sigma {', '.join(f'{s:g}' for s in SIGMAS)}, clip 1): "
        f"DLG on LeNet 32x32, {ITERATIONS} L-BFGS steps, then the default utility training "
        "(3 clients x 5 rounds x 2 local epochs, 3000 Fashion-MNIST images), per point:",
        "",
        "| Ray configuration | sweep wall time | vs 1 worker x 1 thread | attack s per run "
        "(mean) | utility s per run (mean) |",
        "|---|---|---|---|---|",
    ]
    for row in results:
        lines.append(
            f"| {row['config']} | {row['wall_s']:.1f} s | {serial / row['wall_s']:.2f}x | "
            f"{sum(row['attack_s']) / len(row['attack_s']):.1f} | "
            f"{sum(row['utility_s']) / len(row['utility_s']):.1f} |"
        )
    lines += ["", f"Machine: {machine()}."]
    replace_section(ROOT / "docs" / "PERFORMANCE.md", "sweep", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    if "--child" in sys.argv:
        child()
    else:
        main()
