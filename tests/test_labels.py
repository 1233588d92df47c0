"""Specifications of label inference from the observed update (auditlib.attacks.labels).

The batch rules read the last layer's weight (or bias) gradient: distinct labels for a
batch that fits in the classes (GradInversion's and FedLeak's rule), counts for a batch that
must repeat labels (FedLeak's count estimate, or the bias estimate). FedAvg updates are
first turned into a gradient estimate, -(w' - w) / (lr * K).
"""

from __future__ import annotations

import pytest
import torch

from auditlib.attacks.labels import gradient_estimate, idlg_exact, idlg_label, infer_batch_labels
from auditlib.client.protocol import ClientProtocol
from auditlib.data.labels import assign_labels
from auditlib.defenses import build_defense
from auditlib.engine.audit import prepare_victim
from auditlib.errors import AttackUnsupportedError, AuditInputError
from auditlib.fl.scenario import release_update
from auditlib.metrics.matching import label_accuracy
from auditlib.metrics.risk import label_test
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from auditlib.threat import PrivateBatch
from tests.test_report import needs_poppler


def release(
    model: ModelSpec,
    labels: list[int],
    protocol: ClientProtocol | None = None,
    defense: tuple[str, dict] = ("none", {}),
):
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
        build_defense(*defense)[0],
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


# --- iDLG's rule: exact by construction where its assumptions hold ------------------------

_PLAIN = {
    "classes": 100,
    "steps": 1,
    "optimizer": "sgd",
    "weight_decay": 0.0,
    "defense": "none",
    "defense_params": {},
    "honest_server": True,
    "observed": False,
}


def _record(source="weight", negative=1, label=7):
    return {
        "source": source,
        "label": label,
        "negative_entries": negative,
        "unambiguous": negative == 1,
    }


def test_idlg_is_exact_for_one_undefended_gradient_and_says_why():
    exact, words = idlg_exact(_record(), **_PLAIN)
    assert exact and words.startswith("class 7, read by iDLG's rule, exact for one image")
    assert "needs no test against chance" in words
    assert idlg_exact(_record("bias"), **_PLAIN)[0]
    # Norm clipping only rescales the update: every sign stays.
    assert idlg_exact(_record(), **{**_PLAIN, "defense": "clip"})[0]


@pytest.mark.parametrize(
    ("change", "record", "why"),
    [
        ({"defense": "dp-gaussian"}, _record(), "the defense (dp-gaussian) changes"),
        ({"defense": "quantize"}, _record("bias"), "the defense (quantize) changes"),
        ({"defense": "prune"}, _record("bias"), "the defense (prune) changes"),
        (
            {"defense": "clip", "defense_params": {"mode": "value"}},
            _record(),
            "the defense (clip) changes",
        ),
        ({}, _record(negative=4), "4 entries of the last layer's weight update are negative"),
        ({"steps": 3}, _record(), "the client's 3 local steps"),
        ({"weight_decay": 0.01}, _record("bias"), "local optimiser"),
        ({"optimizer": "adam"}, _record("bias"), "local optimiser"),
        ({"honest_server": False}, _record(), "a malicious server's model"),
        ({"observed": True}, _record(), "an observed update"),
        ({"classes": 2}, _record(), "with 2 classes"),
    ],
)
def test_idlg_is_never_called_exact_where_an_assumption_fails(change, record, why):
    exact, words = idlg_exact(record, **{**_PLAIN, **change})
    assert not exact
    assert words.startswith("iDLG's label rule is not exact here (") and why in words


def test_the_bias_rule_stays_exact_over_several_sgd_steps():
    assert idlg_exact(_record("bias"), **{**_PLAIN, "steps": 5})[0]


def test_idlg_on_a_real_undefended_update_is_exact_and_right():
    observed = release(LENET, [61])
    for source in ("weight", "bias"):
        label, record = idlg_label(observed.observation, observed.knowledge, source)
        assert label == 61 and record["source"] == source
        assert idlg_exact(record, **_PLAIN)[0]


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
def test_rules_on_a_noised_update_of_assigned_labels_are_not_a_leak():
    """Issue 50's false leak, small: LeNet at 10 classes, 8 photographs with the labels a
    folder without labels gets, dp-gaussian sigma 1000 with clip 1e-6 (an update of noise):
    no rule's labels are beyond the relabelling test (the full study:
    benchmarks/label_null.py)."""
    lenet10 = ModelSpec("lenet", 10, (3, 32, 32), init="uniform")
    for seed in range(2):
        labels = list(assign_labels(8, 10, seed))
        observed = release(lenet10, labels, defense=("dp-gaussian", {"sigma": 1000, "clip": 1e-6}))
        guesses = []
        for rule, reduce in (
            ("distinct", "sum"),
            ("distinct", "min"),
            ("counts", "sum"),
            ("bias-counts", "sum"),
        ):
            inferred, _ = infer_batch_labels(observed.observation, observed.knowledge, rule, reduce)
            guesses.append([inferred.tolist()])
            assert not label_test([guesses[-1]], [labels], 10).beyond_chance
        assert not label_test(guesses, [labels], 10).beyond_chance


