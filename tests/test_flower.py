"""The Flower integration (auditlib.flower): a real federation on Flower's own simulation
engine records its clients' updates, and a recorded update audits as the product's own
simulation of the same client does.

The federation (tests/fixtures/flower_federation.py) runs in a process of its own: two
SuperNodes on Ray (127.0.0.1 only, its own temp folder), one round of FedAvg with SGD, LeNet
at 32 px, client 0 holding one photograph and client 1 two. Client 0's bundle is then audited
with DLG (paper preset, 50 steps, seed 0) beside ``python -m auditlib audit`` simulating the
same client (the bundle's global weights, the same image, FedAvg, one local epoch, the same
learning rate): the two reconstructions must agree within 1 dB of PSNR.

Until ``audit --observed`` reads bundles, the observed side is the same audit command with
the simulated update swapped for the bundle's (client - global): the engine's release is
wrapped for that run only. The test takes ``--observed`` as soon as the CLI offers it.

Flower's legacy API (tests/fixtures/flower_legacy_federation.py, ``NumPyClient`` clients that
save the weights they return): a legacy FedAvg in ``RecordingLegacyStrategy`` writes each
client's update exactly as the client returned it; and under SecAgg+ (``SecAggPlusWorkflow``,
three clients with ``[secaggplus_mod, record_updates]``) the client mod writes each client's
own update while the server's strategy is handed only the unmasked aggregate and records
nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from auditlib.data import LabelledImages, load_sample_set, write_image_folder
from auditlib.models import ModelSpec, build_model
from auditlib.observed import load_bundle

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
FEDERATION = ROOT / "tests" / "fixtures" / "flower_federation.py"
LEGACY = ROOT / "tests" / "fixtures" / "flower_legacy_federation.py"
FEDERATION_TIMEOUT_S = 240
LR = 0.1
# Each client's photographs (positions in the bundled set) and their labels.
CLIENTS = {0: ((0, 3),), 1: ((1, 5), (2, 7))}
# Under SecAgg+ (its shares need three clients at least): a third client, one photograph.
SECURE_CLIENTS = {**CLIENTS, 2: ((3, 1),)}
ATTACK = ["--attack", "dlg", "--preset", "paper", "--iterations", "50", "--seed", "0"]


def _prepare(root: Path, clients: dict[int, tuple[tuple[int, int], ...]]) -> None:
    """Each client's image folder (``root/data/client-<n>``) and the start model
    (``root/start.st``)."""
    photos = load_sample_set(
        "photographs", 1 + max(i for held in clients.values() for i, _ in held)
    )
    for client, held in clients.items():
        images = LabelledImages(
            tuple(photos.images[i] for i, _ in held),
            tuple(photos.names[i] for i, _ in held),
            tuple(label for _, label in held),
            None,
            "photographs",
        )
        write_image_folder(images, root / "data" / f"client-{client}")
    model = build_model(ModelSpec("lenet", 10, (3, 32, 32), init="uniform"))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, root / "start.st")


def _federate(script: Path, root: Path, *args: str) -> dict | list:
    """Run a fixture federation as its own process (bounded), and what it printed as
    ``RECORDED <json>``."""
    ray_temp = Path(tempfile.mkdtemp(prefix="flray-"))  # short: Ray's socket paths
    env = {k: v for k, v in os.environ.items() if k not in {"RAY_ADDRESS", "AUDIT_RAY_ADDRESS"}}
    env |= {
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "FLWR_TELEMETRY_ENABLED": "0",
    }
    command = [
        sys.executable,
        str(script),
        *("--data", str(root / "data"), "--weights", str(root / "start.st")),
        *("--server-out", str(root / "server"), "--client-out", str(root / "client")),
        *("--ray-temp", str(ray_temp), "--lr", str(LR), "--epochs", "1"),
        *args,
    ]
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=FEDERATION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    finally:
        shutil.rmtree(ray_temp, ignore_errors=True)
    print(f"{script.name} {' '.join(args)}: {time.perf_counter() - started:.1f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    recorded = [line for line in done.stdout.splitlines() if line.startswith("RECORDED ")]
    assert recorded, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(recorded[-1].removeprefix("RECORDED "))


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """The recorded federation: its folder (data/, start.st, server/, client/)."""
    root = tmp_path_factory.mktemp("flower")
    _prepare(root, CLIENTS)
    return root, _federate(FEDERATION, root)


def _bundles(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in sorted((folder / "round-0001").iterdir())}


def _partition_of(root: Path, name: str) -> int:
    """The partition (client 0 or 1) of a node, as its ClientApp's mod recorded it."""
    training = json.loads((root / "client" / "round-0001" / name / "training.json").read_text())
    return training["extra"]["flower"]["node_config"]["partition-id"]


