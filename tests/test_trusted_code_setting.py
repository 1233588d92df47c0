"""The server's trusted-code setting (auditlib.access.trusted_code) and the dashboard's path
for a model class of a user's own code: off by default, changed only by an admin (with their
password) and recorded with who and when; while off, an own-class bundle and its run are
refused saying how an admin allows it; while on, the bundle and its ``.py`` file are taken
(parsed, never run here), and the run, through the run manager on the embedded Ray, builds
the class only in an isolated process, with the command line's result."""

from __future__ import annotations

import json
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from auditlib.access import AccessDenied
from auditlib.access.users import (
    add_user,
    read_users,
    set_trusted_code,
    trusted_code_setting,
)
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model, own_code
from auditlib.models.own_code import own_code_allowed
from tests.conftest import USERS, write_png
from tests.test_own_model import NET

ROOT_PASSWORD = USERS["root"][1]
MODEL = "task.py:Net"
LR = 0.1


@pytest.fixture
def own_users(users_path, tmp_path, monkeypatch) -> Path:
    """A copy of the session's users file this test may change."""
    path = tmp_path / "users" / "users.yaml"
    path.parent.mkdir()
    shutil.copy(users_path, path)
    monkeypatch.setenv("AUDIT_USERS_FILE", str(path))
    return path


def test_trusted_code_is_off_until_an_admin_with_their_password_turns_it_on(own_users, tmp_path):
    assert trusted_code_setting(tmp_path / "none.yaml").allowed is False  # no users file
    assert trusted_code_setting(own_users).allowed is False
    assert "the default; no admin has set it" in trusted_code_setting(own_users).words()
    with pytest.raises(AccessDenied, match="only an admin"):
        set_trusted_code(True, "alice", USERS["alice"][1], path=own_users)
    with pytest.raises(AccessDenied, match="no admin 'root' with that password"):
        set_trusted_code(True, "root", "not-the-password", path=own_users)
    assert trusted_code_setting(own_users).allowed is False

    when = datetime(2026, 11, 30, 9, 15, tzinfo=UTC)
    set_trusted_code(True, "root", ROOT_PASSWORD, path=own_users, now=when)
    setting = trusted_code_setting(own_users)
    assert (setting.allowed, setting.set_by, setting.set_at) == (True, "root", when)
    assert setting.words() == "trusted code: allowed, set by root at 2026-11-30T09:15:00+00:00"
    add_user("carol", "carol-password", "auditor", path=own_users)  # other writes keep it
    assert read_users(own_users).trusted_code == setting
    set_trusted_code(False, "root", ROOT_PASSWORD, path=own_users)
    assert trusted_code_setting(own_users).allowed is False


def test_the_users_command_sets_it_as_the_admin_and_refuses_without_one(own_users, monkeypatch):
    import io

    from auditlib.cli import main

    assert main(["users", "trusted-code", "on"]) == 2  # no --admin: refused in words
    monkeypatch.setattr("sys.stdin", io.StringIO(ROOT_PASSWORD + "\n"))
    assert main(["users", "trusted-code", "on", "--admin", "root", "--password-stdin"]) == 0
    assert trusted_code_setting(own_users).set_by == "root"
    monkeypatch.setattr("sys.stdin", io.StringIO(USERS["bob"][1] + "\n"))
    assert main(["users", "trusted-code", "off", "--admin", "bob", "--password-stdin"]) == 2
    assert trusted_code_setting(own_users).allowed is True


def _client(root: Path) -> tuple[Path, Path, Path]:
    """The app's folder (task.py), a FedSGD bundle of its Net on two images (one SGD step on
    both), and the images' folder."""
    app = root / "app"
    app.mkdir()
    (app / "task.py").write_text(NET)
    images = root / "images"
    images.mkdir()
    for i in range(2):
        write_png(images / f"img{i}.png", i)
    (images / "labels.csv").write_text("filename,label\nimg0.png,3\nimg1.png,7\n")
    from auditlib.data import Normalization, load_image_folder, to_model_batch

    loaded = load_image_folder(images)
    x = to_model_batch(list(loaded.images), (3, 32, 32), Normalization.parse("none", 3))
    y = torch.tensor(loaded.labels)
    with own_code_allowed():
        net = build_model(ModelSpec(f"{app / 'task.py'}:Net", 10, model_args='{"num_classes": 10}'))
    start = {k: v.clone() for k, v in net.state_dict().items()}
    torch.nn.functional.cross_entropy(net(x), y).backward()
    with torch.no_grad():
        for p in net.parameters():
            p -= LR * p.grad
    bundle = root / "bundle"
    bundle.mkdir()
    save_file(start, bundle / "global.safetensors")
    save_file(
        {k: v.detach().contiguous() for k, v in net.state_dict().items()},
        bundle / "client.safetensors",
    )
    training = {
        "model": MODEL,
        "model_args": {"num_classes": 10},
        "num_classes": 10,
        "input_size": 32,
        "optimizer": "sgd",
        "lr": LR,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "local_epochs": 1,
        "local_batch_size": 2,
        "num_examples": 2,
        "bn_mode": "train",
        "shuffled": False,
    }
    (bundle / "training.json").write_text(json.dumps(training))
    return app, bundle, images


