"""Who may see what: the users file (bcrypt hashes, roles, the first admin), the store as one
user sees it (their runs, batches and uploads; an admin's view holds everyone's), starting
runs only with one's own uploads, and the ``users`` command."""

from __future__ import annotations

import hashlib
import io
import stat

import pytest
import yaml

from auditlib.access import AccessDenied, Principal
from auditlib.access.users import (
    add_user,
    init_users,
    principal_of,
    read_users,
    remove_user,
    set_password,
)
from auditlib.cli import main
from auditlib.engine.user_runs import UserRuns
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from auditlib.store import Store
from auditlib.store.scoped import UserStore

ALICE, BOB, ROOT = Principal("alice"), Principal("bob"), Principal("root", "admin")

# ---------------------------------------------------------------------------- the users file


def test_a_user_is_stored_with_a_bcrypt_hash_never_the_password(tmp_path):
    path = tmp_path / "users.yaml"
    add_user("carol", "carol-secret-1", "auditor", name="Carol", path=path)
    text = path.read_text()
    assert "carol-secret-1" not in text
    entry = yaml.safe_load(text)["credentials"]["usernames"]["carol"]
    assert entry["password"].startswith("$2") and entry["roles"] == ["auditor"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    users = read_users(path)
    assert users.check_password("carol", "carol-secret-1")
    assert not users.check_password("carol", "carol-secret-2")
    assert not users.check_password("nobody", "carol-secret-1")
    set_password("carol", "a-new-password", path=path)
    assert read_users(path).check_password("carol", "a-new-password")


@pytest.mark.parametrize(
    ("name", "password", "role", "message"),
    [
        ("Carol", "long-enough", "auditor", "user name 'Carol': expected 2 to 32 characters"),
        ("c", "long-enough", "auditor", "expected 2 to 32 characters"),
        ("carol", "short", "auditor", "at least 8 characters"),
        ("carol", "x" * 73, "auditor", "at most 72 bytes"),
        ("carol", "long-enough", "owner", "role 'owner': expected one of auditor, admin"),
    ],
)
def test_bad_users_are_refused_with_what_was_expected(tmp_path, name, password, role, message):
    path = tmp_path / "users.yaml"
    with pytest.raises(AuditInputError, match=message):
        add_user(name, password, role, path=path)
    assert not path.exists()


def test_the_first_admin_is_created_once_and_the_last_admin_stays(tmp_path):
    path = tmp_path / "users.yaml"
    one_time = init_users(path)
    assert one_time == tmp_path / "first-admin-password"
    assert stat.S_IMODE(one_time.stat().st_mode) == 0o600
    password = one_time.read_text().strip()
    assert len(password) >= 16
    assert read_users(path).check_password("admin", password)
    assert read_users(path).users["admin"].must_change
    assert init_users(path) is None  # never again, nothing changes
    assert one_time.read_text().strip() == password
    with pytest.raises(AuditInputError, match="the one in use"):
        set_password("admin", password, path=path)
    set_password("admin", "the-admins-own", path=path)  # the first change ends it
    assert not read_users(path).users["admin"].must_change and not one_time.exists()
    add_user("dave", "dave-password", "auditor", path=path)
    with pytest.raises(AuditInputError, match="exists"):
        add_user("dave", "other-password", "auditor", path=path)
    with pytest.raises(AuditInputError, match="last admin"):
        remove_user("admin", path=path)
    remove_user("dave", path=path)
    assert principal_of("dave", path) is None  # a removed user is nobody at once
    assert principal_of("admin", path) == Principal("admin", "admin")


def test_a_damaged_or_plain_text_users_file_is_refused(tmp_path):
    path = tmp_path / "users.yaml"
    with pytest.raises(AuditInputError, match="python -m auditlib users init"):
        read_users(path)
    path.write_text("credentials: [1, 2")
    with pytest.raises(AuditInputError, match="cannot be read"):
        read_users(path)
    path.write_text(
        yaml.safe_dump(
            {
                "credentials": {"usernames": {"eve": {"password": "plain", "roles": ["admin"]}}},
                "cookie": {"key": "k" * 40},
            }
        )
    )
    with pytest.raises(AuditInputError, match="must be a bcrypt hash, never plain text"):
        read_users(path)


# ---------------------------------------------------------------- the store as a user sees it

SPEC = {"attack": {"name": "dlg"}, "data": {"source": "asset", "location": "x"}}


@pytest.fixture
def store(tmp_path):
    with Store(f"sqlite:///{tmp_path / 'audit.db'}") as opened:
        yield opened


def test_each_user_sees_only_their_runs_and_an_admin_sees_all(store):
    mine = store.create_run(SPEC, "spec-a", "alice's", owner="alice")
    theirs = store.create_run(SPEC, "spec-a", "bob's", owner="bob")
    before = store.create_run(SPEC, "spec-a", "before sign-in")
    alice, bob, root = UserStore(store, ALICE), UserStore(store, BOB), UserStore(store, ROOT)

    assert [r.id for r in alice.list_runs()] == [mine]
    assert [r.id for r in bob.list_runs()] == [theirs]
    assert {r.id for r in root.list_runs()} == {mine, theirs, before}
    assert alice.get_run(mine).owner == "alice"
    with pytest.raises(AccessDenied, match="belongs to another user; you are signed in as 'bob'"):
        bob.get_run(mine)
    with pytest.raises(AccessDenied, match="recorded before sign-in"):
        alice.get_run(before)
    for read in (bob.events, bob.latest_event, bob.delete_run):
        with pytest.raises(AccessDenied):
            read(mine)
    with pytest.raises(AccessDenied):
        bob.image(mine, "live")
    assert store.get_run(mine) is not None  # a refused delete deleted nothing
    # A spec's standing run is the user's own: bob's comparison never stands on alice's run.
    assert alice.runs_for_specs(["spec-a"])["spec-a"].id == mine
    assert bob.runs_for_specs(["spec-a"])["spec-a"].id == theirs
    assert root.runs_for_specs(["spec-a"], owner="alice")["spec-a"].id == mine
    with pytest.raises(AccessDenied):
        bob.runs_for_specs(["spec-a"], owner="alice")


def test_batches_belong_to_their_owner(store):
    alice, bob, root = UserStore(store, ALICE), UserStore(store, BOB), UserStore(store, ROOT)
    batch_id = alice.create_batch("comparison", "mine", {"members": []})
    assert [b.id for b in alice.list_batches()] == [batch_id]
    assert bob.list_batches() == [] and [b.id for b in root.list_batches()] == [batch_id]
    with pytest.raises(AccessDenied, match=f"comparison {batch_id} belongs to another user"):
        bob.get_batch(batch_id)
    with pytest.raises(AccessDenied):
        bob.delete_batch(batch_id)
    assert root.get_batch(batch_id).owner == "alice"
    alice.delete_batch(batch_id)
    assert store.get_batch(batch_id) is None


def test_an_upload_is_its_uploaders_and_goes_when_nobody_needs_it(store):
    alice, bob = UserStore(store, ALICE), UserStore(store, BOB)
    sha = alice.put_asset("images", "private.zip", b"alice's private images")
    assert [a.sha256 for a in alice.list_assets()] == [sha] and bob.list_assets() == []
    # To bob, alice's upload is one that is not stored: the same answer as for bytes nobody
    # uploaded (uploads are named by their bytes' hash: any other answer tells whoever holds
    # a file that somebody uploaded it).
    nobodys = hashlib.sha256(b"nobody uploaded this").hexdigest()
    assert bob.get_asset(sha) is None and bob.get_asset(nobodys) is None
    assert bob.get_asset_info(sha) is None and bob.get_asset_info(nobodys) is None
    assert bob.runs_using_asset(sha) == bob.runs_using_asset(nobodys) == 0
    assert bob.delete_asset(sha) is None and store.get_asset_info(sha) is not None
    # The same bytes uploaded by bob: one row, two claims (he holds the file anyway), each
    # seen under its uploader's own name, details and time, never the other's.
    assert bob.put_asset("images", "mine.zip", b"alice's private images", {"classes": ["b"]}) == sha
    assert bob.get_asset(sha).data == b"alice's private images"
    assert (bob.get_asset(sha).name, bob.get_asset_info(sha).meta) == (
        "mine.zip",
        {"classes": ["b"]},
    )
    assert [(a.name, a.meta) for a in bob.list_assets()] == [("mine.zip", {"classes": ["b"]})]
    assert alice.get_asset_info(sha).name == "private.zip" and alice.get_asset(sha).meta == {}
    assert bob.get_asset_info(sha).created_at > alice.get_asset_info(sha).created_at
    # alice deletes her upload: her claim goes, bob's keeps the bytes.
    alice.delete_asset(sha)
    assert store.asset_owners(sha) == {"bob"}
    assert alice.get_asset(sha) is None
    assert bob.delete_asset(sha).sha256 == sha  # the last claim: the bytes go
    assert store.get_asset_info(sha) is None
    # Gone (or never uploaded): nothing to read, and nothing to refuse.
    assert bob.get_asset(sha) is None and alice.get_asset_info(sha) is None
    assert bob.runs_using_asset(sha) == 0 and alice.delete_asset(sha) is None


def test_deleting_a_run_keeps_an_upload_another_user_holds(store):
    alice, bob = UserStore(store, ALICE), UserStore(store, BOB)
    sha = alice.put_asset("model", "w.safetensors", b"weights")
    bob.put_asset("model", "w.safetensors", b"weights")
    spec = {"model": {"weights_asset": sha}}
    run_id = store.create_run(spec, "s", owner="alice")
    with pytest.raises(AuditInputError, match="used by 1 of your stored run"):
        alice.delete_asset(sha)
    assert alice.delete_run(run_id) == []  # bob still holds it: kept
    assert store.asset_owners(sha) == {"bob"} and store.get_asset_info(sha) is not None


class _Manager:
    """Stands in for the Ray run manager: records what it was asked to start."""

    def __init__(self, store: Store) -> None:
        self.store, self.started = store, []

    def start(self, spec, assets=None, title="", *, owner=None):
        self.started.append((spec, owner))
        return self.store.create_run(spec.to_dict(), "id", title, owner=owner)

    def cancel(self, run_id):
        self.started.append(("cancel", run_id))

    def owner_of(self, run_id):
        return None  # it holds no run in memory: the store says whose a run is


def test_a_run_starts_as_its_users_with_their_own_uploads_only(store):
    manager = _Manager(store)
    alice, bob = UserRuns.of(manager, ALICE), UserRuns.of(manager, BOB)
    sha = alice.store.put_asset("images", "private.zip", b"private")
    spec = RunSpec(
        model=ModelRef(ModelSpec("lenet")),
        data=DataSpec("asset", sha, batch_size=1),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(2),
    )
    with pytest.raises(AuditInputError, match=r"the upload .* is not among your uploads"):
        bob.start(spec, {sha: b"private"})
    assert manager.started == []
    run_id = alice.start(spec, {sha: b"private"})
    assert store.get_run(run_id).owner == "alice"
    with pytest.raises(AccessDenied):
        bob.cancel(run_id)
    alice.cancel(run_id)
    assert manager.started[-1] == ("cancel", run_id)


# ------------------------------------------------------------------------- the users command


def test_the_users_command_creates_the_first_admin_and_manages_users(tmp_path, monkeypatch, capsys):
    path = tmp_path / "users.yaml"
    monkeypatch.setenv("AUDIT_USERS_FILE", str(path))
    assert main(["users", "init"]) == 0
    shown = capsys.readouterr().out
    one_time = tmp_path / "first-admin-password"
    password = one_time.read_text().strip()
    assert read_users(path).check_password("admin", password)
    assert str(one_time) in shown and password not in shown  # no log keeps it
    assert main(["users", "init"]) == 0
    again = capsys.readouterr().out
    assert password not in again and "has not chosen a password yet" in again

    monkeypatch.setattr("sys.stdin", io.StringIO("frank-password\n"))
    assert main(["users", "add", "frank", "--role", "auditor", "--password-stdin"]) == 0
    assert read_users(path).check_password("frank", "frank-password")
    assert main(["users", "list"]) == 0
    assert "frank\tauditor" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert main(["users", "passwd", "frank", "--password-stdin"]) == 2
    assert "at least 8 characters" in capsys.readouterr().err
    assert main(["users", "remove", "frank"]) == 0
    assert "frank" not in read_users(path).users


# ------------------------------------------------------------------------------- retention


def test_runs_batches_and_uploads_expire_after_the_retention_period(store, monkeypatch):
    from datetime import timedelta

    from auditlib.store.convert import utcnow
    from auditlib.store.retention import expire, retention_days, where_and_how_long

    assert retention_days() is None and expire(store) == (0, 0, ())
    assert "kept until its owner or an admin deletes it" in where_and_how_long(store)
    sha = store.put_asset("images", "old.zip", b"old images", owner="alice")
    kept = store.put_asset("images", "kept.zip", b"kept images", owner="alice")
    old_run = store.create_run({"data": {"source": "asset", "location": kept}}, "s", owner="alice")
    store.finish(old_run, "failed", error="x")
    running = store.create_run(SPEC, "s", owner="alice")
    store.create_batch("sweep", "old", {"members": []}, owner="alice")
    # Everything so far ended "now"; expiring at 0.5 s ago keeps it, at a day ahead removes it.
    assert expire(store, days=0.5 / 86400) == (0, 0, ())
    later = utcnow() + timedelta(days=1)
    runs, batches, uploads = store.delete_older_than(later)
    assert (runs, batches) == (1, 1)  # the finished run; the running one stays
    assert {u.sha256 for u in uploads} == {sha, kept}  # its upload went with it
    assert store.get_run(running) is not None and store.get_run(old_run) is None
    assert store.asset_owners(sha) == set()

    monkeypatch.setenv("AUDIT_RETENTION_DAYS", "30")
    assert retention_days() == 30.0
    assert "kept 30 days after a run ends" in where_and_how_long(store)
    for bad in ("0", "-1", "soon", "nan"):
        monkeypatch.setenv("AUDIT_RETENTION_DAYS", bad)
        with pytest.raises(AuditInputError, match="expected a positive number of days"):
            retention_days()


def test_deleting_a_batch_deletes_its_runs_but_not_those_another_batch_stands_on(store):
    from auditlib.engine import batches
    from auditlib.engine.identity import run_identity

    alice = UserStore(store, ALICE)
    base = RunSpec(
        model=ModelRef(ModelSpec("lenet")),
        data=DataSpec("samples", "photographs", batch_size=1),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(2),
    )
    plain, noisy = ComponentSpec.of("none"), ComponentSpec.of("dp-gaussian", {"sigma": "0.1"})
    first = batches.record_batch(
        alice, "comparison", "first", batches.comparison_members(base, [plain, noisy])
    )
    second = batches.record_batch(
        alice, "comparison", "second", batches.comparison_members(base, [plain])
    )
    runs = {}
    for member in batches.members_of(alice.get_batch(first)):
        runs[member.series] = store.create_run(
            member.spec.to_dict(), run_identity(member.spec), owner="alice"
        )
        store.finish(runs[member.series], "failed", error="stopped")
    unfinished = store.create_run(base.to_dict(), "other", owner="alice")

    gone, freed = batches.delete(alice, alice.get_batch(first))

    assert gone == 1 and freed == []  # the noisy run; "none" is the second batch's member
    assert store.get_run(runs["dp-gaussian"]) is None
    assert store.get_run(runs["none"]) is not None and store.get_run(unfinished) is not None
    assert alice.get_batch(first) is None and alice.get_batch(second) is not None
    with pytest.raises(AccessDenied):  # bob cannot delete alice's batch
        batches.delete(UserStore(store, BOB), alice.get_batch(second))
    assert alice.get_batch(second) is not None


def test_a_role_changes_in_the_file_and_the_last_admin_stays_one(tmp_path):
    from auditlib.access.users import set_role

    path = tmp_path / "users.yaml"
    add_user("ada", "ada-password", "admin", path=path)
    add_user("bea", "bea-password", "auditor", path=path)
    with pytest.raises(AuditInputError, match="last admin"):
        set_role("ada", "auditor", path=path)
    set_role("bea", "admin", path=path)
    set_role("ada", "auditor", path=path)
    assert principal_of("ada", path) == Principal("ada", "auditor")
    assert read_users(path).check_password("ada", "ada-password")  # the password stays
    with pytest.raises(AuditInputError, match="role 'root'"):
        set_role("bea", "root", path=path)
