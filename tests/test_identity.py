"""A run's identity is its resolved configuration (engine.identity); runs stored under the
raw, legacy id are still found."""

from __future__ import annotations

import dataclasses

import pytest

from auditlib.attacks import ATTACKS, build_attack_config
from auditlib.defenses import build_defense_config
from auditlib.engine import batches
from auditlib.engine.controls import control_finding, needs_control
from auditlib.engine.identity import identities, run_identity, stored_run, stored_runs
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from auditlib.store import Store


def _spec(attack=None, defense=None, **scenario) -> RunSpec:
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 32, 32), init="uniform")),
        data=DataSpec("samples", "photographs", batch_size=1),
        scenario=ScenarioSpec(**scenario),
        attack=attack or ComponentSpec.of("ig"),
        defense=defense or ComponentSpec.of("none"),
        budget=Budget(40),
    )


def _same(a: RunSpec, b: RunSpec) -> bool:
    return run_identity(a) == run_identity(b)


@pytest.fixture
def store(tmp_path):
    with Store(f"sqlite:///{tmp_path / 'audit.db'}") as s:
        yield s


# --- one configuration, one id ---------------------------------------------------------------


def test_a_number_is_one_number_however_it_is_written():
    one = _spec(ComponentSpec.of("ig", {"lr": "1"}))
    assert _same(one, _spec(ComponentSpec.of("ig", {"lr": "1.0"})))
    assert _same(one, _spec(ComponentSpec.of("ig", {"lr": 1})))
    assert one.identity() != _spec(ComponentSpec.of("ig", {"lr": "1.0"})).identity()  # legacy
    tv = _spec(ComponentSpec.of("ig", {"tv": "1e-4"}))
    assert _same(tv, _spec(ComponentSpec.of("ig", {"tv": "0.0001"})))
    noise = ComponentSpec.of("dp-gaussian", {"sigma": "0.1", "clip": "30"})
    assert _same(
        _spec(defense=noise),
        _spec(defense=ComponentSpec.of("dp-gaussian", {"sigma": "0.10", "clip": "30.0"})),
    )


def test_a_preset_is_its_values_spelled_out():
    paper = ComponentSpec("ig", preset="paper")
    spelled = ComponentSpec.of("ig", {k: str(v) for k, v in ATTACKS["ig"].presets["paper"].items()})
    assert _same(_spec(paper), _spec(spelled))
    # Under a defense too, where the threat model says whether the attacker adapts.
    noise = ComponentSpec.of("dp-gaussian", {"sigma": "0.1"})
    for knows in (True, False):
        assert _same(
            _spec(paper, noise, attacker_knows_defense=knows),
            _spec(spelled, noise, attacker_knows_defense=knows),
        )
    # Left open, the paper preset faces the paper's own (plain) attacker, the spelled-out
    # values an adaptive twin as well: two different runs.
    assert not _same(_spec(paper, noise), _spec(spelled, noise))
    assert _same(_spec(paper, noise), _spec(spelled, noise, attacker_knows_defense=False))


def test_no_parameters_are_the_defaults_spelled_out():
    _, attack_defaults = build_attack_config("ig")
    _, defense_defaults = build_defense_config("dp-gaussian")
    written = _spec(
        ComponentSpec.of("ig", attack_defaults), ComponentSpec.of("dp-gaussian", defense_defaults)
    )
    bare = _spec(ComponentSpec.of("ig"), ComponentSpec.of("dp-gaussian"))
    assert _same(bare, written)
    assert bare.identity() != written.identity()  # the legacy id told them apart


def test_an_undefended_run_ignores_the_adaptive_switch():
    assert _same(_spec(attacker_knows_defense=True), _spec(attacker_knows_defense=False))
    noise = ComponentSpec.of("dp-gaussian")
    assert not _same(
        _spec(defense=noise, attacker_knows_defense=True),
        _spec(defense=noise, attacker_knows_defense=False),
    )


def test_different_values_give_different_ids():
    base = _spec()
    assert not _same(base, _spec(ComponentSpec.of("ig", {"lr": "0.2"})))
    assert not _same(base, _spec(ComponentSpec.of("dlg")))
    assert not _same(base, _spec(defense=ComponentSpec.of("dp-gaussian")))
    assert not _same(
        _spec(defense=ComponentSpec.of("dp-gaussian", {"sigma": "0.1"})),
        _spec(defense=ComponentSpec.of("dp-gaussian", {"sigma": "0.2"})),
    )
    assert not _same(base, dataclasses.replace(base, budget=Budget(41)))
    assert not _same(base, dataclasses.replace(base, seed=1))
    # The audit preset races its restarts; the same values without it run each to the end.
    audit = ComponentSpec("ig", preset="audit")
    values = ComponentSpec.of("ig", dict(ATTACKS["ig"].presets["audit"]))
    assert (
        build_attack_config("ig", preset="audit")[1]
        == build_attack_config("ig", values.params_dict())[1]
    )
    assert not _same(_spec(audit), _spec(values))


