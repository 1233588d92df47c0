"""Every applicable attack (``--attack all``) one after another and at once
(``engine.at_once``, issue 55), through the product's own run (``run_audit``, as the CLI runs
it): the whole plan's seconds and steps, each attack's steps, stop reason and PSNR, and the
combined PSNR, for the same model, photograph and seed.

Rows interleaved (one after another, at once, one after another, ...) so that load on the
machine falls on both. Without a time budget each attack makes its planned steps either way,
so the rows compare the time of the same work (tests/test_attacks_at_once.py checks that the
attacks end where they end); ``--seconds`` adds the budget (the issue's 120 s and 330 s runs)
and then compares the steps each way makes in it.

Cases: ``lenet`` (DLG's LeNet at 32 px, 100 classes: this machine's CPU, where each step is
small), ``resnet18-32`` (the CIFAR ResNet-18, 10 classes, train-mode BatchNorm: where the
CPU's kernels are large and every attack applies, GradInversion and DLM included) and ``resnet18-224``
(torchvision's ResNet-18, 1000 classes, 224 px, untrained, seed 0, BatchNorm in training
mode: the issue's GPU case, whose plan at the audit preset is 3060 steps).

``--captured``: on CUDA, every attack that can records its step as a CUDA graph after its
first steps without being asked (``attacks.captured``, off by default until measured).

Writes benchmarks/results/attacks_at_once-DEVICE-CASE.json (``-captured.json`` with
``--captured``) and prints each run as a JSON line.
Usage: python -m benchmarks.attacks_at_once [--device cuda] [--case resnet18-224]
       [--rounds 2] [--iterations N] [--seconds S] [--captured]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch

from auditlib.attacks import captured, default_iterations
from auditlib.engine.audit import run_audit
from auditlib.models import ModelSpec
from benchmarks.common import ROOT, machine
from benchmarks.reproduce_attacks import photograph, spec_of

CASES = {
    "lenet": ModelSpec("lenet", 100, (3, 32, 32), init="uniform"),
    "resnet18-32": ModelSpec("resnet18", 10, (3, 32, 32)),
    "resnet18-224": ModelSpec("torchvision:resnet18", 1000, (3, 224, 224)),
}


def one_run(spec, at_once: bool) -> dict:
    result = run_audit(spec, lpips_nets=(), attacks_at_once=at_once)
    summary = result.summary
    return {
        "at_once": at_once,
        "seconds": summary.timing.seconds,
        "steps": summary.timing.iterations,
        "planned_steps": summary.timing.planned_iterations,
        "psnr_mean": summary.metrics.psnr_mean,
        "attacks": [
            {
                "label": a.label,
                "skipped": a.skipped,
                "steps": a.steps,
                "seconds": a.seconds,
                "stop_reason": a.stop_reason,
                "psnr_mean": a.psnr_mean,
                "step": a.step,
                "step_note": a.step_note,
            }
            for a in summary.attacks
        ],
    }


def summary(runs: list[dict]) -> list[dict]:
    rows = []
    for at_once in (False, True):
        mine = [r for r in runs if r["at_once"] is at_once]
        rows.append(
            {
                "attacks": "at once" if at_once else "one after another",
                "runs": len(mine),
                "seconds": statistics.median(r["seconds"] for r in mine),
                "steps": statistics.median(r["steps"] for r in mine),
                "steps_per_s": statistics.median(r["steps"] / r["seconds"] for r in mine),
                "psnr_mean": [round(r["psnr_mean"], 2) for r in mine],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--case", choices=sorted(CASES), default="lenet")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=None, help="default: each attack's")
    parser.add_argument("--seconds", type=float, default=None, help="the run's time budget")
    parser.add_argument(
        "--captured",
        action="store_true",
        help="on CUDA, every attack that can records its step as a CUDA graph without being "
        "asked (attacks.captured.BY_DEFAULT_ON_CUDA)",
    )
    args = parser.parse_args()
    captured.BY_DEFAULT_ON_CUDA = args.captured

    iterations = args.iterations or default_iterations("all", None)
    spec = spec_of(
        CASES[args.case], "all", data=photograph(0), iterations=iterations, seconds=args.seconds
    )
    spec = dataclasses.replace(spec, device=args.device)
    runs = []
    for _ in range(args.rounds):
        for at_once in (False, True):
            runs.append(one_run(spec, at_once))
            print(json.dumps(runs[-1]), flush=True)
    result = {
        "machine": machine(),
        "device": torch.cuda.get_device_name(0) if args.device != "cpu" else args.device,
        "torch": torch.__version__,
        "case": args.case,
        "iterations": iterations,
        "time_budget_s": args.seconds,
        "captured": args.captured,
        "rows": summary(runs),
        "runs": runs,
    }
    name = f"attacks_at_once-{args.device}-{args.case}{'-captured' if args.captured else ''}"
    out = ROOT / "benchmarks" / "results" / f"{name}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    for row in result["rows"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
