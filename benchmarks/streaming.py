"""Cost of running an audit through Ray with progress streamed into the store.

Measures, for the same spec (DLG on LeNet 32x32, batch 1, 100 steps):
- the bare attack (engine.audit.run_audit in this process, events only counted);
- the same audit through RunManager: a Ray streaming task whose messages (events every 10
  steps, a live frame with PSNR and PNG every 50) a consumer thread writes to a SQLite
  store; the attack's own seconds and iterations/s are compared;
- time from RunManager.start() to the first event and to the first live frame in the
  store, for the first run on a fresh Ray instance (cold: the worker imports torch and
  auditlib) and for a later run (warm).

Writes benchmarks/results/streaming.json and the table in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time

import torch

from auditlib.engine.audit import run_audit
from auditlib.engine.ray_backend import cpus_per_run
from auditlib.engine.runs import RunManager
from auditlib.store import Store
from benchmarks.common import ROOT, lenet_spec, machine, replace_section

ITERATIONS = 100
REPEATS = 3


def first_times(
    store: Store, run_id: str, started: float, timeout: float = 300
) -> tuple[float, float]:
    first_event = first_frame = None
    while time.perf_counter() - started < timeout:
        now = time.perf_counter() - started
        if first_event is None and store.latest_event(run_id) is not None:
            first_event = now
        if first_frame is None and store.image(run_id, "live") is not None:
            first_frame = now
        if first_event is not None and first_frame is not None:
            return first_event, first_frame
        time.sleep(0.01)
    raise TimeoutError("no live frame")


def main() -> None:
    spec = lenet_spec("dlg", iterations=ITERATIONS)
    # A Ray task asking for one CPU runs torch with one thread (OMP_NUM_THREADS=1); the bare
    # run does the same, so the comparison measures streaming and nothing else.
    torch.set_num_threads(cpus_per_run())
    bare = []
    for _ in range(REPEATS):
        result = run_audit(spec, lpips_nets=())
        bare.append(result.summary.timing.iterations_per_second)

    with tempfile.TemporaryDirectory() as folder:
        store = Store(f"sqlite:///{folder}/bench.db")
        manager = RunManager(store, lpips_nets=())
        streamed, starts = [], []
        for repeat in range(REPEATS):
            started = time.perf_counter()
            run_id = manager.start(spec)
            event_s, frame_s = first_times(store, run_id, started)
            manager.wait(run_id, 600)
            record = store.get_run(run_id)
            assert record.status == "completed", record.error
            streamed.append(record.result.timing.iterations_per_second)
            starts.append({"run": repeat, "first_event_s": event_s, "first_frame_s": frame_s})

    overhead = statistics.median(bare) / statistics.median(streamed) - 1
    results = {
        "machine": machine(),
        "bare_ips": bare,
        "streamed_ips": streamed,
        "starts": starts,
        "overhead": overhead,
    }
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "streaming.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        f"DLG on LeNet 32x32, batch 1, {ITERATIONS} L-BFGS steps, {REPEATS} runs each:",
        "",
        "| | iterations/s (median) |",
        "|---|---|",
        f"| bare attack, in process, {cpus_per_run()} torch thread(s) | {statistics.median(bare):.2f} |",
        f"| Ray task ({cpus_per_run()} CPU) + events every 10 steps + live frame every 50 + SQLite writes | {statistics.median(streamed):.2f} |",
        "",
        f"Streaming overhead: {100 * overhead:+.1f}% of the attack's time.",
        "",
        "| run on this Ray instance | start() to first event | start() to first live frame |",
        "|---|---|---|",
        *[
            f"| {s['run'] + 1}{' (waits for Ray to start and for a cold worker)' if s['run'] == 0 else ''} | {s['first_event_s']:.2f} s | {s['first_frame_s']:.2f} s |"
            for s in starts
        ],
        "",
        f"Machine: {results['machine']}.",
    ]
    print("\n".join(lines))
    replace_section(ROOT / "docs" / "PERFORMANCE.md", "streaming", "\n".join(lines))


if __name__ == "__main__":
    main()
