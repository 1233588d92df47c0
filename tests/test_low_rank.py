"""A Linear weight's gradient in stacked candidates kept as its factors
(``attacks.low_rank``): the distances measure it as they measure the formed matrix, more
precisely near a match, and only where the update is FedSGD's gradient seen by the plain
attacker."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from auditlib.attacks.low_rank import LowRankRows, dense, factored_layers
from auditlib.attacks.objectives import (
    RowTargets,
    UpdateMatcher,
    cosine_distance,
    l1_distance,
    l2_distance,
    layer_l2_distance,
)
from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import client_update
from tests.test_attacks import lenet_spec, release_for

ROWS, OUT, IN = 5, 7, 11


def _case(rank: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    factored = LowRankRows(
        torch.randn(ROWS, rank, OUT, generator=g), torch.randn(ROWS, rank, IN, generator=g)
    )
    bias = torch.randn(ROWS, OUT, generator=g)
    shared = (torch.randn(OUT, IN, generator=g), torch.randn(OUT, generator=g))
    rows = RowTargets(
        (torch.randn(ROWS, OUT, IN, generator=g), torch.randn(ROWS, OUT, generator=g))
    )
    return (factored, bias), shared, rows


@pytest.mark.parametrize("distance", [l2_distance, cosine_distance, layer_l2_distance, l1_distance])
@pytest.mark.parametrize("rank", [1, 3])
def test_each_distance_of_the_factors_is_the_formed_matrixs(distance, rank):
    candidate, shared, rows = _case(rank)
    formed = dense(candidate)
    assert formed[0].shape == (ROWS, OUT, IN)
    for target in (shared, rows):
        # The reference in float64, from the formed matrices.
        reference = distance(
            tuple(c.double() for c in formed), type(target)(t.double() for t in target)
        )
        value = distance(candidate, target)
        assert value.shape == (ROWS,)
        torch.testing.assert_close(value.double(), reference, rtol=1e-6, atol=1e-6)


def test_near_a_match_the_factored_squared_distance_keeps_float64s_precision():
    # The target is the candidate itself, as float32 stores it: the true distance is float32's
    # rounding of each entry, about 1e-15 of ||T||^2. Taken as ||c||^2 - 2<c,T> + ||T||^2 in
    # float32 it would be float32's cancellation, about 1e-7 of it.
    (factored, _), _, _ = _case(1, seed=3)
    target = factored.dense()[0].detach()
    one = LowRankRows(factored.left[:1], factored.right[:1])
    value = one.squared_distance(target, rows=False)
    assert value.dtype == torch.float64
    assert float(value) <= 1e-12 * float((target.double() ** 2).sum())


def test_a_factored_entrys_gradients_are_the_formed_matrixs():
    (factored, _), shared, _ = _case(2, seed=5)
    left = factored.left.clone().requires_grad_(True)
    right = factored.right.clone().requires_grad_(True)
    for distance in (l2_distance, cosine_distance):
        via_factors = torch.autograd.grad(
            distance((LowRankRows(left, right),), shared[:1]).sum(), [left, right]
        )
        via_matrix = torch.autograd.grad(
            distance((LowRankRows(left, right).dense(),), shared[:1]).sum(), [left, right]
        )
        for a, b in zip(via_factors, via_matrix, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def release():
    torch.manual_seed(0)
    return release_for(lenet_spec("dlg"))[2]


def test_lenets_classifier_is_kept_factored_and_equals_the_clients_gradient(release):
    knowledge = release.knowledge
    matcher = UpdateMatcher(release.observation, knowledge, "l2")
    g = torch.Generator().manual_seed(1)
    images = torch.randn(4, 1, 3, 32, 32, generator=g)
    labels = torch.softmax(torch.randn(4, 1, 100, generator=g), -1)
    stacked = matcher.stacked_updates(images, labels)
    kinds = dict(zip(matcher.parameters, (type(u).__name__ for u in stacked), strict=True))
    assert kinds["fc.0.weight"] == "LowRankRows"
    assert all(kind == "Tensor" for name, kind in kinds.items() if name != "fc.0.weight")
    for r in range(4):
        alone = client_update(
            knowledge.model,
            matcher.parameters,
            images[r],
            labels[r],
            knowledge.protocol,
            differentiable=False,
        )
        for got, want in zip(dense(stacked), alone, strict=True):
            torch.testing.assert_close(got[r], want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "protocol",
    [ClientProtocol(algorithm="fedavg", local_steps=2), ClientProtocol(algorithm="fedavg")],
)
def test_fedavgs_update_is_kept_formed(protocol):
    # After one local step the weights differ per candidate, so the update is no sum of
    # outer products at the server's weights: factors would be wrong, not slow.
    torch.manual_seed(0)
    release = release_for(lenet_spec("dlg"), protocol=protocol)[2]
    matcher = UpdateMatcher(release.observation, release.knowledge, "l2")
    images = torch.randn(2, 1, 3, 32, 32)
    labels = torch.softmax(torch.randn(2, 1, 100), -1)
    assert not any(isinstance(u, LowRankRows) for u in matcher.stacked_updates(images, labels))


def test_a_known_defense_keeps_the_update_formed():
    torch.manual_seed(0)
    release = release_for(lenet_spec("dlg"), defense="prune", defense_params={"ratio": 0.8})[2]
    knows = dataclasses.replace(release.knowledge, defense=release.known_defense)
    assert knows.defense.mask is not None
    matcher = UpdateMatcher(release.observation, knows, "l2")
    images = torch.randn(2, 1, 3, 32, 32)
    labels = torch.softmax(torch.randn(2, 1, 100), -1)
    assert not any(isinstance(u, LowRankRows) for u in matcher.stacked_updates(images, labels))


class _Mixed(nn.Module):
    """A plain classifier, a tied pair, a layer never called and one over many tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(64, 10)
        self.tied_a = nn.Linear(8, 8)
        self.tied_b = nn.Linear(8, 8)
        self.tied_b.weight = self.tied_a.weight
        self.unused = nn.Linear(64, 64)
        self.tokens = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sequence = self.tokens(x.reshape(x.shape[0], 8, 8))  # 8 tokens of 8
        sequence = self.tied_b(self.tied_a(sequence))
        return self.head(sequence.reshape(x.shape[0], 64))