def test_the_strategy_and_the_client_mod_record_the_same_updates(federation):
    root, recorded = federation
    server, client = _bundles(root / "server"), _bundles(root / "client")
    assert sorted(server) == sorted(client) and len(server) == 2
    assert sorted(recorded) == sorted(str(p) for p in server.values())
    start = load_file(root / "start.st")
    for name, bundle in server.items():
        for file in ("global.safetensors", "client.safetensors"):
            ours, theirs = load_file(bundle / file), load_file(client[name] / file)
            assert ours.keys() == theirs.keys() == start.keys()
            assert all(torch.equal(ours[k], theirs[k]) for k in ours)
        assert all(
            torch.equal(load_file(bundle / "global.safetensors")[k], start[k]) for k in start
        )
        moved = load_file(bundle / "client.safetensors")
        assert any(not torch.equal(moved[k], start[k]) for k in start)
        training = json.loads((bundle / "training.json").read_text())
        held = len(CLIENTS[_partition_of(root, name)])
        assert training["num_examples"] == held == training["local_batch_size"]
        assert (training["lr"], training["local_epochs"], training["round"]) == (LR, 1, 1)
        # Named and stamped by the partition the client reported (the mod: its node config).
        partition = _partition_of(root, name)
        assert name == f"partition-{partition}" and training["model"] == "lenet"
        assert training["client_id"].startswith(f"partition-id {partition}, node ")
        assert training["extra"]["flower"]["partition_id"] == partition
        assert training["extra"]["from"]["lr"] == "client metrics 'lr'"
        assert training["extra"]["from"]["local_batch_size"] == "client metrics 'batch-size'"
        assert set(training["extra"]["assumed"]) == {"optimizer", "bn_mode", "shuffled"}
        assert training["extra"]["missing"] == []
        assert training["extra"]["flower"]["train_config"]["server-round"] == 1


def _cli_reads_bundles() -> bool:
    from auditlib.cli.arguments import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return any("--observed" in a.option_strings for a in commands.choices["audit"]._actions)


def _psnr(out: Path) -> float:
    return json.loads((out / "result.json").read_text())["metrics"]["psnr_mean"]


