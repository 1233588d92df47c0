"""Schema version check and migrations, run once when a Store opens a database.

Why a version row: the dashboard is restarted (``make run``) on a database written by an
earlier release, or by a later one if someone rolls back. Opening must then either bring
the tables up to date (older) or refuse before writing anything (newer, or not ours), so
that an unknown layout is never "fixed" by creating tables into it.

``MIGRATIONS[v]`` brings a database from version ``v`` to ``v + 1``. Each step runs in its
own write transaction together with the version bump, so a failing step leaves the
database at the last good version (SQLite and PostgreSQL both roll DDL back).
These module globals are read at call time, so tests can patch them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from sqlalchemy import (
    Connection,
    Index,
    MetaData,
    Table,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.exc import DatabaseError, OperationalError

from auditlib.errors import AuditInputError
from auditlib.store.convert import assets_in_spec, utcnow
from auditlib.store.engine import WRITE_OPTION, SharedEngine, describe, enable_wal
from auditlib.store.models import (
    AssetOwner,
    Base,
    Batch,
    Instance,
    Run,
    RunAsset,
    SchemaInfo,
    TextRun,
    TextRunAsset,
)


def _add_batches(connection: Connection) -> None:
    """1 -> 2: comparisons and sweeps (the ``batches`` table), as schema 2 had it: the
    columns later steps add (``owner``, 4 -> 5) come with those steps."""
    later = {"owner"}
    table = Table(
        "batches",
        MetaData(),
        *(c._copy() for c in Batch.__table__.columns if c.name not in later),
        Index("ix_batches_created_at", "created_at"),
    )
    table.create(connection)


def _add_run_stage(connection: Connection) -> None:
    """2 -> 3: the ``runs.stage`` column (what a run does after its attack)."""
    connection.execute(text("ALTER TABLE runs ADD COLUMN stage VARCHAR(200)"))


def _add_run_assets(connection: Connection) -> None:
    """3 -> 4: the ``run_assets`` table (which uploads each run uses), filled from the
    stored runs' specs, so deleting a run can delete the uploads only it used."""
    RunAsset.__table__.create(connection)
    rows = [
        {"run_id": run_id, "sha256": sha}
        for run_id, spec in connection.execute(select(Run.id, Run.spec))
        for sha in sorted(assets_in_spec(spec or {}))
    ]
    if rows:
        connection.execute(insert(RunAsset), rows)


def _add_owners(connection: Connection) -> None:
    """4 -> 5: owners (``runs.owner``, ``batches.owner``, the ``asset_owners`` table).
    What was stored before sign-in keeps no owner: only an admin sees it. The claims'
    columns later steps add (their name, meta and time, 5 -> 6) come with those steps."""
    for table in ("runs", "batches"):
        connection.execute(text(f"ALTER TABLE {table} ADD COLUMN owner VARCHAR(64)"))
        connection.execute(text(f"CREATE INDEX ix_{table}_owner ON {table} (owner)"))
    later = {"name", "meta", "claimed_at"}
    Table(
        "asset_owners",
        MetaData(),
        *(c._copy() for c in AssetOwner.__table__.columns if c.name not in later),
    ).create(connection)


def _add_claim_details(connection: Connection) -> None:
    """5 -> 6: each claim's own name, meta and time (``asset_owners.name``, ``.meta``,
    ``.claimed_at``), filled for the claims already there from the asset row they share."""
    columns = AssetOwner.__table__.c
    for column in (columns.name, columns.meta, columns.claimed_at):
        kind = column.type.compile(dialect=connection.dialect)
        connection.execute(text(f"ALTER TABLE asset_owners ADD COLUMN {column.name} {kind}"))
    for column, source in (("name", "name"), ("meta", "meta"), ("claimed_at", "created_at")):
        connection.execute(
            text(
                f"UPDATE asset_owners SET {column} = (SELECT assets.{source} FROM assets "
                "WHERE assets.sha256 = asset_owners.sha256)"
            )
        )


def _add_instances(connection: Connection) -> None:
    """6 -> 7: which dashboard process runs each run (``runs.instance``, the ``instances``
    table with its heartbeats), so one process never fails another's live runs. The runs
    already there keep no instance: a later start-up fails those left unfinished, as
    before."""
    Instance.__table__.create(connection)
    connection.execute(text("ALTER TABLE runs ADD COLUMN instance VARCHAR(32)"))
    connection.execute(text("CREATE INDEX ix_runs_instance ON runs (instance)"))


def _add_text_runs(connection: Connection) -> None:
    """7 -> 8: text models' audits (the ``text_runs`` table, ``store/text_runs.py``)."""
    TextRun.__table__.create(connection)


