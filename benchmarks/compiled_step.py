"""Inverting Gradients (or FedLeak, GradInversion, GRNN, DLG: ``--attack``) with its step eager and
compiled (``attacks.compiled``, issue 55), IG's and DLG's beside breaching's, on one device in
one run: the same model, photograph, gradient and steps.

Rows, for seeds 0 to S-1, interleaved (eager, compiled, compiled with R starts together,
breaching) so that load on the machine falls on all of them:

- ours eager: ``ig`` (or ``fedleak``, ``gi``, ``grnn``), paper preset, 1 start, ``compiled=false``;
- ours compiled: the same with ``compiled=true`` (on CUDA a CUDA graph; not DLG's);
- ours captured (``--kinds ...,captured``, CUDA only): the same with ``captured=true``, the
  eager step recorded as a CUDA graph after its first steps (``attacks.captured``; DLG's
  L-BFGS evaluation, ``lbfgs.RecordedRows``), and its R starts;
- ours compiled, R starts together (``restarts`` R, unraced: every start runs every step),
  once (seed 0): what R starts cost beside one (GradInversion's without its Langevin noise:
  unraced starts with noise draw it in turn from one stream, so they stay apart);
- breaching 0.1.2's ``invertinggradients``, 1 trial, its TV scale set to ours, starting from
  our draw (``benchmarks.peers``), where breaching is installed in ``.peers/site``; for DLG
  its ``deepleakage`` (labels unknown to both); none for the others (breaching has no FedLeak
  or GRNN, and its GradInversion is another case).

Each run's seconds split into its first step (where the compiled step traces: "compile s")
and the steps after it, whose rate is the row's steps/s (a step of R starts together counts
R steps, as the product's progress counts them); its steady steps/s counts from the first
event past a fifth of the steps, after a CUDA graph's recording at its first replays. An
L-BFGS step is up to 20 objective evaluations: DLG's rows also count its evaluations (each
start's as its last event reports them; breaching's by counting its model's forwards) and
their rate over the run. PSNR against the photograph at the end.

On CUDA the rows run in the product's arithmetic, full float32 (``engine.device.
full_float32``: TF32 off for convolutions and matrix products), breaching's too, so both sides
compute the same; ``--tf32`` runs them all with TF32 on instead (what the faster arithmetic
gives, and whether the PSNR moves: the product keeps it off), into a ``-tf32`` file. Before
2026-11-30's fifteenth session this benchmark left PyTorch's default on CUDA, cuDNN's TF32
convolutions, on both sides. ``--channels-last`` adds, after each kind's row of one start, the
same row with our model's convolution weights in the channels-last memory format, NHWC
("ours KIND nhwc"; breaching keeps torch's default, NCHW, the reference both rows are set
beside), into a ``-nhwc`` file: the same values laid out for the kernels that prefer it
(cuDNN's tensor-core convolutions, oneDNN's), to measure whether the step gains and whether
the PSNR stays. The product keeps NCHW until that is shown.

Cases: ``lenet`` (DLG's LeNet at 32 px, 100 classes: this machine's CPU), ``resnet18-32``
(the CIFAR ResNet-18, 10 classes, train-mode BatchNorm: where the CPU's kernels are large),
``resnet20-32`` (ResNet-20, 10 classes, train-mode BatchNorm: a small BatchNorm model, for
GradInversion on the CPU) and
``resnet18-224`` (torchvision's ResNet-18, 1000 classes, 224 px, untrained, seed 0,
BatchNorm in training mode: the issue's GPU case). ``--paper-budget`` adds one compiled run
of the paper's ImageNet budget, 24,000 steps.

Writes benchmarks/results/compiled_step-DEVICE-CASE.json (another attack's:
compiled_step-ATTACK-DEVICE-CASE.json; with a captured row, ending ``-captured.json``; the
paper's budget alone, ``--budget-only``, ending ``-budget.json``) and
prints each run as a JSON line. ``--from-log``
makes the file from the lines of earlier runs cut off before they wrote it (a lent GPU's
time), one summary per log: each log is one call, whose rows compare within it.
Usage: python -m benchmarks.compiled_step [--attack fedleak|gi|grnn|dlg] [--device cuda]
       [--case resnet18-224] [--steps 1000] [--seeds 3] [--starts 8]
       [--paper-budget [--budget-only]] [--no-peer] [--keep-traces]
       [--kinds eager,compiled,captured] [--tf32] [--channels-last]
       [--from-log LOG[,LOG] --measured-on M]
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import time
from pathlib import Path

import torch

from auditlib.attacks import RunControl, build_attack_config, get_attack
from auditlib.attacks import compiled as attacks_compiled
from auditlib.engine.device import resolve_device
from auditlib.models import ModelSpec
from auditlib.threat import Observation
from benchmarks.common import ROOT, UNRECORDED, add_log_arguments, logged_machine, machine
from benchmarks.peers import PEERS, _case, _psnr, our_knowledge, theirs

CASES = {
    "lenet": ModelSpec("lenet", 100, (3, 32, 32), init="uniform"),
    "resnet18-32": ModelSpec("resnet18", 10, (3, 32, 32)),
    "resnet20-32": ModelSpec("resnet20", 10, (3, 32, 32)),
    "resnet18-224": ModelSpec("torchvision:resnet18", 1000, (3, 224, 224)),
}
PAPER_BUDGET = 24_000
# The steady rate: from the first event at or past this share of the steps to the end, past
# the CUDA graph's recording at its first replays (300 steps after the first left a window
# of 1.3 to 2.4 s on an H200, in which one start's rate read 123 in one call and 231 in
# another).
STEADY_FROM = 0.2


def ours(
    victim, classes, names, gradient, device, attack, steps, seed, step, starts=1, nhwc=False
) -> dict:
    """One run of our ``attack`` (paper preset), labels known, its step ``step`` (eager,
    compiled or captured), its model's weights channels-last where ``nhwc``; seconds to its
    first step and after."""
    model = copy.deepcopy(victim.model).to(device)
    if nhwc:  # the client's gradient is the same values either way
        model.to(memory_format=torch.channels_last)
    knowledge = our_knowledge(victim, classes, model, True)
    observation = Observation("gradient", tuple(g.to(device) for g in gradient), names)
    # The eager row says captured=false: it stays eager whatever a run on CUDA would choose.
    params = {"restarts": starts} | ({step: True} if step != "eager" else {"captured": False})
    if attack == "gi" and starts > 1:  # unraced starts with noise stay apart
        params["noise"] = 0.0
    config, _ = build_attack_config(attack, params, "paper")
    control = RunControl(steps, emit_every=max(steps // 10, 1), image_every=10**9)
    _sync(device)
    start = time.perf_counter()
    first_at, first_step, final, later = None, 0, None, None
    evaluations: dict[int, float] = {}  # each start's, as its events report them (L-BFGS)
    for event in get_attack(attack).run(observation, knowledge, config, control, seed):
        if "evaluations" in event.losses:
            evaluations[event.restart] = event.losses["evaluations"]
        if event.final is not None:
            final = event.final
        elif first_at is None and event.step > 0:  # the first step's event (always sent)
            _sync(device)
            first_at, first_step = time.perf_counter(), event.step
        elif later is None and event.step >= STEADY_FROM * steps * starts:
            _sync(device)
            later = (time.perf_counter(), event.step)
    _sync(device)
    end = time.perf_counter()
    done = sum(c.steps for c in final.candidates)
    steady = None if later is None or done <= later[1] else (done - later[1]) / (end - later[0])
    return {
        "side": f"ours {step}" + (" nhwc" if nhwc else ""),
        "starts": starts,
        "seed": seed,
        "steps": done,
        "seconds": end - start,
        "first_step_s": first_at - start,
        "steps_per_s": (done - first_step) / (end - first_at),
        "steady_steps_per_s": steady,
        "psnr": _psnr(final.selected.images, victim),
        # How the run computed its step: a captured row whose recording failed ran eagerly.
        "step": final.stepped.how,
        "step_note": final.stepped.note,
        **_evaluated(evaluations, end - start),
        **_reserved(device),
    }


def _evaluated(evaluations: dict[int, float], seconds: float) -> dict:
    """An L-BFGS run's objective evaluations and their rate over the run; none for others."""
    if not evaluations:
        return {}
    total = sum(evaluations.values())
    return {"evaluations": total, "evaluations_per_s": total / seconds}


