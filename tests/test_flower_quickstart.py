"""A Flower user's own app, end to end (docs/FLOWER.md): tests/fixtures/flower_quickstart, a
quickstart-style app with its own ``Net`` (``task.py``), ``NumPyClient`` clients training it
with SGD at momentum 0.9 (2 epochs of mini-batches of 2, four photographs each), a legacy
FedAvg wrapped in ``RecordingLegacyStrategy`` and the ``record_updates`` mod, three SuperNodes,
one round on Flower's simulation engine; partition 2 reports nothing of its training, as
Flower's quickstart does.

Run from the app's own folder, as a user does: ``python make_data.py``, ``python run.py
--quiet 2``, then ``python -m auditlib audit --observed ... --i-trust-this-file``. Checked:
the bundles are named and stamped by partition, round and examples from both recorders; the
own ``Net`` is audited with the client's images (replayed and matched), without them
(unscored, rows labelled), with a folder holding two clients' images (the right four found)
and with another client's images (refused); the quiet client's bundle lists every
assumption on the command line and in the PDF, and its images are refused because the
assumed training is not the client's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from safetensors.torch import load_file

from auditlib.observed.replay import TOLERANCE
from tests.test_report import needs_poppler

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "tests" / "fixtures" / "flower_quickstart"
TIMEOUT_S = 300
ATTACK = ["--attack", "dlg", "--preset", "paper", "--iterations", "5", "--lpips-nets", "none"]
QUIET = 2


def _run(app: Path, *command: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"RAY_ADDRESS", "AUDIT_RAY_ADDRESS"}}
    # auditlib as `pip install -e .` puts it on the path; the app's own modules from its folder
    env |= {"PYTHONPATH": f"{ROOT}{os.pathsep}{app}", "OMP_NUM_THREADS": "1"}
    env |= {"FLWR_TELEMETRY_ENABLED": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(
        [sys.executable, *command],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def _audit(app: Path, *args: str) -> subprocess.CompletedProcess:
    return _run(app, "-m", "auditlib", "audit", *args, "--i-trust-this-file", *ATTACK)


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> Path:
    """The app folder after its federation: data/, bundles/, client-bundles/."""
    folder = tmp_path_factory.mktemp("quickstart") / "app"
    shutil.copytree(APP, folder, ignore=shutil.ignore_patterns("__pycache__"))
    made = _run(folder, "make_data.py")
    assert made.returncode == 0, made.stderr[-3000:]
    ran = _run(folder, "run.py", "--quiet", str(QUIET))
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    return folder


def test_both_recorders_name_and_stamp_each_bundle_by_partition_round_and_examples(app):
    server = {p.name: p for p in (app / "bundles" / "round-0001").iterdir()}
    client = {p.name: p for p in (app / "client-bundles" / "round-0001").iterdir()}
    assert sorted(client) == ["partition-0", "partition-1", "partition-2"]
    # The server's recorder knows a partition only where the client reported it.
    quiet_node = next(n for n in server if n.startswith("client-"))
    assert sorted(server) == sorted(["partition-0", "partition-1", quiet_node])
    for partition in range(3):
        mod = json.loads((client[f"partition-{partition}"] / "training.json").read_text())
        assert mod["client_id"].startswith(f"partition-id {partition}, node ")
        assert (mod["round"], mod["num_examples"]) == (1, 4)
        assert mod["extra"]["flower"]["partition_id"] == partition
        name = quiet_node if partition == QUIET else f"partition-{partition}"
        ours = load_file(server[name] / "client.safetensors")
        theirs = load_file(client[f"partition-{partition}"] / "client.safetensors")
        assert ours.keys() == theirs.keys() and all((ours[k] == theirs[k]).all() for k in ours)
    reported = json.loads((server["partition-0"] / "training.json").read_text())
    assert reported["model"] == "task.py:Net" and reported["model_args"] == {"num_classes": 10}
    assert (reported["momentum"], reported["local_epochs"], reported["local_batch_size"]) == (
        0.9,
        2,
        2,
    )
    assert "unchecked" not in reported["extra"]
    assert set(reported["extra"]["assumed"]) == {"bn_mode"}  # all else as the client reported


def test_the_own_net_is_audited_with_the_clients_images_replayed_and_without_them(app):
    bundle = "bundles/round-0001/partition-0"
    done = _audit(app, "--observed", bundle, "--images", "data/client-0", "--out", "out/0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PSNR" in done.stdout
    result = json.loads((app / "out" / "0" / "result.json").read_text())
    check = result["victim"]["observed"]["image_check"]
    assert check["matches"] and check["largest_relative_distance"] <= TOLERANCE
    assert result["config"]["model"]["spec"]["architecture"] == "task.py:Net"

    done = _audit(app, "--observed", bundle, "--out", "out/0-unscored")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "not scored (no private images to compare with)" in done.stdout
    unscored = json.loads((app / "out" / "0-unscored" / "result.json").read_text())
    label = unscored["attacks"][0]["label"]  # the row of reconstruction.png, named
    assert f"reconstruction.png: {label}'s reconstruction" in done.stdout
    assert "not comparable across attacks" in done.stdout


def test_a_folder_of_two_clients_images_gives_the_right_four_and_a_wrong_set_is_refused(app):
    mixed = app / "mixed"
    rows = []
    for partition in (1, 0):  # client 1's images first, as a folder sorted by name may be
        source = app / "data" / f"client-{partition}"
        lines = (source / "labels.csv").read_text().splitlines()[1:]
        for line in lines:
            mixed.mkdir(exist_ok=True)
            shutil.copy(source / line.split(",")[0], mixed / line.split(",")[0])
        rows += lines
    (mixed / "labels.csv").write_text("filename,label\n" + "\n".join(rows) + "\n")
    bundle = "bundles/round-0001/partition-0"
    done = _audit(app, "--observed", bundle, "--images", "mixed", "--out", "out/mixed")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((app / "out" / "mixed" / "result.json").read_text())
    assert all("-c0_" in name for name in result["victim"]["data"]["names"])
    assert len(result["victim"]["data"]["names"]) == 4

    done = _audit(app, "--observed", bundle, "--images", "data/client-1", "--out", "out/wrong")
    assert done.returncode == 2
    assert "these images do not produce this update" in done.stderr
    assert not (app / "out" / "wrong" / "result.json").exists()


@needs_poppler
def test_a_client_that_reported_nothing_has_every_assumption_listed_in_the_cli_and_the_pdf(
    app, tmp_path
):
    bundle = app / "client-bundles" / "round-0001" / f"partition-{QUIET}"
    assumed = set(json.loads((bundle / "training.json").read_text())["extra"]["assumed"])
    assert assumed == {
        "optimizer",
        "momentum",
        "weight_decay",
        "local_epochs",
        "local_batch_size",
        "bn_mode",
        "shuffled",
    }
    done = _audit(app, "--observed", str(bundle), "--out", "out/quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    listed = done.stdout.split("assumed, not reported by the client", 1)[1]
    assert all(f"  {name} = " in listed for name in assumed)
    assert "read as the batch's gradient only if these assumptions hold" in listed
    # Its own images do not reproduce the update: the client ran 2 epochs at momentum 0.9.
    images = f"data/client-{QUIET}"
    done = _audit(app, "--observed", str(bundle), "--images", images, "--out", "out/q")
    assert done.returncode == 2
    assert "or training.json's training is not the client's:" in done.stderr
    assert "momentum" in done.stderr.split("is not the client's:")[1]

    text = _pdf_text(app, bundle, tmp_path)  # the threat card: one row of assumptions
    card = text.split("training settings the client did not report", 1)[1]
    detail = card.split("not known", 1)[1].split("active manipulation")[0]
    assert detail.strip().startswith("assumed: ")
    assert all(f"{name} " in detail for name in assumed)
    assert "the client's only if the assumptions below hold" in text
    assert "read back exactly" not in text


def _pdf_text(app: Path, bundle: Path, tmp_path: Path) -> str:
    """The PDF of the bundle's unscored audit, stored as the dashboard stores a run, as text
    (the audit in its own process: the model is the app's own class)."""
    script = f"""
import sys
from auditlib.engine.isolation import run_isolated
from auditlib.engine.stream import png_bytes
from auditlib.grids import image_grid
from auditlib.observed import load_bundle
from auditlib.report.pdf import build_report
from auditlib.report.subject import run_subject
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, ObservedRef, RunSpec, ScenarioSpec
from auditlib.store import Store

if __name__ == "__main__":
    bundle = load_bundle({str(bundle)!r})
    spec = RunSpec(
        model=ModelRef(bundle.model_spec),
        data=DataSpec("none", "", normalization=bundle.normalization),
        scenario=ScenarioSpec(
            protocol=bundle.protocol, observed=ObservedRef(bundle.location, bundle.content_sha256)
        ),
        attack=ComponentSpec.of("dlg", {{}}, "paper"),
        defense=ComponentSpec("none"),
        budget=Budget(3),
    )
    result = run_isolated(spec, lpips_nets=())
    store = Store("sqlite:///{tmp_path / "audit.db"}")
    run_id = store.create_run(spec.to_dict(), spec.identity(), "quiet client")
    store.mark_running(run_id)
    rows = [result.reconstruction]
    store.add_image(run_id, 0, "reconstruction", png_bytes(image_grid(rows)))
    store.finish(run_id, "completed", summary=result.summary)
    build_report(run_subject(store, run_id), {str(tmp_path / "quiet.pdf")!r}, charts=False)
"""
    (tmp_path / "pdf.py").write_text(script)
    done = _run(app, str(tmp_path / "pdf.py"))
    assert done.returncode == 0, done.stderr[-3000:]
    pdf = subprocess.run(
        ["pdftotext", "-raw", str(tmp_path / "quiet.pdf"), "-"],  # each cell's text whole
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return " ".join(pdf.split())
