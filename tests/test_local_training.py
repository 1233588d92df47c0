"""The client's local training as real clients run it: torch.optim's SGD with momentum and
weight decay, and Adam, in the one client update; shuffled mini-batches in an order only
the client knows. The default protocol computes bit for bit what it computed before these
options existed, and the identity of every spec that does not use them is unchanged."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import client_update, difference_per_gradient, trainable_parameters
from auditlib.engine.identity import run_identity
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model
from auditlib.spec import (
    Budget,
    ComponentSpec,
    DataSpec,
    ModelRef,
    RunSpec,
    ScenarioSpec,
    run_spec_from_dict,
)

SHAPES = {"lenet": (3, 32, 32), "convnet": (3, 16, 16)}


def _model(architecture: str):
    model = build_model(ModelSpec(architecture, input_shape=SHAPES[architecture]))
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def _batch(architecture: str, size: int = 4):
    generator = torch.Generator().manual_seed(1)
    images = torch.rand((size, *SHAPES[architecture]), generator=generator)
    return images, torch.arange(size) % 10


def _old_update(model, images, labels, protocol, differentiable):
    """client_update as it was before the optimiser options, written out by hand: the same
    operations in the same order (plain SGD steps ``w - lr * g`` over in-order windows)."""
    model.train(protocol.batchnorm_mode == "train")
    parameters = trainable_parameters(model)
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    names = list(parameters)

    def gradient(current, x, y):
        logits = functional_call(model, ({**current, **buffers},), (x,))
        loss = F.cross_entropy(logits, y)
        return torch.autograd.grad(loss, list(current.values()), create_graph=differentiable)

    if protocol.algorithm == "fedsgd":
        return tuple(gradient(parameters, images, labels))
    current = dict(parameters)
    for window in protocol.minibatch_slices(images.shape[0]):
        grads = gradient(current, images[window], labels[window])
        step = {n: current[n] - protocol.local_lr * g for n, g in zip(names, grads, strict=True)}
        current = (
            step if differentiable else {n: t.detach().requires_grad_() for n, t in step.items()}
        )
    if protocol.shared == "weights":
        return tuple(current[n].detach() for n in names)
    return tuple((current[n] - parameters[n]).detach() for n in names)


DEFAULT_PROTOCOLS = [
    ClientProtocol(),
    ClientProtocol(algorithm="fedavg", local_steps=3, local_lr=0.1),
    ClientProtocol(
        algorithm="fedavg", local_epochs=2, local_batch_size=2, local_lr=0.05, shared="weights"
    ),
    ClientProtocol(algorithm="fedavg", local_epochs=2, local_batch_size=3, batchnorm_mode="eval"),
]


@pytest.mark.parametrize("architecture", ["lenet", "convnet"])
@pytest.mark.parametrize("protocol", DEFAULT_PROTOCOLS, ids=lambda p: p.describe())
@pytest.mark.parametrize("differentiable", [False, True])
def test_the_default_optimiser_is_bit_identical_to_the_update_before_it(
    architecture, protocol, differentiable
):
    model = _model(architecture)
    images, labels = _batch(architecture)
    new = client_update(
        model, trainable_parameters(model), images, labels, protocol, differentiable=differentiable
    )
    old = _old_update(copy.deepcopy(model), images, labels, protocol, differentiable)
    assert all(torch.equal(a.detach(), b) for a, b in zip(new, old, strict=True))


def test_specs_without_the_new_options_keep_their_identities():
    """Computed with the code before the optimiser options (commit 8537121)."""
    plain = RunSpec(
        ModelRef(ModelSpec("lenet")),
        DataSpec("samples", "photographs", batch_size=2),
        ScenarioSpec(),
        ComponentSpec.of("dlg"),
        ComponentSpec("none"),
        Budget(10),
    )
    fedavg = RunSpec(
        ModelRef(ModelSpec("lenet")),
        DataSpec("samples", "photographs", batch_size=4),
        ScenarioSpec(
            protocol=ClientProtocol(
                algorithm="fedavg", local_epochs=2, local_batch_size=2, shared="weights"
            )
        ),
        ComponentSpec.of("ig"),
        ComponentSpec.of("prune", {"ratio": 0.5}),
        Budget(10),
    )
    assert plain.identity() == "810877352253e6e79ecf930fd691c2e8d3c764e277b297b936a6929eb67af0d8"
    # DLG's resolved id changed once since, for another reason: its starts advance together
    # on the batched L-BFGS (the attack's ``together``, a different computation); the raw id
    # above and the FedAvg spec's ids below are the ones from before the optimiser options.
    assert run_identity(plain) == "489ebfeff8cd131f495f5a30a667b3f4a28bdfc49b5a792b08b0b7bdd1904103"
    assert fedavg.identity() == "590afb96816631e018e10ed17ff7b789e30b79f76484365519859102c56f91bc"
    assert (
        run_identity(fedavg) == "59ac27f419399a8bed26de07126abb30776c7aba2afad86841799501880a9e98"
    )
    assert "optimizer" not in plain.payload()["scenario"]["protocol"]
    # The options change the identity where they are used, and round-trip through the dict.
    momentum = dataclasses.replace(
        fedavg,
        scenario=ScenarioSpec(
            protocol=dataclasses.replace(fedavg.scenario.protocol, momentum=0.9, shuffle=True)
        ),
    )
    assert momentum.identity() != fedavg.identity()
    assert momentum.payload()["scenario"]["protocol"]["momentum"] == 0.9
    assert run_spec_from_dict(momentum.to_dict()) == momentum
    # 0 and 0.0 are one protocol, and one identity.
    assert ClientProtocol(momentum=0) == ClientProtocol()


def _torch_optim(model, images, labels, make, epochs, size):
    reference = copy.deepcopy(model)
    reference.train()
    optimizer = make(reference.parameters())
    for _ in range(epochs):
        for start in range(0, images.shape[0], size):
            optimizer.zero_grad()
            window = slice(start, start + size)
            F.cross_entropy(reference(images[window]), labels[window]).backward()
            optimizer.step()
    return [p.detach() for p in reference.parameters()]


@pytest.mark.parametrize("architecture", ["lenet", "convnet"])
@pytest.mark.parametrize(
    ("optimizer", "settings"),
    [
        ("sgd", {"momentum": 0.9, "weight_decay": 5e-4}),
        ("sgd", {"weight_decay": 0.01}),
        ("adam", {"weight_decay": 1e-3}),
        ("adam", {}),
    ],
)
def test_each_optimiser_is_torch_optims(architecture, optimizer, settings):
    model = _model(architecture)
    images, labels = _batch(architecture)
    protocol = ClientProtocol(
        algorithm="fedavg",
        local_epochs=2,
        local_batch_size=2,
        local_lr=0.01,
        shared="weights",
        optimizer=optimizer,
        **settings,
    )
    make = torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam
    expected = _torch_optim(
        model, images, labels, lambda p: make(p, lr=0.01, **settings), epochs=2, size=2
    )
    got = client_update(
        model, trainable_parameters(model), images, labels, protocol, differentiable=False
    )
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # The attacker's differentiable simulation computes the same and back-propagates to the
    # images without NaN (Adam's square root at a zero second moment included).
    candidate = images.clone().requires_grad_()
    simulated = client_update(
        model, trainable_parameters(model), candidate, labels, protocol, differentiable=True
    )
    for a, b in zip(simulated, got, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=1e-6, atol=1e-7)
    sum((s**2).sum() for s in simulated).backward()
    assert candidate.grad is not None and bool(torch.isfinite(candidate.grad).all())
    # And so does the torch.func path the restarts run under vmap. Compared in float64: on
    # it train-mode BatchNorm normalises by composite operations (client.exact_batchnorm),
    # another float order than the fused layer's, and in float32 Adam turns that order's
    # noise on gradients that are zero or nearly so (a convolution's bias before BatchNorm)
    # into steps of up to lr against its eps of 1e-8 (measured on the convnet: 7e-3; in
    # float64 9e-9).
    model64 = copy.deepcopy(model).double()
    images64 = images.double()
    got64 = client_update(
        model64, trainable_parameters(model64), images64, labels, protocol, differentiable=False
    )
    buffers = {n: b.clone() for n, b in model64.named_buffers()}
    detached = {n: p.detach() for n, p in model64.named_parameters()}
    functional = client_update(
        model64, detached, images64, labels, protocol, differentiable=True, buffers=buffers
    )
    for a, b in zip(functional, got64, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_shuffling_client_trains_in_its_own_order_and_the_attacker_in_order():
    model = _model("lenet")
    images, labels = _batch("lenet")
    shuffled = ClientProtocol(
        algorithm="fedavg", local_epochs=2, local_batch_size=2, local_lr=0.1, shuffle=True
    )
    in_order = dataclasses.replace(shuffled, shuffle=False)
    parameters = trainable_parameters(model)

    def update(protocol, seed):
        return client_update(
            model, parameters, images, labels, protocol, differentiable=False, order_seed=seed
        )

    attacker = update(shuffled, None)  # it does not know the client's seed
    assert all(torch.equal(a, b) for a, b in zip(attacker, update(in_order, 5), strict=True))
    client = update(shuffled, 5)
    assert not all(torch.equal(a, b) for a, b in zip(client, attacker, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(client, update(shuffled, 5), strict=True))
    windows = shuffled.minibatch_windows(4, 5)
    assert [sorted(torch.cat(windows[e * 2 : e * 2 + 2]).tolist()) for e in (0, 1)] == [
        [0, 1, 2, 3]
    ] * 2  # each epoch a permutation of the batch
    assert "shuffled" in shuffled.describe() and "order unknown" in shuffled.describe()


def test_describe_names_the_optimiser():
    protocol = ClientProtocol(
        algorithm="fedavg", local_epochs=2, local_lr=0.05, momentum=0.9, weight_decay=5e-4
    )
    assert "SGD at lr 0.05 with momentum 0.9 and weight decay 0.0005" in protocol.describe()
    adam = ClientProtocol(algorithm="fedavg", optimizer="adam", local_lr=1e-3)
    assert "of Adam at lr 0.001" in adam.describe()
    assert ClientProtocol().describe() == "FedSGD: one gradient of the whole batch"


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"optimizer": "adam", "momentum": 0.9}, "momentum 0 with adam"),
        ({"momentum": 1.0}, r"momentum must be in \[0, 1\)"),
        ({"weight_decay": -0.1}, r"weight decay must be in \[0, 1\]"),
        ({"optimizer": "rmsprop"}, "local optimizer"),
        ({"momentum": "0.9"}, "momentum must be a number"),
        ({"shuffle": 1}, "shuffle must be true or false"),
    ],
)
def test_bad_optimiser_settings_are_refused(settings, words):
    with pytest.raises(AuditInputError, match=words):
        ClientProtocol(algorithm="fedavg", **settings)


def test_the_gradient_reading_accounts_for_momentum():
    plain = ClientProtocol(algorithm="fedavg", local_steps=3, local_lr=0.1)
    assert difference_per_gradient(plain, 4) == -0.1 * 3
    heavy = dataclasses.replace(plain, momentum=0.5)
    # 1 + (1 + 0.5) + (1 + 0.5 + 0.25) steps of a constant gradient
    assert difference_per_gradient(heavy, 4) == pytest.approx(-0.1 * 4.25)
