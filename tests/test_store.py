"""The store: run lifecycle, persistence across restarts, assets, concurrency, schema
versions. Every test uses a database of its own, on each backend in turn: a SQLite file
and a database of the session's throw-away PostgreSQL server (tests/postgres_server.py;
those tests are marked ``postgres`` and skipped, with the reason, where it cannot start).
A few tests are about SQLite files alone (WAL mode, in-memory URLs, a file that is not a
database, the default URL) and say so.

Why one file over 400 lines: it is the specification of one package or page set, read
from top to bottom; its tests share fixtures and helpers defined here.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import Connection, create_engine, inspect, text
from sqlalchemy.pool import NullPool

from auditlib.errors import AuditInputError
from auditlib.metrics.scores import Spread
from auditlib.result import AuditSummary
from auditlib.store import (
    SCHEMA_VERSION,
    RunFinishedError,
    Store,
    UnknownRunError,
    data_dir,
    default_database_url,
    schema,
)

SPEC = {"model": {"spec": {"name": "lenet"}}, "budget": {"iterations": 50}, "seed": 0}
# A real result.json, written by an earlier version (before verdicts): the store keeps any
# shape AuditSummary reads.
SUMMARY = AuditSummary.from_json(
    json.loads((Path(__file__).parent / "fixtures/results/result_9555ea9_parent.json").read_text())
)
PSNR = SUMMARY.metrics.psnr_mean  # 6.47 dB


def png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (4, 4), color=value).save(buffer, format="PNG")
    return buffer.getvalue()


def url_of(path: Path) -> str:
    return f"sqlite:///{path.as_posix()}"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite:")


@contextmanager
def raw(url: str) -> Iterator[Connection]:
    """A plain connection to the store's database, beside any Store (as another program or
    an older release would open it): one transaction, committed at the end."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        engine.dispose()


def layout(url: str) -> dict[str, object]:
    """Each table's columns (name, type, nullable; in any order: a migration appends) and
    indexes (name, columns)."""
    with raw(url) as connection:
        schema_of = inspect(connection)
        return {
            table: (
                sorted(
                    (c["name"], str(c["type"]), c["nullable"]) for c in schema_of.get_columns(table)
                ),
                sorted((i["name"], tuple(i["column_names"])) for i in schema_of.get_indexes(table)),
            )
            for table in sorted(schema_of.get_table_names())
        }


