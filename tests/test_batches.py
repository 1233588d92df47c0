"""Comparisons and sweeps as sets of ordinary runs; the utility and RDLV every run carries."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest
import torch

from auditlib.client.protocol import LATER_FIELDS
from auditlib.data import Normalization
from auditlib.engine import batches
from auditlib.engine.audit import run_audit
from auditlib.engine.identity import run_identity, stored_run
from auditlib.errors import AuditInputError
from auditlib.fl.federated import FederationSpec
from auditlib.metrics.evaluate import score
from auditlib.models import ModelSpec
from auditlib.result import UtilityRecord
from auditlib.spec import (
    Budget,
    ComponentSpec,
    DataSpec,
    ModelRef,
    RunSpec,
    ScenarioSpec,
    UtilitySpec,
    run_spec_from_dict,
)
from auditlib.store import Store
from auditlib.threat import PrivateBatch

TINY_UTILITY = UtilitySpec(train=200, test=100, federation=FederationSpec(clients=2, rounds=1))


def _base(**changes) -> RunSpec:
    spec = RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 32, 32), init="uniform")),
        data=DataSpec("samples", "photographs", batch_size=2),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(5),
    )
    return dataclasses.replace(spec, **changes)


@pytest.fixture
def store(database_url):
    """An empty store on each backend in turn (SQLite, PostgreSQL: tests/postgres_server.py)."""
    with Store(database_url) as s:
        yield s


# --- specs -----------------------------------------------------------------------------------


def test_identity_of_a_spec_without_utility_is_what_it_was_before_utility_existed():
    spec = _base()
    payload = spec.to_dict()
    del payload["utility"]
    # Fields added since, at their defaults, are left out of the identity alike.
    for name in ("server", "secure_aggregation", "observed"):
        del payload["scenario"][name]
    for name in LATER_FIELDS:
        del payload["scenario"]["protocol"][name]
    del payload["model"]["spec"]["model_args"]  # an own class's arguments (issue 53): none
    del payload["model"]["code_asset"]  # an own class's uploaded file (issue 53): none
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    assert spec.identity() == hashlib.sha256(text.encode()).hexdigest()
    assert _base(utility=TINY_UTILITY).identity() != spec.identity()


def test_spec_round_trips_through_json_and_refuses_unknown_fields():
    spec = _base(utility=TINY_UTILITY, defense=ComponentSpec.of("prune", {"ratio": 0.5}))
    again = run_spec_from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and again.identity() == spec.identity()
    broken = spec.to_dict()
    broken["budget"]["hours"] = 3
    with pytest.raises(AuditInputError, match="budget has unknown fields hours"):
        run_spec_from_dict(broken)


def test_utility_spec_checks_its_data():
    with pytest.raises(AuditInputError, match="digits set has 1797 images"):
        UtilitySpec(dataset="digits", train=1700, test=300)
    with pytest.raises(AuditInputError, match="utility dataset 'cifar'"):
        UtilitySpec(dataset="cifar")


# --- members ---------------------------------------------------------------------------------


def test_comparison_members_change_only_the_defense():
    base = _base(utility=TINY_UTILITY)
    members = batches.comparison_members(
        base, [ComponentSpec.of("none"), ComponentSpec.of("dp-gaussian", {"sigma": 0.01})]
    )
    assert [m.label for m in members] == ["none", "dp-gaussian (sigma=0.01)"]
    for member in members:
        assert dataclasses.replace(member.spec, defense=base.defense) == base
    assert members[1].spec.defense.params_dict() == {"sigma": "0.01"}


def test_batch_refuses_bad_parameters_and_duplicates_before_recording():
    base = _base()
    with pytest.raises(AuditInputError, match="ratio"):
        batches.comparison_members(base, [ComponentSpec.of("prune", {"ratio": 1.5})])
    with pytest.raises(AuditInputError, match="appears twice"):
        batches.comparison_members(base, [ComponentSpec.of("none"), ComponentSpec.of("none")])


def test_sweep_members_vary_the_registered_strength_knob():
    curve = batches.SweepCurve("dp-gaussian", (0.001, 0.1), params=(("clip", "1"),))
    members = batches.sweep_members(_base(), [curve, batches.SweepCurve("prune", (0.5,))])
    assert [m.label for m in members] == [
        "dp-gaussian sigma=0.001",
        "dp-gaussian sigma=0.1",
        "prune ratio=0.5",
    ]
    assert members[0].spec.defense.params_dict() == {"clip": "1", "sigma": "0.001"}
    assert [m.value for m in members] == [0.001, 0.1, 0.5]
    with pytest.raises(AuditInputError, match="has no strength knob"):
        batches.sweep_members(_base(), [batches.SweepCurve("none", (1.0,))])
    with pytest.raises(AuditInputError, match="has no setting 'volume'"):
        batches.sweep_members(_base(), [batches.SweepCurve("prune", (1.0,), knob="volume")])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0.1, lots", "'lots' is not a number"),
        ("", "at least one number"),
        ("0.1, 0.1", "appears twice"),
        ("inf", "not a finite number"),
        (", ".join(str(i) for i in range(17)), "at most 16 points"),
    ],
)
def test_grid_text_is_checked(text, message):
    with pytest.raises(AuditInputError, match=message):
        batches.parse_grid(text)


def test_grid_text_is_parsed():
    assert batches.parse_grid("0.001, 0.01;0.1 ,1e-4") == (0.001, 0.01, 0.1, 1e-4)


# --- store and launching ---------------------------------------------------------------------


class RecordingManager:
    """The two RunManager methods a batch uses, recording the runs in a real store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.started: list[str] = []
        self.cancelled: list[str] = []

    def start(self, spec: RunSpec, assets=None, title: str = "") -> str:
        run_id = self.store.create_run(spec.to_dict(), run_identity(spec), title)
        self.started.append(run_id)
        return run_id

    def cancel(self, run_id: str) -> None:
        self.cancelled.append(run_id)


