"""What watching costs: the dashboard server's CPU while a comparison runs, with Streamlit's
collection of every object after each script run (its default) and without it (ours).

``python -m benchmarks.watch_cost [--repeats N] [--iterations I]``. For each repetition,
both settings in turn (interleaved): one ``streamlit run app.py`` on 127.0.0.1 with its own
data folder and embedded Ray, ``runner.postScriptGC`` set by Streamlit's environment
variable; one signed-in session (headless Chromium) waits for Ray and its warm worker,
then starts the Compare page's default comparison (four defenses) at the browser test's
small settings and stays on it, so its view refreshes once a second until all four runs
have results. Taken: the seconds from the click to "4 of 4 runs have results", the CPU
seconds the server process (not Ray's workers) spent meanwhile and its resident memory at
the end (what the collection would save), and the runs' own seconds as they recorded them
(attack and utility training). Bounded: every wait has a deadline.
The figures go to ``benchmarks/results/watch_cost.json`` and docs/PERFORMANCE.md (between
the ``watch-cost`` markers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests.test_browser reads the tests' conftest

from auditlib.access.users import add_user  # noqa: E402
from auditlib.store import Store  # noqa: E402
from benchmarks.common import machine, replace_section, status_kib  # noqa: E402
from tests.test_browser import (  # noqa: E402
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    Server,
    _set_number,
    sign_in,
)

RESULTS = ROOT / "benchmarks" / "results" / "watch_cost.json"
DOC = ROOT / "docs" / "PERFORMANCE.md"
PASSWORD = "watch-cost-password"
WARM_S = 30.0  # after the first page view: Ray started and a worker warmed (about 20 s here)
SETTINGS = {"Streamlit's default": "true", "ours": "false"}  # runner.postScriptGC


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (not its children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _runs_seconds(data: Path) -> float:
    """The comparison's runs' own seconds: each attack's and utility training's."""
    total = 0.0
    with Store(f"sqlite:///{data / 'audit.db'}") as store:
        for run in store.list_runs(limit=100):
            utility = None if run.result is None else run.result.measured_utility
            total += (run.seconds or 0.0) + (0.0 if utility is None else utility.seconds)
    return total


def _one(setting: str, iterations: int, users: Path, playwright) -> dict:
    data = Path(tempfile.mkdtemp(prefix="watch-"))
    server = Server(data / "data", log="watch_cost_server.log")
    server.env |= {"AUDIT_USERS_FILE": str(users), "STREAMLIT_RUNNER_POST_SCRIPT_GC": setting}
    server.start()
    try:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2200})
            page.set_default_timeout(60_000)
            page.goto(server.url)
            sign_in(page, "auditor", PASSWORD)
            page.get_by_role("heading", name="Setup").first.wait_for()
            page.wait_for_timeout(int(WARM_S * 1000))
            page.get_by_role("link", name="Compare").first.click()
            page.get_by_role("heading", name="Compare defenses").first.wait_for()
            sidebar = page.locator('[data-testid="stSidebar"]')
            sidebar.get_by_text("Iterations", exact=True).wait_for()
            _set_number(sidebar, "Iterations", iterations, page)
            _set_number(sidebar, "Rounds", 1, page)
            _set_number(sidebar, "Clients", 2, page)
            _set_number(sidebar, "Training examples", 100, page)
            assert server.process is not None
            cpu = _cpu_seconds(server.process.pid)
            clicked = time.monotonic()
            page.get_by_role("button", name="Run the comparison (4 runs)").click()
            page.get_by_text("4 of 4 runs have results").wait_for(timeout=600_000)
            wall = time.monotonic() - clicked
            cpu = _cpu_seconds(server.process.pid) - cpu
            rss = status_kib(server.process.pid, "VmRSS")
            if rss is None:
                raise RuntimeError(f"/proc gives no VmRSS for the server ({server.process.pid})")
        finally:
            browser.close()
    finally:
        server.stop()
        server.log.close()
    return {
        "wall_s": round(wall, 1),
        "server_cpu_s": round(cpu, 1),
        "server_rss_mb": round(rss / 1024),
        "runs_s": round(_runs_seconds(data / "data"), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=2)
    args = parser.parse_args()
    if not (1 <= args.repeats <= 5 and 1 <= args.iterations <= 50):
        parser.error("--repeats 1..5 and --iterations 1..50 (a bounded benchmark)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    users = Path(tempfile.mkdtemp(prefix="watch-users-")) / "users.yaml"
    add_user("auditor", PASSWORD, "auditor", path=users)
    rows: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with sync_playwright() as playwright:
        for repeat in range(args.repeats):
            for name, setting in SETTINGS.items():
                row = _one(setting, args.iterations, users, playwright)
                rows[name].append(row)
                print(f"repeat {repeat + 1}, {name}: {row}", flush=True)
    result = {
        "machine": machine(),
        "iterations": args.iterations,
        "repeats": args.repeats,
        "rows": rows,
        "median": {
            name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            for name, runs in rows.items()
        },
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    replace_section(DOC, "watch-cost", _table(result))
    print(json.dumps(result["median"], indent=2))
    return 0


def _table(r: dict) -> str:
    lines = [
        f"The Compare page's four default defenses (none, dp-gaussian, prune, soteria), DLG "
        f"audit preset at {r['iterations']} iterations, utility on 100 examples (1 round, 2 "
        f"clients), watched in one headless Chromium session; median of {r['repeats']} "
        f"interleaved repetitions. Machine: {r['machine']}.",
        "",
        "| after each script run | click to 4 of 4 results | server CPU meanwhile | server memory at the end | the runs' own seconds (sum) | each repetition (wall, server CPU) |",
        "|---|---|---|---|---|---|",
    ]
    for name, runs in r["rows"].items():
        m = r["median"][name]
        each = "; ".join(f"{x['wall_s']} s, {x['server_cpu_s']} s" for x in runs)
        gc = "every object collected" if name != "ours" else "no collection (ours)"
        lines.append(
            f"| {gc} | {m['wall_s']} s | {m['server_cpu_s']} s | {m['server_rss_mb']:.0f} MiB "
            f"| {m['runs_s']} s | {each} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