def untouched(url: str) -> object:
    """What a refused open must leave as it was: a SQLite file's bytes; else the layout."""
    return sha(Path(url.removeprefix("sqlite:///"))) if is_sqlite(url) else layout(url)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A SQLite file, for the tests about SQLite files alone."""
    return tmp_path / "audit.db"


@pytest.fixture
def url(database_url: str) -> str:
    """An empty database on each backend in turn (SQLite file, PostgreSQL)."""
    return database_url


@pytest.fixture
def store(url: str):
    with Store(url) as s:
        yield s


def test_run_lifecycle(store: Store) -> None:
    run_id = store.create_run(SPEC, "abc", title="LeNet / DLG")
    run = store.get_run(run_id)
    assert run is not None and run.status == "queued" and not run.finished
    assert run.created_at.tzinfo is not None and run.created_at.utcoffset().total_seconds() == 0
    assert run.started_at is None and run.summary is None and run.psnr_mean is None

    store.mark_running(run_id, worker="ray-task-1")
    for step in range(3):
        store.add_event(run_id, step * 10, 50, 0.1 * step, {"gradient_match": 1.0 / (step + 1)})
    store.add_image(run_id, 0, "originals", png(10))
    store.add_image(run_id, 20, "live", png(20))
    store.finish(run_id, "completed", SUMMARY)

    run = store.get_run(run_id)
    assert run is not None
    assert run.status == "completed" and run.finished and run.worker == "ray-task-1"
    assert run.spec == SPEC and run.result == SUMMARY  # typed round trip
    assert run.summary == json.loads(json.dumps(SUMMARY.to_json()))  # and its JSON
    assert run.created_at <= run.started_at <= run.finished_at  # type: ignore[operator]
    assert (run.psnr_mean, run.ssim_mean, run.lpips_mean) == (PSNR, SUMMARY.metrics.ssim_mean, None)
    assert (run.label_accuracy, run.iterations) == (0.5, 20)
    assert run.seconds == SUMMARY.timing.seconds

    events = store.events(run_id)
    assert [e.seq for e in events] == [0, 1, 2]
    assert [e.step for e in events] == [0, 10, 20] and events[0].total == 50
    assert events[2].losses == {"gradient_match": pytest.approx(1 / 3)}
    assert [e.seq for e in store.events(run_id, after_seq=0)] == [1, 2]
    assert store.events(run_id, after_seq=2) == []
    latest = store.latest_event(run_id)
    assert latest is not None and latest.seq == 2 and latest.elapsed_s == pytest.approx(0.2)
    originals = store.image(run_id, "originals")
    assert originals is not None and originals.png == png(10) and originals.step == 0
    assert store.image(run_id, "reconstruction") is None


def test_list_runs_newest_first_with_filters(store: Store) -> None:
    ids = [store.create_run(SPEC, f"spec{i % 2}", title=f"run {i}") for i in range(4)]
    store.finish(ids[1], "completed", SUMMARY)
    runs = store.list_runs()
    assert [r.id for r in runs] == ids[::-1]
    assert runs[2].psnr_mean == PSNR and runs[0].psnr_mean is None
    assert [r.id for r in store.list_runs(limit=2)] == ids[:1:-1]
    assert [r.id for r in store.list_runs(status="completed")] == [ids[1]]
    assert [r.id for r in store.list_runs(status="queued")] == [ids[3], ids[2], ids[0]]
    assert [r.id for r in store.list_runs(spec_id="spec0")] == [ids[2], ids[0]]
    with pytest.raises(ValueError, match="valid: cancelled, completed, failed"):
        store.list_runs(status="done")


def test_live_image_replaced_others_kept(store: Store) -> None:
    run_id = store.create_run(SPEC, "abc")
    store.mark_running(run_id)
    for step in range(5):
        store.add_image(run_id, step, "live", png(step))
    store.add_image(run_id, 0, "originals", png(100))
    store.add_image(run_id, 4, "reconstruction", png(200))
    store.add_image(run_id, 5, "reconstruction", png(201))

    live = store.image(run_id, "live")
    assert live is not None and live.step == 4 and live.png == png(4)
    final = store.image(run_id, "reconstruction")
    assert final is not None and final.png == png(201)
    with raw(store.url) as connection:
        query = text("SELECT kind, count(*) FROM run_images GROUP BY kind")
        counts = dict(connection.execute(query).all())
    assert counts == {"live": 1, "originals": 1, "reconstruction": 2}
    with pytest.raises(ValueError, match="valid: live, originals, reconstruction"):
        store.add_image(run_id, 0, "thumbnail", png(1))
    with pytest.raises(ValueError, match="not PNG"):
        store.add_image(run_id, 0, "live", b"GIF89a...")


def test_finish_rules_and_nan(store: Store) -> None:
    run_id = store.create_run(SPEC, "abc")
    with pytest.raises(ValueError, match="valid: cancelled, completed, failed, timed_out"):
        store.finish(run_id, "done")
    with pytest.raises(ValueError, match="valid"):
        store.finish(run_id, "running")  # not a final status
    metrics = SUMMARY.metrics
    spreads = {
        **metrics.spreads,
        "psnr": Spread(math.nan, 0.0, math.nan, math.nan),
        "ssim": Spread(math.inf, 0.0, 0.0, math.inf),
    }
    summary = replace(SUMMARY, metrics=replace(metrics, spreads=spreads))
    store.finish(run_id, "timed_out", summary, error=None)

    run = store.get_run(run_id)
    assert run is not None and run.status == "timed_out"
    assert run.summary["metrics"]["psnr_mean"] is None  # JSON has no NaN
    assert run.summary["metrics"]["ssim_mean"] is None
    assert run.psnr_mean is None and run.ssim_mean is None and run.iterations == 20
    with raw(store.url) as connection:  # the JSON as stored (JSONB on PostgreSQL)
        query = text("SELECT CAST(summary AS TEXT) FROM runs WHERE id = :id")
        stored = connection.execute(query, {"id": run_id}).scalar_one()
    assert "NaN" not in stored and "Infinity" not in stored and "null" in stored

    with pytest.raises(RunFinishedError, match="already timed_out"):
        store.finish(run_id, "completed", SUMMARY)
    with pytest.raises(RunFinishedError):
        store.add_event(run_id, 1, 2, 0.1, {})
    with pytest.raises(RunFinishedError):
        store.add_image(run_id, 1, "live", png(1))
    with pytest.raises(RunFinishedError):
        store.mark_running(run_id)
    store.request_cancel(run_id)  # too late: a no-op
    after = store.get_run(run_id)
    assert after is not None and after.status == "timed_out" and not after.cancel_requested
    assert after.finished_at == run.finished_at


def test_events_nan_losses_cancel_and_unknown_runs(store: Store) -> None:
    run_id = store.create_run(SPEC, "abc")
    store.add_event(run_id, 1, 10, 0.5, {"loss": math.nan, "tv": 0.25})
    assert store.events(run_id)[0].losses == {"loss": None, "tv": 0.25}
    with pytest.raises(ValueError, match="elapsed_s"):
        store.add_event(run_id, 2, 10, math.nan, {})
    store.request_cancel(run_id)
    run = store.get_run(run_id)
    assert run is not None and run.cancel_requested and run.status == "queued"
    store.finish(run_id, "cancelled")

    assert store.get_run("nope") is None
    assert store.events("nope") == [] and store.latest_event("nope") is None
    for write in (
        lambda: store.add_event("nope", 1, 1, 0.0, {}),
        lambda: store.add_image("nope", 1, "live", png(1)),
        lambda: store.mark_running("nope"),
        lambda: store.finish("nope", "failed"),
        lambda: store.request_cancel("nope"),
    ):
        with pytest.raises(UnknownRunError, match="no run 'nope'"):
            write()


def test_delete_run_removes_events_and_images(store: Store) -> None:
    keep = store.create_run(SPEC, "abc")
    gone = store.create_run(SPEC, "abc")
    for run_id in (keep, gone):
        store.add_event(run_id, 1, 1, 0.0, {"l": 1.0})
        store.add_image(run_id, 1, "originals", png(1))
    store.delete_run(gone)
    store.delete_run(gone)  # idempotent
    assert store.get_run(gone) is None and store.events(gone) == []
    assert store.image(gone, "originals") is None
    assert len(store.events(keep)) == 1 and store.image(keep, "originals") is not None
    with pytest.raises(UnknownRunError):  # its writer learns that it is gone
        store.add_event(gone, 2, 2, 0.0, {})


def _spec_using(weights: str | None, images: str | None) -> dict:
    spec = json.loads(json.dumps(SPEC))
    spec.setdefault("model", {})["weights_asset"] = weights
    if images is not None:
        spec["data"] = {"source": "asset", "location": images, "batch_size": 1}
    return spec


def test_deleting_the_last_run_that_uses_an_upload_deletes_the_upload(store: Store) -> None:
    weights = store.put_asset("model", "w.safetensors", b"w" * 1000)
    images = store.put_asset("images", "a.png", b"i" * 100)
    first = store.create_run(_spec_using(weights, images), "one")
    second = store.create_run(_spec_using(weights, None), "two")
    assert store.runs_using_asset(weights) == 2 and store.runs_using_asset(images) == 1

    # Only the images were this run's alone: they go with it, the weights stay.
    assert [a.name for a in store.delete_run(first)] == ["a.png"]
    assert store.get_asset_info(images) is None
    assert store.get_asset(weights).data == b"w" * 1000
    with pytest.raises(AuditInputError, match="used by 1 stored run"):
        store.delete_asset(weights)

    freed = store.delete_run(second)
    assert [(a.name, a.size) for a in freed] == [("w.safetensors", 1000)]
    assert store.list_assets() == []
    assert store.delete_run(second) == []  # idempotent


def test_an_upload_no_run_uses_can_be_deleted(store: Store) -> None:
    kept = store.put_asset("images", "kept.png", b"k")
    unused = store.put_asset("images", "unused.png", b"u")
    store.create_run(_spec_using(None, kept), "one")
    assert store.delete_asset(unused).name == "unused.png"
    assert store.delete_asset(unused) is None  # already gone
    assert [a.name for a in store.list_assets()] == ["kept.png"]


def test_persistence_across_reopen(url: str) -> None:
    first = Store(url)
    run_id = first.create_run(SPEC, "abc", title="kept")
    first.mark_running(run_id)
    first.add_event(run_id, 5, 10, 1.0, {"loss": 0.5})
    first.add_image(run_id, 5, "live", png(5))
    first.finish(run_id, "completed", SUMMARY)
    asset = first.put_asset("images", "batch.zip", b"bytes", {"count": 2})
    first.close()
    first.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        first.get_run(run_id)

    with Store(url) as second:  # `make run` again
        run = second.get_run(run_id)
        assert run is not None and run.title == "kept" and run.result == SUMMARY
        assert run.psnr_mean == PSNR
        assert [e.losses for e in second.events(run_id)] == [{"loss": 0.5}]
        live = second.image(run_id, "live")
        assert live is not None and live.png == png(5)
        record = second.get_asset(asset)
        assert record is not None and record.data == b"bytes" and record.meta == {"count": 2}
    if is_sqlite(url):  # the journal mode is a SQLite file's (engine.py)
        with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
            assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_failing_the_runs_of_a_gone_instance_leaves_every_other_run_alone(store: Store) -> None:
    """``Instances.fail_runs``: the unfinished runs of the instances named (None: runs
    recorded with none) end failed with their reason, counted by owner; the live runs of
    another instance and every finished run stay as they are."""
    from auditlib.store.instances import Instances

    instances = Instances(store)
    instances.register("gone", "host pid:[1]", 10, "100")
    instances.register("live", "host pid:[1]", 11, "101")
    queued = store.create_run(SPEC, "a", owner="alice", instance="gone")
    running = store.create_run(SPEC, "b", owner="bob", instance="gone")
    store.mark_running(running)
    done = store.create_run(SPEC, "c", owner="alice", instance="gone")
    store.finish(done, "completed", SUMMARY)
    legacy = store.create_run(SPEC, "d", owner="alice")
    other = store.create_run(SPEC, "e", owner="alice", instance="live")
    store.mark_running(other)

    failed = instances.fail_runs({"gone": "its process ended", None: "no instance"})
    assert failed == {"alice": 2, "bob": 1}
    for run_id, reason in (
        (queued, "its process ended"),
        (running, "its process ended"),
        (legacy, "no instance"),
    ):
        run = store.get_run(run_id)
        assert run is not None and run.status == "failed"
        assert run.error == reason and run.finished_at is not None
    finished = store.get_run(done)
    assert finished is not None and finished.status == "completed" and finished.error is None
    assert store.get_run(other).status == "running" and store.get_run(other).instance == "live"
    assert instances.fail_runs({"gone": "again"}) == {}
    instances.stop(["gone"])
    assert [i.id for i in instances.running()] == ["live"]


def test_assets_content_addressed(store: Store) -> None:
    first = store.put_asset("model", "lenet.safetensors", b"weights-1", {"arch": "lenet"})
    again = store.put_asset("model", "renamed.safetensors", b"weights-1")
    other = store.put_asset("images", "faces.zip", b"weights-2")
    assert first == again == hashlib.sha256(b"weights-1").hexdigest()
    assert other != first
    with raw(store.url) as connection:
        assert connection.scalar(text("SELECT count(*) FROM assets")) == 2

    record = store.get_asset(first)
    assert record is not None and record.data == b"weights-1" and record.size == 9
    assert record.name == "lenet.safetensors" and record.meta == {"arch": "lenet"}
    assert record.created_at.tzinfo == UTC
    assert store.get_asset("0" * 64) is None
    models = store.list_assets("model")
    assert [a.sha256 for a in models] == [first] and not hasattr(models[0], "data")
    assert {a.sha256 for a in store.list_assets()} == {first, other}
    with pytest.raises(ValueError, match="valid: code, images, model"):
        store.put_asset("weights", "x", b"x")


def _writers_and_readers(store: Store, count: int = 200) -> list[str]:
    """Two runs written at once (two consumer threads) while two page threads poll."""
    run_ids = [store.create_run(SPEC, "abc"), store.create_run(SPEC, "def")]
    errors: list[BaseException] = []
    writing = len(run_ids)
    lock = threading.Lock()

    def write(run_id: str) -> None:
        nonlocal writing
        try:
            store.mark_running(run_id)
            for step in range(count):
                store.add_event(run_id, step, count, step * 0.01, {"loss": 1.0 / (step + 1)})
                if step % 20 == 0:
                    store.add_image(run_id, step, "live", png(step))
        except BaseException as exc:
            errors.append(exc)
        finally:
            with lock:
                writing -= 1

    def read(run_id: str) -> None:
        try:
            last = -1
            while writing:
                for event in store.events(run_id, after_seq=last):
                    assert event.seq == last + 1
                    last = event.seq
                store.list_runs()
                store.latest_event(run_id)
                store.image(run_id, "live")
                time.sleep(0.001)  # a poller, not a busy loop hogging the GIL
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(r,)) for r in run_ids]
    threads += [threading.Thread(target=read, args=(r,)) for r in run_ids]
    for thread in threads:
        thread.start()
    store.request_cancel(run_ids[0])  # the UI writing at the same time
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    for run_id in run_ids:
        assert [e.seq for e in store.events(run_id)] == list(range(count))
    return run_ids


def test_concurrent_writers_and_readers(store: Store) -> None:
    run_id = _writers_and_readers(store)[0]
    run = store.get_run(run_id)
    assert run is not None and run.cancel_requested


def test_in_memory_url(tmp_path: Path) -> None:  # SQLite alone: an in-memory database
    with Store("sqlite://") as memory:
        run_id, other = _writers_and_readers(memory, count=50)
        memory.finish(run_id, "completed", SUMMARY)
        assert {r.status for r in memory.list_runs()} == {"completed", "running"}
        with Store("sqlite://") as same:  # one engine per URL: the same database
            assert same.get_run(other) is not None
    with Store("sqlite://") as fresh:  # the last close disposed it
        assert fresh.list_runs() == []


# ------------------------------------------------------------------------- schema


def _version(url: str) -> int:
    with raw(url) as connection:
        return connection.scalar(text("SELECT version FROM schema_info"))


# What each migration step added (MIGRATIONS[v]: schema v -> v + 1), taken away again, in
# SQL that SQLite and PostgreSQL both run: a database as release v wrote it. A new step
# adds its entry here.
UNDO: dict[int, list[str]] = {
    1: ["DROP TABLE batches"],
    2: ["ALTER TABLE runs DROP COLUMN stage"],
    3: ["DROP TABLE run_assets"],
    4: [
        "DROP TABLE asset_owners",
        "DROP INDEX ix_runs_owner",
        "ALTER TABLE runs DROP COLUMN owner",
        "DROP INDEX ix_batches_owner",
        "ALTER TABLE batches DROP COLUMN owner",
    ],
    5: [
        "ALTER TABLE asset_owners DROP COLUMN name",
        "ALTER TABLE asset_owners DROP COLUMN meta",
        "ALTER TABLE asset_owners DROP COLUMN claimed_at",
    ],
    6: [
        "DROP TABLE instances",
        "DROP INDEX ix_runs_instance",
        "ALTER TABLE runs DROP COLUMN instance",
    ],
    7: ["DROP TABLE text_runs"],
    8: ["DROP TABLE text_run_assets"],
}


def as_release(url: str, version: int) -> None:
    """Turn a database of the current schema into one of schema ``version``, rows kept."""
    with raw(url) as connection:
        for step in range(SCHEMA_VERSION - 1, version - 1, -1):
            for statement in UNDO[step]:
                connection.execute(text(statement))
        connection.execute(text("UPDATE schema_info SET version = :v"), {"v": version})


def test_schema_created_with_version(url: str) -> None:
    Store(url).close()
    assert _version(url) == SCHEMA_VERSION
    assert {
        "schema_info",
        "assets",
        "runs",
        "run_events",
        "run_images",
        "batches",
        "run_assets",
    } <= set(layout(url))


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_a_migrated_database_has_the_layout_of_a_new_one(url: str, version: int) -> None:
    """Every older schema, migrated, ends with the tables, columns and indexes a new
    database gets, so a migration and the models cannot drift apart."""
    with Store(url) as new:
        run_id = new.create_run(SPEC, "abc")
    fresh = layout(url)
    as_release(url, version)
    assert layout(url) != fresh
    with Store(url) as migrated:
        assert migrated.get_run(run_id) is not None
    assert _version(url) == SCHEMA_VERSION
    assert layout(url) == fresh


def test_schema_1_database_gains_the_batches_table(url: str) -> None:
    """A database of the first release (no batches) is migrated, its runs kept."""
    with Store(url) as old:
        run_id = old.create_run(SPEC, "abc")
    as_release(url, 1)
    with Store(url) as migrated:
        assert migrated.get_run(run_id) is not None
        batch_id = migrated.create_batch("sweep", "s", {"members": []})
        assert migrated.get_batch(batch_id).kind == "sweep"
    assert _version(url) == SCHEMA_VERSION


def test_schema_2_database_gains_the_run_stage(url: str) -> None:
    """A database of the second release (no ``runs.stage``) is migrated, its runs kept."""
    with Store(url) as old:
        run_id = old.create_run(SPEC, "abc")
    as_release(url, 2)
    with Store(url) as migrated:
        assert migrated.get_run(run_id).stage is None
        migrated.mark_running(run_id)
        migrated.set_stage(run_id, "utility training: round 1 of 5")
        assert migrated.get_run(run_id).stage == "utility training: round 1 of 5"
    assert _version(url) == SCHEMA_VERSION


def test_schema_3_database_learns_which_runs_use_which_uploads(url: str) -> None:
    """A database of the third release (no ``run_assets``): the migration reads each
    stored run's spec, so deleting an old run still deletes the uploads only it used."""
    with Store(url) as old:
        weights = old.put_asset("model", "w.safetensors", b"w")
        images = old.put_asset("images", "a.png", b"i")
        both = old.create_run(_spec_using(weights, images), "one")
        only_weights = old.create_run(_spec_using(weights, None), "two")
    as_release(url, 3)
    with Store(url) as migrated:
        assert migrated.runs_using_asset(weights) == 2
        assert [a.sha256 for a in migrated.delete_run(both)] == [images]
        assert [a.sha256 for a in migrated.delete_run(only_weights)] == [weights]
    assert _version(url) == SCHEMA_VERSION


