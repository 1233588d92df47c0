"""A sample of 64 photographs at 224 px on ResNet-18: does it fit, or does the planner chunk it?

``python -m benchmarks.sample_memory`` (a few minutes on 2 cores). 64 square crops of the
bundled photographs (``benchmarks.photo_crops``) are written to a folder and audited as an
auditor's sample is, one image per update (``engine.sample.update_specs``, then
``engine.together.audit_together``): ResNet-18 with torchvision's stem, 1000 classes, ImageNet
normalisation, FedSGD, Inverting Gradients' audit preset (its starts, each update its own),
BatchNorm in train mode (the default) and in eval mode (updates together, chunked, in both),
``--iterations`` steps (1 by default: the memory of a step is the question, not the
reconstruction). The memory plan (``engine.memory_plan``) measures a step of one update
and of two on this machine and chunks the 64 updates to fit a share of the free memory; the
run says what it chose. Beside it, the process's peak resident memory over the whole
sample, and the seconds. Writes ``benchmarks/results/sample_memory.json`` and the table in
docs/PERFORMANCE.md ("A sample at 224 px").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from auditlib.client.protocol import ClientProtocol
from auditlib.engine.memory_plan import free_bytes
from auditlib.engine.sample import update_specs
from auditlib.engine.together import audit_together
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from benchmarks.common import machine, replace_section, status_kib
from benchmarks.malicious_server import IMAGENET, model_of, write_folder
from benchmarks.photo_crops import photo_crops

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "sample_memory.json"


def _peak_resident_gb() -> float:
    peak = status_kib("self", "VmHWM")
    if peak is None:
        raise RuntimeError("/proc gives no VmHWM for this process")
    return peak * 1024 / 1e9


def measure(updates: int, size: int, attack: str, iterations: int, batchnorm: str) -> dict:
    pixels, names = photo_crops(updates, size)
    free = free_bytes(torch.device("cpu"))
    with tempfile.TemporaryDirectory() as folder:
        write_folder(pixels, tuple(f"{i:03d}-{n}" for i, n in enumerate(names)), Path(folder))
        spec = RunSpec(
            model=ModelRef(model_of(size)),
            data=DataSpec("folder", folder, batch_size=1, normalization=IMAGENET),
            scenario=ScenarioSpec(protocol=ClientProtocol(batchnorm_mode=batchnorm)),
            attack=ComponentSpec.of(attack, preset="audit"),
            defense=ComponentSpec.of("none"),
            budget=Budget(iterations),
        )
        specs = update_specs(spec, updates)
        began = time.perf_counter()
        results, notes = audit_together(specs, lpips_nets=())
        seconds = time.perf_counter() - began
    return {
        "updates": updates,
        "size": size,
        "attack": attack,
        "iterations": iterations,
        "batchnorm": batchnorm,
        "free_gb_before": None if free is None else free / 1e9,
        "notes": [note.words for note in notes],
        "peak_resident_gb": _peak_resident_gb(),
        "seconds": seconds,
        "results": len(results),
        "machine": machine(),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| updates | image | attack | BatchNorm | steps | free before | what the run said | "
        "peak resident | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        notes = "; ".join(row["notes"])
        lines.append(
            f"| {row['updates']} x 1 | {row['size']} px | {row['attack']} (audit) | "
            f"{row['batchnorm']} | {row['iterations']} | {row['free_gb_before']:.1f} GB | "
            f"{notes} | {row['peak_resident_gb']:.1f} GB | {row['seconds']:.0f} |"
        )
    return "\n".join([*lines, "", f"Measured on: {rows[0]['machine']}."])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--attack", default="ig")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--no-doc", action="store_true", help="print only; leave the docs")
    parser.add_argument("--one", choices=("train", "eval"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # the child: one measurement, printed as one line of JSON
        row = measure(args.updates, args.size, args.attack, args.iterations, args.one)
        print(json.dumps(row))
        return
    rows = []
    for batchnorm in ("train", "eval"):  # each in a process of its own: its own peak
        rows.append(_in_child(args, batchnorm))
        print(json.dumps(rows[-1], indent=2), flush=True)
    if not args.no_doc:
        RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "sample-memory", table(rows))


def _in_child(args: argparse.Namespace, batchnorm: str) -> dict:
    """One measurement in a fresh process, so its peak resident memory is its own."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.sample_memory",
        "--one",
        batchnorm,
        *("--updates", str(args.updates), "--size", str(args.size)),
        *("--attack", args.attack, "--iterations", str(args.iterations)),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
