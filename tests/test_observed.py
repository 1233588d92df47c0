"""Observed updates: an update a client actually sent, as a bundle (global weights, the
client's weights or their difference, training.json), read and checked, then audited from
the command line with and without the client's private images."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model
from auditlib.observed import load_bundle, write_bundle

TRAINING = {
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