def test_schema_5_claims_keep_the_name_their_upload_had(url: str) -> None:
    """A database of the fifth release (claims without their own name, meta and time): each
    claim is filled from the upload it shares, so its owner sees what they saw before."""
    with Store(url) as old:
        sha = old.put_asset("images", "a.zip", b"i", {"count": 1}, owner="alice")
        old.put_asset("images", "b.zip", b"i", {"count": 2}, owner="bob")
        first = old.get_asset_info(sha)
    as_release(url, 5)
    with Store(url) as migrated:
        for owner in ("alice", "bob"):
            info = migrated.get_asset_info(sha, owner=owner)
            assert (info.name, info.meta, info.created_at) == (
                "a.zip",
                {"count": 1},
                first.created_at,
            )
        migrated.put_asset("images", "c.zip", b"i", {"count": 3}, owner="bob")
        assert migrated.get_asset_info(sha, owner="bob").name == "c.zip"
        assert migrated.get_asset_info(sha, owner="alice").name == "a.zip"
    assert _version(url) == SCHEMA_VERSION


def test_newer_schema_refused_untouched(url: str) -> None:
    Store(url).close()
    with raw(url) as connection:
        connection.execute(text("UPDATE schema_info SET version = 99"))
    before = untouched(url)
    with pytest.raises(
        AuditInputError, match=rf"newer release \(schema 99\).*up to {SCHEMA_VERSION}"
    ):
        Store(url)
    assert _version(url) == 99 and untouched(url) == before


