"""Observed updates: an update a client actually sent, as a bundle (global weights, the
client's weights or their difference, training.json), read and checked, then audited from
the command line with and without the client's private images."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest
import torch
from hostile import TRAINING as A_CLIENTS_TRAINING
from safetensors.torch import save_file

from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model
from auditlib.observed import load_bundle, write_bundle

# The client's training.json with what a recorder stamps beside it.
TRAINING = A_CLIENTS_TRAINING | {
    "shuffled": False,
    "round": 3,
    "client_id": "7",
    "source": "plain pytorch",
}


def _lenet_states(shift: float = 0.01):
    model = build_model(ModelSpec("lenet", input_shape=(3, 32, 32)))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    return start, {k: v + shift for k, v in start.items()}


def _write_raw(folder: Path, start, update, training, update_file="client.safetensors") -> Path:
    """A bundle written by hand (safetensors and json only), as any client code writes one."""
    folder.mkdir(parents=True)
    save_file(start, str(folder / "global.safetensors"))
    save_file(update, str(folder / update_file))
    (folder / "training.json").write_text(json.dumps(training))
    return folder


def test_a_written_bundle_reads_back_with_its_training_and_update(tmp_path):
    start, client = _lenet_states()
    folder = write_bundle(tmp_path / "b", start, client, TRAINING)
    bundle = load_bundle(folder)
    assert bundle.shared == "weights" and bundle.delta is None
    assert bundle.training.input_shape == (3, 32, 32) and bundle.training.round == 3
    protocol = bundle.protocol
    assert (protocol.algorithm, protocol.optimizer, protocol.momentum) == ("fedavg", "sgd", 0.9)
    assert protocol.local_epochs == 2 and protocol.local_batch_size == 2
    kind, tensors = bundle.observed_update(("fc.0.bias",))
    assert kind == "weights" and torch.equal(tensors[0], client["fc.0.bias"])
    assert torch.allclose(bundle.weight_change(("fc.0.bias",))[0], torch.full((10,), 0.01))
    model = bundle.build_model()
    assert torch.equal(model.state_dict()["fc.0.weight"], start["fc.0.weight"])
    # Numpy arrays (a framework's weights) and a delta are written alike.
    delta = {k: (v - start[k]).numpy() for k, v in client.items()}
    again = load_bundle(write_bundle(tmp_path / "d", start, delta, TRAINING, delta=True))
    assert again.shared == "delta" and again.protocol.shared == "delta"
    kind, tensors = again.observed_update(("fc.0.bias",))
    assert kind == "weight_delta" and torch.allclose(tensors[0], torch.full((10,), 0.01))
    assert again.content_sha256 != bundle.content_sha256


def test_one_sgd_step_on_every_example_is_read_as_its_gradient(tmp_path):
    start, _ = _lenet_states()
    gradient = {k: torch.randn_like(v) for k, v in start.items()}
    lr, decay = 0.1, 5e-4
    client = {k: v - lr * (gradient[k] + decay * v) for k, v in start.items()}
    training = TRAINING | {"local_epochs": 1, "local_batch_size": 4, "lr": lr}
    bundle = load_bundle(write_bundle(tmp_path / "b", start, client, training))
    assert bundle.protocol.algorithm == "fedsgd"
    kind, tensors = bundle.observed_update(("fc.0.weight",))
    assert kind == "gradient"
    torch.testing.assert_close(tensors[0], gradient["fc.0.weight"], rtol=1e-3, atol=1e-4)
    assert any("read back exactly as the batch's gradient" in n for n in bundle.notes())
    # Adam's one step is not a gradient: the audit stays FedAvg's.
    adam = training | {"optimizer": "adam", "momentum": 0}
    assert load_bundle(write_bundle(tmp_path / "a", start, client, adam)).protocol.algorithm == (
        "fedavg"
    )


def _refusal(call) -> str:
    with pytest.raises(AuditInputError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_bad_bundles_are_refused_in_one_line_naming_what_is_wrong(tmp_path):
    start, client = _lenet_states()
    nan_delta = {k: v - start[k] for k, v in client.items()}
    nan_delta["body.2.weight"][0, 0, 0, 0] = float("nan")
    other = build_model(ModelSpec("mlp", input_shape=(3, 32, 32))).state_dict()
    cases = {
        "missing": (
            start,
            client,
            {k: v for k, v in TRAINING.items() if k not in ("lr", "bn_mode")},
        ),
        "nan": (start, nan_delta, TRAINING),
        "architecture": (start, client, TRAINING | {"num_classes": 100}),
        "other model": (start, other, TRAINING),
        "type": (start, client, TRAINING | {"lr": "0.05"}),
        "lr": (start, client, TRAINING | {"lr": 0}),
        "unknown": (start, client, TRAINING | {"learning_rate": 0.05}),
        "both counts": (start, client, TRAINING | {"local_steps": 4}),
    }
    words = {
        "missing": "training.json lacks fields lr, bn_mode",
        "nan": "delta.safetensors: body.2.weight has 1 NaN or infinite value",
        "architecture": "global.safetensors does not fit lenet (100 classes, input 3x32x32) "
        "that training.json names: shape: fc.0.weight is [10, 768] here but [100, 768]",
        "other model": "client.safetensors is not a state of the model in global.safetensors",
        "type": "lr must be a number, got '0.05' (a string)",
        "lr": "lr must be a learning rate > 0, got 0",
        "unknown": "unknown fields learning_rate",
        "both counts": "both local_epochs and local_steps",
    }
    for name, (global_state, update, training) in cases.items():
        file = "delta.safetensors" if name == "nan" else "client.safetensors"
        folder = _write_raw(tmp_path / name.replace(" ", "-"), global_state, update, training, file)
        assert words[name] in _refusal(lambda folder=folder: load_bundle(folder)), name
        # write_bundle refuses the same before writing anything.
        target = tmp_path / f"w-{name.replace(' ', '-')}"
        _refusal(
            lambda g=global_state, u=update, t=training, target=target, d=name == "nan": (
                write_bundle(target, g, u, t, delta=d)
            )
        )
        assert not target.exists()


def test_the_update_file_is_one_safetensors_file_never_unpickled(tmp_path):
    start, client = _lenet_states()
    both = _write_raw(tmp_path / "both", start, client, TRAINING)
    save_file(client, str(both / "delta.safetensors"))
    assert "holds both client.safetensors and delta.safetensors" in _refusal(
        lambda: load_bundle(both)
    )
    (both / "client.safetensors").unlink()
    (both / "delta.safetensors").unlink()
    assert "neither client.safetensors nor delta.safetensors" in _refusal(lambda: load_bundle(both))

    class Boom:
        def __reduce__(self):
            return (print, ("unpickled!",))

    (both / "client.safetensors").write_bytes(pickle.dumps({"fc.0.bias": Boom()}))
    assert "not a safetensors file" in _refusal(lambda: load_bundle(both))
    assert "was not found" in _refusal(lambda: load_bundle(tmp_path / "nowhere"))


def test_a_capture_may_write_an_incomplete_record_that_is_refused_until_completed(tmp_path):
    start, client = _lenet_states()
    partial = {k: v for k, v in TRAINING.items() if k != "lr"} | {"extra": {"missing": ["lr"]}}
    folder = write_bundle(tmp_path / "b", start, client, partial, complete=False)
    assert "lacks field lr" in _refusal(lambda: load_bundle(folder))
    assert "already holds a bundle" in _refusal(
        lambda: write_bundle(folder, start, client, TRAINING)
    )
    write_bundle(folder, start, client, TRAINING | {"extra": {"note": 1}}, overwrite=True)
    assert load_bundle(folder).training.extra == {"note": 1}


# --- One client trained in plain PyTorch, audited from the command line -----------------------


def _plain_pytorch_client(root: Path, *, write_delta: bool = False):
    """A client outside the product: LeNet at 32 px, SGD with momentum 0.9 and weight decay
    5e-4, 2 local epochs of 2 batches of 2 photographs, written with safetensors and json
    directly. Returns the bundle folder, the images folder (PNG files and labels.csv) and the
    client's state."""
    import torch.nn.functional as F
    from PIL import Image

    from auditlib.data import Normalization, load_sample_set, to_model_batch

    photographs = load_sample_set("photographs", 4, seed=0)
    pixels = to_model_batch(list(photographs.images), (3, 32, 32), Normalization.identity(3))
    as_bytes = (pixels * 255).round().clamp(0, 255).to(torch.uint8)
    labels = [3, 1, 4, 1]
    images = root / "images"
    images.mkdir(parents=True)
    for i in range(4):
        Image.fromarray(as_bytes[i].permute(1, 2, 0).numpy()).save(images / f"img{i}.png")
    rows = [f"img{i}.png,{label}" for i, label in enumerate(labels)]
    (images / "labels.csv").write_text("filename,label\n" + "\n".join(rows) + "\n")

    x, y = as_bytes.float() / 255, torch.tensor(labels)
    model = build_model(ModelSpec("lenet", input_shape=(3, 32, 32)))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    for _ in range(2):
        for window in (slice(0, 2), slice(2, 4)):
            optimizer.zero_grad()
            F.cross_entropy(model(x[window]), y[window]).backward()
            optimizer.step()
    client = {k: v.detach().clone() for k, v in model.state_dict().items()}
    training = {
        "model": "lenet",
        "num_classes": 10,
        "input_size": 32,
        "optimizer": "sgd",
        "lr": 0.05,
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "local_epochs": 2,
        "local_batch_size": 2,
        "num_examples": 4,
        "bn_mode": "train",
        "shuffled": False,
        "source": "plain pytorch",
    }
    if write_delta:
        update = {k: v - start[k] for k, v in client.items()}
        folder = _write_raw(root / "bundle", start, update, training, "delta.safetensors")
    else:
        folder = _write_raw(root / "bundle", start, client, training)
    return folder, images, client


