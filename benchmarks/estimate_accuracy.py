"""The time estimate beside the real time, on this machine (issue 52).

For each case the run's estimate (``engine.preflight.estimate_time``: a few real steps of its
attacks, measured) and then the run itself (``engine.audit.run_audit``): the seconds the
estimate said the attacks take (the budget's cut included), the seconds they took
(``timing.seconds``), their ratio, the planned steps the estimate counted and the run's own
count (``timing.planned_iterations``), and what the estimate itself took. Cases: LeNet with
DLG at its audit settings (the dashboard's default), the same from PyTorch's default
initialisation, the built-in ResNet-18 at 32 px with
IG's audit settings, torchvision's resnet18 at 64 px with IG, and the same under a 20 s
budget that stops it.

Writes benchmarks/results/estimate_accuracy.json and prints it.
Usage: python -m benchmarks.estimate_accuracy [--case lenet_dlg ...]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from auditlib.engine.audit import run_audit
from auditlib.engine.preflight import estimate_time
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from benchmarks.common import ROOT, machine

RESULTS = ROOT / "benchmarks" / "results" / "estimate_accuracy.json"


def _spec(
    architecture: str,
    side: int,
    attack: str,
    preset: str,
    iterations: int,
    seconds=None,
    init: str = "default",
) -> RunSpec:
    return RunSpec(
        model=ModelRef(ModelSpec(architecture, 10, (3, side, side), init=init)),
        data=DataSpec("samples", "photographs", batch_size=1),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of(attack, preset=preset),
        defense=ComponentSpec.of("none"),
        budget=Budget(iterations, max_seconds=seconds),
    )


CASES = {
    # The dashboard's defaults: DLG's audit preset, 8 starts raced over 300 steps each, on
    # LeNet of 10 classes from the DLG paper's U(-0.5, 0.5) initialisation.
    "lenet_dlg_audit": lambda: _spec("lenet", 32, "dlg", "audit", 300, init="uniform"),
    # The same from PyTorch's default initialisation: its starts converge within the race,
    # and an L-BFGS step that has converged ends after one or two evaluations.
    "lenet_default_init_dlg_audit": lambda: _spec("lenet", 32, "dlg", "audit", 300),
    "resnet18_32px_ig_audit": lambda: _spec("resnet18", 32, "ig", "audit", 100),
    # At 64 px: at 32 its last BatchNorm sees one value per channel for one image (refused).
    "torchvision_resnet18_64px_ig": lambda: _spec("torchvision:resnet18", 64, "ig", "paper", 30),
    "torchvision_resnet18_64px_ig_20s": lambda: _spec(
        "torchvision:resnet18", 64, "ig", "paper", 300, 20.0
    ),
}


def measure(name: str) -> dict[str, object]:
    spec = CASES[name]()
    started = time.perf_counter()
    estimate = estimate_time(spec)
    estimating_s = time.perf_counter() - started
    assert estimate is not None
    timing = run_audit(spec, lpips_nets=()).summary.timing
    return {
        "case": name,
        "estimate_words": estimate.words(),
        "estimated_s": round(estimate.expected_s, 2),
        "real_s": round(timing.seconds, 2),
        "real_over_estimate": round(timing.seconds / estimate.expected_s, 2),
        "estimate_planned_steps": estimate.planned_steps,
        "run_planned_steps": timing.planned_iterations,
        "run_steps": timing.iterations,
        "estimate_took_s": round(estimating_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    args = parser.parse_args()
    rows = [measure(name) for name in args.case or CASES]
    out = {"machine": machine(), "load_average": os.getloadavg(), "cases": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
