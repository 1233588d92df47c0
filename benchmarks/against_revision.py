"""Attack throughput of this tree beside an earlier revision's, interleaved on one machine:
the check that a change to the attack loop costs the CPU nothing (issue 55: "IG and DLG
throughput on LeNet not below today's").

The revision is checked out into a git worktree under /tmp; each round runs one process per
tree (this tree first in odd rounds, the revision first in even ones), each timing the
attacks' quiet runs with ``benchmarks.attack_throughput.timed`` (events off, after a warm-up
step) on DLG's LeNet at 32 px, batch 1. Medians over the rounds.

Writes benchmarks/results/against_revision-ATTACKS.json and prints it.
Usage: python -m benchmarks.against_revision REV [--rounds 5] [--attacks ig dlg]
       [--preset audit]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import ROOT, machine

STEPS = {"ig": 1000, "dlg": 60, "gi": 300, "grnn": 100, "fedleak": 100}


def child(attacks: list[str]) -> None:
    """Time each attack once in this process's tree; print one JSON line. With
    ``AUDIT_BENCH_PRESET`` set, each attack at that preset (its starts together, unraced)."""
    from auditlib.client.protocol import ClientProtocol
    from benchmarks import attack_throughput
    from benchmarks.attack_throughput import CASES, release_for, timed

    preset = os.environ.get("AUDIT_BENCH_PRESET")
    if preset:  # timed() builds the default configuration: give it the preset's
        build = attack_throughput.build_attack_config
        attack_throughput.build_attack_config = lambda name: build(name, {}, preset)

    case = CASES[0]  # LeNet 32x32, batch 1
    release = release_for(case, "cpu", ClientProtocol())
    rates = {}
    for name in attacks:
        rates[name] = timed(name, release, STEPS[name], 10**9, 10**9)["steps_per_second"]
    print(json.dumps(rates))


def worktree(revision: str) -> Path:
    sha = subprocess.check_output(["git", "rev-parse", revision], cwd=ROOT, text=True).strip()
    path = Path("/tmp") / f"auditlib-{sha[:12]}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "-f", str(path), sha], cwd=ROOT, check=True)
    return path


def run_in(tree: Path, attacks: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "benchmarks.against_revision", "--child", *attacks]
    out = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("revision", nargs="?")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--attacks", nargs="*", default=["ig", "dlg"])
    parser.add_argument("--preset", help="each attack at this preset (e.g. audit)")
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.preset:
        os.environ["AUDIT_BENCH_PRESET"] = args.preset
    if args.child is not None:
        child(args.child)
        return
    base = worktree(args.revision)
    # The earlier tree runs this file from here (it may predate it).
    (base / "benchmarks" / "against_revision.py").write_text(Path(__file__).read_text())
    runs: dict[str, list[dict]] = {"this tree": [], args.revision: []}
    for round_ in range(args.rounds):
        order = [("this tree", ROOT), (args.revision, base)]
        for label, tree in order if round_ % 2 == 0 else order[::-1]:
            runs[label].append(run_in(tree, args.attacks))
            print(label, json.dumps(runs[label][-1]), flush=True)
    medians = {
        label: {a: statistics.median(r[a] for r in rows) for a in args.attacks}
        for label, rows in runs.items()
    }
    result = {
        "machine": machine(),
        "revision": subprocess.check_output(
            ["git", "rev-parse", args.revision], cwd=ROOT, text=True
        ).strip(),
        "this_tree": subprocess.check_output(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, text=True
        ).strip(),
        "preset": args.preset,
        "steps": {a: STEPS[a] for a in args.attacks},
        "median_steps_per_second": medians,
        "ratio": {a: medians["this tree"][a] / medians[args.revision][a] for a in args.attacks},
        "runs": runs,
    }
    name = "-".join(args.attacks) + (f"-{args.preset}" if args.preset else "")
    out = ROOT / "benchmarks" / "results" / f"against_revision-{name}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median_steps_per_second", "ratio")}, indent=1))


if __name__ == "__main__":
    main()
