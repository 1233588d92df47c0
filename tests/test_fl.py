"""Specification of auditlib.fl: the client's local computation (one definition shared by
victim and attacker), what the server receives, and the small FedAvg training loop.

Why one file over 400 lines: it is the specification of one package or page set, read
from top to bottom; its tests share fixtures and helpers defined here.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import classification_loss, client_update, trainable_parameters
from auditlib.data.normalization import Normalization
from auditlib.defenses import build_defense
from auditlib.errors import AuditInputError
from auditlib.fl.scenario import release_update
from auditlib.fl.training import FederatedTraining, federated_averaging
from auditlib.threat import PrivateBatch

NUM_CLASSES = 3


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """The models here are tiny: one intra-op thread avoids thread-pool wake-ups that cost
    milliseconds per operation on a busy machine. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def linear_model(seed: int = 0, dtype=torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, NUM_CLASSES)).to(dtype)


def batchnorm_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, NUM_CLASSES)
    )


def data(n: int, seed: int = 0, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 1, 2, 2, generator=g, dtype=dtype)
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    return images, labels


def fedavg(**kwargs) -> ClientProtocol:
    return ClientProtocol(algorithm="fedavg", **kwargs)


def manual_local_sgd(
    model: nn.Module, images, labels, protocol: ClientProtocol
) -> list[torch.Tensor]:
    """Reference: torch.optim.SGD over the protocol's mini-batches, on a copy of the model."""
    local = copy.deepcopy(model)
    local.train(protocol.batchnorm_mode == "train")
    optimiser = torch.optim.SGD(local.parameters(), lr=protocol.local_lr)
    for window in protocol.minibatch_slices(len(images)):
        optimiser.zero_grad()
        F.cross_entropy(local(images[window]), labels[window]).backward()
        optimiser.step()
    return [p.detach() for p in local.parameters()]


def state_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --- ClientProtocol -------------------------------------------------------------------------


def test_fedsgd_is_one_step_on_the_whole_batch():
    protocol = ClientProtocol(algorithm="fedsgd", local_steps=5, local_batch_size=2)
    assert protocol.steps_for(8) == 1
    assert protocol.minibatch_slices(8) == [slice(0, 8)]
    assert protocol.observation_kind == "gradient"
    assert ClientProtocol(shared="weights").observation_kind == "gradient"


def test_fedavg_local_steps_on_the_whole_batch_by_default():
    protocol = fedavg(local_steps=3)
    assert protocol.steps_for(8) == 3
    assert protocol.minibatch_slices(8) == [slice(0, 8)] * 3
    assert protocol.observation_kind == "weight_delta"
    assert fedavg(shared="weights").observation_kind == "weights"


def test_fedavg_mini_batches_cycle_through_the_batch_in_order():
    protocol = fedavg(local_steps=5, local_batch_size=3)
    assert protocol.steps_for(8) == 5
    assert protocol.minibatch_slices(8) == [
        slice(0, 3),
        slice(3, 6),
        slice(6, 8),  # the last mini-batch of an epoch is short
        slice(0, 3),
        slice(3, 6),
    ]


def test_fedavg_local_epochs_override_local_steps():
    protocol = fedavg(local_steps=100, local_epochs=2, local_batch_size=3)
    assert protocol.steps_for(8) == 6  # 2 epochs x ceil(8 / 3)
    assert protocol.minibatch_slices(8) == [slice(0, 3), slice(3, 6), slice(6, 8)] * 2
    assert fedavg(local_epochs=3).steps_for(8) == 3  # whole-batch steps


def test_a_local_batch_larger_than_the_batch_is_the_whole_batch():
    protocol = fedavg(local_steps=2, local_batch_size=50)
    assert protocol.minibatch(8) == 8
    assert protocol.minibatch_slices(8) == [slice(0, 8)] * 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"local_steps": 0}, "local steps must be >= 1"),
        ({"local_steps": 1001}, "local steps must be <= 1000"),
        ({"local_epochs": 0}, "local epochs"),
        ({"local_epochs": 101}, "local epochs"),
        ({"local_lr": 0.0}, "local learning rate"),
        ({"local_lr": -0.1}, "local learning rate"),
        ({"local_lr": 11.0}, "local learning rate"),
        ({"local_batch_size": 0}, "local batch size"),
    ],
)
def test_invalid_protocol_values_are_refused(kwargs, message):
    with pytest.raises(AuditInputError, match=message):
        fedavg(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"algorithm": "FedSGD"},
        {"algorithm": "fedavg", "shared": "deltas"},
        {"batchnorm_mode": "Train"},
    ],
    ids=["algorithm-FedSGD", "shared-deltas", "batchnorm_mode-Train"],
)
def test_unknown_protocol_choices_are_refused(kwargs):
    with pytest.raises(AuditInputError):
        ClientProtocol(**kwargs)


