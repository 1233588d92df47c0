"""A raced run's starts together against one after another (the audit preset's race).

The audit preset runs its starts in a race (successive halving: the worse half dropped at
each rung), so most of a run's steps are taken by the one or two starts left. This runs
each case at the audit preset on DLG's LeNet at 32x32 (one photograph, FedSGD; the cases
of ``benchmarks.restart_batching``: ``-fedkl-twin`` is the twin that fits FedKL's lock),
``together=false`` and ``true``, interleaved, and reports the median wall time of the
whole attack run, its steps and each arm's best objective. Together, a start left alone
steps through plain autograd with its own rows (IG, DLG), and GRNN's step holds only the
running starts' generators (``grnn_restarts.GrnnRestarts._compact``).

Writes benchmarks/results/raced_starts.json and the table in docs/PERFORMANCE.md.
Usage: python -m benchmarks.raced_starts [--steps 300] [--repeats 3] [--only CASE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from auditlib.attacks import RunControl, build_attack_config, get_attack
from auditlib.attacks.restarts import AUDIT_PRESET, run_attack
from benchmarks.common import ROOT, machine, replace_section
from benchmarks.restart_batching import case_release, case_variant

RESULTS = ROOT / "benchmarks" / "results" / "raced_starts.json"
DOC = ROOT / "docs" / "PERFORMANCE.md"
CASES = ("ig", "grnn", "fedleak", "gi", "ig-fedkl-twin", "dlg-fedkl-twin", "grnn-fedkl-twin")


def _run(case: str, release, steps: int, together: bool):
    variant = case_variant(case)
    params = {**variant.params, "together": together}
    config, _ = build_attack_config(variant.attack, params, AUDIT_PRESET)
    control = RunControl(steps, emit_every=10, image_every=50)
    start = time.perf_counter()
    final = None
    info = get_attack(variant.attack)
    events = run_attack(
        info, release.observation, release.knowledge, config, control, 0, AUDIT_PRESET
    )
    for event in events:
        final = event.final or final
    return time.perf_counter() - start, final


def measure(case: str, steps: int, repeats: int) -> dict:
    release = case_release(case)
    _run(case, release, 10, True)  # warm-up: lazy imports, allocator
    seconds: dict[bool, list[float]] = {False: [], True: []}
    finals = {}
    for _ in range(repeats):
        for together in (False, True):
            took, finals[together] = _run(case, release, steps, together)
            seconds[together].append(took)
    row = {"case": case, "max_steps": steps, "steps": finals[True].steps}
    for together, arm in ((False, "apart"), (True, "together")):
        row[f"{arm}_s"] = statistics.median(seconds[together])
        row[f"{arm}_runs_s"] = seconds[together]
        row[f"{arm}_best"] = finals[together].selected.loss
    row["starts"] = len(finals[True].candidates)
    row["steps_by_start"] = [c.steps for c in finals[True].candidates]
    row["ratio"] = row["apart_s"] / row["together_s"]
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| case (LeNet 32x32, batch 1, audit preset) | starts: steps each | apart (s) | "
        "together (s) | apart / together | best objective apart / together |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        steps = ", ".join(str(s) for s in r["steps_by_start"])
        lines.append(
            f"| {r['case']} | {r['starts']}: {steps} | {r['apart_s']:.2f} | "
            f"{r['together_s']:.2f} | {r['ratio']:.2f}x | "
            f"{r['apart_best']:.3g} / {r['together_best']:.3g} |"
        )
    return "\n".join(lines) + f"\n\nMeasured on: {machine()}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=CASES, default=list(CASES))
    parser.add_argument("--no-doc", action="store_true", help="print only; leave the docs")
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = [measure(case, args.steps, args.repeats) for case in CASES if case in args.only]
    text = table(rows)
    print(text)
    if args.no_doc:
        return
    RESULTS.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2) + "\n")
    replace_section(DOC, "raced-starts", text)


if __name__ == "__main__":
    main()