def _files(folder: Path) -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in sorted(folder.iterdir())]


def test_while_off_the_bundle_is_refused_saying_how_an_admin_allows_it(own_users, tmp_path):
    from auditlib.observed import bundle_from_upload

    _, bundle, _ = _client(tmp_path)
    with pytest.raises(AuditInputError) as refused:
        bundle_from_upload(_files(bundle))
    words = str(refused.value)
    assert "an admin has not allowed trusted code on this server" in words
    assert "python -m auditlib users trusted-code on --admin NAME" in words


def test_while_on_the_bundle_and_its_file_are_taken_without_running_it(own_users, tmp_path):
    from auditlib.observed import bundle_from_upload

    app, bundle, _ = _client(tmp_path)
    taken, archive = bundle_from_upload(_files(bundle), trusted_code=True)
    assert taken.model_spec.architecture == MODEL and archive[:2] == b"PK"
    source = (app / "task.py").read_bytes()
    own_code.check_own_file(source, "task.py", MODEL)  # parsed only: nothing imported
    refusals = {
        "model.py": (source, "expected task.py"),
        "task.py": (b"class Other: pass\n", "no top-level class Net (its classes are Other)"),
        "app/task.py": (b"def broken(:\n", "not valid Python (line 1"),
    }
    for name, (data, words) in refusals.items():
        with pytest.raises(AuditInputError) as refused:
            own_code.check_own_file(data, name, MODEL)
        assert words in str(refused.value)
    with pytest.raises(AuditInputError, match="at most 262,144 bytes"):
        own_code.check_own_file(b"#" * (own_code.MAX_FILE_BYTES + 1), "task.py", MODEL)


def _dashboard_spec(store, bundle: Path, images: Path, app: Path, *, code: bool = True):
    """The run the Setup page and the Attack lab make of the upload (run_choices.build_run),
    its uploads stored as alice's."""
    from auditlib.data import images_zip, load_image_folder
    from auditlib.observed import bundle_from_upload
    from auditlib.spec import (
        Budget,
        ComponentSpec,
        DataSpec,
        ModelRef,
        ObservedRef,
        RunSpec,
        ScenarioSpec,
    )

    taken, archive = bundle_from_upload(_files(bundle), trusted_code=True)
    source = (app / "task.py").read_bytes()
    zipped = images_zip(load_image_folder(images))
    assets = {
        store.put_asset("observed", "bundle.zip", archive, owner="alice"): archive,
        store.put_asset("images", "images", zipped, owner="alice"): zipped,
    }
    code_sha = store.put_asset("code", "task.py", source, owner="alice")
    if code:
        assets[code_sha] = source
    observed_sha, images_sha = list(assets)[:2]
    model = ModelRef(
        taken.model_spec,
        content_sha256=code_sha,
        code_asset=code_sha if code else None,
    )
    spec = RunSpec(
        model=model,
        data=DataSpec("asset", images_sha, batch_size=2),
        scenario=ScenarioSpec(
            protocol=taken.protocol,
            observed=ObservedRef(observed_sha, taken.content_sha256, source="asset"),
        ),
        attack=ComponentSpec.of("dlg", {}, "paper"),
        defense=ComponentSpec("none"),
        budget=Budget(iterations=2),
        seed=0,
    )
    return spec, assets