def _reserved(device: str) -> dict:
    """On CUDA, the memory torch's allocator holds after the run (kept CUDA graphs hold
    their pools: ``--keep-traces``)."""
    if torch.device(device).type != "cuda":
        return {}
    return {"reserved_gib": torch.cuda.memory_reserved() / 2**30}


# Breaching's attack beside ours, and whether the labels are known to both.
PEER_OF = {"ig": ("invertinggradients", True), "dlg": ("deepleakage", False)}


def peer(victim, classes, gradient, device, steps, seed, attack="ig") -> dict:
    theirs_name, labels_known = PEER_OF[attack]
    seconds, done, psnr, forwards = theirs(
        victim, classes, gradient, theirs_name, steps, labels_known, seed, device=device
    )
    evaluated = _evaluated({0: forwards}, seconds) if attack == "dlg" else {}
    return {
        "side": "breaching",
        "starts": 1,
        "seed": seed,
        "steps": done,
        "seconds": seconds,
        "first_step_s": None,
        "steps_per_s": done / seconds,
        "psnr": psnr,
        **evaluated,
    }


def guarded(run, steps, seed, step, starts=1, nhwc=False) -> dict:
    """One of our runs, or what stopped it (a machine without what compiling or recording
    needs): the other rows are still measured."""
    try:
        return run(steps, seed, step, starts, nhwc)
    except Exception as error:
        side = f"ours {step}" + (" nhwc" if nhwc else "")
        return {"side": side, "starts": starts, "seed": seed, "error": repr(error)[:2000]}


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _median_of(values) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summary(runs: list[dict]) -> list[dict]:
    """Medians per (side, starts): seconds, first step, steps/s; PSNR mean and range."""
    rows = []
    measured = [r for r in runs if "error" not in r]
    for key in dict.fromkeys((r["side"], r["starts"]) for r in measured):
        mine = [r for r in measured if (r["side"], r["starts"]) == key]
        first = [r["first_step_s"] for r in mine if r["first_step_s"] is not None]
        rows.append(
            {
                "side": key[0],
                "starts": key[1],
                "runs": len(mine),
                "steps": mine[0]["steps"],
                "seconds": statistics.median(r["seconds"] for r in mine),
                "first_step_s": statistics.median(first) if first else None,
                "steps_per_s": statistics.median(r["steps_per_s"] for r in mine),
                "steady_steps_per_s": _median_of(r.get("steady_steps_per_s") for r in mine),
                "evaluations_per_s": _median_of(r.get("evaluations_per_s") for r in mine),
                "psnr_mean": statistics.mean(r["psnr"] for r in mine),
                "psnr": [round(r["psnr"], 2) for r in mine],
            }
        )
    return rows