def _add_text_run_assets(connection: Connection) -> None:
    """8 -> 9: which uploads each text run uses (the ``text_run_assets`` table). Text runs
    recorded before it named no upload by its hash, so they link none."""
    TextRunAsset.__table__.create(connection)


SCHEMA_VERSION: int = 9
MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    1: _add_batches,
    2: _add_run_stage,
    3: _add_run_assets,
    4: _add_owners,
    5: _add_claim_details,
    6: _add_instances,
    7: _add_text_runs,
    8: _add_text_run_assets,
}

_VERSION_ROW = 1


def _guard(shared: SharedEngine) -> AbstractContextManager[object]:
    return shared.lock if shared.lock is not None else nullcontext()


@contextmanager
def _transaction(shared: SharedEngine, *, write: bool) -> Iterator[Connection]:
    engine = shared.engine.execution_options(**{WRITE_OPTION: True}) if write else shared.engine
    with _guard(shared), engine.begin() as connection:
        yield connection


def _user_tables(connection: Connection) -> set[str]:
    return {t for t in inspect(connection).get_table_names() if not t.startswith("sqlite_")}


def _stored_version(connection: Connection, where: str) -> int | None:
    """The version row's value; None when the database has no tables at all."""
    tables = _user_tables(connection)
    if not tables:
        return None
    if SchemaInfo.__tablename__ not in tables:
        raise AuditInputError(
            f"the database at {where} already holds tables ({', '.join(sorted(tables)[:5])}"
            f"{', ...' if len(tables) > 5 else ''}) but no schema_info table, so it was not "
            "written by this tool; refusing to open it so it is not corrupted "
            "(point AUDIT_DATABASE_URL at an empty or audit database)"
        )
    version = connection.scalar(select(SchemaInfo.version).where(SchemaInfo.id == _VERSION_ROW))
    if not isinstance(version, int) or version < 1:
        raise AuditInputError(
            f"the database at {where} has a schema_info table without a valid version "
            f"({version!r}); refusing to open it so it is not corrupted"
        )
    return version


def _check_known(version: int, where: str) -> None:
    if version > SCHEMA_VERSION:
        raise AuditInputError(
            f"the database at {where} was written by a newer release (schema {version}); "
            f"this release understands up to {SCHEMA_VERSION}; refusing to open it so it "
            "is not corrupted"
        )
    missing = [v for v in range(version, SCHEMA_VERSION) if v not in MIGRATIONS]
    if missing:
        raise AuditInputError(
            f"the database at {where} has schema {version} and this release has no "
            f"migration from schema {missing[0]} to {missing[0] + 1}; refusing to open it"
        )


def _create(shared: SharedEngine, where: str) -> None:
    with _transaction(shared, write=True) as connection:
        # Re-checked under the write lock: another process may have created it meanwhile.
        version = _stored_version(connection, where)
        if version is not None:
            _check_known(version, where)
            return
        Base.metadata.create_all(connection)
        connection.execute(
            insert(SchemaInfo).values(id=_VERSION_ROW, version=SCHEMA_VERSION, created_at=utcnow())
        )


def _migrate(shared: SharedEngine, where: str, start: int) -> None:
    for step in range(start, SCHEMA_VERSION):
        with _transaction(shared, write=True) as connection:
            # Re-read under the write lock: another process may have run this step.
            if _stored_version(connection, where) != step:
                continue
            try:
                MIGRATIONS[step](connection)
            except Exception as exc:
                raise RuntimeError(
                    f"migrating the database at {where} from schema {step} to {step + 1} "
                    f"failed ({exc}); it was left at schema {step}"
                ) from exc
            connection.execute(
                update(SchemaInfo).where(SchemaInfo.id == _VERSION_ROW).values(version=step + 1)
            )


def ensure_schema(shared: SharedEngine) -> None:
    """Create, accept or migrate the database behind ``shared``; refuse what is not ours.

    Raises AuditInputError, before writing anything, for a database of a newer schema,
    one with foreign tables and no version row, or a file that is not a database.
    """
    where = describe(shared.engine.url)
    try:
        with _transaction(shared, write=False) as connection:
            version = _stored_version(connection, where)
        if version is not None:
            _check_known(version, where)
    except OperationalError as exc:
        raise AuditInputError(f"cannot open the database at {where}: {exc.orig}") from exc
    except DatabaseError as exc:
        raise AuditInputError(
            f"{where} is not a database this tool can open ({exc.orig}); refusing to touch "
            "it (point AUDIT_DATABASE_URL or AUDIT_DATA_DIR elsewhere)"
        ) from exc
    enable_wal(shared)
    if version is None:
        _create(shared, where)
    elif version < SCHEMA_VERSION:
        _migrate(shared, where, version)