# --- client_update: FedSGD ------------------------------------------------------------------


def test_fedsgd_update_is_the_gradient_of_the_mean_cross_entropy():
    model = linear_model()
    images, labels = data(5)
    update = client_update(
        model, trainable_parameters(model), images, labels, ClientProtocol(), differentiable=False
    )
    expected = torch.autograd.grad(F.cross_entropy(model(images), labels), list(model.parameters()))
    assert len(update) == 2
    for u, e in zip(update, expected, strict=True):
        torch.testing.assert_close(u, e, rtol=0, atol=1e-7)


def test_soft_one_hot_labels_give_the_class_id_gradient():
    model = linear_model()
    images, labels = data(5)
    one_hot = F.one_hot(labels, NUM_CLASSES).float()
    logits = model(images)
    torch.testing.assert_close(
        classification_loss(logits, one_hot), F.cross_entropy(logits, labels)
    )
    parameters = trainable_parameters(model)
    hard = client_update(model, parameters, images, labels, ClientProtocol(), differentiable=False)
    soft = client_update(model, parameters, images, one_hot, ClientProtocol(), differentiable=False)
    for h, s in zip(hard, soft, strict=True):
        torch.testing.assert_close(h, s, rtol=0, atol=1e-7)


def test_soft_labels_weight_the_classes():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    soft = torch.tensor([[0.25, 0.75, 0.0]])
    log_p = F.log_softmax(logits, dim=-1)
    expected = -(0.25 * log_p[0, 0] + 0.75 * log_p[0, 1])
    torch.testing.assert_close(classification_loss(logits, soft), expected)


def test_the_update_follows_the_order_of_the_parameters_given():
    model = linear_model()
    images, labels = data(4)
    parameters = trainable_parameters(model)
    assert list(parameters) == ["1.weight", "1.bias"]
    reversed_parameters = dict(reversed(list(parameters.items())))
    forward = client_update(
        model, parameters, images, labels, ClientProtocol(), differentiable=False
    )
    backward = client_update(
        model, reversed_parameters, images, labels, ClientProtocol(), differentiable=False
    )
    assert backward[0].shape == (NUM_CLASSES,)
    torch.testing.assert_close(backward[0], forward[1])


# --- client_update: FedAvg ------------------------------------------------------------------


def test_fedavg_delta_equals_manual_sgd_on_consecutive_mini_batches():
    model = linear_model()
    images, labels = data(7)
    protocol = fedavg(local_steps=4, local_lr=0.5, local_batch_size=3)
    w0 = [p.detach().clone() for p in model.parameters()]
    update = client_update(
        model, trainable_parameters(model), images, labels, protocol, differentiable=False
    )
    expected = manual_local_sgd(model, images, labels, protocol)
    for u, e, w in zip(update, expected, w0, strict=True):
        torch.testing.assert_close(u, e - w, rtol=0, atol=1e-6)
        assert float(u.abs().max()) > 1e-3  # really moved


def test_fedavg_with_batchnorm_matches_manual_sgd_and_leaves_the_model_alone():
    model = batchnorm_model().train()
    images, labels = data(6)
    protocol = fedavg(local_epochs=2, local_lr=0.3, local_batch_size=3)
    before = state_copy(model)
    update = client_update(
        model, trainable_parameters(model), images, labels, protocol, differentiable=False
    )
    after = model.state_dict()
    assert set(after) >= {"2.running_mean", "2.running_var", "2.num_batches_tracked"}
    for key, value in before.items():
        assert torch.equal(after[key], value), key
    expected = manual_local_sgd(model, images, labels, protocol)
    parameters = [before[name] for name, _ in model.named_parameters()]
    for u, e, w in zip(update, expected, parameters, strict=True):
        torch.testing.assert_close(u, e - w, rtol=0, atol=1e-6)


