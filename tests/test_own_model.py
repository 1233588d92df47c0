"""A model class of the user's own code (``path/to/file.py:ClassName``, docs/FLOWER.md): built
only where running its code was accepted, in a process of its own; a bundle naming a model
this tool does not know is refused naming only the architectures its tensors fit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model
from auditlib.models.own_code import own_code_allowed
from auditlib.observed import load_bundle

# Flower's quickstart CNN, with its class count as a constructor argument.
NET = """
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))
"""
ARGS = '{"num_classes": 7}'


def _net_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.py").write_text(NET)
    return folder / "task.py"


def _own_modules() -> set[str]:
    return {m for m in sys.modules if m.startswith("auditlib_own_model_")}


def test_an_own_class_is_built_only_where_running_its_code_was_allowed(tmp_path):
    spec = ModelSpec(f"{_net_file(tmp_path)}:Net", 7, (3, 32, 32), model_args=ARGS)
    before = _own_modules()
    with pytest.raises(AuditInputError, match="--i-trust-this-file"):
        build_model(spec)
    assert _own_modules() == before  # refused before the file was imported
    with own_code_allowed():
        model = build_model(spec)
    assert type(model).__name__ == "Net" and model.fc3.out_features == 7
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 7)
    with pytest.raises(AuditInputError, match="constructor arguments"):
        ModelSpec("lenet", model_args=ARGS)
    with own_code_allowed(), pytest.raises(AuditInputError, match="has nothing named Nett"):
        build_model(ModelSpec(f"{tmp_path / 'task.py'}:Nett"))


def _net_bundle(root: Path, model: str, *, one_step: bool = True) -> Path:
    """A bundle of the Net client: one SGD step on two images (lr 0.1), training.json as a
    recorder writes it, with some fields assumed."""
    with own_code_allowed():
        net = build_model(ModelSpec(f"{root / 'app' / 'task.py'}:Net", 7, model_args=ARGS))
    start = {k: v.clone() for k, v in net.state_dict().items()}
    x, y = (
        torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),
        torch.tensor([1, 4]),
    )
    torch.nn.functional.cross_entropy(net(x), y).backward()
    with torch.no_grad():
        for p in net.parameters():
            p -= 0.1 * p.grad
    folder = root / "bundle"
    folder.mkdir(parents=True)
    save_file(start, folder / "global.safetensors")
    save_file(
        {k: v.detach().contiguous() for k, v in net.state_dict().items()},
        folder / "client.safetensors",
    )
    training = {
        "model": model,
        "model_args": json.loads(ARGS),
        "num_classes": 7,
        "input_size": 32,
        "optimizer": "sgd",
        "lr": 0.1,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "local_epochs": 1,
        "local_batch_size": 2,
        "num_examples": 2,
        "bn_mode": "train",
        "extra": {"assumed": {"momentum": "0.0: not reported", "local_epochs": "1: not reported"}},
    }
    (folder / "training.json").write_text(json.dumps(training))
    return folder


def test_a_bundle_of_an_unknown_model_names_only_the_architectures_its_tensors_fit(tmp_path):
    _net_file(tmp_path / "app")
    folder = _net_bundle(tmp_path, "Net")
    with pytest.raises(AuditInputError) as refused:
        load_bundle(folder)
    words = str(refused.value)
    assert "no architecture of this tool fits global.safetensors's 10 tensors" in words
    assert "lenet" not in words and "convnet" not in words  # close by name, but do not fit
    assert "path/to/file.py:ClassName" in words and "--i-trust-this-file" in words

    # A misspelt built-in whose tensors it is: named, and nothing that does not fit.
    from tests.test_observed import TRAINING, _lenet_states, _write_raw

    start, moved = _lenet_states()
    lenet = _write_raw(tmp_path / "lenet", start, moved, TRAINING | {"model": "LeNet5"})
    with pytest.raises(AuditInputError) as refused:
        load_bundle(lenet)
    assert "the architectures whose tensors fit global.safetensors: lenet)" in str(refused.value)


def test_an_own_class_bundle_reads_without_running_its_code_and_audits_in_its_own_process(
    tmp_path, capsys, monkeypatch
):
    from auditlib.cli import main

    _net_file(tmp_path / "app")
    folder = _net_bundle(tmp_path, "task.py:Net")
    monkeypatch.chdir(tmp_path / "app")  # the path is the app folder's, as the recorder wrote it
    before = _own_modules()
    bundle = load_bundle(folder)  # checked without the class: the update against the global
    assert bundle.model_spec.info.source == "own code" and bundle.protocol.algorithm == "fedsgd"
    audit = ["audit", "--observed", str(folder), "--attack", "dlg", "--preset", "paper"]
    audit += ["--iterations", "3"]
    audit += ["--lpips-nets", "none", "--out", str(tmp_path / "out")]
    assert main(audit) == 2
    assert "runs the code of task.py" in capsys.readouterr().err
    assert main([*audit, "--i-trust-this-file"]) == 0
    printed = capsys.readouterr().out
    assert _own_modules() == before  # built in the audit's own process only
    # The assumptions, and the reading that holds only if they do, said on the command line.
    assert "assumed, not reported by the client" in printed and "momentum = 0.0" in printed
    assert "read as the batch's gradient only if these assumptions hold" in printed
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    knows = " ".join(result["threat_model"]["server_knows"])
    assert "exact only if the assumption holds" in knows and "read back exactly" not in knows
    assert "assumed, not reported by the client: momentum" in knows
    protocol = result["config"]["scenario"]["protocol"]
    assert (protocol["local_lr"], protocol["shared"]) == (0.1, "weights")  # as recorded


def test_the_dashboard_refuses_an_uploaded_own_class_bundle_saying_why(tmp_path):
    from auditlib.observed import bundle_from_upload

    _net_file(tmp_path / "app")
    folder = _net_bundle(tmp_path, "task.py:Net")
    files = [(p.name, p.read_bytes()) for p in sorted(folder.iterdir())]
    with pytest.raises(AuditInputError) as refused:
        bundle_from_upload(files)
    words = str(refused.value)
    assert "task.py:Net, a model class of the client's own code" in words
    assert "an admin has not allowed trusted code on this server" in words
    assert "users trusted-code on --admin NAME" in words and "--i-trust-this-file" in words