def test_a_batch_reopens_with_its_members_and_restarts_only_what_is_missing(store, stored_summary):
    members = batches.sweep_members(_base(), [batches.SweepCurve("dp-gaussian", (0.0, 0.1, 1.0))])
    batch_id = batches.record_batch(store, "sweep", "dp <b>sweep</b>", members)
    batch = store.get_batch(batch_id)
    assert batch.kind == "sweep" and batch.title == "dp <b>sweep</b>"
    assert [m.spec for m in batches.members_of(batch)] == [m.spec for m in members]

    manager = RecordingManager(store)
    first = batches.launch(manager, batch)
    assert len(first) == 4  # three points and the undefended control they are judged by
    done, failed, running, control = first
    assert store.get_run(control).spec_id == run_identity(members[0].spec.control())
    store.finish(done, "completed", summary=stored_summary)
    store.finish(failed, "failed", error="worker lost")
    store.mark_running(running)

    again = batches.launch(manager, batch)  # only the failed point is run again
    assert len(again) == 1 and store.get_run(again[0]).spec_id == run_identity(members[1].spec)
    state = {s.member.label: s.run for s in batches.batch_state(store, batch)}
    assert state["dp-gaussian sigma=0"].id == done
    assert state["dp-gaussian sigma=0.1"].id == again[0]  # the newest, none completed yet
    assert set(batches.cancel(manager, batch)) == {again[0], running}
    assert set(manager.cancelled) == {again[0], running}  # not the finished ones
    store.finish(control, "completed", summary=stored_summary)

    # A completed run stands for its spec even when a newer run of it failed.
    store.finish(again[0], "completed", summary=stored_summary)
    later = manager.start(members[1].spec)
    store.finish(later, "failed", error="x")
    assert stored_run(store, members[1].spec).id == again[0]

    # Another batch over the same specs computes nothing new once they are completed.
    store.finish(running, "completed", summary=stored_summary)
    other = store.get_batch(batches.record_batch(store, "comparison", "again", members))
    assert batches.launch(manager, other) == []


# --- what every run now carries --------------------------------------------------------------


