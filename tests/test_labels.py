"""Specifications of label inference from the observed update (auditlib.attacks.labels).

The batch rules read the last layer's weight (or bias) gradient: distinct labels for a
batch that fits in the classes (GradInversion's and FedLeak's rule), counts for a batch that
must repeat labels (FedLeak's count estimate, or the bias estimate). FedAvg updates are
first turned into a gradient estimate, -(w' - w) / (lr * K).
"""

from __future__ import annotations

import pytest
import torch

from auditlib.attacks.labels import gradient_estimate, infer_batch_labels
from auditlib.client.protocol import ClientProtocol
from auditlib.defenses import build_defense
from auditlib.engine.audit import prepare_victim
from auditlib.errors import AttackUnsupportedError, AuditInputError
from auditlib.fl.scenario import release_update
from auditlib.metrics.matching import label_accuracy
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from auditlib.threat import PrivateBatch


def release(model: ModelSpec, labels: list[int], protocol: ClientProtocol | None = None):
    """The server's view of a batch of len(labels) photographs (repeated if needed)."""
    spec = RunSpec(
        model=ModelRef(model),
        data=DataSpec("samples", "photographs", batch_size=min(len(labels), 17)),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(1),
    )
    victim = prepare_victim(spec)
    images = victim.batch.images.repeat(4, 1, 1, 1)[: len(labels)]
    batch = PrivateBatch(images, torch.tensor(labels), victim.batch.names)
    return release_update(
        victim.model,
        batch,
        protocol or ClientProtocol(),
        build_defense("none")[0],
        normalization=victim.normalization,
        num_classes=model.num_classes,
        labels_known=False,
        seed=0,
    )


LENET = ModelSpec("lenet", 100, (3, 32, 32), init="uniform")
RESNET10 = ModelSpec("resnet10", 10, (3, 32, 32))


@pytest.mark.parametrize(("reduce", "at_least"), [("sum", 7), ("min", 8)])
def test_distinct_labels_of_a_batch_of_eight(reduce, at_least):
    # The rule is exact for one image only: in a batch, other images' positive p_i * h can
    # outweigh a present class's negative term. Measured here: sum 7/8 (61 read as 91), min 8/8.
    labels = [3, 17, 25, 40, 58, 61, 77, 99]
    observed = release(LENET, labels)
    inferred, record = infer_batch_labels(observed.observation, observed.knowledge, reduce=reduce)
    assert inferred.tolist() == sorted(inferred.tolist()) and len(set(inferred.tolist())) == 8
    assert label_accuracy(inferred.tolist(), labels) * 8 >= at_least
    assert record["labels"] == inferred.tolist()


def test_distinct_rule_works_through_relu_and_batchnorm():
    labels = [0, 2, 3, 5, 6, 9]
    observed = release(RESNET10, labels)
    inferred, _ = infer_batch_labels(observed.observation, observed.knowledge)
    assert inferred.tolist() == labels


def test_fedavg_weights_give_the_same_labels_as_the_gradient():
    labels = [1, 4, 8, 12, 30]
    protocol = ClientProtocol("fedavg", local_steps=3, local_lr=0.05, shared="weights")
    observed = release(LENET, labels, protocol)
    assert observed.observation.kind == "weights"
    from_gradient = release(LENET, labels)
    expected = infer_batch_labels(from_gradient.observation, from_gradient.knowledge)[0]
    inferred = infer_batch_labels(observed.observation, observed.knowledge, reduce="min")[0]
    assert infer_batch_labels(observed.observation, observed.knowledge)[0].tolist() == (
        expected.tolist()
    )
    assert inferred.tolist() == labels


def test_one_full_batch_fedavg_step_is_read_back_as_the_exact_gradient():
    labels = [2, 7]
    gradient = release(LENET, labels)
    step = release(LENET, labels, ClientProtocol("fedavg", local_steps=1, local_lr=0.1))
    for index, expected in enumerate(gradient.observation.tensors):
        estimate = gradient_estimate(step.observation, step.knowledge, index)
        torch.testing.assert_close(estimate, expected, rtol=1e-3, atol=1e-6)


def test_counts_recover_most_labels_of_a_batch_larger_than_the_classes():
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (32,), generator=generator).tolist()
    observed = release(RESNET10, labels)
    inferred, record = infer_batch_labels(observed.observation, observed.knowledge)
    assert len(inferred) == 32
    assert "FedLeak count estimate" in record["rule"]
    assert sum(record["counts"].values()) == 32
    # Measured 0.875 here; a guess of the most frequent class would score 6/32.
    assert label_accuracy(inferred.tolist(), labels) >= 0.75


@pytest.mark.parametrize("fill", ["largest-remainder", "lowest-class"])
def test_both_readings_of_fedleaks_fill_step_give_a_full_batch(fill):
    labels = [0, 0, 1, 2, 3, 3, 3, 4, 5, 6, 7, 8, 9, 9, 1, 2]
    observed = release(RESNET10, labels)
    inferred, _ = infer_batch_labels(
        observed.observation, observed.knowledge, rule="counts", fill=fill
    )
    assert len(inferred) == 16
    assert label_accuracy(inferred.tolist(), labels) >= 0.5


def test_bias_counts_on_an_untrained_model():
    generator = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 10, (16,), generator=generator).tolist()
    observed = release(RESNET10, labels)
    inferred, record = infer_batch_labels(
        observed.observation, observed.knowledge, rule="bias-counts"
    )
    assert sum(record["counts"].values()) == 16
    assert label_accuracy(inferred.tolist(), labels) >= 0.8


def test_distinct_rule_refuses_more_images_than_classes():
    observed = release(RESNET10, [*range(10), 0, 1])
    with pytest.raises(AttackUnsupportedError, match="cannot have distinct labels"):
        infer_batch_labels(observed.observation, observed.knowledge, rule="distinct")


def test_unknown_rule_is_refused_with_the_choices():
    observed = release(LENET, [1])
    with pytest.raises(AuditInputError, match="expected auto, distinct"):
        infer_batch_labels(observed.observation, observed.knowledge, rule="guess")  # type: ignore[arg-type]
