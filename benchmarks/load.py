"""Several signed-in users on one dashboard at once: sessions, concurrent runs, refreshes.

``python -m benchmarks.load [--sessions N] [--runs-per-session K] [--iterations I]
[--refreshes R]``. One ``streamlit run app.py`` on 127.0.0.1 with its own data folder and
embedded Ray; N Playwright contexts in one headless Chromium, each signed in as its own
auditor. Every session starts K short DLG runs from the Attack lab (so N x K runs are
queued or running at once on the one server), the first session cancels its last run,
and while the runs go every session reloads its History page R times, timing each reload
until the table's caption is back. Bounded: every wait has a deadline, the whole benchmark
one of ``--deadline`` seconds.

Checked at the end, from the store: every run ended in its right status (completed; the
cancelled one cancelled), no event was lost (each run's event sequence is 0, 1, 2, ...
without a gap, and a completed run's last event is at its last step), every completed run
has its originals and its reconstruction, and each session's History listed exactly its
own runs. The figures go to ``benchmarks/results/load.json`` and docs/PERFORMANCE.md
(between the ``load`` markers).
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
from benchmarks.common import machine, replace_section  # noqa: E402
from tests.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, Server, sign_in  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "load.json"
DOC = ROOT / "docs" / "PERFORMANCE.md"
PASSWORD = "load-test-password"


def _start_runs(page, url: str, count: int, iterations: int) -> None:
    """Start ``count`` runs from the Attack lab (the Setup defaults: LeNet, one photograph)."""
    page.goto(f"{url}/lab")
    sidebar = page.locator('[data-testid="stSidebar"]')
    field = sidebar.get_by_label("Iterations", exact=True)
    field.fill(str(iterations))
    field.press("Enter")
    page.wait_for_timeout(1000)
    for _ in range(count):
        before = page.url
        page.get_by_role("button", name="Start the attack").click()
        page.wait_for_url(lambda u, before=before: "run=" in u and u != before)  # its view
        page.wait_for_timeout(500)


def _refresh_latencies(page, url: str, refreshes: int, deadline: float) -> list[float]:
    """Reload History ``refreshes`` times; seconds from the reload to its caption."""
    page.goto(f"{url}/history")
    page.get_by_text("newest first").first.wait_for()
    out = []
    for _ in range(refreshes):
        if time.monotonic() > deadline:
            break
        started = time.monotonic()
        page.reload()
        page.get_by_text("newest first").first.wait_for()
        out.append(time.monotonic() - started)
        page.wait_for_timeout(500)
    return out


def _history_count(page, url: str) -> int:
    """How many runs the session's History lists."""
    page.goto(f"{url}/history")
    caption = page.get_by_text("newest first").first  # a refresh may show two for a moment
    caption.wait_for()
    return int(caption.inner_text().split(" run(s)")[0])