def logged_runs(path: str) -> tuple[list[dict], str | None, str | None]:
    """The runs a log printed (lines with a ``side`` and a ``seed``; not its summary rows),
    and the torch and device that ``benchmarks/device/run.py`` named on its first line."""
    runs, torch_version, device = [], None, None
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("torch ") and " cuda " in line:
            torch_version, _, device = line[len("torch ") :].partition(" cuda ")
        elif line.startswith("{"):
            record = json.loads(line)
            if "side" in record and "seed" in record:
                runs.append(record)
    return runs, torch_version, device


def from_logs(args) -> None:
    calls = []
    for path in args.from_log.split(","):
        runs, torch_version, device = logged_runs(path)
        budget = next((r for r in runs if r.get("steps") == PAPER_BUDGET), None)
        runs = [r for r in runs if r is not budget]
        calls.append(
            {
                "log": Path(path).name,
                "device": device,
                "torch": torch_version,
                "rows": summary(runs),
                "paper_budget": budget,
                "runs": runs,
            }
        )
        for row in calls[-1]["rows"]:
            print(json.dumps(row))
    result = {
        "machine": args.measured_on or logged_machine(args.from_log) or UNRECORDED,
        "attack": args.attack,
        "case": args.case,
        "steps": args.steps,
        "calls": calls,
    }
    _output(args).write_text(json.dumps(result, indent=1) + "\n")


def _arithmetic(device: str) -> str:
    """The float32 the rows ran in: on CUDA, TF32 off (the product's) or on (``--tf32``)."""
    if torch.device(device).type != "cuda":
        return "float32"
    on = torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32
    return "TF32 on" if on else "full float32 (TF32 off, as the product)"