def test_rdlv_compares_the_reconstruction_with_the_data_mean():
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(3, 3, 16, 16, generator=generator)
    truth = PrivateBatch(images, torch.tensor([0, 1, 2]), ("a", "b", "c"))
    prior = np.full((16, 16, 3), 0.5)
    none = Normalization.parse("none", 3)
    perfect = score(images, None, truth, none, lpips_nets=(), prior=prior)
    assert perfect.spreads["rdlv"].min > 0  # a copy reveals more than the template
    flat = score(torch.full_like(images, 0.5), None, truth, none, lpips_nets=(), prior=prior)
    assert flat.spreads["rdlv"].max == pytest.approx(0.0, abs=1e-9)  # the template itself: 0
    without = score(images, None, truth, none, lpips_nets=())
    assert without.rdlv_mean is None and "prior" in without.why_unavailable("rdlv")


def test_a_run_with_utility_reports_accuracy_rdlv_and_epsilon():
    spec = _base(
        utility=TINY_UTILITY,
        defense=ComponentSpec.of("dp-gaussian", {"sigma": 0.01, "clip": 1}),
    )
    summary = run_audit(spec, lpips_nets=()).summary
    utility = summary.utility
    assert utility.complete and utility.rounds_completed == 1
    assert [r.round for r in utility.rounds] == [0, 1]
    assert 0.0 <= utility.accuracy <= 1.0
    assert utility.starts_from.startswith("DLG's uniform")  # sigmoid LeNet
    assert utility.privacy["epsilon"] == pytest.approx(summary.defense_report.epsilon)
    # The photographs set holds 17 images: the prior is the mean of the 15 outside the batch.
    assert summary.metrics.rdlv_mean is not None
    assert len([p.rdlv for p in summary.metrics.per_image]) == 2
    assert (
        summary.victim.data.rdlv_prior
        == "mean of 15 images of the data source outside the audited batch"
    )


def test_rdlv_is_unavailable_when_the_source_is_the_batch(tmp_path):
    from PIL import Image

    for name in ("a", "b"):
        Image.fromarray(np.full((16, 16, 3), 90 if name == "a" else 200, np.uint8)).save(
            tmp_path / f"{name}.png"
        )
    spec = _base(data=DataSpec("folder", str(tmp_path)), budget=Budget(2))
    metrics = run_audit(spec, lpips_nets=()).summary.metrics
    assert metrics.rdlv_mean is None
    assert "no more than the audited batch" in metrics.why_unavailable("rdlv")


def test_a_utility_that_did_not_learn_is_flagged_not_read_as_a_cost(store, stored_summary):
    from auditlib.report.subject import batch_subject, utility_caveat

    members = batches.comparison_members(
        _base(utility=TINY_UTILITY), [ComponentSpec.of("none"), ComponentSpec.of("prune")]
    )
    batch_id = batches.record_batch(store, "comparison", "c", members)
    manager = RecordingManager(store)
    none_run, prune_run = batches.launch(manager, store.get_batch(batch_id))

    def finish(run_id: str, before: float, after: float) -> None:
        utility = UtilityRecord.from_json(
            {
                "dataset": "fashion-mnist",
                "train_examples": 200,
                "test_examples": 100,
                "federation": {"rounds": 5},
                "rounds": [
                    {"round": 0, "accuracy": before, "macro_f1": 0.0},
                    {"round": 5, "accuracy": after, "macro_f1": 0.0},
                ],
                "accuracy": after,
                "macro_f1": 0.0,
                "seconds": 1.0,
            }
        )
        summary = dataclasses.replace(stored_summary, utility=utility)
        store.finish(run_id, "completed", summary=summary)

    finish(none_run, 0.10, 0.112)  # the undefended model stayed at chance
    finish(prune_run, 0.10, 0.30)
    caveat = utility_caveat(batch_subject(store, batch_id).entries)
    assert caveat is not None and caveat.startswith("the undefended model barely learned")
    assert "10.0% before, 11.2% after 5 rounds" in caveat

    learned = batches.record_batch(store, "comparison", "d", members[1:])
    assert utility_caveat(batch_subject(store, learned).entries) is None  # prune learned
