"""Issue 57's faults replayed against the real dashboard, on SQLite and on PostgreSQL.

Each fault runs real servers (``sh scripts/in_own_group.sh python -m streamlit run app.py``,
as ``make run`` starts it, on 127.0.0.1), starts runs in them through Chromium as a user
would, does the fault, and reads what it left in the store: each run's final status and
reason, the events and images kept, the store's integrity check (SQLite), and the seconds
from the fault (or its end) to the run's true status. Every wait is bounded.

    python -m benchmarks.faults [--backends sqlite postgresql] [--only NAME ...]

Writes benchmarks/results/faults.json and the table in docs/FAULTS.md (between its
``faults`` markers).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy import text

from auditlib.access.users import add_user
from auditlib.store import Store
from benchmarks.common import ROOT, replace_section

sys.path.insert(0, str(ROOT / "tests"))  # tests.test_browser reads the tests' conftest
from tests.postgres_server import PostgresServer
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, _free_port, sign_in, upload_images

RESULTS = ROOT / "benchmarks" / "results" / "faults.json"
DOC = ROOT / "docs" / "FAULTS.md"
PASSWORD = "fault-password"
USERS = ("ann", "ben")
SHORT, LONG = 40, 100_000  # iterations: a run of some seconds, one that outlasts any fault


@dataclass(frozen=True)
class Row:
    fault: str
    backend: str
    runs: str  # each run's final status and reason
    kept: str  # events and images stored
    integrity: str
    true_after_s: float | None  # from the fault (or its end) to the run's true status
    held: bool
    note: str = ""


class Dashboard:
    """One dashboard server on the store, started as ``make run`` starts it."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.log = log
        self.wrapper: subprocess.Popen | None = None

    def start(self) -> None:
        command = ["sh", "scripts/in_own_group.sh", sys.executable, "-m", "streamlit", "run"]
        command += ["app.py", "--server.port", str(self.port), "--server.headless", "true"]
        with self.log.open("ab") as log:
            self.wrapper = subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            health = f"{self.url}/_stcore/health"
            with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=2) as answer:
                if answer.status == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"the dashboard on {self.url} did not start in 90 s")

    @property
    def server_pid(self) -> int:
        assert self.wrapper is not None
        children = Path(f"/proc/{self.wrapper.pid}/task/{self.wrapper.pid}/children")
        return int(children.read_text().split()[0])

    def descendants(self) -> set[int]:
        """Every process the server started (Ray's servers, agents and workers)."""
        found, todo = set(), [self.server_pid]
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                for task in Path(f"/proc/{pid}/task").iterdir():
                    for child in (task / "children").read_text().split():
                        if int(child) not in found:
                            found.add(int(child))
                            todo.append(int(child))
        return found

    def terminate(self) -> None:
        """SIGTERM, as a service manager stops it; waits for it to exit."""
        if self.wrapper is not None and self.wrapper.poll() is None:
            self.wrapper.send_signal(signal.SIGTERM)
            self.wrapper.wait(90)

    def kill(self) -> None:
        """kill -9 of the server itself (its wrapper then ends its group)."""
        os.kill(self.server_pid, signal.SIGKILL)
        assert self.wrapper is not None
        self.wrapper.wait(30)


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (zombies are gone)."""
    living = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                living.add(pid)
    return living


class Bench:
    """One backend's store, its users, a browser, and the dashboards started on it."""

    def __init__(self, backend: str, root: Path, url: str, browser, pg: PostgresServer | None):
        self.backend, self.root, self.url, self.browser, self.pg = backend, root, url, browser, pg
        self.users = root / "users.yaml"
        if not self.users.exists():
            for name in USERS:
                add_user(name, PASSWORD, "auditor", path=self.users)
        self.dashboards: list[Dashboard] = []

    def dashboard(self, cpus: int = 2) -> Dashboard:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AUDIT_", "RAY_"))}
        env.update(
            AUDIT_USERS_FILE=str(self.users),
            AUDIT_RAY_NUM_CPUS=str(cpus),
            RAY_USAGE_STATS_ENABLED="0",
        )
        if self.backend == "sqlite":
            env["AUDIT_DATA_DIR"] = str(self.root / "data")
        else:
            env["AUDIT_DATABASE_URL"] = self.url
        board = Dashboard(env, self.root / f"server-{len(self.dashboards)}.log")
        board.start()
        self.dashboards.append(board)
        return board

    def page(self, board: Dashboard, path: str = "lab"):
        page = self.browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.set_default_timeout(60_000)
        page.goto(f"{board.url}/{path}")
        sign_in(page, USERS[0], PASSWORD)
        return page

    def start_run(self, board: Dashboard, iterations: int) -> str:
        page = self.page(board)
        sidebar = page.locator('[data-testid="stSidebar"]')
        field = sidebar.get_by_label("Iterations", exact=True)
        field.fill(str(iterations))
        field.press("Enter")
        page.wait_for_timeout(1500)
        page.get_by_role("button", name="Start the attack").click()
        deadline = time.monotonic() + 60
        while "run=" not in page.url:
            assert time.monotonic() < deadline, "Start did not open a run"
            page.wait_for_timeout(200)
        run_id = page.url.split("run=")[1].split("&")[0]
        page.context.close()
        return run_id

    def store(self) -> Store:
        return Store(self.url)

    def status(self, run_id: str) -> tuple[str, str | None]:
        with self.store() as store:
            record = store.get_run(run_id)
            return (record.status, record.error) if record else ("deleted", None)

    def wait_status(self, run_id: str, done: Callable[[str], bool], timeout: float) -> float:
        began = time.monotonic()
        while not done(self.status(run_id)[0]):
            if time.monotonic() - began > timeout:
                return float("nan")
            time.sleep(0.25)
        return time.monotonic() - began

    def kept(self, run_ids: list[str]) -> str:
        with self.store() as store:
            parts = []
            for run_id in run_ids:
                events = len(store.events(run_id))
                images = sorted(
                    kind
                    for kind in ("originals", "live", "reconstruction")
                    if store.image(run_id, kind) is not None
                )
                parts.append(f"{events} events, images {'+'.join(images) or 'none'}")
            return "; ".join(parts)

    def integrity(self) -> str:
        if self.backend != "sqlite":
            return "n/a (PostgreSQL)"
        with Store(self.url) as store, store._shared.engine.connect() as connection:
            return str(connection.execute(text("PRAGMA integrity_check")).scalar())

    def described(self, run_ids: list[str]) -> str:
        return "; ".join(
            f"{status}" + (f": {error}" if error else "")
            for status, error in (self.status(r) for r in run_ids)
        )

    def stop_all(self) -> None:
        for board in self.dashboards:
            with contextlib.suppress(Exception):
                board.terminate()
        self.dashboards.clear()