def test_a_recorded_update_audits_as_the_products_simulation_of_the_same_client(
    federation, tmp_path, monkeypatch
):
    from auditlib.cli import audit as cli_audit
    from auditlib.cli import main
    from auditlib.engine import releases
    from auditlib.threat import Observation

    root, _ = federation
    # The command's time estimate (a few real steps before each audit) is no part of what
    # is compared here: both audits go without it.
    monkeypatch.setattr(cli_audit, "estimate_time", lambda *args, **kwargs: None)
    bundle = next(b for n, b in _bundles(root / "server").items() if _partition_of(root, n) == 0)
    images = root / "data" / "client-0"
    started = time.perf_counter()
    simulated = [
        "audit",
        *("--model", "lenet", "--weights", str(bundle / "global.safetensors")),
        *("--images", str(images), "--scenario", "fedavg", "--local-epochs", "1"),
        *("--local-lr", str(LR), *ATTACK, "--lpips-nets", "none"),
    ]
    assert main([*simulated, "--out", str(tmp_path / "simulated")]) == 0
    simulated_s = time.perf_counter() - started

    started = time.perf_counter()
    swapped = {}
    if _cli_reads_bundles():
        observed = ["audit", "--observed", str(bundle), "--images", str(images), *ATTACK]
        assert main([*observed, "--lpips-nets", "none", "--out", str(tmp_path / "obs")]) == 0
    else:  # the same audit, its simulated update swapped for the bundle's
        start = load_file(bundle / "global.safetensors")
        sent = load_file(bundle / "client.safetensors")
        release_update = releases.release_update

        def observed_release(*args, **kwargs):
            release = release_update(*args, **kwargs)
            view = release.observation
            assert view.kind == "weight_delta"
            tensors = tuple(
                (sent[n] - start[n]).to(t.device, t.dtype)
                for n, t in zip(view.parameter_names, view.tensors, strict=True)
            )
            swapped["simulated"], swapped["observed"] = view.tensors, tensors
            observation = Observation(view.kind, tensors, view.parameter_names)
            return dataclasses.replace(release, observation=observation)

        monkeypatch.setattr(releases, "release_update", observed_release)
        assert main([*simulated, "--out", str(tmp_path / "obs")]) == 0
        # The Flower client computed the update the product simulates, to float rounding.
        for ours, theirs in zip(swapped["simulated"], swapped["observed"], strict=True):
            assert ours is not theirs
            torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-6)
    observed_s = time.perf_counter() - started

    psnr_simulated, psnr_observed = _psnr(tmp_path / "simulated"), _psnr(tmp_path / "obs")
    print(
        f"PSNR simulated {psnr_simulated:.2f} dB ({simulated_s:.1f} s), observed "
        f"{psnr_observed:.2f} dB ({observed_s:.1f} s)"
    )
    # Both audits recover the photograph. Their PSNR agree only roughly: L-BFGS on a sigmoid
    # LeNet turns the updates' float rounding (equal to 1e-4, above) into another path
    # (within 1 dB on one machine, 21.8 against 23.4 dB on an AMD EPYC with AVX2).
    assert psnr_simulated > 15 and psnr_observed > 15


# --- The legacy strategy API (flwr.server.strategy) and SecAgg+ -----------------------------


@pytest.fixture(scope="module")
def legacy_federation(tmp_path_factory):
    """A legacy FedAvg wrapped in RecordingLegacyStrategy, NumPyClient clients that save the
    weights they return (saved/node-<id>.safetensors): its folder and what it recorded."""
    root = tmp_path_factory.mktemp("flower-legacy")
    _prepare(root, CLIENTS)
    recorded = _federate(LEGACY, root, "--workflow", "plain", "--saved", str(root / "saved"))
    return root, recorded


@pytest.fixture(scope="module")
def secure_federation(tmp_path_factory):
    """Three NumPyClient clients under SecAgg+ (SecAggPlusWorkflow), each with
    ``[secaggplus_mod, record_updates]``, the server's FedAvg wrapped in
    RecordingLegacyStrategy and saving what aggregate_fit was handed."""
    root = tmp_path_factory.mktemp("flower-secagg")
    _prepare(root, SECURE_CLIENTS)
    recorded = _federate(
        LEGACY, root, "--workflow", "secaggplus", "--clients", "3", "--saved", str(root / "saved")
    )
    return root, recorded


