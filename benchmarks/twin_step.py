"""The L-BFGS attacks' twin (the attacker that knows the defense) on DLG's fixed step and on
a strong Wolfe search (``attacks.dlg.LBFGS_TWIN``), defense by defense: whether its starts
stayed finite, its pick's PSNR, its seconds; the plain attack beside them.

Why: DLG's twin under DP noise of sigma 10 diverged on every start within a few steps (its
objective is the noise's likelihood plus the image prior, not DLG's), and the verdict then
said the defense held against it ("Low").

Case: DLG's (``benchmarks.common.lenet_spec``): LeNet, 100 classes, one photograph, the
audit preset (8 starts raced), 60 steps a start, seed 0, no control, no LPIPS.
Writes benchmarks/results/twin_step.json.
Usage: python -m benchmarks.twin_step [--iterations 60]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from auditlib.attacks import ATTACKS
from auditlib.engine.audit import run_audit
from auditlib.spec import ComponentSpec
from benchmarks.common import ROOT, lenet_spec, plain_and_twin, write_results

DEFENSES = (
    ("dp-gaussian", {"sigma": 0.01}),
    ("dp-gaussian", {"sigma": 0.1}),
    ("dp-gaussian", {"sigma": 1.0}),
    ("dp-gaussian", {"sigma": 10.0}),
    ("dp-laplace", {"scale": 0.01}),
    ("quantize", {}),
    ("prune", {"ratio": 0.9}),
    ("soteria", {}),
)
STEPS = {"fixed step (DLG's)": {}, "strong Wolfe (the twin's)": dict(ATTACKS["dlg"].twin_params)}


def _case(defense: str, params: dict, twin_params: dict, iterations: int) -> dict:
    spec = lenet_spec("dlg", iterations=iterations, defense=ComponentSpec.of(defense, params))
    spec = dataclasses.replace(spec, attack=ComponentSpec.of("dlg", preset="audit"))
    started = time.perf_counter()
    summary = run_audit(spec, lpips_nets=()).summary
    wall = time.perf_counter() - started
    return {
        "defense": defense,
        "params": params,
        "twin_params": twin_params,
        **plain_and_twin(summary),
        "run_wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60)
    args = parser.parse_args()
    own = ATTACKS["dlg"]
    rows = []
    try:
        for defense, params in DEFENSES:
            for name, twin_params in STEPS.items():
                ATTACKS["dlg"] = dataclasses.replace(own, twin_params=twin_params)
                row = {"twin_step": name, **_case(defense, params, twin_params, args.iterations)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        ATTACKS["dlg"] = own
    write_results(
        ROOT / "benchmarks" / "results" / "twin_step.json",
        "cpu",
        None,
        iterations=args.iterations,
        rows=rows,
    )


if __name__ == "__main__":
    main()
