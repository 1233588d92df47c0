"""torchvision models audited end to end from the command line, with the auditor's weights.

For mobilenet_v3_small, efficientnet_b0 and vit_b_16 at 224 px: random weights (seeded
build, ``weights=None``) saved as safetensors, then ``python -m auditlib audit --model
torchvision:NAME --weights FILE`` on one photograph with IG (its audit preset: raced
restarts) at 2 iterations per restart; the seconds the command took, whether it completed,
and what it reported. Then weights that do not fit are refused, the message naming the first
mismatching tensors: another architecture's file, a 1000-class file for a 10-class model,
and a ViT file saved at 224 px for a 64 px model.

Writes benchmarks/results/torchvision_models.json and prints it.
Usage: python -m benchmarks.torchvision_models [--attack ig] [--iterations 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import safetensors.torch

from auditlib.models import ModelSpec, build_model, describe_model
from benchmarks.common import ROOT, machine

RESULTS = ROOT / "benchmarks" / "results" / "torchvision_models.json"
MODELS = ("mobilenet_v3_small", "efficientnet_b0", "vit_b_16")
SIDE = 224
CLASSES = 10


def save_weights(spec: ModelSpec, path: Path) -> dict:
    """Build ``spec`` (random, seeded) and save its state_dict as safetensors."""
    start = time.perf_counter()
    model = build_model(spec)
    built = time.perf_counter() - start
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(state, str(path))
    summary = describe_model(model)
    return {
        "build_seconds": round(built, 2),
        "parameters": summary["num_parameters"],
        "has_batchnorm": summary["has_batchnorm"],
        "last_linear": summary["last_linear"],
        "file_mb": round(path.stat().st_size / 1e6, 1),
    }


def audit(model: str, weights: Path, out: Path, size: int, attack: str, iterations: int) -> dict:
    """One CLI audit; seconds, exit code and the last lines it printed."""
    command = [
        sys.executable,
        "-m",
        "auditlib",
        "audit",
        "--model",
        f"torchvision:{model}",
        "--input-size",
        str(size),
        "--num-classes",
        str(CLASSES),
        "--weights",
        str(weights),
        "--samples",
        "photographs",
        "--batch-size",
        "1",
        "--attack",
        attack,
        "--iterations",
        str(iterations),
        "--out",
        str(out),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    seconds = time.perf_counter() - start
    row = {
        "command": " ".join(["python", *command[1:]]).replace(str(weights), weights.name),
        "exit_code": done.returncode,
        "seconds": round(seconds, 1),
        "stdout": [line.replace(f"{out.parent}/", "") for line in done.stdout.splitlines()[:1]],
        "stderr_tail": [line for line in done.stderr.strip().splitlines() if line][-2:],
    }
    result = out / "result.json"
    if done.returncode == 0 and result.is_file():
        summary = json.loads(result.read_text())
        row["completed"] = summary["stop_reason"] == "completed"
        row["stop_reason"] = summary["stop_reason"]
        row["attack_seconds"] = summary["timing"]["seconds"]
        row["steps"] = summary["timing"]["iterations"]
    else:
        row["completed"] = False
    return row


def refusal(model: str, weights: Path, out: Path, size: int, what: str) -> dict:
    row = audit(model, weights, out, size, "ig", 1)
    message = row["stderr_tail"][-1] if row["stderr_tail"] else ""
    return {
        "case": what,
        "model": f"torchvision:{model}",
        "input_size": size,
        "exit_code": row["exit_code"],
        "seconds": row["seconds"],
        "refused": row["exit_code"] == 2 and "do not fit" in message,
        "message": message,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--attack", default="ig")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    args = parser.parse_args()
    rows, refusals = [], []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = {}
        for name in args.models:
            spec = ModelSpec(f"torchvision:{name}", CLASSES, (3, SIDE, SIDE), seed=1)
            files[name] = folder / f"{name}.safetensors"
            facts = save_weights(spec, files[name])
            print(f"{name}: built and saved ({facts})", file=sys.stderr)
            row = {"model": spec.architecture, "input_size": SIDE, **facts}
            row |= audit(name, files[name], folder / name, SIDE, args.attack, args.iterations)
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
        # Weights that do not fit: another architecture, another class count, another size.
        small = files.get("mobilenet_v3_small") or folder / "mobilenet_v3_small.safetensors"
        if not small.is_file():
            save_weights(ModelSpec("torchvision:mobilenet_v3_small", CLASSES), small)
        cases = [("efficientnet_b0", small, SIDE, "mobilenet_v3_small weights, efficientnet_b0")]
        thousand = folder / "mobilenet_1000.safetensors"
        save_weights(ModelSpec("torchvision:mobilenet_v3_small", 1000, (3, SIDE, SIDE)), thousand)
        cases.append(("mobilenet_v3_small", thousand, SIDE, "1000-class weights, 10 classes"))
        if "vit_b_16" in files:
            cases.append(("vit_b_16", files["vit_b_16"], 64, "ViT weights saved at 224, 64 px"))
        for model, weights, size, what in cases:
            row = refusal(model, weights, folder / f"refused-{model}", size, what)
            print(json.dumps(row), file=sys.stderr)
            refusals.append(row)
    saved = {
        "machine": machine(),
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "cpus": os.cpu_count(),
        # Shared machines: the 1-minute load average before and after (timings scale with it).
        "load_average": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "attack": args.attack,
        "iterations": args.iterations,
        "audits": rows,
        "refusals": refusals,
    }
    RESULTS.write_text(json.dumps(saved, indent=2) + "\n")
    print(json.dumps(saved, indent=2))


if __name__ == "__main__":
    main()
