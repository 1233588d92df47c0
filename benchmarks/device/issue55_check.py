"""Issue 55's "What must be shown", read from the result files a lent GPU's call wrote
(``issue55.sh essentials``: its $OUT, or benchmarks/results), item by item: the figures,
and whether each holds, does not hold, or is unmeasured (its file missing, or its run cut
short), so that a session with little device time writes its closing note from one reading.

Rates are whole runs' (steps over seconds, the first step and any recording included) on
both sides, like with like; PSNR is set beside breaching's seed by seed. A run asked to
record its step whose result says it did not (its recording failed, and it ran eagerly) is
named in its item's words: the figure is still the product's, but not a recorded step's.

Usage: python -m benchmarks.device.issue55_check [DIR]
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from auditlib.reconstruction import RECORDED
from benchmarks.common import ROOT

CASE = "cuda-resnet18-224"
PAPER_BUDGET = 24_000
# The bars.
TIMES_BREACHING = 5.0
PSNR_WITHIN_DB = 0.5
EIGHT_STARTS_AT_MOST = 1.25
BUDGET_UNDER_S = 300.0
PLAN_UNDER_S = 60.0


@dataclass(frozen=True)
class Item:
    """One line of the issue's list: its name, its figures in words, and whether it holds
    (None: unmeasured)."""

    name: str
    words: str
    holds: bool | None

    def line(self) -> str:
        verdict = {True: "holds", False: "does not hold", None: "unmeasured"}[self.holds]
        return f"{self.name}: {verdict}: {self.words}"


def _load(folder: Path, name: str) -> dict | None:
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else None


def _runs(result: dict, side: str, starts: int) -> list[dict]:
    return [
        r
        for r in result.get("runs", [])
        if r.get("side") == side and r.get("starts") == starts and "error" not in r
    ]


def _unrecorded(runs: list[dict]) -> str | None:
    """Why runs asked to record their step did not, from their own record (``step`` and
    ``step_note``, kept since the result says how; files written before are taken as
    asked); None where every one did."""
    notes = [
        f"{r.get('label') or r.get('side')}: {r.get('step')}"
        + (f" ({r['step_note']})" if r.get("step_note") else "")
        for r in runs
        if r.get("step", RECORDED) != RECORDED and not r.get("skipped")
    ]
    return "; ".join(dict.fromkeys(notes)) or None


def _rate(run: dict) -> float:
    return run["steps"] / run["seconds"]


def one_start(result: dict | None) -> Item:
    """Captured IG, 1 start, against breaching in the same call: >= 5x its steps/s, PSNR
    within 0.5 dB of it (mean over the seeds)."""
    name = "IG 1 start, >= 5x breaching, same PSNR"
    if result is None:
        return Item(name, "no compiled_step-...-captured.json", None)
    ours, theirs = _runs(result, "ours captured", 1), _runs(result, "breaching", 1)
    if not ours or not theirs:
        return Item(name, "a side has no run", None)
    mine = statistics.median(_rate(r) for r in ours)
    peer = statistics.median(_rate(r) for r in theirs)
    by_seed = {r["seed"]: r["psnr"] for r in theirs}
    gaps = [r["psnr"] - by_seed[r["seed"]] for r in ours if r["seed"] in by_seed]
    gap = statistics.mean(gaps) if gaps else float("nan")
    ratio = mine / peer
    words = (
        f"{mine:.1f} against breaching's {peer:.1f} steps/s ({ratio:.1f}x; "
        f"{result.get('arithmetic', 'arithmetic unrecorded')}), PSNR {gap:+.2f} dB from "
        f"breaching's over {len(gaps)} seeds ({', '.join(f'{g:+.2f}' for g in gaps)})"
    )
    holds = ratio >= TIMES_BREACHING and abs(gap) <= PSNR_WITHIN_DB and len(gaps) >= 3
    return _recorded_or_not(Item(name, words, holds), ours)


def _recorded_or_not(item: Item, runs: list[dict]) -> Item:
    """``item``, its words naming the runs it stands on that did not record their step:
    its figures are what ran, which is then not a recorded step (nor what switching
    recording on by default would be shown to give)."""
    why = _unrecorded(runs)
    if why is None:
        return item
    return Item(item.name, f"{item.words}; asked to record but did not: {why}", item.holds)


def eight_starts(result: dict | None) -> Item:
    """8 captured starts together against 1, the same steps each, seed 0: at most 1.25x."""
    name = "8 starts <= 1.25x one start"
    if result is None:
        return Item(name, "no compiled_step-...-captured.json", None)
    one = [r for r in _runs(result, "ours captured", 1) if r["seed"] == 0]
    many = [r for r in result.get("runs", []) if r.get("side") == "ours captured"]
    many = [r for r in many if r.get("starts", 1) > 1 and "error" not in r]
    if not one or not many:
        return Item(name, "no seed-0 run of one start and of several", None)
    ratio = many[0]["seconds"] / one[0]["seconds"]
    words = (
        f"{many[0]['starts']} starts {many[0]['seconds']:.1f} s against one start's "
        f"{one[0]['seconds']:.1f} s for {one[0]['steps']} steps each ({ratio:.2f}x)"
    )
    return _recorded_or_not(Item(name, words, ratio <= EIGHT_STARTS_AT_MOST), [one[0], many[0]])


def paper_budget(result: dict | None) -> Item:
    """The paper's 24,000 steps, captured, in under 5 minutes; its PSNR."""
    name = "24,000 steps < 5 min"
    run = None if result is None else result.get("paper_budget")
    if run is None or "error" in run:
        why = "no -captured-budget.json" if result is None else "its run failed or was cut"
        return Item(name, why, None)
    words = f"{run['steps']:,} steps in {run['seconds']:.0f} s, PSNR {run['psnr']:.2f} dB"
    holds = run["steps"] >= PAPER_BUDGET and run["seconds"] < BUDGET_UNDER_S
    return _recorded_or_not(Item(name, words, holds), [run])


def whole_plan(result: dict | None) -> Item:
    """``--attack all`` at 224 px, every attack's step recorded: the whole plan in < 60 s,
    the better of one after another and at once."""
    name = "--attack all, the whole plan < 60 s"
    if result is None:
        return Item(name, "no attacks_at_once-...-captured.json", None)
    parts, holds = [], False
    for run in result.get("runs", []):
        way = "at once" if run["at_once"] else "one after another"
        whole = run["steps"] >= run["planned_steps"]
        parts.append(
            f"{way} {run['steps']:,} of {run['planned_steps']:,} steps in {run['seconds']:.1f} s"
        )
        holds = holds or (whole and run["seconds"] < PLAN_UNDER_S)
    if not parts:
        return Item(name, "no run", None)
    attacks = [a for run in result["runs"] for a in run.get("attacks", [])]
    return _recorded_or_not(Item(name, "; ".join(parts), holds), attacks)


def check(folder: Path) -> list[Item]:
    captured = _load(folder, f"compiled_step-{CASE}-captured.json")
    return [
        one_start(captured),
        eight_starts(captured),
        paper_budget(_load(folder, f"compiled_step-{CASE}-captured-budget.json")),
        whole_plan(_load(folder, f"attacks_at_once-{CASE}-captured.json")),
    ]


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks" / "results"
    for item in check(folder):
        print(item.line())


if __name__ == "__main__":
    main()
