"""A sample audit's updates together against one after another, through the engine.

DLG's setting (LeNet, sigmoid, U(-0.5, 0.5) init, 100 classes, bundled 32x32 photographs,
batch 1, FedSGD): 16 updates (one photograph each, ``engine.sample.update_specs``), each at
its attack's audit preset (DLG: 8 L-BFGS starts raced, 300 steps; IG: 4 signed-Adam starts
raced, 300 steps; GradInversion, ``--attacks gi``, on ResNet-20 since its prior needs
BatchNorm: 4 Adam starts raced, 300 steps), no time budget. Two arms, interleaved in each
repetition:

- apart: ``engine.audit.run_audit`` on each update in turn (the sample audit's path before;
  each update's own starts already advance together);
- together: ``engine.together.audit_together`` on the 16 (every update's starts rows of one
  batched computation, each with its own target and its own race).

Both arms do the whole run per update (victim, release, attack, scores, verdict; LPIPS
off). Reported per arm, the median of the repetitions: wall time, updates per second, and
the share of images recovered beyond the best guess (``metrics.sample.SampleVerdict``, the
sample audit's figure); the throughput ratio is apart's wall time over together's.
``--starts-apart`` runs the apart arm as the audit ran when issue 34 was filed: each
update's starts one after another too (DLG's ``together=false``, torch's own L-BFGS).
``--profile`` splits one together run's time into the attack's steps (within them the
batched objective and, for DLG, the L-BFGS directions) and the rest.

Writes benchmarks/results/updates_together.json and the table in docs/PERFORMANCE.md.

Usage: python -m benchmarks.updates_together [--quick] [--repeats 5] [--updates 16]
       [--attacks dlg,ig] [--threads 1] [--profile]
(a run of some attacks keeps the other attacks' rows in the results and the table;
--from-log LOG1,LOG2 makes them from runs printed with --no-doc)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import torch

from auditlib.attacks import ATTACKS
from auditlib.attacks.lbfgs_batched import BatchedLbfgs
from auditlib.attacks.lbfgs_histories import Histories
from auditlib.attacks.objectives import UpdateMatcher
from auditlib.attacks.updates import _Rows
from auditlib.engine.audit import run_audit
from auditlib.engine.sample import update_specs
from auditlib.engine.together import audit_together
from auditlib.metrics.sample import SampleVerdict, UpdateOutcome
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, ModelRef
from benchmarks.common import (
    ROOT,
    UNRECORDED,
    add_log_arguments,
    lenet_spec,
    logged_machine,
    machine,
    on_device,
    read_log,
    replace_section,
    write_results,
)
from benchmarks.lbfgs_together import _timed

RESULTS = ROOT / "benchmarks" / "results" / "updates_together.json"
DOC = ROOT / "docs" / "PERFORMANCE.md"


# GradInversion's prior is BatchNorm's statistics: it runs on the registry's ResNet-20 (train
# mode, the client's default), the same photographs at 32x32, 100 classes.
MODELS = {"gi": ModelSpec("resnet20", 100, (3, 32, 32))}


# The one-after-another arm as the audit ran when issue 34 was filed: each update's starts
# one after another too, on torch's own L-BFGS (DLG's ``together=false``).
STARTS_APART = ", starts apart"


def _specs(attack: str, updates: int, steps: int, device: str = "cpu", starts_apart=False):
    base = dataclasses.replace(
        lenet_spec(attack),
        attack=ComponentSpec.of(attack, {"together": False} if starts_apart else {}, "audit"),
        budget=Budget(steps),
        device=device,
    )
    if attack in MODELS:
        base = dataclasses.replace(base, model=ModelRef(MODELS[attack]))
    return update_specs(base, updates)


def _label(attack: str) -> str:
    model = MODELS.get(attack.removesuffix(STARTS_APART))
    return attack if model is None else f"{attack} ({model.architecture})"


def _verdict(results) -> SampleVerdict:
    return SampleVerdict(
        tuple(
            UpdateOutcome.of(
                i, r.summary.verdict, r.summary.metrics.per_image, r.summary.timing.seconds
            )
            for i, r in enumerate(results)
        )
    )


def _run(specs, together: bool) -> dict:
    start = time.perf_counter()
    if together:
        results, notes = audit_together(specs, lpips_nets=())
        words = [n.words for n in notes]
    else:
        results, words = [run_audit(s, lpips_nets=()) for s in specs], []
    seconds = time.perf_counter() - start
    sample = _verdict(results)
    return {
        "seconds": seconds,
        "updates_per_s": len(specs) / seconds,
        "recovered": sample.images_recovered,
        "images": sample.images,
        "share": sample.share,
        "psnr": [u.worst_psnr for u in sample.updates],
        "steps": sum(r.summary.timing.iterations for r in results),
        "notes": words,
        "load": os.getloadavg()[0],
    }


def measure(
    attack: str,
    updates: int,
    steps: int,
    repeats: int,
    device: str = "cpu",
    apart: int = 0,
    starts_apart: bool = False,
) -> dict:
    """Both arms ``repeats`` times, interleaved; ``apart`` > 0 runs the one-after-another arm
    on the first ``apart`` updates only (each update's run is independent of the others, so
    its updates per second are the same: used where the whole arm would not fit a lent GPU's
    time), and the ratio is of updates per second. ``starts_apart``: the one-after-another
    arm also runs each update's starts one after another (``STARTS_APART``; the row is
    labelled so)."""
    specs = _specs(attack, updates, steps, device)
    one_by_one = _specs(attack, updates, steps, device, True) if starts_apart else specs
    one_by_one = one_by_one[: apart or updates]
    label = attack + (STARTS_APART if starts_apart else "")
    # Lazy imports, allocator: each arm once, on 2 updates of 2 steps.
    _run(_specs(attack, 2, 2, device), True)
    _run(_specs(attack, 2, 2, device, starts_apart), False)
    arms: dict[bool, list[dict]] = {False: [], True: []}
    for _ in range(repeats):
        for together in (False, True):
            arms[together].append(_run(specs if together else one_by_one, together))
            # Each run as one JSON line: a run cut off (a lent GPU's time) keeps what it
            # measured, and --from-log makes the rows from those lines.
            print(
                json.dumps({"attack": label, "together": together, **arms[together][-1]}),
                flush=True,
            )
    return _row(label, updates, steps, arms)


def _row(attack: str, updates: int, steps: int, arms: dict[bool, list[dict]]) -> dict:
    """Both arms' runs as one row: per arm the median of its runs (the first run's share)."""

    def median(together: bool, key: str) -> float:
        return statistics.median(r[key] for r in arms[together])

    repeats = min(len(arms[False]), len(arms[True]))
    row = {"attack": attack, "updates": updates, "steps": steps, "repeats": repeats}
    row["apart_updates"] = arms[False][0]["images"] * updates // arms[True][0]["images"]
    for together, name in ((False, "apart"), (True, "together")):
        row[name] = {k: median(together, k) for k in ("seconds", "updates_per_s", "load")}
        first = arms[together][0]
        row[name].update({k: first.get(k) for k in ("recovered", "images", "share", "psnr")})
        row[name]["runs"] = arms[together]
    row["notes"] = arms[True][0]["notes"]
    row["throughput_ratio"] = row["together"]["updates_per_s"] / row["apart"]["updates_per_s"]
    return row


def from_log(path: str, updates: int, steps: int) -> tuple[list[dict], list[dict]]:
    """The rows and profiles of an earlier run from the JSON lines it printed (one per
    finished run, one per profile), for a run cut off before it wrote its results, or runs
    measured separately; an attack with an arm that never finished has no row (said on
    stderr)."""
    arms: dict[str, dict[bool, list[dict]]] = {}
    runs, profiles = read_log(path)
    for run in runs:
        arms.setdefault(run.pop("attack"), {False: [], True: []})[run.pop("together")].append(run)
    rows = []
    for attack, runs in arms.items():
        if runs[False] and runs[True]:
            rows.append(_row(attack, updates, steps, runs))
        else:
            print(f"{attack}: an arm never finished in {path}; no row", file=sys.stderr)
    return rows, profiles


def _stepping(attack: str) -> type:
    """The class whose ``step`` is one step of every row of ``attack`` (its stacked starts)."""
    from auditlib.attacks import (
        dlg,
        fedleak_step,
        gradinversion,
        grnn_restarts,
        inverting_gradients,
    )

    steppers = {
        "dlg": dlg._Starts,
        "ig": inverting_gradients._Restarts,
        "fedleak": fedleak_step.Restarts,
        "grnn": grnn_restarts.GrnnRestarts,
        "gi": gradinversion._Rows,
    }
    return steppers[attack]


def profile(attack: str, updates: int, steps: int, device: str = "cpu") -> dict:
    """Where one together run's time goes: the attack's steps (every row's objective, its
    backward, the optimiser; for DLG the batched L-BFGS with its per-start logic), within
    them the batched objective (DLG: each evaluation with its backward; the others: the
    forward ``vmap`` pass and the distances, their backward being outside) and the L-BFGS
    directions (DLG), and the rest (victims, releases, scores, events, races)."""
    bucket: dict[str, float] = {}
    undo = [
        _timed(_stepping(attack), "step", bucket),
        # The rows' forward pass (GradInversion's with its BatchNorm statistics) and distances.
        _timed(UpdateMatcher, "recorded_updates", bucket),
        _timed(_Rows, "measured", bucket),
        _timed(BatchedLbfgs, "_evaluate", bucket),
        _timed(Histories, "direction", bucket),
    ]
    try:
        run = _run(_specs(attack, updates, steps, device), True)
    finally:
        for u in undo:
            u()
    total = run["seconds"]
    objective = bucket.get("_evaluate", 0.0) or (
        bucket.get("recorded_updates", 0.0) + bucket.get("measured", 0.0)
    )
    found = {
        "attack": attack,
        "seconds": total,
        "attack_share": bucket.get("step", 0.0) / total,
        "objective_share": objective / total,
        "direction_share": bucket.get("direction", 0.0) / total,
        "rest_share": 1 - bucket.get("step", 0.0) / total,
    }
    print(json.dumps({"profile": found}), flush=True)  # for --from-log
    return found


def scaling(sizes=(1, 8, 16, 32, 64, 128), device: str = "cpu") -> list[dict]:
    """The cost of one batched DLG objective evaluation (forward and backward, the images'
    and label logits' gradients) per row, at K rows: where batching stops paying."""
    from auditlib.attacks.objectives import UpdateMatcher
    from auditlib.engine.audit import prepare_run

    run = prepare_run(dataclasses.replace(lenet_spec("dlg"), device=device))
    release = run.release
    matcher = UpdateMatcher(release.observation, release.knowledge, "l2")
    generator = torch.Generator().manual_seed(0)

    def evaluate(matcher, images: torch.Tensor, logits: torch.Tensor) -> None:
        labels = torch.softmax(logits, -1)
        if images.shape[0] == 1:  # one start: plain autograd, as the attacks do alone
            loss = matcher(images[0], labels[0])
        else:
            loss = matcher.together(images, labels).sum()
        torch.autograd.grad(loss, [images, logits])

    def synchronize() -> None:
        if device != "cpu":
            torch.cuda.synchronize()

    rows = []
    for k in sizes:
        images = torch.randn(k, 1, 3, 32, 32, generator=generator).to(device).requires_grad_(True)
        logits = torch.randn(k, 1, 100, generator=generator).to(device).requires_grad_(True)
        evaluate(matcher, images, logits)
        repeats = max(5, 256 // k)
        synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            evaluate(matcher, images, logits)
        synchronize()
        seconds = (time.perf_counter() - start) / repeats
        rows.append(
            {"rows": k, "ms_per_evaluation": 1e3 * seconds, "ms_per_row": 1e3 * seconds / k}
        )
    return rows


def table(
    rows: list[dict],
    profiled: list[dict],
    scaled: list[dict] | None = None,
    measured_on: str | None = None,
) -> str:
    lines = [
        "| attack (audit preset) | updates | steps per start | arm | wall time (s) | "
        "updates/s | recovered (share) | throughput ratio | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for arm in ("apart", "together"):
            a = r[arm]
            ratio = f"{r['throughput_ratio']:.2f}x" if arm == "together" else "-"
            updates = r.get("apart_updates", r["updates"]) if arm == "apart" else r["updates"]
            lines.append(
                f"| {_label(r['attack'])} | {updates} | {r['steps']} | {arm} | {a['seconds']:.1f} | "
                f"{a['updates_per_s']:.3f} | {a['recovered']}/{a['images']} ({a['share']:.0%}) | "
                f"{ratio} | {a['load']:.1f} |"
            )
    text = "\n".join(lines)
    for p in profiled:
        if "attack_share" not in p:  # an earlier run's split, which counted IG's backward as rest
            continue
        lbfgs = p["attack"] == "dlg"
        within = f"batched objective, {'with its backward' if lbfgs else 'forward'}, "
        within += f"{p['objective_share']:.0%}"
        within += f"; L-BFGS directions {p['direction_share']:.0%}" if lbfgs else ""
        text += (
            f"\n\nOne together run of {_label(p['attack'])} ({p['seconds']:.1f} s): the attack's steps "
            f"{p['attack_share']:.0%} ({within}), the rest (victims, releases, scores, events, "
            f"races) {p['rest_share']:.0%}."
        )
    if scaled:
        text += (
            "\n\nOne batched DLG objective evaluation (forward and backward) at K rows: "
            + (", ".join(f"K = {r['rows']}: {r['ms_per_row']:.2f} ms per row" for r in scaled))
            + "."
        )
    repeats = " and ".join(f"{r['repeats']}" for r in rows)
    return text + (
        f"\n\nMedian of {repeats} interleaved repetitions (the load column: the median 1-minute "
        f"load average at the end of each run). Measured on: {measured_on or machine()}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 updates, 10 steps, 1 repeat")
    parser.add_argument("--attacks", default="dlg,ig")
    parser.add_argument("--updates", type=int, default=16)
    parser.add_argument("--steps", type=int, default=300, help="steps per start")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--scaling", action="store_true", help="also time one batched evaluation per row count"
    )
    parser.add_argument("--no-doc", action="store_true", help="print only; leave the docs")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (its own table)")
    parser.add_argument(
        "--apart-updates",
        type=int,
        default=0,
        help="run the one-after-another arm on the first N updates only (0: all); the "
        "ratio is of updates per second",
    )
    parser.add_argument(
        "--starts-apart",
        action="store_true",
        help="the one-after-another arm runs each update's starts one after another too "
        "(DLG's together=false: the audit as issue 34 found it)",
    )
    add_log_arguments(parser, "--updates, --steps and --device")
    parser.add_argument(
        "--despite-no-cpu-gain",
        action="store_true",
        help="the together arm batches even an attack whose AttackInfo.no_cpu_gain keeps a "
        "CPU sample's updates apart (to measure that claim again)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.despite_no_cpu_gain:
        for name, info in list(ATTACKS.items()):
            ATTACKS[name] = dataclasses.replace(info, no_cpu_gain=None)
    updates, steps, repeats = (4, 10, 1) if args.quick else (args.updates, args.steps, args.repeats)
    measured_on = None
    if args.from_log:
        rows, profiled, scaled = [], [], []
        for log in args.from_log.split(","):  # one run's log, or several runs' (by attack)
            found = from_log(log, updates, steps)
            rows, profiled = rows + found[0], profiled + found[1]
        attacks = [r["attack"] for r in rows]
        measured_on = args.measured_on or logged_machine(args.from_log) or UNRECORDED
    else:
        print(json.dumps({"machine": machine()}), flush=True)
        attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
        rows = [
            measure(a, updates, steps, repeats, args.device, args.apart_updates, args.starts_apart)
            for a in attacks
        ]
        profiled = (
            [profile(a, updates, steps, args.device) for a in attacks] if args.profile else []
        )
        scaled = scaling(device=args.device) if args.scaling else []
    text = table(rows, profiled, scaled, measured_on)
    print(text)
    if args.quick or args.no_doc:
        return
    # Rows of the attacks not rerun are kept (DLG and IG may be measured in separate runs,
    # with their own repetitions); the table is made from all of them.
    results, marker = on_device(RESULTS, "updates-together", args.device)
    kept = json.loads(results.read_text()) if results.exists() else {"rows": [], "profile": []}
    measured = {r["attack"] for r in rows}
    rows = [r for r in kept["rows"] if r["attack"] not in measured] + rows
    profiled = [p for p in kept.get("profile", []) if p["attack"] not in attacks] + profiled
    order = {"dlg": 0, "ig": 1}
    rows.sort(key=lambda r: order.get(r["attack"], 2))
    profiled.sort(key=lambda p: order.get(p["attack"], 2))
    scaled = scaled or kept.get("scaling", [])
    write_results(results, args.device, measured_on, rows=rows, profile=profiled, scaling=scaled)
    replace_section(DOC, marker, table(rows, profiled, scaled, measured_on))


if __name__ == "__main__":
    main()
