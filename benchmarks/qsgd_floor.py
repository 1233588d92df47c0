"""The QSGD twin's floor (``likelihoods.STEP_FLOOR``): the attacker that knows QSGD reads
every bucket at its own step (the exact likelihood, floor 0) or no finer than a fraction of
the release's coarsest step. Per floor: whether the twin's starts stayed finite, its pick's
PSNR, its seconds; the plain attack beside it.

Why: under QSGD's default 8 bits on LeNet's 100 classes, the rows of the classes the model
all but rules out have steps of 1e-13 where the coarsest is 0.1, and read exactly every
start of DLG's twin left float32's finite numbers within 16 steps.

Case: DLG's (``benchmarks.common.lenet_spec``): LeNet, 100 classes, one photograph (the
bundled set's first four), the audit preset, seed 0, no control, no LPIPS; DLG 60 steps,
IG 300. Writes benchmarks/results/qsgd_floor.json.

--privacy-row reruns instead the privacy table's 4-bit row (docs/REPRODUCTION.md,
``benchmarks.reproduce_defenses``: DLG, IG and GRNN at its budgets) with the floor, each
judged beside its control from that table's AMD rerun
(benchmarks/results/defenses-privacy-2026-12-03.json); it writes
benchmarks/results/qsgd_floor-privacy-row.json.
The table goes between the qsgd-floor markers of docs/ALGORITHMS.md (--render-only: from
the saved JSON).
--classes N (not 100) runs the same cases on LeNet with N classes into
benchmarks/results/qsgd_floor-N-classes.json, leaving the doc's table as it is.
Usage: python -m benchmarks.qsgd_floor [--offsets 4] [--classes 100] [--privacy-row]
       [--render-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

from auditlib import likelihoods
from auditlib.engine.audit import run_audit
from auditlib.spec import ComponentSpec
from benchmarks.common import ROOT, lenet_spec, plain_and_twin, replace_section, write_results
from benchmarks.reproduce_attacks import audit
from benchmarks.reproduce_defenses import ATTACKS, judged, privacy_spec, verdict_cell

CONTROLS = ROOT / "benchmarks" / "results" / "defenses-privacy-2026-12-03.json"
RESULTS = ROOT / "benchmarks" / "results" / "qsgd_floor.json"
DOC = ROOT / "docs" / "ALGORITHMS.md"

# (attack, its steps, bits, the floors compared): every floor on DLG's 8 bits, the exact
# likelihood against the chosen floor elsewhere.
CASES = (
    ("dlg", 60, 8, (0.0, 0.01, 0.1, 1.0)),
    ("dlg", 60, 4, (0.0, 0.1)),
    ("ig", 300, 8, (0.0, 0.1)),
    ("ig", 300, 4, (0.0, 0.1)),
)


def _case(attack: str, iterations: int, bits: int, offset: int, floor: float, classes: int) -> dict:
    spec = lenet_spec(
        attack,
        num_classes=classes,
        iterations=iterations,
        offset=offset,
        defense=ComponentSpec.of("quantize", {"bits": bits}),
    )
    spec = dataclasses.replace(spec, attack=ComponentSpec.of(attack, preset="audit"))
    chosen = likelihoods.STEP_FLOOR
    likelihoods.STEP_FLOOR = floor  # read by QsgdLikelihood.read when the release is built
    try:
        started = time.perf_counter()
        summary = run_audit(spec, lpips_nets=()).summary
        wall = time.perf_counter() - started
    finally:
        likelihoods.STEP_FLOOR = chosen
    row = {"attack": attack, "bits": bits, "offset": offset, "floor": floor, "classes": classes}
    row["run_wall_s"] = wall
    return {**row, **plain_and_twin(summary)}


def privacy_row() -> None:
    controls = {
        r["attack"]: r for r in json.loads(CONTROLS.read_text())["rows"] if r["defense"] == "none"
    }
    rows = []
    for attack, preset, iterations in ATTACKS:
        spec = privacy_spec(attack, preset, iterations, ComponentSpec.of("quantize", {"bits": 4}))
        row = audit(spec, setting="quantize (bits=4)")
        row["verdict_beside_control"] = verdict_cell(judged(row, controls[attack]))
        print(attack, row["by_attack"], row["verdict_beside_control"], flush=True)
        rows.append(row)
    write_results(
        ROOT / "benchmarks" / "results" / "qsgd_floor-privacy-row.json",
        "cpu",
        None,
        floor=likelihoods.STEP_FLOOR,
        controls=str(CONTROLS.relative_to(ROOT)),
        rows=rows,
    )


def render(rows: list[dict]) -> str:
    """Per attack, bits and floor: the plain attack's mean PSNR, the twin's, how many of the
    runs' twins diverged (every start), and the twin's mean seconds."""
    lines = [
        "| attack | QSGD bits | floor | plain: PSNR | twin: PSNR | twins diverged | twin: s |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in dict.fromkeys((r["attack"], r["bits"], r["floor"]) for r in rows):
        runs = [r for r in rows if (r["attack"], r["bits"], r["floor"]) == key]
        diverged = sum(r["twin"]["stop_reason"] == "diverged" for r in runs)
        floor = "0 (exact)" if key[2] == 0 else f"{key[2]:g}"
        lines.append(
            f"| {key[0]} | {key[1]} | {floor} | "
            f"{statistics.mean(r['plain']['psnr_mean'] for r in runs):.2f} dB | "
            f"{statistics.mean(r['twin']['psnr_mean'] for r in runs):.2f} dB | "
            f"{diverged} of {len(runs)} | "
            f"{statistics.mean(r['twin']['seconds'] for r in runs):.1f} |"
        )
    return "\n".join(lines)


def write_doc() -> None:
    saved = json.loads(RESULTS.read_text())
    table = render(saved["rows"]) + f"\n\nMeasured on: {saved['machine']}."
    replace_section(DOC, "qsgd-floor", table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offsets", type=int, default=4, help="photographs, from the first")
    parser.add_argument("--classes", type=int, default=100, help="LeNet's classes")
    parser.add_argument("--privacy-row", action="store_true", help="see the module's text")
    parser.add_argument("--render-only", action="store_true", help="the table from the JSON")
    args = parser.parse_args()
    if args.privacy_row:
        privacy_row()
        return
    if args.render_only:
        write_doc()
        return
    rows = []
    for attack, iterations, bits, floors in CASES:
        for offset in range(args.offsets):
            for floor in floors:
                row = _case(attack, iterations, bits, offset, floor, args.classes)
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.classes != 100:
        path = RESULTS.with_name(f"qsgd_floor-{args.classes}-classes.json")
        write_results(path, "cpu", None, chosen=likelihoods.STEP_FLOOR, rows=rows)
        print(render(rows))
        return
    write_results(RESULTS, "cpu", None, chosen=likelihoods.STEP_FLOOR, rows=rows)
    write_doc()


if __name__ == "__main__":
    main()