def _refused(page, url: str, run_id: str) -> bool:
    """Whether the session's link to ``run_id`` (another user's) is refused on the page."""
    page.goto(f"{url}/lab?run={run_id}")
    page.get_by_text("This run cannot be opened").wait_for(timeout=60_000)
    return page.get_by_text("belongs to another user").count() > 0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--runs-per-session", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--refreshes", type=int, default=15)
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds, in all")
    args = parser.parse_args()
    if not (1 <= args.sessions <= 8 and 1 <= args.runs_per_session <= 4):
        parser.error("--sessions 1..8 and --runs-per-session 1..4 (a bounded load)")
    from playwright.sync_api import sync_playwright

    deadline = time.monotonic() + args.deadline
    data = Path(tempfile.mkdtemp(prefix="load-"))
    users = [f"user{i}" for i in range(args.sessions)]
    for user in users:
        add_user(user, PASSWORD, "auditor", path=data / "users.yaml")
    os.environ["AUDIT_USERS_FILE"] = str(data / "users.yaml")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server = Server(data / "data")
    server.start()
    started = time.monotonic()
    latencies: dict[str, list[float]] = {}
    listed: dict[str, int] = {}
    refused: dict[str, bool] = {}
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            pages = {}
            for user in users:
                page = browser.new_context(viewport={"width": 1400, "height": 1600}).new_page()
                page.set_default_timeout(120_000)
                page.goto(server.url)
                sign_in(page, user, PASSWORD)
                pages[user] = page
            for i, user in enumerate(users):
                _start_runs(pages[user], server.url, args.runs_per_session, args.iterations)
                if i == 0:  # the first session cancels its last run (queued behind others)
                    pages[user].get_by_role("button", name="Cancel run").click()
            for user in users:  # sessions take turns; each reload is timed on its own
                latencies[user] = _refresh_latencies(
                    pages[user], server.url, args.refreshes, deadline
                )
            with Store(f"sqlite:///{data / 'data' / 'audit.db'}") as store:
                while time.monotonic() < deadline:
                    if all(r.finished for r in store.list_runs(limit=1000)):
                        break
                    time.sleep(2)
                owners = {r.id: r.owner for r in store.list_runs(limit=1000)}
            for i, user in enumerate(users):
                listed[user] = _history_count(pages[user], server.url)
                other = users[(i + 1) % len(users)]
                if other != user:  # a link to the next user's run, opened by this one
                    theirs = next(r for r, o in owners.items() if o == other)
                    refused[user] = _refused(pages[user], server.url, theirs)
            browser.close()
    finally:
        server.stop()
        server.log.close()
    wall = time.monotonic() - started

    with Store(f"sqlite:///{data / 'data' / 'audit.db'}") as store:
        runs = store.list_runs(limit=1000)
        problems = []
        statuses: dict[str, int] = {}
        events = 0
        for run in runs:
            statuses[run.status] = statuses.get(run.status, 0) + 1
            seqs = [e.seq for e in store.events(run.id)]
            events += len(seqs)
            if seqs != list(range(len(seqs))):
                problems.append(f"run {run.id[:8]}: event sequence has gaps")
            if run.status == "completed":
                last = store.latest_event(run.id)
                if last is None or last.step != last.total:
                    problems.append(f"run {run.id[:8]}: last event not at the last step")
                for kind in ("originals", "reconstruction"):
                    if store.image(run.id, kind) is None:
                        problems.append(f"run {run.id[:8]}: no {kind} image")
        for user in users:
            own = sum(r.owner == user for r in runs)
            if listed.get(user) != own:
                problems.append(f"{user}'s History listed {listed.get(user)} run(s), not {own}")
            if len(users) > 1 and not refused.get(user):
                problems.append(f"{user} opened another user's run by its link")
    for run in runs:  # the cancelled run ends cancelled (or completed, if it was done first)
        right = ("cancelled", "completed") if run.cancel_requested else ("completed",)
        if run.status not in right:
            problems.append(f"run {run.id[:8]} ended {run.status}, expected {right[0]}")
    if sum(r.cancel_requested for r in runs) != 1:
        problems.append("the cancellation was not recorded")
    every = [s for values in latencies.values() for s in values]
    result = {
        "machine": machine(),
        "sessions": args.sessions,
        "runs": len(runs),
        "iterations": args.iterations,
        "statuses": statuses,
        "events": events,
        "wall_s": round(wall, 1),
        "refreshes": len(every),
        "refresh_p50_s": round(statistics.median(every), 2) if every else None,
        "refresh_p90_s": round(_percentile(every, 0.9), 2) if every else None,
        "refresh_max_s": round(max(every), 2) if every else None,
        "history_counts": listed,
        "links_to_others_refused": refused,
        "problems": problems,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    replace_section(DOC, "load", _table(result))
    print(json.dumps(result, indent=2))
    return 0 if not problems else 1


def _table(r: dict) -> str:
    lost = "none" if not r["problems"] else "; ".join(r["problems"])
    return (
        f"{r['sessions']} signed-in sessions (Playwright contexts, one Chromium), "
        f"{r['runs']} DLG runs of {r['iterations']} iterations started from them at once on "
        f"one server (embedded Ray), one cancelled:\n\n"
        "| statuses | events stored | History reloads timed | p50 | p90 | max | wall | problems |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"| {', '.join(f'{v} {k}' for k, v in sorted(r['statuses'].items()))} | "
        f"{r['events']} | {r['refreshes']} | {r['refresh_p50_s']} s | {r['refresh_p90_s']} s | "
        f"{r['refresh_max_s']} s | {r['wall_s']} s | {lost} |\n\n"
        f"Each session's History listed its own runs only "
        f"({', '.join(f'{u}: {n}' for u, n in r['history_counts'].items())}), and each "
        f"session's link to the next user's run was refused "
        f"({sum(r['links_to_others_refused'].values())} of {len(r['links_to_others_refused'])})."
        f" Machine: {r['machine']}."
    )


if __name__ == "__main__":
    raise SystemExit(main())
