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
import statistics
import time
from dataclasses import dataclass

import torch

from auditlib.attacks import ProgressEvent, RunControl, build_attack_config, get_attack
from auditlib.attacks.base import snapshot
from auditlib.client.protocol import ClientProtocol
from auditlib.defenses import build_defense
from auditlib.engine.audit import prepare_victim
from auditlib.fl.scenario import release_update
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from benchmarks.common import ROOT, machine, replace_section


@dataclass(frozen=True)
class Case:
    label: str
    model: ModelSpec
    batch: int
    steps: dict[str, int]  # steps timed per attack (iDLG is defined for batch 1 only)
    repeats: int  # alternating quiet / every-step runs; medians are reported


CASES = (
    Case(
        "LeNet 32x32, batch 1",
        ModelSpec("lenet", 100, (3, 32, 32), init="uniform"),
        1,
        {
            "dlg": 60,
            "idlg": 60,
            "ig": 1000,
            "gi": 300,
            "grnn": 100,
            "dlm": 10,
            "dlm+": 10,
            "fedleak": 100,
        },
        3,
    ),
    Case(
        "ResNet-18 32x32, batch 4",
        ModelSpec("resnet18", 10, (3, 32, 32)),
        4,
        {"dlg": 2, "ig": 10, "gi": 10, "grnn": 10, "dlm+": 1, "fedleak": 5},
        1,
    ),
    Case(
        "ResNet-10 32x32, batch 16",
        ModelSpec("resnet10", 10, (3, 32, 32)),
        16,
        {"ig": 10, "gi": 10, "grnn": 10, "fedleak": 5},
        1,
    ),
)

# DLM's observation is the weights after FedAvg local training (its paper: several local
# steps); every other attack is timed on a FedSGD gradient.
FEDAVG = ClientProtocol("fedavg", local_steps=5, local_lr=0.01, shared="weights")
PROTOCOL_OF = {"dlm": FEDAVG, "dlm+": FEDAVG}


def release_for(case: Case, device: str, protocol: ClientProtocol):
    spec = RunSpec(
        model=ModelRef(case.model),
        data=DataSpec("samples", "photographs", batch_size=min(case.batch, 17)),
        scenario=ScenarioSpec(protocol=protocol),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(1),
        device=device,
    )
    victim = prepare_victim(spec)
    return release_update(
        victim.model,
        victim.batch,
        protocol,
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


def event_cost_s(release, repeats: int = 2000) -> float:
    """Seconds to build one progress event carrying an image snapshot and labels: the work
    an attack adds to a step when it reports (measured directly, free of run-to-run noise)."""
    images = torch.randn(release.knowledge.batch_size, *release.knowledge.input_shape)
    labels = torch.zeros(release.knowledge.batch_size, dtype=torch.long)
    start = time.perf_counter()
    for step in range(repeats):
        ProgressEvent(
            step,
            repeats,
            0.0,
            {"loss": float(images[0, 0, 0, 0])},
            0,
            snapshot(images),
            labels.cpu(),
        )
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--no-docs", action="store_true", help="print only; leave docs/PERFORMANCE.md alone"
    )
    parser.add_argument("--attacks", nargs="*", help="only these attacks (default: all)")
    args = parser.parse_args()

    rows = []
    for case in CASES:
        releases: dict[ClientProtocol, object] = {}
        for name, steps in case.steps.items():
            if args.attacks and name not in args.attacks:
                continue
            protocol = PROTOCOL_OF.get(name, ClientProtocol())
            if protocol not in releases:
                releases[protocol] = release_for(case, args.device, protocol)
            release = releases[protocol]
            quiet, default, chatty = [], [], []
            for _ in range(case.repeats):
                quiet.append(timed(name, release, steps, emit_every=10**9, image_every=10**9))
                default.append(timed(name, release, steps, emit_every=10, image_every=50))
                chatty.append(timed(name, release, steps, emit_every=1, image_every=1))
            q = statistics.median(r["seconds"] for r in quiet)
            d = statistics.median(r["seconds"] for r in default)
            c = statistics.median(r["seconds"] for r in chatty)
            per_event = event_cost_s(release)
            rows.append(
                {
                    "event_cost_s": per_event,
                    # events every 10 steps, an image with every 5th of them
                    "default_share": per_event / 10 / (q / steps),
                    "case": case.label,
                    "attack": name,
                    "steps": steps,
                    "repeats": case.repeats,
                    "quiet": quiet,
                    "every_step": chatty,
                    "default_intervals": default,
                    "quiet_median_s": q,
                    "default_median_s": d,
                    "every_step_median_s": c,
                    "event_overhead": c / q - 1,
                    "default_overhead": d / q - 1,
                }
            )
            print(json.dumps(rows[-1]))

    out = ROOT / "benchmarks" / "results"
    saved = out / f"throughput-{args.device}.json"
    if args.attacks and saved.exists():
        # A partial run replaces its own rows and keeps the others' earlier measurements.
        fresh = {(r["case"], r["attack"]) for r in rows}
        earlier = json.loads(saved.read_text())["rows"]
        kept = [r for r in earlier if (r["case"], r["attack"]) not in fresh]
        order = [(c.label, a) for c in CASES for a in c.steps]
        rows = sorted(kept + rows, key=lambda r: order.index((r["case"], r["attack"])))
    results = {"machine": machine(), "device": args.device, "rows": rows}
    out.mkdir(exist_ok=True)
    (out / f"throughput-{args.device}.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "| configuration | attack | steps timed × runs | steps/s | objective evaluations/s | "
        "one event with images (µs) | its share of the attack's time, event every 10 steps (default) | "
        "measured difference of whole runs, default intervals | same, event + image every step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        evaluations = r["quiet"][0]["evaluations"]
        evals = f"{evaluations / r['quiet_median_s']:.1f}" if evaluations else "= steps/s"
        lines.append(
            f"| {r['case']} | {r['attack']} | {r['steps']} × {r['repeats']} | "
            f"{r['steps'] / r['quiet_median_s']:.2f} | {evals} | {1e6 * r['event_cost_s']:.0f} | {100 * r['default_share']:.3f}% | "
            f"{100 * r['default_overhead']:+.1f}% | {100 * r['event_overhead']:+.1f}% |"
        )
    lines += ["", f"Device: {args.device}. Machine: {results['machine']}."]
    print("\n".join(lines))
    if not args.no_docs:
        replace_section(
            ROOT / "docs" / "PERFORMANCE.md", f"throughput-{args.device}", "\n".join(lines)
        )


if __name__ == "__main__":
    main()
