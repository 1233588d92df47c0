"""A Flower user's own model class on the Message API, on a real Flower simulation
(tests/fixtures/flower_quickstart/message_run.py: the quickstart-style app's own ``task.Net``
trained by a ``@app.train()`` ClientApp, FedAvg wrapped in ``RecordingStrategy``, two
SuperNodes, one round): each client's bundle names ``task.py:Net`` and is audited with its
images from the app's own folder after ``--i-trust-this-file`` (replayed and matched); and
the same class audits a sample in several updates (``--updates``), each in its own process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from auditlib.observed.replay import TOLERANCE
from tests.test_flower_quickstart import APP, ATTACK, _audit, _run

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> Path:
    """The app folder after its Message-API federation: data/, message-bundles/."""
    folder = tmp_path_factory.mktemp("message") / "app"
    shutil.copytree(APP, folder, ignore=shutil.ignore_patterns("__pycache__"))
    made = _run(folder, "make_data.py")
    assert made.returncode == 0, made.stderr[-3000:]
    ran = _run(folder, "message_run.py")
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    return folder


def test_the_message_api_recorder_records_the_own_class_and_its_bundle_audits(app):
    bundles = app / "message-bundles" / "round-0001"
    assert sorted(p.name for p in bundles.iterdir()) == ["partition-0", "partition-1"]
    training = json.loads((bundles / "partition-0" / "training.json").read_text())
    assert training["model"] == "task.py:Net" and training["model_args"] == {"num_classes": 10}
    assert (training["momentum"], training["local_epochs"], training["num_examples"]) == (0.9, 2, 4)
    out = app / "out-message"
    audited = _audit(
        app, "--observed", str(bundles / "partition-0"), "--images", "data/client-0",
        "--out", str(out),
    )  # fmt: skip
    assert audited.returncode == 0, audited.stdout[-3000:] + audited.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    check = result["victim"]["observed"]["image_check"]
    assert check["matches"] is True and check["largest_relative_distance"] <= TOLERANCE
    assert result["metrics"]["psnr_mean"] > 0


def test_several_updates_of_the_own_class_audit_each_in_its_own_process(app):
    out = app / "out-updates"
    audited = _run(
        app, "-m", "auditlib", "audit", "--model", "task.py:Net",
        "--model-args", '{"num_classes": 10}', "--images", "data/client-0",
        "--normalization", "0.5,0.5,0.5/0.5,0.5,0.5", "--batch-size", "2", "--updates", "2",
        "--i-trust-this-file", *ATTACK, "--out", str(out),
    )  # fmt: skip
    assert audited.returncode == 0, audited.stdout[-3000:] + audited.stderr[-3000:]
    printed = audited.stdout + audited.stderr
    assert "a model class of your own code runs in a process of its own" in printed
    results = sorted(out.glob("update-*/result.json"))
    assert len(results) == 2, printed[-2000:]
    for path in results:
        result = json.loads(path.read_text())
        assert result["config"]["model"]["spec"]["architecture"] == "task.py:Net"
        assert result["metrics"]["psnr_mean"] > 0