FINISHED = {"completed", "failed", "cancelled", "timed_out"}


def two_dashboards(bench: Bench) -> Row:
    """A run on the first dashboard; a second started on the same store, its History
    opened; each then runs one: every run finishes with its result."""
    first = bench.dashboard(cpus=1)  # two dashboards on 2 cores: a worker each
    run_a = bench.start_run(first, SHORT * 5)
    bench.wait_status(run_a, lambda s: s == "running", 120)
    second = bench.dashboard(cpus=1)
    page = bench.page(second, "history")
    page.wait_for_timeout(2000)
    warned = page.get_by_text("still in progress when the dashboard process").count()
    page.context.close()
    run_b = bench.start_run(second, SHORT)
    took = max(bench.wait_status(r, FINISHED.__contains__, 600) for r in (run_a, run_b))
    statuses = [bench.status(r)[0] for r in (run_a, run_b)]
    bench.stop_all()
    return Row(
        "two dashboards on one store, a run each",
        bench.backend,
        bench.described([run_a, run_b]),
        bench.kept([run_a, run_b]),
        bench.integrity(),
        None,
        statuses == ["completed", "completed"] and not warned,
        f"the second's History warned of no run: {not warned}; both ended in {took:.0f} s",
    )


def store_outage(bench: Bench) -> Row:
    """The database gone 2 s into a run for 10 s or until its worker has finished
    (PostgreSQL: stopped and started again; SQLite: another process holding its write
    lock), a second run cancelled during it."""
    board = bench.dashboard()
    finishing = bench.start_run(board, SHORT)
    cancelled = bench.start_run(board, LONG)
    for run_id in (finishing, cancelled):
        bench.wait_status(run_id, lambda s: s == "running", 120)
    page = bench.page(board, f"lab?run={cancelled}")
    time.sleep(2)
    down = time.time()
    holder = None
    if bench.pg is not None:
        bench.pg.halt()
    else:  # an exclusive lock: every write waits out its busy timeout, then fails
        holder = subprocess.Popen(
            [sys.executable, "-c", LOCK_HOLDER, str(bench.root / "data" / "audit.db")],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    try:
        page.get_by_role("button", name="Cancel run").click()
        page.wait_for_timeout(1500)
        history = bench.page(board, "history") if bench.pg is not None else None
        one_line = None
        if history is not None:
            with contextlib.suppress(Exception):  # at most 20 s for the page's one line
                history.get_by_text("could not be shown").wait_for(timeout=20_000)
            body = history.locator("body").inner_text()
            one_line = "Traceback" not in body and "could not be shown" in body
            history.context.close()
        # Down for 10 s, and on until both workers have ended (one finished, one
        # cancelled), so each ending meets the outage (at most 90 s).
        while time.time() < down + 90 and (
            time.time() < down + 10 or any("audit_task" in _cmdline(p) for p in board.descendants())
        ):
            time.sleep(0.25)
    finally:
        if bench.pg is not None:
            bench.pg.resume()
        elif holder is not None:
            holder.terminate()
            holder.wait(10)
    back = time.time()
    page.context.close()
    took = [bench.wait_status(r, FINISHED.__contains__, 120) for r in (finishing, cancelled)]
    statuses = [bench.status(r)[0] for r in (finishing, cancelled)]
    with bench.store() as store:
        record = store.get_run(finishing)
        ended = record.result.timing.ended_unix if record and record.result else float("nan")
    during = down <= ended <= back  # its worker finished while the store was down
    bench.stop_all()
    said = "" if one_line is None else f"; History during the outage: one line {one_line}"
    said = f"; its worker finished {ended - down:.1f} s into the {back - down:.0f} s outage" + said
    return Row(
        "store outage mid-run (10 s or more), Cancel during it",
        bench.backend,
        bench.described([finishing, cancelled]),
        bench.kept([finishing, cancelled]),
        bench.integrity(),
        max(took),
        statuses == ["completed", "cancelled"]
        and during
        and max(took) < 30
        and one_line is not False,
        f"seconds from the store's return to each true status: {took[0]:.1f}, {took[1]:.1f}" + said,
    )


LOCK_HOLDER = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(600)
"""


def deleted_mid_run(bench: Bench) -> Row:
    """A running run deleted (History's Delete): its Ray task stops computing."""
    board = bench.dashboard()
    run_id = bench.start_run(board, LONG)
    bench.wait_status(run_id, lambda s: s == "running", 120)
    time.sleep(3)
    workers = {p for p in board.descendants() if "audit_task" in _cmdline(p)}
    with bench.store() as store:
        store.delete_run(run_id)
    began = time.monotonic()
    while alive(workers) and time.monotonic() - began < 60:
        time.sleep(0.25)
    took = time.monotonic() - began
    bench.stop_all()
    return Row(
        "a running run deleted",
        bench.backend,
        bench.described([run_id]),
        "-",
        bench.integrity(),
        took,
        bool(workers) and not alive(workers) and took < 20,
        f"its worker ({len(workers)} process) ended {took:.1f} s after the deletion",
    )


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def sigterm(bench: Bench) -> Row:
    """SIGTERM with two runs in flight: both end failed, saying the server stopped, before
    it exits; nothing it started is left running."""
    board = bench.dashboard()
    run_ids = [bench.start_run(board, LONG) for _ in range(2)]
    for run_id in run_ids:  # both computing: running, with progress stored
        bench.wait_status(run_id, lambda s: s == "running", 120)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "0 events" in bench.kept(run_ids):
        time.sleep(0.5)
    started = board.descendants()
    began = time.monotonic()
    board.terminate()
    took = max(bench.wait_status(r, FINISHED.__contains__, 60) for r in run_ids)
    exited = time.monotonic() - began
    time.sleep(5)
    left = alive(started)
    bench.dashboards.clear()
    reasons = [bench.status(r) for r in run_ids]
    held = all(s == "failed" and e and "server shut down" in e for s, e in reasons)
    return Row(
        "SIGTERM with two runs in flight",
        bench.backend,
        bench.described(run_ids),
        bench.kept(run_ids),
        bench.integrity(),
        took,
        held and not left,
        f"the server exited {exited:.1f} s after SIGTERM; processes left 5 s later: {len(left)}",
    )


def kill_and_restart(bench: Bench) -> Row:
    """kill -9 with a run in flight, then a restart: the run is failed, saying why, at the
    restart (no page opened); nothing the dead server started lives on."""
    board = bench.dashboard()
    run_id = bench.start_run(board, LONG)
    bench.wait_status(run_id, lambda s: s == "running", 120)
    time.sleep(2)
    started = board.descendants()
    board.kill()
    time.sleep(5)
    left = alive(started)
    still = bench.status(run_id)[0]
    began = time.monotonic()
    bench.dashboards.clear()
    bench.dashboard()  # no page is opened: the start-up reconciles
    took = bench.wait_status(run_id, FINISHED.__contains__, 120)
    restarted = time.monotonic() - began
    status, error = bench.status(run_id)
    bench.stop_all()
    return Row(
        "kill -9 with a run in flight, then a restart",
        bench.backend,
        bench.described([run_id]),
        bench.kept([run_id]),
        bench.integrity(),
        restarted if took == took else None,
        status == "failed"
        and bool(error)
        and "ended while it was in progress" in error
        and not left,
        f"'{still}' until the restart; true {restarted:.1f} s after the restart began "
        f"(no page opened); processes left 5 s after the kill: {len(left)}",
    )


def disk_full(bench: Bench) -> Row:
    """The store's disk full 2 s into a run (SQLite's folder on a small tmpfs, filled):
    the run goes on, an upload on Setup says the disk is full in one line, and once space
    is freed the run ends with its result within a beat."""
    if bench.backend != "sqlite":
        raise Skipped("PostgreSQL's disk is its server's: not this service's to fill")
    data = bench.root / "data"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(data)], check=True)
    try:
        board = bench.dashboard()
        run_id = bench.start_run(board, SHORT)
        bench.wait_status(run_id, lambda s: s == "running", 120)
        time.sleep(2)
        filler = data / "filler"
        with filler.open("wb") as file, contextlib.suppress(OSError):
            while True:
                file.write(b"\0" * (1 << 20))
                file.flush()
        full = time.time()
        page = bench.page(board, "")  # Setup, the default page
        upload_images(page)
        with contextlib.suppress(Exception):
            page.get_by_text("disk is full").wait_for(timeout=30_000)
        body = page.locator("body").inner_text()
        page.context.close()
        said = "the server's disk is full" in body and "Traceback" not in body
        while time.time() < full + 60 and any(
            "audit_task" in _cmdline(p) for p in board.descendants()
        ):
            time.sleep(0.25)  # the worker finishes while the disk is full
        held_back = bench.status(run_id)[0] == "running"
        filler.unlink()
        took = bench.wait_status(run_id, FINISHED.__contains__, 60)
        row = Row(
            "the store's disk full mid-run, an upload during it",
            bench.backend,
            bench.described([run_id]),
            bench.kept([run_id]),
            bench.integrity(),
            took,
            said and held_back and bench.status(run_id)[0] == "completed" and took < 30,
            f"the upload said the disk is full in one line: {said}; the run stayed "
            f"'running' while the disk was full: {held_back}; seconds from the space freed "
            f"to its true status: {took:.1f}",
        )
        bench.stop_all()
        return row
    finally:
        bench.stop_all()
        subprocess.run(["umount", "-l", str(data)], check=False)