def test_migration_runs_once(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store(url) as old:
        run_id = old.create_run(SPEC, "abc")
    calls: list[int] = []
    current = SCHEMA_VERSION

    def add_note_column(connection: Connection) -> None:
        calls.append(1)
        connection.execute(text("ALTER TABLE runs ADD COLUMN note TEXT"))

    monkeypatch.setattr(schema, "SCHEMA_VERSION", current + 1)
    monkeypatch.setattr(schema, "MIGRATIONS", {**schema.MIGRATIONS, current: add_note_column})
    with Store(url) as migrated:
        assert migrated.get_run(run_id) is not None  # data survives the migration
    assert calls == [1] and _version(url) == current + 1
    Store(url).close()
    assert calls == [1]  # already at the new version: not again
    assert "note" in {column[0] for column in layout(url)["runs"][0]}


def test_migration_missing_or_failing(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    Store(url).close()
    current = SCHEMA_VERSION
    monkeypatch.setattr(schema, "SCHEMA_VERSION", current + 2)

    def half_done(connection: Connection) -> None:
        connection.execute(text("ALTER TABLE runs ADD COLUMN half TEXT"))
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(schema, "MIGRATIONS", {current: half_done})
    with pytest.raises(
        AuditInputError, match=f"no migration from schema {current + 1} to {current + 2}"
    ):
        Store(url)
    assert _version(url) == current

    monkeypatch.setattr(schema, "SCHEMA_VERSION", current + 1)
    with pytest.raises(RuntimeError, match=f"left at schema {current}"):
        Store(url)
    assert _version(url) == current
    # the half-done step was rolled back with it (both backends roll DDL back)
    assert "half" not in {column[0] for column in layout(url)["runs"][0]}


def test_not_a_database_refused(db: Path) -> None:  # SQLite alone: a file that is not one
    db.write_bytes(b"these are holiday photos, not a database\n" * 50)
    before = sha(db)
    with pytest.raises(AuditInputError, match="not a database this tool can open"):
        Store(url_of(db))
    assert sha(db) == before


def test_foreign_database_refused(url: str) -> None:
    with raw(url) as connection:
        connection.execute(text("CREATE TABLE invoices (id INTEGER PRIMARY KEY)"))
    before = untouched(url)
    with pytest.raises(AuditInputError, match=r"tables \(invoices\) but no schema_info"):
        Store(url)
    assert untouched(url) == before
    if is_sqlite(url):  # nor was the file switched to WAL
        with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
            assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


@pytest.mark.postgres
def test_a_postgresql_database_that_is_not_there_is_refused(postgres_server) -> None:
    missing = postgres_server.url("no_such_database")
    with pytest.raises(AuditInputError, match="cannot open the database at postgresql"):
        Store(missing)


def test_default_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # SQLite's
    monkeypatch.delenv("AUDIT_DATABASE_URL", raising=False)
    monkeypatch.setenv("AUDIT_DATA_DIR", str(tmp_path / "nested" / "data"))
    assert data_dir() == (tmp_path / "nested" / "data").resolve() and data_dir().is_dir()
    assert default_database_url() == url_of((tmp_path / "nested" / "data").resolve() / "audit.db")
    with Store() as default:
        default.create_run(SPEC, "abc")
    assert (tmp_path / "nested" / "data" / "audit.db").is_file()
    monkeypatch.setenv("AUDIT_DATABASE_URL", "sqlite://")
    assert default_database_url() == "sqlite://"


@pytest.mark.postgres
def test_audit_database_url_selects_postgresql(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUDIT_DATABASE_URL", postgres_url)
    with Store() as default:
        assert repr(default).startswith("Store('postgresql+psycopg://postgres@/audit_")
        run_id = default.create_run(SPEC, "abc")
    with Store(postgres_url) as again:
        assert again.get_run(run_id) is not None