def _returned(root: Path) -> dict[str, tuple[dict[str, torch.Tensor], dict[str, str]]]:
    """What each client returned, as it saved it: node id -> (state_dict, its metadata)."""
    saved = {}
    for file in sorted((root / "saved").glob("node-*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            metadata = handle.metadata()
        saved[file.stem.removeprefix("node-")] = (load_file(file), metadata)
    return saved


def test_a_legacy_strategy_records_each_clients_update_as_the_client_returned_it(
    legacy_federation,
):
    root, recorded = legacy_federation
    bundles, returned = _bundles(root / "server"), _returned(root)
    assert sorted(recorded["written"]) == sorted(str(p) for p in bundles.values())
    assert recorded["aggregated_rounds"] == []
    assert sorted(bundles) == sorted(f"client-{node}" for node in returned)
    assert len(bundles) == 2
    start = load_file(root / "start.st")
    for node, (weights, metadata) in returned.items():
        bundle = bundles[f"client-{node}"]
        loaded = load_bundle(bundle)  # checked: the arrays fit the LeNet named
        sent, came = (
            load_file(bundle / "global.safetensors"),
            load_file(bundle / "client.safetensors"),
        )
        # Positional arrays named after the model's state_dict: the very tensors.
        assert sent.keys() == came.keys() == start.keys() == weights.keys()
        assert all(torch.equal(sent[k], start[k]) for k in start)
        assert all(torch.equal(came[k], weights[k]) for k in weights)
        assert any(not torch.equal(came[k], start[k]) for k in start)
        training = json.loads((bundle / "training.json").read_text())
        held = len(CLIENTS[int(metadata["partition"])])
        assert int(metadata["num_examples"]) == held
        assert (training["num_examples"], training["local_batch_size"]) == (held, held)
        assert (training["lr"], training["local_epochs"], training["round"]) == (LR, 1, 1)
        assert (loaded.training.lr, loaded.training.num_examples) == (LR, held)
        assert training["model"] == "lenet" and training["client_id"] == node
        assert training["extra"]["from"]["num_examples"] == "client reply (num_examples)"
        assert training["extra"]["from"]["lr"] == "client metrics 'lr'"
        assert training["extra"]["missing"] == [] and "unchecked" not in training["extra"]
        flower = training["extra"]["flower"]
        assert flower["layout"] == "legacy" and flower["strategy"] == "SavingFedAvg"
        assert flower["train_config"] == {"lr": LR, "local-epochs": 1}
        assert flower["array_names"].startswith("positional arrays named after the model")


def test_under_secaggplus_the_client_mod_records_each_clients_own_update_and_the_server_none(
    secure_federation,
):
    """``record_updates`` after ``secaggplus_mod`` sees each client's plain update; the
    server's strategy is handed only the unmasked aggregate (one object for every result),
    and the legacy recorder writes nothing for it."""
    root, recorded = secure_federation
    returned = _returned(root)
    assert len(returned) == 3
    # The server: nothing written, the round known as aggregated only.
    assert recorded == {"written": [], "aggregated_rounds": [1]}
    assert not (root / "server").exists()
    # The clients: each mod's bundle holds the very weights its client returned.
    bundles = _bundles(root / "client")  # the mod knows each node's partition-id
    partitions = {node: metadata["partition"] for node, (_, metadata) in returned.items()}
    assert sorted(bundles) == sorted(f"partition-{p}" for p in partitions.values())
    start = load_file(root / "start.st")
    for node, (weights, metadata) in returned.items():
        bundle = bundles[f"partition-{partitions[node]}"]
        assert load_bundle(bundle).training.client_id.endswith(f"node {node}")
        sent, came = (
            load_file(bundle / "global.safetensors"),
            load_file(bundle / "client.safetensors"),
        )
        assert all(torch.equal(sent[k], start[k]) for k in start)
        assert came.keys() == weights.keys()
        assert all(torch.equal(came[k], weights[k]) for k in weights)
        training = json.loads((bundle / "training.json").read_text())
        held = len(SECURE_CLIENTS[int(metadata["partition"])])
        assert (training["num_examples"], training["lr"], training["round"]) == (held, LR, 1)
        assert training["extra"]["flower"]["layout"] == "legacy"
        assert "unchecked" not in training["extra"]
    # What aggregate_fit was handed: for every client, the one aggregate (the FedAvg of the
    # clients' updates, to SecAgg+'s quantisation), far from any client's own update.
    with safe_open(str(root / "saved" / "server-results.safetensors"), "pt") as handle:
        metadata = handle.metadata()
    results = load_file(root / "saved" / "server-results.safetensors")
    assert metadata.pop("shared") == "1" and sorted(metadata) == sorted(returned)
    names = list(build_model(ModelSpec("lenet", 10, (3, 32, 32))).state_dict())
    total = sum(int(m["num_examples"]) for _, m in returned.values())
    mean = {
        k: sum(w[k] * int(m["num_examples"]) for w, m in returned.values()) / total for k in names
    }
    for node in returned:
        # (SecAgg+ dequantises into float64; the clients sent float32.)
        handed = {k: results[f"{node}.{i}"].float() for i, k in enumerate(names)}
        torch.testing.assert_close(handed, mean, rtol=0, atol=1e-4)
        for own, _ in returned.values():
            assert max((handed[k] - own[k]).abs().max().item() for k in names) > 1e-2