class Skipped(Exception):
    """A fault that does not apply to this store."""


FAULTS: list[tuple[str, Callable[[Bench], Row]]] = [
    ("two-dashboards", two_dashboards),
    ("outage", store_outage),
    ("deleted", deleted_mid_run),
    ("sigterm", sigterm),
    ("kill", kill_and_restart),
    ("disk-full", disk_full),
]


def _table(rows: list[Row]) -> str:
    lines = [
        "| fault | store | runs' final status and reason | kept | integrity | to true status | held |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        seconds = "-" if row.true_after_s is None else f"{row.true_after_s:.1f} s"
        lines.append(
            f"| {row.fault} | {row.backend} | {row.runs} | {row.kept} | {row.integrity} | "
            f"{seconds} | {'yes' if row.held else '**no**'}: {row.note} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="*", default=["sqlite", "postgresql"])
    parser.add_argument("--only", nargs="*", help="the faults to run (names in FAULTS)")
    parser.add_argument("--no-docs", action="store_true", help="print only")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    rows: list[Row] = []
    faults = [f for f in FAULTS if not args.only or f[0] in args.only]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for backend in args.backends:
            pg = PostgresServer.start() if backend == "postgresql" else None
            try:
                for name, fault in faults:
                    root = Path(tempfile.mkdtemp(prefix=f"fault-{name}-"))
                    url = (
                        f"sqlite:///{root / 'data' / 'audit.db'}"
                        if pg is None
                        else pg.url(pg.create_database())
                    )
                    (root / "data").mkdir()
                    bench = Bench(backend, root, url, browser, pg)
                    began = time.monotonic()
                    try:
                        row = fault(bench)
                    except Skipped as why:
                        print(f"skipped {backend:10} {name}: {why}", flush=True)
                        continue
                    except Exception as exc:  # a fault that could not be replayed held nothing
                        row = Row(name, backend, "-", "-", "-", None, False, f"{exc!r}"[:300])
                    finally:
                        bench.stop_all()
                    rows.append(row)
                    print(
                        f"{'held  ' if row.held else 'FAILED'} {backend:10} {row.fault}: "
                        f"{row.runs} | {row.kept} | {row.note} ({time.monotonic() - began:.0f} s)",
                        flush=True,
                    )
            finally:
                if pg is not None:
                    pg.stop()
        browser.close()
    if not args.no_docs:  # rows of faults not rerun (--only, --backends) are kept
        kept = [Row(**r) for r in json.loads(RESULTS.read_text())] if RESULTS.exists() else []
        new = {(r.fault, r.backend): r for r in rows}
        merged = [new.pop((r.fault, r.backend), r) for r in kept] + list(new.values())
        RESULTS.write_text(json.dumps([asdict(r) for r in merged], indent=2) + "\n")
        replace_section(DOC, "faults", _table(merged))
    held = sum(r.held for r in rows)
    print(f"\n{held} of {len(rows)} held")
    return 0 if held == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
