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
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from safetensors.torch import load_file

from auditlib.observed.replay import TOLERANCE
from tests.flower_runs import app_with_images, run_commands, run_in_app
from tests.test_report import needs_poppler

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# One DLG step: every check here is of what the audit reads, names and refuses, none of how
# close its reconstruction comes.
ATTACK = ["--attack", "dlg", "--preset", "paper", "--iterations", "1", "--lpips-nets", "none"]
QUIET = 2
BUNDLE = "bundles/round-0001/partition-0"
QUIET_BUNDLE = f"client-bundles/round-0001/partition-{QUIET}"
# Every audit the tests read, as a user types it from the app's folder (after
# `--i-trust-this-file` and ATTACK), run in turn in one process once the federation is done.
AUDITS = {
    "replayed": ("--observed", BUNDLE, "--images", "data/client-0", "--out", "out/0"),
    "unscored": ("--observed", BUNDLE, "--out", "out/0-unscored"),
    "mixed": ("--observed", BUNDLE, "--images", "mixed", "--out", "out/mixed"),
    "wrong": ("--observed", BUNDLE, "--images", "data/client-1", "--out", "out/wrong"),
    "quiet": ("--observed", QUIET_BUNDLE, "--out", "out/quiet"),
    "quiet-own-images": (
        "--observed", QUIET_BUNDLE, "--images", f"data/client-{QUIET}", "--out", "out/q",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> Path:
    """The app folder after its federation: data/, bundles/, client-bundles/."""
    folder = app_with_images(tmp_path_factory, "quickstart")
    ran = run_in_app(folder, "run.py", "--quiet", str(QUIET))
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def audited(app) -> dict[str, subprocess.CompletedProcess]:
    """Each of AUDITS' commands' exit code, stdout and stderr, and the quiet client's PDF
    (``pdf/quiet.pdf``, :func:`_pdf_script`) built beside them."""
    _mix_two_clients(app)
    (app / "pdf").mkdir()
    script = app / "pdf" / "pdf.py"
    script.write_text(_pdf_script(app / QUIET_BUNDLE, app / "pdf"))
    jobs = {
        name: ("cli", ["audit", *args, "--i-trust-this-file", *ATTACK])
        for name, args in AUDITS.items()
    }
    return run_commands(app, jobs | {"pdf": ("script", str(script))}, timeout=540)


def _mix_two_clients(app: Path) -> None:
    """``mixed/``: client 1's images and client 0's in one folder, client 1's first, as a
    folder sorted by name may hold them."""
    mixed = app / "mixed"
    rows = []
    for partition in (1, 0):
        source = app / "data" / f"client-{partition}"
        lines = (source / "labels.csv").read_text().splitlines()[1:]
        for line in lines:
            mixed.mkdir(exist_ok=True)
            shutil.copy(source / line.split(",")[0], mixed / line.split(",")[0])
        rows += lines
    (mixed / "labels.csv").write_text("filename,label\n" + "\n".join(rows) + "\n")


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


def test_the_own_net_is_audited_with_the_clients_images_replayed_and_without_them(app, audited):
    done = audited["replayed"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PSNR" in done.stdout
    result = json.loads((app / "out" / "0" / "result.json").read_text())
    check = result["victim"]["observed"]["image_check"]
    assert check["matches"] and check["largest_relative_distance"] <= TOLERANCE
    assert result["config"]["model"]["spec"]["architecture"] == "task.py:Net"

    done = audited["unscored"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "not scored (no private images to compare with)" in done.stdout
    unscored = json.loads((app / "out" / "0-unscored" / "result.json").read_text())
    label = unscored["attacks"][0]["label"]  # the row of reconstruction.png, named
    assert f"reconstruction.png: {label}'s reconstruction" in done.stdout
    assert "not comparable across attacks" in done.stdout


def test_a_folder_of_two_clients_images_gives_the_right_four_and_a_wrong_set_is_refused(
    app, audited
):
    done = audited["mixed"]  # mixed/: client 1's images, then client 0's
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((app / "out" / "mixed" / "result.json").read_text())
    assert all("-c0_" in name for name in result["victim"]["data"]["names"])
    assert len(result["victim"]["data"]["names"]) == 4

    done = audited["wrong"]
    assert done.returncode == 2
    assert "these images do not produce this update" in done.stderr
    assert not (app / "out" / "wrong" / "result.json").exists()


@needs_poppler
def test_a_client_that_reported_nothing_has_every_assumption_listed_in_the_cli_and_the_pdf(
    app, audited
):
    bundle = app / QUIET_BUNDLE
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
    done = audited["quiet"]
    assert done.returncode == 0, done.stderr[-3000:]
    listed = done.stdout.split("assumed, not reported by the client", 1)[1]
    assert all(f"  {name} = " in listed for name in assumed)
    assert "read as the batch's gradient only if these assumptions hold" in listed
    # Its own images do not reproduce the update: the client ran 2 epochs at momentum 0.9.
    done = audited["quiet-own-images"]
    assert done.returncode == 2
    assert "or training.json's training is not the client's:" in done.stderr
    assert "momentum" in done.stderr.split("is not the client's:")[1]

    text = _pdf_text(app, audited)  # the threat card: one row of assumptions
    card = text.split("training settings the client did not report", 1)[1]
    detail = card.split("not known", 1)[1].split("active manipulation")[0]
    assert detail.strip().startswith("assumed: ")
    assert all(f"{name} " in detail for name in assumed)
    assert "the client's only if the assumptions below hold" in text
    assert "read back exactly" not in text


def _pdf_script(bundle: Path, folder: Path) -> str:
    """A script that builds the PDF of the bundle's unscored audit, stored as the dashboard
    stores a run, into ``folder/quiet.pdf`` (the audit in its own process: the model is the
    app's own class)."""
    return f"""
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
    store = Store("sqlite:///{folder / "audit.db"}")
    run_id = store.create_run(spec.to_dict(), spec.identity(), "quiet client")
    store.mark_running(run_id)
    rows = [result.reconstruction]
    store.add_image(run_id, 0, "reconstruction", png_bytes(image_grid(rows)))
    store.finish(run_id, "completed", summary=result.summary)
    build_report(run_subject(store, run_id), {str(folder / "quiet.pdf")!r}, charts=False)
"""


def _pdf_text(app: Path, audited: dict[str, subprocess.CompletedProcess]) -> str:
    """The quiet client's PDF (built by :func:`_pdf_script` with the audits) as text."""
    done = audited["pdf"]
    assert done.returncode == 0, done.stderr[-3000:]
    pdf = subprocess.run(
        ["pdftotext", "-raw", str(app / "pdf" / "quiet.pdf"), "-"],  # each cell's text whole
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return " ".join(pdf.split())