def _audit(args: list[str], capsys) -> tuple[int, str, str]:
    from auditlib.cli import main

    code = main(["audit", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


FAST = ["--attack", "ig", "--iterations", "4", "--lpips-nets", "none"]


def test_the_products_simulation_of_the_client_is_the_plain_pytorch_update(tmp_path):
    from auditlib.defenses import build_defense
    from auditlib.engine.attack_phase import plan_attacks
    from auditlib.engine.releases import Rounds
    from auditlib.engine.victim import prepare_victim
    from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

    folder, images, client = _plain_pytorch_client(tmp_path)
    bundle = load_bundle(folder)
    simulated = RunSpec(
        model=ModelRef(bundle.model_spec, weights=str(folder / "global.safetensors")),
        data=DataSpec("folder", str(images), batch_size=4),
        scenario=ScenarioSpec(protocol=bundle.protocol),
        attack=ComponentSpec.of("ig"),
        defense=ComponentSpec("none"),
        budget=Budget(1),
    )
    assert not bundle.protocol.shuffle and bundle.protocol.momentum == 0.9
    victim = prepare_victim(simulated)
    attack = plan_attacks(simulated.attack, 1)[0]
    release = Rounds(simulated, victim, build_defense("none")[0]).for_attack(attack)
    assert release.observation.kind == "weights"
    for name, tensor in zip(
        release.observation.parameter_names, release.observation.tensors, strict=True
    ):
        torch.testing.assert_close(tensor, client[name], rtol=1e-5, atol=1e-6)


def test_an_observed_update_is_audited_with_its_private_images_and_scored(tmp_path, capsys):
    folder, images, _ = _plain_pytorch_client(tmp_path)
    out = tmp_path / "out"
    code, stdout, stderr = _audit(
        ["--observed", str(folder), "--images", str(images), *FAST, "--out", str(out)], capsys
    )
    assert code == 0, stderr
    assert "PSNR" in stdout and " dB" in stdout
    result = json.loads((out / "result.json").read_text())
    assert result["metrics"]["psnr_mean"] is not None and "unscored" not in result
    assert result["verdict"]["outcome"] in ("leaks", "labels_leak", "inconclusive")
    scenario = result["config"]["scenario"]
    assert scenario["observed"]["content_sha256"] == load_bundle(folder).content_sha256
    assert scenario["protocol"]["momentum"] == 0.9 and scenario["protocol"]["shared"] == "weights"
    assert result["threat_model"]["observation"] == "weights"
    assert any("observed, not simulated" in k for k in result["threat_model"]["server_knows"])
    assert result["victim"]["observed"]["training"]["local_epochs"] == 2
    assert (out / "reconstruction.png").exists()


def test_without_private_images_the_reconstructions_are_shown_and_not_scored(tmp_path, capsys):
    from PIL import Image

    from auditlib.result import AuditSummary

    folder, _, _ = _plain_pytorch_client(tmp_path, write_delta=True)
    out = tmp_path / "out"
    code, stdout, stderr = _audit(["--observed", str(folder), *FAST, "--out", str(out)], capsys)
    assert code == 0, stderr
    assert "not scored (no private images to compare with)" in stdout
    assert "verdict: Unavailable: no private images to compare with" in stdout
    assert "PSNR" not in stdout.split("verdict:")[0]
    data = json.loads((out / "result.json").read_text())
    assert data["metrics"] is None and data["oracle_best"] is None
    assert data["unscored"] == "no private images to compare with"
    verdict = data["verdict"]
    assert verdict["outcome"] == "unavailable" and verdict["finding"] is None
    assert data["attacks"][0]["attack_loss"] is not None and data["attacks"][0]["psnr_mean"] is None
    assert data["threat_model"]["observation"] == "weight_delta"
    summary = AuditSummary.from_json(data)  # reads back, typed
    assert summary.metrics is None and summary.verdict.finding is None
    assert not summary.verdict.is_finding
    with Image.open(out / "reconstruction.png") as png:  # one row of the 4 reconstructions
        assert png.size == (4 * 32 * 4 + 5 * 2, 32 * 4 + 2 * 2)


def test_bad_observed_input_is_one_clear_line_and_nothing_is_stored(tmp_path, capsys):
    folder, images, client = _plain_pytorch_client(tmp_path)
    start = dict(load_bundle(folder).global_state)
    training = json.loads((folder / "training.json").read_text())
    nan_delta = {k: v - start[k] for k, v in client.items()}
    nan_delta["fc.0.bias"][2] = float("nan")
    resnet = build_model(ModelSpec("resnet10", input_shape=(3, 32, 32))).state_dict()
    cases = {
        "architecture": (
            _write_raw(tmp_path / "arch", start, client, training | {"num_classes": 5}),
            "global.safetensors does not fit lenet (5 classes",
        ),
        "missing": (
            _write_raw(
                tmp_path / "missing",
                start,
                client,
                {k: v for k, v in training.items() if k != "lr"},
            ),
            "training.json lacks field lr",
        ),
        "nan": (
            _write_raw(tmp_path / "nan", start, nan_delta, training, "delta.safetensors"),
            "delta.safetensors: fc.0.bias has 1 NaN or infinite value",
        ),
        "other model": (
            _write_raw(tmp_path / "other", resnet, resnet, training | {"model": "resnet10"}),
            None,  # a bundle of another model than the images: checked below
        ),
    }
    for name, (bundle, words) in cases.items():
        out = tmp_path / f"out-{name.replace(' ', '-')}"
        args = ["--observed", str(bundle), "--images", str(images), *FAST, "--out", str(out)]
        if name == "other model":  # a ResNet bundle audited as the LeNet it is not
            args += ["--model", "lenet"]
            words = "--model lenet clashes with the observed bundle (model in training.json"
        code, stdout, stderr = _audit(args, capsys)
        assert code == 2, (name, stderr)
        assert stderr.startswith("error: ") and stderr.count("\n") == 1, stderr
        assert words in stderr, (name, stderr)
        assert stdout == "" and not out.exists(), name


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--local-lr", "0.1"], "--local-lr 0.1 clashes with the observed bundle (lr in"),
        (["--momentum", "0"], "--momentum 0.0 clashes with the observed bundle (momentum in"),
        (["--num-classes", "10", "--local-lr", "0.05"], None),  # the bundle's own values
        (["--weights", "w.safetensors"], "--weights does not apply with --observed"),
        (["--defense", "prune"], "the defense prune cannot be applied to it afterwards"),
        (["--server", "malicious"], "a malicious server (it sends a model of its own)"),
        (["--labels-known"], "the server knows the labels only with the private images"),
    ],
)
def test_options_the_bundle_sets_or_cannot_take_are_refused(tmp_path, capsys, options, words):
    folder, _, _ = _plain_pytorch_client(tmp_path)
    out = tmp_path / "out"
    args = ["--observed", str(folder), *options, *FAST, "--iterations", "1", "--out", str(out)]
    code, _, stderr = _audit(args, capsys)
    if words is None:
        assert code == 0, stderr
        return
    assert code == 2 and words in stderr and stderr.count("\n") == 1, stderr
    assert not out.exists()


def test_a_one_step_update_is_audited_as_the_gradient_it_is(tmp_path, capsys):
    start, _ = _lenet_states()
    gradient = {k: torch.randn_like(v) * 1e-2 for k, v in start.items()}
    client = {k: v - 0.1 * gradient[k] for k, v in start.items()}
    training = TRAINING | {"local_epochs": 1, "local_batch_size": 4, "lr": 0.1, "momentum": 0}
    folder = write_bundle(tmp_path / "b", start, client, training | {"weight_decay": 0})
    out = tmp_path / "out"
    code, _, stderr = _audit(["--observed", str(folder), *FAST, "--out", str(out)], capsys)
    assert code == 0, stderr
    data = json.loads((out / "result.json").read_text())
    assert data["threat_model"]["observation"] == "gradient"
    assert data["config"]["scenario"]["protocol"]["algorithm"] == "fedsgd"


def test_a_shuffling_client_is_simulated_and_the_threat_card_says_the_order_was_unknown():
    from auditlib.client.protocol import ClientProtocol
    from auditlib.engine.audit import SHUFFLED_ORDER, run_audit
    from auditlib.metrics.verdict import BATCH_ORDER
    from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

    protocol = ClientProtocol(
        algorithm="fedavg", local_epochs=1, local_batch_size=2, momentum=0.9, shuffle=True
    )
    spec = RunSpec(
        model=ModelRef(ModelSpec("lenet", input_shape=(3, 32, 32))),
        data=DataSpec("samples", "photographs", batch_size=4),
        scenario=ScenarioSpec(protocol=protocol),
        attack=ComponentSpec.of("ig"),
        defense=ComponentSpec("none"),
        budget=Budget(2),
    )
    summary = run_audit(spec, lpips_nets=()).summary
    card = {k.item: k for k in summary.verdict.scope.threat.knowledge}
    assert not card[BATCH_ORDER].known and card[BATCH_ORDER].detail == SHUFFLED_ORDER
    assert "shuffled its mini-batches" in summary.threat_model.server_knows[1]
    assert summary.metrics is not None and summary.unscored is None


# --- A bundle brought in as an upload (the dashboard's Setup page) ------------------------


def test_an_uploaded_bundle_is_its_files_or_one_zip_of_its_folder_and_is_stored_once(tmp_path):
    import io
    import zipfile

    from auditlib.observed import bundle_from_archive, bundle_from_upload

    start, client = _lenet_states()
    folder = write_bundle(tmp_path / "b", start, client, TRAINING)
    on_disk = load_bundle(folder)
    files = [(p.name, p.read_bytes()) for p in sorted(folder.iterdir())]
    bundle, archive = bundle_from_upload(files)
    assert bundle.content_sha256 == on_disk.content_sha256  # one bundle, one identity
    # A zip of the folder (as a file manager makes it: the folder inside, a macOS fork).
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as made:
        for name, data in files:
            made.writestr(f"round-3/{name}", data)
        made.writestr("__MACOSX/round-3/._training.json", b"fork")
    zipped, again = bundle_from_upload([("round-3.zip", buffer.getvalue())])
    assert zipped.content_sha256 == on_disk.content_sha256
    assert again == archive  # the stored form does not depend on how it came
    stored = bundle_from_archive(archive, "upload")
    assert stored.content_sha256 == on_disk.content_sha256
    assert torch.equal(stored.client_state["fc.0.bias"], client["fc.0.bias"])

    def refusal(upload) -> str:
        with pytest.raises(AuditInputError) as caught:
            bundle_from_upload(upload)
        return str(caught.value)

    assert "no training.json" in refusal([f for f in files if f[0] != "training.json"])
    assert "notes.txt, which is not a bundle's file" in refusal([*files, ("notes.txt", b"x")])
    assert "not both" in refusal([*files, ("round-3.zip", buffer.getvalue())])
    assert "not a readable zip" in refusal([("b.zip", b"PK not a zip")])
    nested = io.BytesIO()
    with zipfile.ZipFile(nested, "w") as made:
        for name, data in files:
            made.writestr(f"a/b/{name}", data)
    assert "at its top level or in one folder" in refusal([("n.zip", nested.getvalue())])
    pickled = [(n, pickle.dumps(client) if n == "client.safetensors" else d) for n, d in files]
    assert "not a safetensors file" in refusal(pickled)  # never unpickled


def test_a_stored_bundle_is_audited_as_its_folder_is(tmp_path):
    """The dashboard's run of an uploaded bundle (an asset handed to the worker as bytes)
    gives the run the command line gives for its folder: the same id, the same update."""
    from auditlib.engine.audit import run_audit
    from auditlib.observed import bundle_from_upload
    from auditlib.spec import (
        NO_IMAGES,
        Budget,
        ComponentSpec,
        DataSpec,
        ModelRef,
        ObservedRef,
        RunSpec,
        ScenarioSpec,
    )

    folder, _, _ = _plain_pytorch_client(tmp_path, write_delta=True)
    bundle, archive = bundle_from_upload([(p.name, p.read_bytes()) for p in folder.iterdir()])
    asset = hashlib.sha256(archive).hexdigest()

    def spec(observed: ObservedRef) -> RunSpec:
        return RunSpec(
            model=ModelRef(bundle.model_spec),
            data=DataSpec("none", "", normalization=bundle.normalization),
            scenario=ScenarioSpec(protocol=bundle.protocol, observed=observed),
            attack=ComponentSpec.of("ig"),
            defense=ComponentSpec("none"),
            budget=Budget(3),
        )

    uploaded = spec(ObservedRef(asset, bundle.content_sha256, source="asset"))
    from_folder = spec(ObservedRef(str(folder), bundle.content_sha256))
    assert uploaded.identity() == from_folder.identity()
    assert NO_IMAGES.source == "none"
    first = run_audit(uploaded, assets={asset: archive}, lpips_nets=())
    second = run_audit(from_folder, lpips_nets=())
    assert first.summary.unscored == second.summary.unscored == "no private images to compare with"
    torch.testing.assert_close(first.reconstruction, second.reconstruction)
    with pytest.raises(AuditInputError, match="was not handed to this worker"):
        run_audit(uploaded, assets={}, lpips_nets=())
