"""Attack inner-loop throughput and the cost of progress events, on fixed configurations.

For each attack and configuration: optimiser steps per second (for L-BFGS also objective
evaluations per second, since one step makes up to 20), after one warm-up step that pays
one-off costs (imports, allocator). Then the event overhead: the same run with an event and
an image snapshot at every step versus events switched off.

Writes benchmarks/results/throughput.json and the table in docs/PERFORMANCE.md.
Usage: python benchmarks/attack_throughput.py [--device cpu|cuda] [--no-docs]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import torch

from auditlib.attacks import RunControl, build_attack_config, get_attack
from auditlib.defenses import build_defense
from auditlib.engine.audit import prepare_victim
from auditlib.fl.protocol import ClientProtocol
from auditlib.fl.scenario import release_update
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from benchmarks.common import ROOT, machine, replace_section


@dataclass(frozen=True)
class Case:
    label: str
    model: ModelSpec
    batch: int
    steps: dict[str, int]  # steps timed per attack


CASES = (
    Case(
        "LeNet 32x32, batch 1",
        ModelSpec("lenet", 100, (3, 32, 32), init="uniform"),
        1,
        {"dlg": 20, "idlg": 20, "ig": 200},
    ),
    Case(
        "ResNet-18 32x32, batch 4",
        ModelSpec("resnet18", 10, (3, 32, 32)),
        4,
        {"dlg": 2, "idlg": 0, "ig": 10},
    ),
)


def release_for(case: Case, device: str):
    spec = RunSpec(
        model=ModelRef(case.model),
        data=DataSpec("samples", "photographs", batch_size=case.batch),
        scenario=ScenarioSpec(protocol=ClientProtocol()),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(1),
        device=device,
    )
    victim = prepare_victim(spec)
    return release_update(
        victim.model,
        victim.batch,
        spec.scenario.protocol,
        build_defense("none")[0],
        normalization=victim.normalization,
        num_classes=case.model.num_classes,
        labels_known=False,
        seed=0,
    )


def timed(name: str, release, steps: int, emit_every: int, image_every: int) -> dict:
    config, _ = build_attack_config(name)
    run = get_attack(name).run
    # Warm-up: one step pays the one-off costs (torch.optim imports torch._dynamo lazily).
    for _ in run(release.observation, release.knowledge, config, RunControl(1), 0):
        pass
    control = RunControl(steps, emit_every=emit_every, image_every=image_every)
    events = 0
    evaluations = None
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    for event in run(release.observation, release.knowledge, config, control, 0):
        events += 1
        evaluations = event.losses.get("evaluations", evaluations)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {
        "steps": steps,
        "seconds": seconds,
        "steps_per_second": steps / seconds,
        "events": events,
        "evaluations": evaluations,
        "evaluations_per_second": evaluations / seconds if evaluations else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--no-docs", action="store_true", help="print only; leave docs/PERFORMANCE.md alone"
    )
    args = parser.parse_args()

    rows = []
    for case in CASES:
        release = release_for(case, args.device)
        for name, steps in case.steps.items():
            if steps == 0:
                continue
            quiet = timed(name, release, steps, emit_every=10**9, image_every=10**9)
            chatty = timed(name, release, steps, emit_every=1, image_every=1)
            rows.append(
                {
                    "case": case.label,
                    "attack": name,
                    "quiet": quiet,
                    "every_step": chatty,
                    "event_overhead": chatty["seconds"] / quiet["seconds"] - 1,
                }
            )
            print(json.dumps(rows[-1]))

    results = {"machine": machine(), "device": args.device, "rows": rows}
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / f"throughput-{args.device}.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "| configuration | attack | steps timed | steps/s | objective evaluations/s | overhead of an event + image every step |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        q = r["quiet"]
        evals = f"{q['evaluations_per_second']:.1f}" if q["evaluations_per_second"] else "= steps/s"
        lines.append(
            f"| {r['case']} | {r['attack']} | {q['steps']} | {q['steps_per_second']:.2f} | {evals} | {100 * r['event_overhead']:+.1f}% |"
        )
    lines += ["", f"Device: {args.device}. Machine: {results['machine']}."]
    print("\n".join(lines))
    if not args.no_docs:
        replace_section(
            ROOT / "docs" / "PERFORMANCE.md", f"throughput-{args.device}", "\n".join(lines)
        )


if __name__ == "__main__":
    main()