def test_only_a_plain_linear_met_once_and_of_low_rank_is_factored():
    model = _Mixed()
    parameters = dict(model.named_parameters())
    layers = factored_layers(model, parameters, torch.zeros(2, 64))
    # head: rank 2 (two examples), 2^2 x 74 < 640. tied: shared weight. unused: never runs.
    # tokens: rank 16 (2 x 8 tokens), 16^2 x 16 > 64.
    assert list(layers.modules) == ["head.weight"]
    assert layers.outputs["head.weight"] == (2, 10)
    # A hook of the model's own that changes the head's output: the probe there would read
    # the gradient at the changed output, so the head stays formed.
    handle = model.head.register_forward_hook(lambda module, args, output: 2 * output)
    try:
        assert not factored_layers(model, parameters, torch.zeros(2, 64)).modules
    finally:
        handle.remove()


def test_a_targets_float64_copy_is_made_once_and_goes_with_it():
    from auditlib.attacks import low_rank

    (factored, _), shared, _ = _case(1, seed=9)
    target = shared[0].clone()
    first = factored.inner(target, rows=False)
    copy = low_rank._FLOAT64[id(target)][2]
    assert torch.equal(factored.inner(target, rows=False), first)
    assert low_rank._FLOAT64[id(target)][2] is copy  # not cast again
    target.mul_(2)  # changed in place: a new copy, the new values
    torch.testing.assert_close(factored.inner(target, rows=False), 2 * first)
    key = id(target)
    del target
    assert key not in low_rank._FLOAT64