def _output(args) -> Path:
    name = "" if args.attack == "ig" else f"{args.attack}-"
    rows = "-captured" if "captured" in getattr(args, "kinds", "") else ""
    rows += "-tf32" if getattr(args, "tf32", False) else ""
    rows += "-nhwc" if getattr(args, "channels_last", False) else ""
    # The paper's budget alone has a file of its own: it would otherwise replace the rows'.
    rows += "-budget" if getattr(args, "budget_only", False) else ""
    file = f"compiled_step-{name}{args.device}-{args.case}{rows}.json"
    return ROOT / "benchmarks" / "results" / file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--attack", choices=["ig", "fedleak", "gi", "grnn", "dlg"], default="ig")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--case", choices=sorted(CASES), default="lenet")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--starts", type=int, default=8, help="starts of the together row")
    parser.add_argument("--paper-budget", action="store_true")
    parser.add_argument("--no-peer", action="store_true", help="leave breaching out")
    parser.add_argument(
        "--budget-only", action="store_true", help="only the paper's budget (with --paper-budget)"
    )
    parser.add_argument(
        "--keep-traces",
        action="store_true",
        help="on CUDA, keep each run's traces for the next (attacks.compiled.KEEP_ON_CUDA)",
    )
    parser.add_argument(
        "--kinds",
        default="eager,compiled",
        help="the rows' steps, comma-separated: eager, compiled, captured (a CUDA graph "
        "recorded from the eager step: CUDA only); each but eager also runs its R starts "
        "together (seed 0), and the last one the paper's budget",
    )
    parser.add_argument(
        "--tf32",
        action="store_true",
        help="on CUDA, TF32 on for convolutions and matrix products (the product keeps it off)",
    )
    parser.add_argument(
        "--channels-last",
        action="store_true",
        help="after each kind's row of one start, the same with our model's weights "
        "channels-last (NHWC); breaching stays NCHW",
    )
    add_log_arguments(parser, "--attack, --device, --case and --steps")
    args = parser.parse_args()
    attacks_compiled.KEEP_ON_CUDA = args.keep_traces
    kinds = tuple(args.kinds.split(","))
    if not set(kinds) <= {"eager", "compiled", "captured"}:
        parser.error(f"--kinds takes eager, compiled and captured, not {args.kinds}")
    if args.from_log:
        return from_logs(args)

    resolve_device(args.device)  # on CUDA the product's full float32 (TF32 off), both sides
    if args.tf32:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    print(json.dumps({"machine": machine()}), flush=True)  # for --from-log
    spec = CASES[args.case]
    victim, names, gradient = _case(spec)
    if args.attack == "dlg" and "compiled" in kinds:
        parser.error("DLG has no compiled step: --kinds eager,captured")
    with_peer = not args.no_peer and PEERS.exists() and args.attack in PEER_OF
    run = functools.partial(
        ours, victim, spec.num_classes, names, gradient, args.device, args.attack
    )
    runs = []
    for seed in range(0 if args.budget_only else args.seeds):
        # The R-starts row runs once (seed 0): it measures what R starts cost beside one.
        together = seed == 0 and args.starts > 1
        layouts = (False, True) if args.channels_last else (False,)
        rows = [(kind, 1, nhwc) for kind in kinds for nhwc in layouts]
        rows += [(kind, args.starts, False) for kind in kinds if kind != "eager" and together]
        for step, starts, nhwc in rows:
            runs.append(guarded(run, args.steps, seed, step, starts, nhwc))
            print(json.dumps(runs[-1]), flush=True)
        if with_peer:
            runs.append(
                peer(victim, spec.num_classes, gradient, args.device, args.steps, seed, args.attack)
            )
            print(json.dumps(runs[-1]), flush=True)
    budget = None
    if args.paper_budget:
        budget = guarded(run, PAPER_BUDGET, 0, kinds[-1])
        print(json.dumps(budget), flush=True)
    result = {
        "machine": machine(),
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else args.device,
        "torch": torch.__version__,
        "attack": args.attack,
        "case": args.case,
        "steps": args.steps,
        "arithmetic": _arithmetic(args.device),
        "memory_format": "NCHW, and NHWC in the nhwc rows"
        if args.channels_last
        else "torch's default (NCHW)",
        "peer": "breaching 0.1.2"
        if with_peer
        else f"none for {args.attack}"
        if args.attack not in PEER_OF
        else "not installed (.peers/site)",
        "rows": summary(runs),
        "paper_budget": budget,
        "runs": runs,
    }
    _output(args).write_text(json.dumps(result, indent=1) + "\n")
    for row in result["rows"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