@pytest.mark.ray
def test_an_own_class_runs_through_the_run_manager_isolated_with_the_clis_result(
    own_users, tmp_path, monkeypatch, ray_session
):
    from auditlib.cli import main
    from auditlib.engine.runs import RunManager
    from auditlib.result import AuditSummary
    from auditlib.store import Store
    from tests.test_runs import UNLIMITED

    app, bundle, images = _client(tmp_path)
    before = {m for m in sys.modules if m.startswith("auditlib_own_model_")}  # the client's
    with Store(f"sqlite:///{tmp_path}/runs.db") as store:
        manager = RunManager(store, lpips_nets=(), limits=UNLIMITED)
        spec, assets = _dashboard_spec(store, bundle, images, app)
        with pytest.raises(AuditInputError, match="an admin has not allowed trusted code"):
            manager.start(spec, assets, owner="alice")  # off: refused before anything runs
        set_trusted_code(True, "root", ROOT_PASSWORD, path=own_users)
        unfiled, unfiled_assets = _dashboard_spec(store, bundle, images, app, code=False)
        with pytest.raises(AuditInputError, match="never from a path on the server"):
            manager.start(unfiled, unfiled_assets, owner="alice")
        assert store.list_runs() == []  # nothing was recorded for the refused starts
        run_id = manager.start(spec, assets, owner="alice")
        assert manager.wait(run_id, 240)
        record = store.get_run(run_id)
        assert record.status == "completed", record.error
        dashboard = AuditSummary.from_json(record.summary)
        # The uploaded file was imported in the worker's child process, never here.
        assert {m for m in sys.modules if m.startswith("auditlib_own_model_")} == before

    monkeypatch.chdir(app)  # training.json's path is the app folder's
    # One torch thread, as the Ray worker's (AUDIT_RAY_CPUS_PER_RUN 1): L-BFGS carries the
    # rounding of another thread count into its steps (measured: 6.27 dB at 1, 6.25 at 2).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "cli"
    cli = ["audit", "--observed", str(bundle), "--images", str(images), "--attack", "dlg"]
    cli += ["--preset", "paper", "--iterations", "2", "--seed", "0", "--lpips-nets", "none"]
    assert main([*cli, "--out", str(out), "--i-trust-this-file"]) == 0
    command_line = AuditSummary.from_json(json.loads((out / "result.json").read_text()))
    assert dashboard.victim.observed["image_check"]["matches"] is True
    ours, theirs = dashboard.metrics, command_line.metrics
    assert ours is not None and theirs is not None
    assert ours.mean("psnr") == pytest.approx(theirs.mean("psnr"), abs=1e-3)
    assert ours.label_accuracy == theirs.label_accuracy


def test_the_setup_page_refuses_an_own_class_until_allowed_then_wants_the_file_and_the_tick(
    own_users, dashboard_store, tmp_path
):
    """The page, in a real Streamlit run: while the admin's setting is off the bundle is
    refused saying how an admin allows it, and nothing is stored; once on, the page asks for
    the class's file and the user's tick, keeps the file as the user's private upload, and
    the Lab will not start before the tick."""
    from auditlib.access import Principal
    from auditlib.store.scoped import UserStore
    from dashboard.setup_state import TRUST_KEY
    from tests.test_app import LAB, _app, _errors

    store, _ = dashboard_store
    app, bundle, _ = _client(tmp_path)
    files = [(name, data, "application/octet-stream") for name, data in _files(bundle)]
    at = _app()
    at.file_uploader(key="observed_files.0").set_value(files).run()
    assert not at.exception
    refused = [e for e in _errors(at) if "an admin has not allowed trusted code" in e]
    assert refused and "users trusted-code on --admin NAME" in refused[0]
    assert store.list_assets() == [] and "observed" not in at.query_params

    set_trusted_code(True, "root", ROOT_PASSWORD, path=own_users)
    at = _app()
    at.file_uploader(key="observed_files.0").set_value(files).run()
    at.radio(key="source").set_value("none").run()  # the update alone: shown, not scored
    assert not at.exception and not _errors(at), _errors(at)
    assert at.checkbox(key=TRUST_KEY).value is False  # never ticked for the user
    source = (app / "task.py").read_bytes()
    at.file_uploader(key="code_file.0").set_value([("task.py", source, "text/x-python")]).run()
    assert not _errors(at), _errors(at)
    asset = store.get_asset(at.query_params["code"])
    assert asset is not None and asset.kind == "code" and asset.data == source
    from dashboard.resources import shared_store

    assert UserStore(shared_store(), Principal("bob")).get_asset(asset.sha256) is None
    # Without the tick the Lab names what is missing and offers no Start.
    at.switch_page(LAB.path).run()
    assert not at.exception
    page = " ".join(m.value for m in [*at.warning, *at.error, *at.info, *at.markdown])
    assert "tick that you trust task.py" in page, page[:2000]