@pytest.fixture(scope="module")
def one_idlg_step():
    """One iDLG step on one photograph, LeNet at 100 classes, labels unknown."""
    from auditlib.engine.audit import run_audit
    from tests.test_attacks import lenet_spec

    spec = lenet_spec("idlg", iterations=1, params={"restarts": 1})
    return spec, run_audit(spec, lpips_nets=())


def test_the_verdict_of_one_idlg_step_at_100_classes_names_the_label(one_idlg_step):
    """The label is a finding by iDLG's exact rule (the test alone gives p = 0.01, not below
    0.01), the verdict says which, and beside it that the images are not shown safe."""
    from dashboard.verdict_words import verdict_cell

    _, result = one_idlg_step
    verdict = result.summary.verdict
    truth = result.summary.metrics.per_image[0].true_label
    assert verdict.outcome == "labels_leak" and verdict.level == "Labels"
    assert verdict.finding.label_p_value is None and verdict.finding.labels_recovered == 1
    assert f"class {truth}, read by iDLG's rule, exact for one image" in verdict.sentence
    assert "the images not shown safe" in verdict.headline
    assert verdict_cell(verdict) == "Labels: labels leak, images not shown safe"


@needs_poppler
def test_the_pdf_of_a_labels_verdict_says_what_is_known_of_the_images(one_idlg_step, tmp_path):
    from auditlib.report.pdf import build_report
    from auditlib.report.subject import run_subject
    from auditlib.store import Store
    from tests.test_report import flat, pdf_text, store_run

    spec, result = one_idlg_step
    with Store(f"sqlite:///{tmp_path}/runs.db") as store:
        subject = run_subject(store, store_run(store, spec, result, "one iDLG step"))
    build_report(subject, tmp_path / "labels.pdf", charts=False)
    text = flat(pdf_text(tmp_path / "labels.pdf"))
    assert "recovered the private label (1 of 1); the images not shown safe" in text
    assert "read by iDLG's rule, exact for one image" in text
    assert "Images not shown safe: a failed attack on the undefended update" in text


def _scored(truth: list[int], guess: list[int]):
    from auditlib.metrics.scores import ImageScore, Scores

    per_image = tuple(ImageScore(f"i{k}", k, 0.1, 10.0, t) for k, t in enumerate(truth))
    return Scores(per_image=per_image, spreads={}, recovered_labels=tuple(guess))


def _run(label: str, record: dict | None):
    from types import SimpleNamespace

    return SimpleNamespace(label=label, final=SimpleNamespace(label_inference=record))


def test_a_run_judges_its_labels_by_the_exact_rule_or_the_test():
    import dataclasses

    from auditlib.engine.judging import _labels_found
    from tests.test_attacks import lenet_spec

    spec = lenet_spec("idlg")  # 100 classes, one image, FedSGD, no defense
    exact = _labels_found(spec, [_scored([61], [61])], [_run("idlg", _record(label=61))])
    assert exact.beyond_chance and exact.p_value is None and "class 61" in exact.basis
    # Under noise the same record is a guess: the test (p = 1/100, not below 0.01) decides.
    noised = dataclasses.replace(spec, defense=ComponentSpec.of("dp-gaussian", {"sigma": 1}))
    guess = _labels_found(noised, [_scored([61], [61])], [_run("idlg", _record(label=61))])
    assert not guess.beyond_chance and guess.p_value == pytest.approx(0.01)
    assert "iDLG's label rule is not exact here (the defense (dp-gaussian)" in guess.basis
    # A wrong label is no finding, whatever the rule.
    wrong = _labels_found(spec, [_scored([61], [7])], [_run("idlg", _record(label=7))])
    assert wrong.correct == 0 and not wrong.beyond_chance
    # Several attacks: the best of them against the best of them.
    truth = [0, 1, 2, 3]
    several = [
        _scored(truth, [0, 1, 2, 3]),
        _scored(truth, [0, 1, 2, 3]),
        _scored(truth, [5, 6, 7, 8]),
    ]
    best = _labels_found(
        dataclasses.replace(spec, data=dataclasses.replace(spec.data, batch_size=4)),
        several,
        [_run("dlg", None), _run("gi", {"rule": "distinct"})],
    )
    assert best.correct == 4 and best.beyond_chance
    # Labels the attacker knew are never a finding.
    known = dataclasses.replace(
        spec, scenario=dataclasses.replace(spec.scenario, labels_known=True)
    )
    assert _labels_found(known, [_scored([61], [61])], []) is None