def test_eval_mode_batchnorm_uses_the_running_statistics():
    model = batchnorm_model()
    with torch.no_grad():
        model[2].running_mean.fill_(0.3)
        model[2].running_var.fill_(2.0)
    images, labels = data(6)
    protocol = fedavg(local_steps=2, local_lr=0.3, batchnorm_mode="eval")
    w0 = [p.detach().clone() for p in model.parameters()]
    update = client_update(
        model, trainable_parameters(model), images, labels, protocol, differentiable=False
    )
    expected = manual_local_sgd(model, images, labels, protocol)
    for u, e, w in zip(update, expected, w0, strict=True):
        torch.testing.assert_close(u, e - w, rtol=0, atol=1e-6)
    train_mode = client_update(
        model,
        trainable_parameters(model),
        images,
        labels,
        fedavg(local_steps=2, local_lr=0.3),
        differentiable=False,
    )
    assert not torch.allclose(update[0], train_mode[0])


def test_fedsgd_with_batchnorm_leaves_the_running_statistics_alone():
    model = batchnorm_model().train()
    before = state_copy(model)
    images, labels = data(6)
    for _ in range(3):
        client_update(
            model,
            trainable_parameters(model),
            images,
            labels,
            ClientProtocol(),
            differentiable=False,
        )
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_fedavg_shared_weights_are_w0_plus_delta():
    model = linear_model()
    images, labels = data(6)
    parameters = trainable_parameters(model)
    delta = client_update(
        model, parameters, images, labels, fedavg(local_steps=3, local_lr=0.2), differentiable=False
    )
    weights = client_update(
        model,
        parameters,
        images,
        labels,
        fedavg(local_steps=3, local_lr=0.2, shared="weights"),
        differentiable=False,
    )
    for w, d, p in zip(weights, delta, parameters.values(), strict=True):
        torch.testing.assert_close(w, p.detach() + d, rtol=0, atol=1e-6)
        assert not w.requires_grad


def test_victim_updates_carry_no_graph():
    model = linear_model()
    images, labels = data(4)
    for protocol in (
        ClientProtocol(),
        fedavg(local_steps=2),
        fedavg(local_steps=2, shared="weights"),
    ):
        update = client_update(
            model, trainable_parameters(model), images, labels, protocol, differentiable=False
        )
        assert all(t.grad_fn is None and not t.requires_grad for t in update)


# --- client_update: differentiable (the attacker's simulation) ------------------------------


def sigmoid_mlp() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(4, 5), nn.Sigmoid(), nn.Linear(5, NUM_CLASSES)
    ).double()


@pytest.mark.parametrize(
    "protocol",
    [ClientProtocol(), fedavg(local_steps=3, local_lr=0.5, local_batch_size=2)],
    ids=["fedsgd", "fedavg"],
)
def test_the_update_is_differentiable_in_the_images(protocol):
    """Double backward: d/dx of the distance between simulated and observed updates matches a
    central finite difference on one pixel."""
    model = sigmoid_mlp()
    parameters = trainable_parameters(model)
    images, labels = data(4, seed=1, dtype=torch.float64)
    g = torch.Generator().manual_seed(2)
    target = [
        torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.1 for p in parameters.values()
    ]

    def distance(x: torch.Tensor) -> torch.Tensor:
        update = client_update(model, parameters, x, labels, protocol, differentiable=True)
        return sum(((u - t) ** 2).sum() for u, t in zip(update, target, strict=True))

    x = images.clone().requires_grad_()
    (grad,) = torch.autograd.grad(distance(x), x)
    assert grad.shape == images.shape
    assert float(grad.abs().max()) > 0

    h = 1e-6
    pixel = (1, 0, 1, 0)
    plus, minus = images.clone(), images.clone()
    plus[pixel] += h
    minus[pixel] -= h
    finite_difference = (distance(plus).item() - distance(minus).item()) / (2 * h)
    assert grad[pixel].item() == pytest.approx(finite_difference, rel=1e-5, abs=1e-9)


def test_the_differentiable_update_equals_the_victims():
    model = sigmoid_mlp()
    parameters = trainable_parameters(model)
    images, labels = data(4, seed=1, dtype=torch.float64)
    protocol = fedavg(local_steps=3, local_lr=0.5, local_batch_size=2)
    victim = client_update(model, parameters, images, labels, protocol, differentiable=False)
    attacker = client_update(model, parameters, images, labels, protocol, differentiable=True)
    for v, a in zip(victim, attacker, strict=True):
        torch.testing.assert_close(a.detach(), v, rtol=0, atol=1e-12)
        assert a.requires_grad


# --- release_update -------------------------------------------------------------------------


