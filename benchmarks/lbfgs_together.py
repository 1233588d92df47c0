"""DLG's audit preset with its 8 L-BFGS starts together against apart, through the attack.

DLG's setting (LeNet, sigmoid, U(-0.5, 0.5) init, 100 classes, a 32x32 bundled photograph,
batch 1, FedSGD) and its audit preset: 8 starts raced by successive halving, 300 steps per
start (480 L-BFGS steps if none stops early), L-BFGS lr 1, 20 evaluations per step. Each
repetition runs both arms, interleaved: ``together=false`` (each start on torch's own
L-BFGS, one after another: the path before the batched L-BFGS) and ``together=true``
(``attacks.lbfgs_batched``: the 8 starts' evaluations batched through ``vmap``, one
history each). Reported per arm, the median of the repetitions: wall time, start-steps per
second (L-BFGS steps summed over the starts) and objective evaluations per second (summed
likewise), and the PSNR of the attacker's pick (lowest gradient distance; the same every
repetition, the runs are deterministic). ``--profile`` also splits one together run's time
into objective evaluations, two-loop directions and the rest.

Two schedules: the preset's race (successive halving drops the worse half at 3 %, 10 % and
25 % of the steps, so most of its 480 start-steps run with one or two starts left, where
there is nothing to batch: its speed-up is bounded by 480 / 300 = 1.6x however cheap a
batched step is), and the same 8 starts each to the end of a shorter budget (no race:
every step has 8 starts to batch, the batching's own gain).

Writes benchmarks/results/lbfgs_together.json and the table in docs/PERFORMANCE.md.
``--photographs`` instead runs the audit preset on all 17 bundled photographs, starts apart
and together (seed 0, no time budget), and writes their PSNRs side by side.

Usage: python -m benchmarks.lbfgs_together [--quick] [--repeats 5] [--photo 0] [--profile]
       [--threads 2] [--photographs]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable

import torch

from auditlib.attacks import RunControl, build_attack_config, get_attack
from auditlib.attacks.lbfgs_batched import BatchedLbfgs
from auditlib.attacks.lbfgs_histories import Histories
from auditlib.attacks.restarts import run_attack
from auditlib.data.samples import PHOTOGRAPHS
from auditlib.defenses import build_defense
from auditlib.engine.audit import prepare_victim
from auditlib.fl.scenario import release_update
from auditlib.metrics import score
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

RESULTS = ROOT / "benchmarks" / "results" / "lbfgs_together.json"
DOC = ROOT / "docs" / "PERFORMANCE.md"


def _victim_and_release(photo: int, device: str = "cpu"):
    spec = dataclasses.replace(lenet_spec("dlg", offset=photo), device=device)
    victim = prepare_victim(spec)
    release = release_update(
        victim.model,
        victim.batch,
        spec.scenario.protocol,
        build_defense("none", None)[0],
        normalization=victim.normalization,
        num_classes=spec.model.spec.num_classes,
        labels_known=False,
        seed=0,
    )
    return victim, release


def _run(victim, release, steps: int, together: bool, raced: bool = True) -> dict:
    """One DLG run at the audit preset's settings: raced as the preset runs it, or (not
    ``raced``) every one of the 8 starts to the full step budget."""
    info = get_attack("dlg")
    config, _ = build_attack_config("dlg", {"together": together}, "audit")
    control = RunControl(steps, emit_every=10, image_every=50)
    start = time.perf_counter()
    final, evaluations = None, {}
    if raced:
        run = run_attack(info, release.observation, release.knowledge, config, control, 0, "audit")
    else:
        run = info.run(release.observation, release.knowledge, config, control, 0)
    for event in run:
        final = event.final or final
        if "evaluations" in event.losses:
            evaluations[event.restart] = event.losses["evaluations"]
    seconds = time.perf_counter() - start
    picked = final.selected
    scores = score(picked.images, picked.labels, victim.batch, victim.normalization, lpips_nets=())
    start_steps = sum(c.steps for c in final.candidates)
    return {
        "seconds": seconds,
        "start_steps": start_steps,
        "steps_per_s": start_steps / seconds,
        # Events come every 10 steps: evaluations after the last event are not counted.
        "evaluations_per_s": sum(evaluations.values()) / seconds,
        "psnr": scores.psnr_mean,
        "picked": picked.restart,
        "stops": sorted(c.stop_reason for c in final.candidates),
    }


def _timed(owner: type, name: str, bucket: dict[str, float]) -> Callable[[], None]:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            bucket[name] = bucket.get(name, 0.0) + time.perf_counter() - start

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original)


def profile(victim, release, steps: int, raced: bool) -> dict:
    """Where one together run's time goes: objective evaluations (forward, backward, the
    rows written and read), the batched two-loop directions, and the rest (the per-start
    scalar logic of torch's algorithm, the loop's events and the race)."""
    bucket: dict[str, float] = {}
    undo = [
        _timed(BatchedLbfgs, "_evaluate", bucket),
        _timed(Histories, "direction", bucket),
    ]
    try:
        row = _run(victim, release, steps, True, raced)
    finally:
        for u in undo:
            u()
    total = row["seconds"]
    return {
        "raced": raced,
        "seconds": total,
        "evaluate_share": bucket.get("_evaluate", 0.0) / total,
        "direction_share": bucket.get("direction", 0.0) / total,
        "rest_share": 1 - sum(bucket.values()) / total,
    }


def measure(photo: int, steps: int, repeats: int, raced: bool, device: str = "cpu") -> dict:
    victim, release = _victim_and_release(photo, device)
    _run(victim, release, 2, True)  # warm-up: lazy imports, allocator
    _run(victim, release, 2, False)
    arms: dict[bool, list[dict]] = {False: [], True: []}
    for _ in range(repeats):
        for together in (False, True):
            arms[together].append(_run(victim, release, steps, together, raced))
            # One JSON line per run: --from-log makes rows of a run cut off before the end.
            case = {"photo": photo, "steps": steps, "raced": raced, "together": together}
            print(json.dumps({**case, **arms[together][-1]}), flush=True)
    return _row(photo, steps, raced, arms)


def _row(photo: int, steps: int, raced: bool, arms: dict[bool, list[dict]]) -> dict:
    """Both arms' runs as one row, per arm the median of its runs."""

    def median(together: bool, key: str) -> float:
        return statistics.median(r[key] for r in arms[together])

    repeats = min(len(arms[False]), len(arms[True]))
    row = {"photo": photo, "steps": steps, "repeats": repeats, "raced": raced}
    for together, name in ((False, "apart"), (True, "together")):
        row[name] = {
            key: median(together, key)
            for key in ("seconds", "steps_per_s", "evaluations_per_s", "psnr")
        }
        row[name]["start_steps"] = arms[together][0]["start_steps"]
        row[name]["picked"] = arms[together][0]["picked"]
    row["speedup_wall"] = row["apart"]["seconds"] / row["together"]["seconds"]
    row["speedup_steps"] = row["together"]["steps_per_s"] / row["apart"]["steps_per_s"]
    return row


