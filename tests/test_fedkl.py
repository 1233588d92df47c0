"""Specification of the FedKL defense: the key and the lock stay on the client, the server
holds the architecture with its own guess, and federated training keeps a lock per client."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import client_update
from auditlib.data.normalization import Normalization
from auditlib.defenses import build_defense
from auditlib.fl.federated import FederationSpec, train_federated
from auditlib.fl.scenario import release_update
from auditlib.models import ModelSpec, build_model
from auditlib.models.keylock import KeyLockNorm
from auditlib.threat import PrivateBatch

torch.set_num_threads(1)


def release(attacker="random-key", protocol=None):
    protocol = protocol or ClientProtocol()
    model = build_model(ModelSpec("lenet", 10, (3, 32, 32), init="uniform"))
    for p in model.parameters():
        p.requires_grad_(True)
    g = torch.Generator().manual_seed(0)
    batch = PrivateBatch(torch.rand(2, 3, 32, 32, generator=g), torch.tensor([3, 7]), ("a", "b"))
    defense, _ = build_defense("fedkl", {"attacker": attacker})
    out = release_update(
        model,
        batch,
        protocol,
        defense,
        normalization=Normalization.parse("none", 3),
        num_classes=10,
        labels_known=False,
        seed=4,
    )
    return model, batch, out


def lock_of(model: nn.Module) -> KeyLockNorm:
    return next(m for m in model.modules() if isinstance(m, KeyLockNorm))


def test_the_key_and_the_lock_never_leave_the_client():
    model, _, out = release()
    names = out.observation.parameter_names
    assert not any("lock" in n or n.endswith(".key") for n in names)
    # The server receives every shared parameter: those of the locked model it sent, one
    # for each parameter of the model before the lock went in.
    server = out.knowledge.model
    assert names == tuple(n for n, _ in server.named_parameters() if "lock" not in n)
    assert len(names) == len(list(model.parameters()))
    assert len(out.observation.tensors) == len(out.knowledge.parameters())
    assert list(out.knowledge.parameters()) == list(names)


def test_the_server_holds_the_initial_lock_frozen_with_a_key_of_its_own():
    _, _, random_key = release("random-key")
    _, _, shared_key = release("shared-key")
    server_lock = lock_of(random_key.knowledge.model)
    assert not any(p.requires_grad for p in server_lock.parameters())
    # Same initial lock weights in both views; only the key differs.
    torch.testing.assert_close(
        server_lock.lock_gamma.weight, lock_of(shared_key.knowledge.model).lock_gamma.weight
    )
    assert not torch.equal(server_lock.key, lock_of(shared_key.knowledge.model).key)
    plain = lock_of(release("plain-bn")[2].knowledge.model)
    gamma, beta = plain.affine()
    assert torch.equal(gamma, torch.ones_like(gamma)) and torch.equal(beta, torch.zeros_like(beta))


@pytest.mark.parametrize("attacker, matches", [("shared-key", True), ("random-key", False)])
def test_only_the_true_key_lets_the_server_reproduce_the_update(attacker, matches):
    _, batch, out = release(attacker)
    server = out.knowledge.model
    parameters = out.knowledge.parameters()
    again = client_update(
        server, parameters, batch.images, batch.labels, ClientProtocol(), differentiable=False
    )
    same = all(
        torch.allclose(a, b, rtol=1e-4, atol=1e-6)
        for a, b in zip(again, out.observation.tensors, strict=True)
    )
    assert same is matches


def test_fedkl_releases_weights_without_the_lock_under_fedavg():
    model, _, out = release(protocol=ClientProtocol("fedavg", local_steps=2, shared="weights"))
    assert out.observation.kind == "weights"
    assert len(out.observation.tensors) == len(list(model.parameters()))


@pytest.mark.parametrize("name", ["dlg", "idlg", "ig", "gi", "grnn", "dlm", "dlm+", "fedleak"])
def test_every_attack_runs_against_the_locked_model(name):
    from auditlib.engine.audit import run_audit
    from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

    protocol = ClientProtocol()
    if name.startswith("dlm"):
        protocol = ClientProtocol("fedavg", local_steps=2, local_lr=0.01, shared="weights")
    spec = RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 16, 16), init="uniform")),
        data=DataSpec("samples", "photographs", batch_size=1, offset=0),
        scenario=ScenarioSpec(protocol=protocol),
        attack=ComponentSpec.of(name),
        defense=ComponentSpec.of("fedkl"),
        budget=Budget(2),
        seed=1,
    )
    summary = run_audit(spec, lpips_nets=()).summary
    assert summary.timing.iterations >= 1
    assert any("FedKL" in line for line in summary.threat_model.server_knows)


# --- federated training with a lock per client ----------------------------------------------------


def blobs(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 1, 4, 4, generator=torch.Generator().manual_seed(99)) * 2
    labels = torch.arange(n) % 4
    return centres[labels] + torch.randn(n, 1, 4, 4, generator=g), labels


def conv_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(96, 4))


def test_each_client_keeps_its_own_lock_and_the_server_never_averages_it():
    model = conv_model()
    federation = FederationSpec(clients=3, rounds=5, local_lr=0.05, local_batch_size=16)
    rounds = list(
        train_federated(model, blobs(300, 1), blobs(200, 2), federation, build_defense("fedkl")[0])
    )
    lock = lock_of(model)
    initial = lock_of(conv_model_with_lock()).lock_gamma.weight
    torch.testing.assert_close(lock.lock_gamma.weight, initial)  # never aggregated
    last = rounds[-1]
    assert last.accuracy > 0.9  # each client's own key and lock
    assert last.accuracy > rounds[0].accuracy + 0.3
    # Without its key the shared model loses much of what the clients learned (Table III).
    assert last.accuracy_without_key < last.accuracy - 0.2
    assert rounds[0].accuracy_without_key is not None


def conv_model_with_lock() -> nn.Module:
    model = conv_model()
    build_defense("fedkl")[0].change_model(model, (1, 4, 4), 0)
    return model


def test_a_scripted_model_cannot_take_the_lock():
    from auditlib.errors import AuditInputError

    scripted = torch.jit.script(conv_model())
    with pytest.raises(AuditInputError, match="cannot be changed"):
        build_defense("fedkl")[0].change_model(scripted, (1, 4, 4), 0)
