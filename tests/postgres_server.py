"""A throw-away PostgreSQL server for the store's tests, and the fixtures that use it.

The store promises any SQLAlchemy URL (``AUDIT_DATABASE_URL``), and PostgreSQL is the one a
shared deployment uses, so the store's tests run on it as well as on SQLite. The server is
started once per test session from the binaries of Debian's ``postgresql`` package
(``/usr/lib/postgresql/<version>/bin``, installed by ``make setup`` where the user is root,
or ``initdb`` on PATH), in a temporary directory of its own:

- no TCP at all (``listen_addresses = ''``): its only socket is a unix socket in that
  directory, reachable by its owner (and root) alone, so ``trust`` authentication is safe,
  and it cannot clash with a system cluster or another session's server;
- PostgreSQL refuses to run as root, so under root it runs as the ``postgres`` system user
  that the Debian package creates;
- durability off (``fsync``, ``synchronous_commit``, ``full_page_writes``): a test database
  need not survive a power cut;
- every test gets an empty database of its own, dropped after it, so tests stay independent;
- at the end of the session the server stops and its directory is removed.

Where it cannot start (no binaries, no driver, no ``postgres`` user), the tests that need
it are skipped with the reason, naming what is missing. Every wait is bounded: ``pg_ctl -w``
with a timeout, and a timeout on every command.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

START_TIMEOUT_S = 60  # pg_ctl -w waits at most this long for the server to accept connections
COMMAND_TIMEOUT_S = 120  # any one command (initdb, pg_ctl) is killed after this long
SUPERUSER = "postgres"
SETTINGS = {
    "listen_addresses": "''",  # no TCP: the unix socket below is the only way in
    "unix_socket_permissions": "0700",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "50",
}
_SAFE_PATH = re.compile(r"[A-Za-z0-9/_.-]+")


class PostgresUnavailable(RuntimeError):
    """No server could be started here; the message says what is missing."""


def find_binaries() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``: the newest Debian
    version under /usr/lib/postgresql, else the one ``initdb`` on PATH is in."""
    needed = ("initdb", "pg_ctl", "postgres")
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)] or [0],
        reverse=True,
    )
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for directory in candidates:
        if all(os.access(directory / name, os.X_OK) for name in needed):
            return directory
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in /usr/lib/postgresql/*/bin "
        "or on PATH; install Debian's postgresql package (`make setup` does, as root)"
    )


class PostgresServer:
    """One running throw-away server; :meth:`start` makes one, :meth:`stop` ends it."""

    def __init__(self, binaries: Path, root: Path, user: pwd.struct_passwd | None) -> None:
        self.binaries = binaries
        self.root = root
        self.data = root / "data"
        self.socket_dir = root / "socket"
        self.log = root / "server.log"
        self._user = user  # who the server runs as; None: this process's own user
        self._running = False

    # ------------------------------------------------------------------ life cycle

    @classmethod
    def start(cls) -> PostgresServer:
        """initdb a fresh cluster in a temporary directory and start it; raises
        PostgresUnavailable, having cleaned up, when that cannot be done here."""
        if importlib.util.find_spec("psycopg") is None:
            raise PostgresUnavailable(
                "the psycopg driver is not installed (pip install -r requirements.txt)"
            )
        binaries = find_binaries()
        user = None
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam(SUPERUSER)
            except KeyError:
                raise PostgresUnavailable(
                    f"running as root, and there is no {SUPERUSER!r} system user to run the "
                    "server as (PostgreSQL refuses root; Debian's postgresql package creates it)"
                ) from None
        base = tempfile.gettempdir()
        if not _SAFE_PATH.fullmatch(base) or len(base) > 60:  # a socket path has <= 107 bytes
            base = "/tmp"
        root = Path(tempfile.mkdtemp(prefix="auditlib-pg-", dir=base))
        server = cls(binaries, root, user)
        try:
            server._init_and_start()
        except PostgresUnavailable:
            server.stop()
            raise
        except Exception as exc:  # it started but does not answer on its socket
            reason = f"the server does not answer on {server.socket_dir}: {exc}{server._log_tail()}"
            server.stop()
            raise PostgresUnavailable(reason) from exc
        except BaseException:
            server.stop()
            raise
        atexit.register(server.stop)  # should the session end without its fixture teardown
        return server

    def _init_and_start(self) -> None:
        self.socket_dir.mkdir()
        if self._user is not None:
            for path in (self.root, self.socket_dir):
                os.chown(path, self._user.pw_uid, self._user.pw_gid)
        cluster = ["-D", str(self.data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8"]
        self._run("initdb", [*cluster, "--locale=C", "--no-sync"])  # no fsync: throw-away
        with (self.data / "postgresql.conf").open("a") as conf:  # later lines win
            conf.write("\n# the test session's throw-away server (tests/postgres_server.py)\n")
            for name, value in {
                **SETTINGS,
                "unix_socket_directories": f"'{self.socket_dir}'",
            }.items():
                conf.write(f"{name} = {value}\n")
        self._running = True  # from here on stop() must try pg_ctl stop
        self._run(
            "pg_ctl",
            ["-D", str(self.data), "-l", str(self.log), "-w", "-t", str(START_TIMEOUT_S), "start"],
        )
        self.execute("SELECT 1")  # it accepts connections on the socket

    def halt(self) -> None:
        """Stop the server, its data kept: an outage, as a restart of the database is to its
        clients (their connections dropped, every new one refused); :meth:`resume` ends it."""
        self._run("pg_ctl", ["-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop"])

    def resume(self) -> None:
        """Start the halted server again on its data."""
        self._run(
            "pg_ctl",
            ["-D", str(self.data), "-l", str(self.log), "-w", "-t", str(START_TIMEOUT_S), "start"],
        )

    def stop(self) -> None:
        """Stop the server (immediate: nothing in it is kept) and delete its directory;
        idempotent. A server pg_ctl cannot stop is killed by the pid it wrote."""
        if self._running:
            self._running = False
            try:
                self._run(
                    "pg_ctl", ["-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop"]
                )
            except PostgresUnavailable:
                self._kill_postmaster()
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill_postmaster(self) -> None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # the server this object started, by its own pid

    def _run(self, program: str, args: list[str]) -> None:
        """Run one of the server's programs as the server's user; raises PostgresUnavailable
        with its output (and the server log's tail) when it fails or outlives the timeout."""
        command = [str(self.binaries / program), *args]
        ids = {}
        if self._user is not None:
            ids = {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        try:
            done = subprocess.run(
                command,
                cwd=self.root,
                env={**env, "HOME": str(self.root)},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                check=False,
                **ids,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PostgresUnavailable(f"{program} could not run: {exc}") from exc
        if done.returncode != 0:
            raise PostgresUnavailable(
                f"{program} failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-800:]}{self._log_tail()}"
            )

    def _log_tail(self) -> str:
        try:
            tail = self.log.read_text(errors="replace").strip()[-800:]
        except OSError:
            return ""
        return f"; server log: {tail}" if tail else ""

    # ------------------------------------------------------------------ databases

    def execute(self, statement: str, database: str = "postgres") -> None:
        """One statement outside a transaction (CREATE/DROP DATABASE need that)."""
        import psycopg

        with psycopg.connect(
            host=str(self.socket_dir),
            user=SUPERUSER,
            dbname=database,
            autocommit=True,
            connect_timeout=10,
        ) as connection:
            connection.execute(statement)  # type: ignore[arg-type]  # our own SQL, no input

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of one of its databases (over the unix socket)."""
        return f"postgresql+psycopg://{SUPERUSER}@/{database}?host={self.socket_dir}"

    def create_database(self) -> str:
        """A new empty database; returns its name."""
        name = f"audit_{uuid.uuid4().hex[:12]}"
        self.execute(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        """Drop it, closing whatever connections a failed test left open."""
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ---------------------------------------------------------------------- fixtures
# Registered in tests/conftest.py, so any test module can ask for them.

BACKENDS = ("sqlite", pytest.param("postgresql", marks=pytest.mark.postgres))


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The session's throw-away server; tests that need it are skipped, with the reason,
    where it cannot start (the attempt is made once per session)."""
    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL server for this test: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of an empty PostgreSQL database of this test's own, dropped after it."""
    name = postgres_server.create_database()
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend in turn: a SQLite file under tmp_path, then a
    database of the session's PostgreSQL server (tests marked ``postgres``)."""
    if request.param == "sqlite":
        return f"sqlite:///{(tmp_path / 'audit.db').as_posix()}"
    return request.getfixturevalue("postgres_url")