def test_a_batch_refuses_one_configuration_written_twice():
    twice = [
        ComponentSpec.of("prune", {"ratio": "0.5"}),
        ComponentSpec.of("prune", {"ratio": ".50"}),
    ]
    with pytest.raises(AuditInputError, match="appears twice"):
        batches.comparison_members(_spec(), twice)


def test_every_applicable_attack_has_one_id_and_takes_no_parameters():
    every = _spec(ComponentSpec("all"))
    assert run_identity(every) == run_identity(_spec(ComponentSpec("all")))
    assert not _same(every, _spec(ComponentSpec("ig", preset="audit")))
    with pytest.raises(AuditInputError, match="takes no attack parameters"):
        run_identity(_spec(ComponentSpec.of("all", {"lr": "1"})))


def test_an_invalid_parameter_is_refused_with_its_reason():
    with pytest.raises(AuditInputError, match="attack ig has no parameter speed; valid: "):
        run_identity(_spec(ComponentSpec.of("ig", {"speed": "3"})))
    with pytest.raises(AuditInputError, match="lr='fast' must be a number"):
        run_identity(_spec(ComponentSpec.of("ig", {"lr": "fast"})))
    with pytest.raises(AuditInputError, match="has no preset 'fastest'"):
        run_identity(_spec(ComponentSpec("ig", preset="fastest")))
    with pytest.raises(AuditInputError, match="unknown defense 'walls'"):
        run_identity(_spec(defense=ComponentSpec.of("walls")))


# --- finding stored runs ---------------------------------------------------------------------


def test_a_run_stored_under_its_legacy_id_is_found(store):
    spec = _spec(ComponentSpec.of("ig", {"lr": "1"}))
    old = store.create_run(spec.to_dict(), spec.identity(), "recorded before resolved ids")
    assert stored_run(store, spec).id == old
    # Another spelling of the same configuration finds it only once it is stored under the
    # resolved id (the legacy id is the spec's own, as written).
    respelled = _spec(ComponentSpec.of("ig", {"lr": "1.0"}))
    assert stored_run(store, respelled) is None
    new = store.create_run(respelled.to_dict(), run_identity(respelled))
    assert stored_run(store, spec).id == new  # both pending: the newest stands for it
    assert stored_run(store, respelled).id == new


def test_a_legacy_run_with_scores_stands_before_a_newer_one_without(store):
    spec = _spec(defense=ComponentSpec.of("dp-gaussian", {"sigma": "0.1"}))
    old = store.create_run(spec.to_dict(), spec.identity())
    store.finish(old, "completed")
    new = store.create_run(spec.to_dict(), run_identity(spec))
    store.finish(new, "failed", error="worker lost")
    found = stored_runs(store, [spec, _spec(ComponentSpec.of("dlg"))])
    assert [r and r.id for r in found] == [old, None]
    newer = store.create_run(spec.to_dict(), run_identity(spec))
    store.finish(newer, "completed")
    assert stored_run(store, spec).id == newer


def test_a_legacy_control_still_serves_its_defended_runs(store):
    defended = _spec(defense=ComponentSpec.of("dp-gaussian", {"sigma": "0.1"}))
    control = defended.control()
    old = store.create_run(control.to_dict(), control.identity())
    store.finish(old, "completed")
    assert needs_control(store, defended) is None
    assert control_finding(store, defended)[2].id == old


def test_a_batch_does_not_recompute_points_stored_under_legacy_ids(store):
    members = batches.sweep_members(_spec(), [batches.SweepCurve("dp-gaussian", (0.1, 1.0))])
    for spec in [m.spec for m in members] + [members[0].spec.control()]:
        store.finish(store.create_run(spec.to_dict(), spec.identity()), "completed")
    batch = store.get_batch(batches.record_batch(store, "sweep", "", members))

    class Refuses:
        def __init__(self, store):
            self.store = store

        def start(self, spec, assets=None, title=""):
            raise AssertionError(f"{title or spec.defense} was computed already")

    assert batches.launch(Refuses(store), batch) == []
    assert all(s.run is not None for s in batches.batch_state(store, batch))


def test_a_stored_spec_that_no_longer_resolves_is_found_by_its_legacy_id(store):
    gone = _spec(ComponentSpec.of("ig", {"retired_knob": "3"}))  # a parameter since removed
    assert identities(gone).resolved is None
    old = store.create_run(gone.to_dict(), gone.identity())
    assert stored_run(store, gone).id == old


def test_the_legacy_id_is_unchanged():
    """RunSpec.identity() must stay as it was: runs stored under it are found by it (the
    value below is what it gave before run identities were resolved)."""
    spec = _spec(ComponentSpec.of("ig", {"lr": "1"}))
    assert spec.identity() == "f2a3947332a6a5a9a5a1975d92e2bdb3ebcc1e269d4d87ac3570d31024edf8d9"
    pair = identities(spec)
    assert pair.legacy == spec.identity() and pair.resolved == run_identity(spec)
    assert pair.resolved != pair.legacy
