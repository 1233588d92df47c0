"""Wall time of a 5-point DP sweep on LeNet with one Ray worker and with two.

The sweep is what the Trade-off page starts: five ordinary runs (Inverting Gradients, 300
steps, on LeNet (ReLU) 32x32, one photograph, then the default utility training: 3 clients
x 5 rounds on 3000 Fashion-MNIST images), Gaussian noise sigma in {0, 1e-4, 1e-3, 1e-2, 1e-1} with clip 1, launched as a
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

ITERATIONS = 300
REPEATS = 2
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

    spec = lenet_spec("ig", iterations=ITERATIONS, num_classes=10)
    # ReLU: DLG's sigmoid LeNet barely trains in 5 rounds (about 11 %), so the utility
    # training would not do the work it does for a model that learns; DLG itself fails on
    # ReLU (no smooth second derivative), so the attack is Inverting Gradients.
    model = dataclasses.replace(spec.model.spec, activation="relu")
    base = dataclasses.replace(
        spec, model=dataclasses.replace(spec.model, spec=model), utility=UtilitySpec()
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
        attack = [r.result.timing.seconds for r in runs]
        # Most runs executing at the same moment (the workers' own clock: begin and end of
        # each audit, utility included).
        timings = [r.result.timing for r in runs]
        moments = sorted(
            [(t.began_unix, 1) for t in timings] + [(t.ended_unix, -1) for t in timings]
        )
        concurrent = most = 0
        for _, step in moments:
            concurrent += step
            most = max(most, concurrent)
        utility = [r.result.measured_utility.seconds for r in runs]
        print(
            json.dumps(
                {
                    "wall_s": wall,
                    "max_concurrent": most,
                    "attack_s": attack,
                    "utility_s": utility,
                    "psnr": [r.psnr_mean for r in runs],
                    "accuracy": [r.result.measured_utility.accuracy for r in runs],
                }
            )
        )
        ray.shutdown()


def main() -> None:
    walls: dict[str, list[float]] = {label: [] for label, _ in CONFIGS}
    results = {}
    for repeat in range(REPEATS):  # interleaved, so drift of the machine hits every config
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
            walls[label].append(row["wall_s"])
            row["config"] = label
            results.setdefault(label, []).append(row)
            print(f"{label}, repeat {repeat + 1}: {row['wall_s']:.1f} s", flush=True)
    mean = {label: sum(w) / len(w) for label, w in walls.items()}
    serial = mean[CONFIGS[0][0]]
    out = ROOT / "benchmarks" / "results" / "sweep_parallel.json"
    out.write_text(json.dumps({"machine": machine(), "results": results}, indent=2) + "\n")
    lines = [
        f"5-point DP sweep (dp-gaussian sigma {', '.join(f'{s:g}' for s in SIGMAS)}, clip 1): "
        f"Inverting Gradients on LeNet (ReLU) 32x32, {ITERATIONS} Adam steps, then the default "
        "utility training (3 clients x 5 rounds x 2 local epochs, 3000 Fashion-MNIST images), "
        f"per point; {REPEATS} sweeps per configuration, interleaved:",
        "",
        "| Ray configuration | sweep wall time (each) | mean | vs 1 worker x 1 thread | most "
        "runs at once | attack s per run | utility s per run | final accuracy (sigma 0) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, _ in CONFIGS:
        rows = results[label]
        attack = [s for r in rows for s in r["attack_s"]]
        utility = [s for r in rows for s in r["utility_s"]]
        lines.append(
            f"| {label} | {', '.join(f'{w:.1f} s' for w in walls[label])} | "
            f"{mean[label]:.1f} s | {serial / mean[label]:.2f}x | "
            f"{max(r['max_concurrent'] for r in rows)} | {sum(attack) / len(attack):.1f} | "
            f"{sum(utility) / len(utility):.1f} | {rows[0]['accuracy'][0]:.1%} |"
        )
    lines += ["", f"Machine: {machine()}."]
    replace_section(ROOT / "docs" / "PERFORMANCE.md", "sweep", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    if "--child" in sys.argv:
        child()
    else:
        main()
