"""A Flower user's own model class on the Message API, on a real Flower simulation
(tests/fixtures/flower_quickstart/message_run.py: the quickstart-style app's own ``task.Net``
trained by a ``@app.train()`` ClientApp, FedAvg wrapped in ``RecordingStrategy``, two
SuperNodes, one round): each client's bundle names ``task.py:Net`` and is audited with its
images from the app's own folder after ``--i-trust-this-file`` (replayed and matched); and
the same class audits a sample in several updates (``--updates``), each in its own process.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from auditlib.observed.replay import TOLERANCE
from tests.flower_runs import app_with_images, run_commands, run_in_app
from tests.test_flower_quickstart import ATTACK

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BUNDLES = Path("message-bundles") / "round-0001"


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> Path:
    """The app folder after its Message-API federation: data/, message-bundles/."""
    folder = app_with_images(tmp_path_factory, "message")
    ran = run_in_app(folder, "message_run.py")
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def audited(app) -> dict[str, subprocess.CompletedProcess]:
    """The two audits the tests read, as a user types them from the app's folder, run in
    turn in one process: each one's exit code, stdout and stderr."""
    observed = (
        "audit", "--observed", str(BUNDLES / "partition-0"), "--images", "data/client-0",
        "--out", "out-message", "--i-trust-this-file", *ATTACK,
    )  # fmt: skip
    updates = (
        "audit", "--model", "task.py:Net",
        "--model-args", '{"num_classes": 10}', "--images", "data/client-0",
        "--normalization", "0.5,0.5,0.5/0.5,0.5,0.5", "--batch-size", "2", "--updates", "2",
        "--i-trust-this-file", *ATTACK, "--out", "out-updates",
    )  # fmt: skip
    jobs = {"observed": ("cli", observed), "updates": ("cli", updates)}
    return run_commands(app, jobs, timeout=540)


def test_the_message_api_recorder_records_the_own_class_and_its_bundle_audits(app, audited):
    bundles = app / BUNDLES
    assert sorted(p.name for p in bundles.iterdir()) == ["partition-0", "partition-1"]
    training = json.loads((bundles / "partition-0" / "training.json").read_text())
    assert training["model"] == "task.py:Net" and training["model_args"] == {"num_classes": 10}
    assert (training["momentum"], training["local_epochs"], training["num_examples"]) == (0.9, 2, 4)
    out = app / "out-message"
    done = audited["observed"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    check = result["victim"]["observed"]["image_check"]
    assert check["matches"] is True and check["largest_relative_distance"] <= TOLERANCE
    assert result["metrics"]["psnr_mean"] > 0


def test_several_updates_of_the_own_class_audit_each_in_its_own_process(app, audited):
    out = app / "out-updates"
    done = audited["updates"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed = done.stdout + done.stderr
    assert "a model class of your own code runs in a process of its own" in printed
    results = sorted(out.glob("update-*/result.json"))
    assert len(results) == 2, printed[-2000:]
    for path in results:
        result = json.loads(path.read_text())
        assert result["config"]["model"]["spec"]["architecture"] == "task.py:Net"
        assert result["metrics"]["psnr_mean"] > 0
