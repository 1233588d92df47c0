"""Where the database is, and one shared, thread-ready Engine per database URL.

The dashboard reads the store from several Streamlit script threads while one consumer
thread per run writes to it. An Engine owns a connection pool; creating one per call or
per page would defeat the pool and, for SQLite, multiply open file handles, so engines
are shared per URL and reference-counted: the last ``Store.close()`` on a URL disposes it.

SQLite settings and why:

- ``check_same_thread=False``: pooled connections move between threads (one at a time).
- WAL journal (set once per file by the schema check, after the file is known to be ours;
  it persists in the file): readers never block the writer and the writer never blocks
  readers, so polling pages cannot stall a run.
- ``busy_timeout``: two writers (the consumer and a UI "cancel" click) wait for each other
  instead of failing at once with "database is locked".
- SQLAlchemy emits BEGIN itself (the driver's legacy mode does not BEGIN before SELECT or
  DDL): reads see one snapshot, schema creation is one transaction, and write sessions
  start with BEGIN IMMEDIATE so a read-then-write can never hit SQLITE_BUSY_SNAPSHOT,
  which ``busy_timeout`` does not retry.
- In-memory databases (``sqlite://``) live in one connection: StaticPool shares it
  between threads, and since that one connection has one transaction state, a lock
  serialises every session on it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import StaticPool

from auditlib.paths import data_dir, private

BUSY_TIMEOUT_MS = 15_000
WRITE_OPTION = "auditlib_write"  # execution option: this transaction will write


def default_database_url() -> str:
    """``$AUDIT_DATABASE_URL``, else a SQLite file ``audit.db`` in :func:`data_dir`."""
    configured = os.environ.get("AUDIT_DATABASE_URL", "").strip()
    if configured:
        return configured
    return f"sqlite:///{(data_dir() / 'audit.db').as_posix()}"


def describe(url: str | URL) -> str:
    """The URL for messages: the file path for SQLite, the URL without password otherwise."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.database or ":memory:"
    return parsed.render_as_string(hide_password=True)


def is_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite"


def is_sqlite_memory(url: URL) -> bool:
    return is_sqlite(url) and url.database in (None, "", ":memory:")


@dataclass
class SharedEngine:
    """An engine, how many open Stores use it, and the lock in-memory SQLite needs."""

    engine: Engine
    lock: threading.RLock | None
    users: int = 0


_registry: dict[str, SharedEngine] = {}
_registry_lock = threading.Lock()


def _install_sqlite_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from the driver (see the module docstring); these pragmas are
        # per connection and do not write the file.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.execute("PRAGMA synchronous = NORMAL")  # safe with WAL, much faster
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        writes = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")


def _private_database(path: Path) -> None:
    """The SQLite file created readable by its owner only (SQLite gives its -wal and -shm
    files the database's permissions), or made so where this process owns it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    private(path, 0o600)


def _create(url: URL) -> SharedEngine:
    if is_sqlite_memory(url):
        engine = create_engine(url, connect_args={"check_same_thread": False}, poolclass=StaticPool)
        _install_sqlite_hooks(engine)
        return SharedEngine(engine, threading.RLock())
    if is_sqlite(url):
        database = url.database or ""
        if not database.startswith("file:"):
            _private_database(Path(database).expanduser())
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False},
            pool_size=5,  # one writer per run plus a few polling page threads
            max_overflow=20,
            pool_timeout=30,
        )
        _install_sqlite_hooks(engine)
        return SharedEngine(engine, None)
    engine = create_engine(
        url,
        pool_size=5,
        max_overflow=10,
        pool_pre_ping=True,  # a server restart or idle timeout must not surface as an error
        pool_recycle=1800,
    )
    return SharedEngine(engine, None)


def acquire(url: str) -> SharedEngine:
    """The shared engine for ``url`` (created on first use); pair with :func:`release`."""
    parsed = make_url(url)
    key = parsed.render_as_string(hide_password=False)
    with _registry_lock:
        shared = _registry.get(key)
        if shared is None:
            shared = _registry[key] = _create(parsed)
        shared.users += 1
        return shared


def release(shared: SharedEngine) -> None:
    """One user fewer; the last one disposes the engine (closing SQLite files)."""
    with _registry_lock:
        shared.users -= 1
        if shared.users > 0:
            return
        for key, value in list(_registry.items()):
            if value is shared:
                del _registry[key]
        shared.engine.dispose()


def enable_wal(shared: SharedEngine) -> None:
    """Switch a SQLite file to WAL; a no-op elsewhere and for in-memory databases.

    Called only after the schema check accepted the file, because the journal mode is
    written into the file's header and a refused file must stay untouched.
    """
    url = shared.engine.url
    if not is_sqlite(url) or is_sqlite_memory(url):
        return
    raw = shared.engine.raw_connection()
    try:
        cursor = raw.cursor()
        try:
            cursor.execute("PRAGMA journal_mode = WAL")  # outside a transaction, as required
        finally:
            cursor.close()
    finally:
        raw.close()