def from_log(path: str, photo: int, steps: int) -> tuple[list[dict], list[dict]]:
    """The rows and profiles of an earlier run from the JSON lines it printed (a run cut off
    before it wrote its results, or one printed with --no-doc; lines without their case
    are ``photo`` and ``steps``, raced)."""
    cases: dict[tuple, dict[bool, list[dict]]] = {}
    runs, profiled = read_log(path)
    for run in runs:
        case = (run.pop("photo", photo), run.pop("steps", steps), run.pop("raced", True))
        cases.setdefault(case, {False: [], True: []})[run.pop("together")].append(run)
    rows = [_row(*case, arms) for case, arms in cases.items() if arms[False] and arms[True]]
    return rows, profiled


def table(rows: list[dict], profiled: list[dict], measured_on: str | None = None) -> str:
    lines = [
        "| DLG audit settings, 8 starts | steps per start | arm | wall time (s) | start-steps | "
        "start-steps/s | evaluations/s | PSNR of the pick (dB) | speed-up (wall) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        schedule = "raced (the preset)" if r["raced"] else "each to the end (no race)"
        for arm in ("apart", "together"):
            a = r[arm]
            speedup = f"{r['speedup_wall']:.2f}x" if arm == "together" else "-"
            lines.append(
                f"| {schedule} | {r['steps']} | {arm} | {a['seconds']:.1f} | "
                f"{a['start_steps']} | {a['steps_per_s']:.1f} | {a['evaluations_per_s']:.0f} | "
                f"{a['psnr']:.2f} | {speedup} |"
            )
    text = "\n".join(lines)
    for p in profiled:
        schedule = "raced" if p["raced"] else "not raced"
        text += (
            f"\n\nOne together run, {schedule} ({p['seconds']:.1f} s): objective evaluations "
            f"{p['evaluate_share']:.0%}, two-loop directions {p['direction_share']:.0%}, the "
            f"rest (per-start scalar logic, events, race) {p['rest_share']:.0%}."
        )
    medians = " and ".join(f"{r['repeats']}" for r in rows)
    return text + (
        f"\n\nMedian of {medians} interleaved repetitions; bundled photograph "
        f"{rows[0]['photo']}. Measured on: {measured_on or machine()}."
    )


def photographs() -> list[dict]:
    """The audit preset on each of the 17 photographs (300 steps, raced, no time budget,
    seed 0), starts apart and together: did any recovery get worse?"""
    rows = []
    for offset, name in enumerate(PHOTOGRAPHS):
        victim, release = _victim_and_release(offset)
        row = {"photograph": name}
        for together, arm in ((False, "apart"), (True, "together")):
            row[arm] = _run(victim, release, 300, together)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def photographs_table(rows: list[dict]) -> str:
    lines = [
        "| photograph | audit, starts apart: PSNR (dB) / s | audit, starts together: PSNR (dB) / s |",
        "|---|---|---|",
    ]
    for r in rows:
        cells = [f"{r[a]['psnr']:.2f} / {r[a]['seconds']:.0f}" for a in ("apart", "together")]
        lines.append(f"| {r['photograph']} | {cells[0]} | {cells[1]} |")
    for arm in ("apart", "together"):
        psnr = [r[arm]["psnr"] for r in rows]
        seconds = [r[arm]["seconds"] for r in rows]
        lines.append(
            f"\n- {arm}: {sum(p >= 30 for p in psnr)}/{len(psnr)} at >= 30 dB, mean "
            f"{statistics.mean(psnr):.2f} dB, min {min(psnr):.2f} dB; "
            f"{statistics.mean(seconds):.1f} s per image on average."
        )
    return "\n".join(lines) + f"\n\nMeasured on: {machine()}."


def photographs_summary(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per arm, the figures the docs quote: mean and minimum PSNR, mean seconds."""
    summary = {}
    for arm in ("apart", "together"):
        psnr = [r[arm]["psnr"] for r in rows]
        summary[arm] = {
            "psnr_mean": statistics.mean(psnr),
            "psnr_min": min(psnr),
            "recovered": sum(p >= 30 for p in psnr),
            "seconds_mean": statistics.mean(r[arm]["seconds"] for r in rows),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 steps per start, 2 repeats")
    parser.add_argument("--steps", type=int, default=300, help="steps per start, raced")
    parser.add_argument(
        "--unraced-steps", type=int, default=60, help="steps per start, no race (0: skip)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--photo", type=int, default=0, help="bundled photograph (offset)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--no-doc", action="store_true", help="print only; leave the docs")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (its own table)")
    add_log_arguments(parser, "--steps, --photo and --device")
    parser.add_argument(
        "--photographs",
        action="store_true",
        help="only the audit preset on the 17 photographs, starts apart and together",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.photographs:
        rows = photographs()
        text = photographs_table(rows)
        print(text)
        (ROOT / "benchmarks" / "results" / "lbfgs_together_photographs.json").write_text(
            json.dumps(
                {"machine": machine(), "rows": rows, "summary": photographs_summary(rows)},
                indent=2,
            )
            + "\n"
        )
        return
    steps, unraced, repeats = (
        (30, 10, 2) if args.quick else (args.steps, args.unraced_steps, args.repeats)
    )
    cases = [(steps, True)] + ([(unraced, False)] if unraced > 0 else [])
    profiled, measured_on = [], args.measured_on
    if args.from_log:
        rows, profiled = from_log(args.from_log, args.photo, steps)
        measured_on = measured_on or logged_machine(args.from_log) or UNRECORDED
    else:
        print(json.dumps({"machine": machine()}), flush=True)
        rows = [measure(args.photo, n, repeats, raced, args.device) for n, raced in cases]
        if args.profile:
            victim, release = _victim_and_release(args.photo, args.device)
            profiled = [profile(victim, release, n, raced) for n, raced in cases]
            for p in profiled:
                print(json.dumps({"profile": p}), flush=True)
    text = table(rows, profiled, measured_on)
    print(text)
    if args.quick or args.no_doc:
        return
    results, marker = on_device(RESULTS, "lbfgs-together", args.device)
    write_results(results, args.device, measured_on, rows=rows, profile=profiled)
    replace_section(DOC, marker, text)


if __name__ == "__main__":
    main()