def private_batch(n: int = 4) -> PrivateBatch:
    images, labels = data(n, seed=5)
    return PrivateBatch(images, labels, tuple(f"{i}.png" for i in range(n)))


def release(model, protocol, defense=("none", {}), labels_known=False, seed=0, batch=None):
    return release_update(
        model,
        batch or private_batch(),
        protocol,
        build_defense(*defense)[0],
        normalization=Normalization.identity(1),
        num_classes=NUM_CLASSES,
        labels_known=labels_known,
        seed=seed,
    )


@pytest.mark.parametrize(
    ("protocol", "kind"),
    [
        (ClientProtocol(), "gradient"),
        (fedavg(local_steps=2), "weight_delta"),
        (fedavg(local_steps=2, shared="weights"), "weights"),
    ],
)
def test_release_observation_kind_follows_the_protocol(protocol, kind):
    assert release(linear_model(), protocol).observation.kind == kind


@pytest.mark.parametrize(
    "protocol", [ClientProtocol(), fedavg(local_steps=2, local_lr=0.3)], ids=["fedsgd", "fedavg"]
)
def test_without_defense_the_observation_is_the_plain_update(protocol):
    model, batch = linear_model(), private_batch()
    expected = client_update(
        copy.deepcopy(model),
        trainable_parameters(copy.deepcopy(model)),
        batch.images,
        batch.labels,
        protocol,
        differentiable=False,
    )
    result = release(model, protocol, batch=batch)
    assert result.observation.parameter_names == ("1.weight", "1.bias")
    for o, e in zip(result.observation.tensors, expected, strict=True):
        torch.testing.assert_close(o, e, rtol=0, atol=1e-7)
    norm = float(torch.linalg.vector_norm(torch.cat([e.reshape(-1) for e in expected])))
    assert result.undefended_norm == pytest.approx(norm, rel=1e-6)
    assert result.defended_norm == pytest.approx(norm, rel=1e-6)
    assert result.privacy == {}


def test_shared_weights_are_released_as_w0_plus_update():
    model, batch = linear_model(), private_batch()
    w0 = [p.detach().clone() for p in model.parameters()]
    delta = release(model, fedavg(local_steps=2, local_lr=0.3), batch=batch).observation.tensors
    weights = release(model, fedavg(local_steps=2, local_lr=0.3, shared="weights"), batch=batch)
    for w, d, p in zip(weights.observation.tensors, delta, w0, strict=True):
        torch.testing.assert_close(w, p + d, rtol=0, atol=1e-6)
    # The reported norms are those of the difference, not of the weights.
    assert weights.undefended_norm == pytest.approx(
        float(torch.linalg.vector_norm(torch.cat([d.reshape(-1) for d in delta]))), rel=1e-5
    )


def test_with_shared_weights_the_defense_acts_on_the_difference():
    model, batch = linear_model(), private_batch()
    w0 = [p.detach().clone() for p in model.parameters()]
    protocol = fedavg(local_steps=2, local_lr=0.3, shared="weights")
    released = release(model, protocol, defense=("prune", {"ratio": 0.5}), batch=batch)
    for w, p in zip(released.observation.tensors, w0, strict=True):
        difference = w - p
        assert int((difference == 0).sum()) == round(
            0.5 * p.numel()
        )  # 6 of 12 weights, 2 of 3 biases


def test_a_noisy_release_is_fixed_by_the_seed():
    model = linear_model()
    defense = ("dp-gaussian", {"sigma": 0.1, "clip": 1.0})
    a = release(model, ClientProtocol(), defense=defense, seed=3)
    b = release(model, ClientProtocol(), defense=defense, seed=3)
    c = release(model, ClientProtocol(), defense=defense, seed=4)
    assert all(
        torch.equal(x, y) for x, y in zip(a.observation.tensors, b.observation.tensors, strict=True)
    )
    assert not torch.equal(a.observation.tensors[0], c.observation.tensors[0])
    assert a.privacy["epsilon"] is not None
    assert a.defended_norm != a.undefended_norm


def test_labels_reach_the_attacker_only_when_known():
    batch = private_batch()
    assert release(linear_model(), ClientProtocol(), batch=batch).knowledge.labels is None
    known = release(linear_model(), ClientProtocol(), labels_known=True, batch=batch).knowledge
    assert torch.equal(known.labels, batch.labels)
    assert known.labels is not batch.labels


def test_the_attackers_model_is_a_separate_copy():
    model = batchnorm_model().train()
    before = state_copy(model)
    knowledge = release(model, fedavg(local_steps=2, local_batch_size=2)).knowledge
    assert knowledge.model is not model
    for key, value in knowledge.model.state_dict().items():
        assert torch.equal(value, before[key]), key
    with torch.no_grad():
        for p in knowledge.model.parameters():
            p.add_(1.0)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_release_describes_the_batch_without_handing_it_over():
    batch = private_batch(4)
    protocol = fedavg(local_steps=2)
    knowledge = release(linear_model(), protocol, batch=batch).knowledge
    assert knowledge.batch_size == 4
    assert knowledge.input_shape == (1, 2, 2)
    assert knowledge.num_classes == NUM_CLASSES
    assert knowledge.protocol is protocol
    assert knowledge.normalization == Normalization.identity(1)


def test_observation_tensors_are_detached():
    for protocol in (ClientProtocol(), fedavg(local_steps=2, shared="weights")):
        observation = release(linear_model(), protocol).observation
        for t in observation.tensors:
            assert not t.requires_grad
            assert t.grad_fn is None


# --- federated_averaging --------------------------------------------------------------------


def separable_pool(n: int = 128, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two classes at (+1, +1) and (-1, -1) plus small noise, as 1 x 1 x 2 images."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 2
    centres = (labels.float() * 2 - 1)[:, None].expand(n, 2)
    points = centres + 0.3 * torch.randn(n, 2, generator=g)
    return points.view(n, 1, 1, 2), labels


def two_class_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(2, 2))


def test_federated_averaging_lowers_the_loss():
    model = two_class_model()
    images, labels = separable_pool()
    training = FederatedTraining(
        rounds=6,
        clients_per_round=4,
        examples_per_client=16,
        protocol=fedavg(local_epochs=1, local_lr=0.5, local_batch_size=8),
    )
    losses = federated_averaging(model, images, labels, training, seed=0)
    assert len(losses) == 6
    assert losses[-1] < losses[0]
    assert losses[-1] < 0.5 * losses[0]
    with torch.no_grad():
        accuracy = float((model(images).argmax(1) == labels).float().mean())
    assert accuracy > 0.95
    assert not model.training


def test_federated_averaging_with_the_default_protocol_lowers_the_loss():
    model = two_class_model()
    images, labels = separable_pool()
    losses = federated_averaging(model, images, labels, FederatedTraining(rounds=5), seed=1)
    assert losses[-1] < losses[0]


def test_one_round_with_one_full_batch_client_is_one_gradient_step():
    model = two_class_model()
    images, labels = separable_pool(16)
    w0 = [p.detach().clone() for p in model.parameters()]
    loss = F.cross_entropy(model(images), labels)
    initial = loss.item()
    grads = torch.autograd.grad(loss, list(model.parameters()))
    training = FederatedTraining(
        rounds=1, clients_per_round=1, examples_per_client=16, protocol=fedavg(local_lr=0.5)
    )
    losses = federated_averaging(model, images, labels, training, seed=0)
    assert losses == [pytest.approx(initial, rel=1e-6)]
    for p, w, g in zip(model.parameters(), w0, grads, strict=True):
        torch.testing.assert_close(p.detach(), w - 0.5 * g, rtol=0, atol=1e-6)


def test_federated_averaging_is_fixed_by_the_seed():
    images, labels = separable_pool()
    training = FederatedTraining(rounds=2, clients_per_round=2, examples_per_client=16)
    a, b = two_class_model(), two_class_model()
    assert federated_averaging(a, images, labels, training, seed=5) == federated_averaging(
        b, images, labels, training, seed=5
    )
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_federated_averaging_needs_enough_examples_for_a_round():
    images, labels = separable_pool(16)
    training = FederatedTraining(rounds=1, clients_per_round=4, examples_per_client=8)
    with pytest.raises(ValueError, match="a round needs 32"):
        federated_averaging(two_class_model(), images, labels, training, seed=0)


@pytest.mark.parametrize(
    "protocol",
    [
        ClientProtocol(algorithm="fedavg", local_steps=1, shared="weights"),
        ClientProtocol(algorithm="fedsgd", local_lr=0.5),
    ],
    ids=["shared-weights", "fedsgd"],
)
def test_federated_training_refuses_clients_that_do_not_share_weight_differences(protocol):
    """The server adds the mean client update to the weights: only weight differences fit."""
    with pytest.raises(AuditInputError, match="weight differences"):
        FederatedTraining(rounds=1, protocol=protocol)
