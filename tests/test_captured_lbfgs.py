"""Specification of the L-BFGS attacks' evaluations recorded as a CUDA graph and replayed
(``captured=true`` on DLG, iDLG, DLM and DLM+: lbfgs.RecordedRows, issue 55): every
evaluation computes the step's starts, the first ones eagerly, then one recording replayed
with each evaluation's own points; it answers the starts asked for, and each attack ends
where its batched L-BFGS ends eager.

A CUDA graph needs a GPU: on the CPU the recording is test_captured_step's stand-in,
which keeps what a graph keeps and reruns the step at each replay; the CUDA tests
(skipped here) record real graphs on a lent GPU (benchmarks/device/issue55.sh tests)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_attacks import lenet_spec, release_for
from test_attacks_at_once import reproducible_cuda  # noqa: F401  (a fixture)
from test_captured_step import CUDA, StandIn, _captured_here, _final, count_recordings

from auditlib.attacks import RunControl, build_attack_config, get_attack
from auditlib.attacks.compiled import traced_model
from auditlib.attacks.lbfgs import RecordedRows
from auditlib.attacks.lbfgs_batched import BatchedLbfgs
from auditlib.attacks.objectives import UpdateMatcher
from auditlib.attacks.race import PLAN
from auditlib.errors import AttackUnsupportedError

L_BFGS = ("dlg", "idlg", "dlm", "dlm+")


def _quadratics(starts: int):
    """Each start's own quadratic, 0.5 sum a_k (x - c_k)^2 in float64, its curvature a_k
    another per start, so the starts meet torch's stopping tests after different numbers of
    evaluations and the later evaluations ask for fewer rows than the step runs."""
    generator = torch.Generator().manual_seed(0)
    scale = torch.logspace(0, 2, 6, dtype=torch.float64)
    curvature = torch.stack([scale ** (k / starts) for k in range(1, starts + 1)])
    centre = torch.randn(starts, 6, generator=generator, dtype=torch.float64)
    start = torch.randn(starts, 6, generator=generator, dtype=torch.float64)
    return start, curvature, centre


def _row_losses(x, rows, curvature, centre) -> torch.Tensor:
    """Each row's quadratic, summed on its own: the same kernels whether 1 row is asked
    or all 3, so eager and recorded evaluations agree to the bit on any CPU."""
    return torch.stack([0.5 * (curvature[r] * (x[r] - centre[r]) ** 2).sum() for r in rows])


def test_the_evaluations_answer_the_rows_asked_from_every_running_row_as_eager_does():
    start, curvature, centre = _quadratics(3)
    x_eager = start.clone().requires_grad_()
    eager = BatchedLbfgs([x_eager], 3, max_iter=20, line_search_fn="strong_wolfe")
    asked: list[list[int]] = []

    def objective(rows):
        asked.append(list(rows))
        return _row_losses(x_eager, rows, curvature, centre)

    x_recorded = start.clone().requires_grad_()
    recorded = BatchedLbfgs([x_recorded], 3, max_iter=20, line_search_fn="strong_wolfe")

    def own_rows(x):  # the running rows are all three here: their own curvatures
        return _row_losses(x, range(3), curvature, centre), {}

    stand_in = StandIn()
    rows = RecordedRows([x_recorded], own_rows, torch.device("cpu"), None)
    rows.gradient.record = stand_in
    for _ in range(3):
        losses = eager.step(objective)
        rows.running = [0, 1, 2]
        assert recorded.step(rows) == losses  # every start's loss, as eager
        torch.testing.assert_close(x_recorded, x_eager, rtol=0, atol=0)
    assert any(len(r) < 3 for r in asked)  # some evaluations asked for fewer rows ...
    assert stand_in.recorded == 1  # ... and were answered by the one recording
    assert recorded.evaluations == eager.evaluations


def test_a_row_that_left_the_finite_numbers_does_not_change_another_rows_evaluation():
    # The rows an evaluation computes but was not asked for hold whatever point their start
    # stopped at; each row's value is its own start's (vmap), so it changes no other row.
    _, _, release = release_for(lenet_spec("dlg", batch=2))
    knowledge = release.knowledge
    matcher = UpdateMatcher(release.observation, knowledge, "l2")
    matcher.factored = False
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(2, 2, 3, 32, 32, generator=generator)

    def objective(rows_of_images):
        return matcher.together(rows_of_images, torch.tensor([0, 1])), {}

    with traced_model(knowledge):
        variable = images.clone().requires_grad_()
        rows = RecordedRows([variable], objective, knowledge.device, matcher)
        rows.running = [0, 1]
        alone = rows([0])
        with torch.no_grad():
            variable[1] = float("nan")
        beside_nan = rows([0])
    assert torch.isfinite(alone.losses).all() and torch.isfinite(alone.grads[0]).all()
    torch.testing.assert_close(beside_nan.losses, alone.losses, rtol=0, atol=0)
    torch.testing.assert_close(beside_nan.grads[0], alone.grads[0], rtol=0, atol=0)


def _dense(monkeypatch) -> None:
    """A Linear weight's update formed densely in the eager run too, as a recorded
    evaluation forms it: kept factored, the same sums run in another order, which DLG's
    unit steps magnify (its images 0.09 apart after 12 evaluations on this CPU)."""
    monkeypatch.setattr(UpdateMatcher, "_factored_layers", lambda self, images: None)


# Two starts of 4 L-BFGS steps of 3 evaluations each, the first WARMUP_STEPS eager and the
# rest replays. A fixed step (no line search, whose count of evaluations is each start's
# own) keeps both starts in every eager evaluation, so eager and recorded evaluations have
# the same shapes and kernels on any CPU (the test checks it); the strong-Wolfe search with
# starts asked apart is the quadratics' test above. DLM with the stable preset's gamma.
_PARAMS = {
    "dlg": {"restarts": 2, "lbfgs_max_iter": 3},
    "idlg": {"restarts": 2, "lbfgs_max_iter": 3},
    "dlm": {"restarts": 2, "lbfgs_max_iter": 3, "gamma_on": "dummy"},
    "dlm+": {"restarts": 2, "lbfgs_max_iter": 3},
}


@pytest.mark.parametrize("attack", L_BFGS)
def test_each_lbfgs_attack_captured_ends_where_its_batched_lbfgs_ends_eager(monkeypatch, attack):
    _dense(monkeypatch)
    _, _, release = release_for(lenet_spec(attack, batch=1))
    params = _PARAMS[attack]
    asked = []
    evaluate = BatchedLbfgs._evaluate
    monkeypatch.setattr(
        BatchedLbfgs,
        "_evaluate",
        lambda self, objective, rows, wanted: (
            asked.append(len(rows)) or evaluate(self, objective, rows, wanted)
        ),
    )
    eager = _final(attack, release, params, 4)
    assert set(asked) == {2}  # both starts in every eager evaluation: the recorded shapes
    stand_in = _captured_here(monkeypatch)
    captured = _final(attack, release, {**params, "captured": True}, 4)
    assert stand_in.recorded == 1  # replayed from then on
    for a, b in zip(eager.candidates, captured.candidates, strict=True):
        assert b.steps == a.steps == 4 and b.stop_reason == "completed"
        assert b.loss == a.loss
        torch.testing.assert_close(b.images, a.images, rtol=0, atol=0)


def test_one_start_captured_runs_on_the_batched_lbfgs_near_torchs(monkeypatch):
    # The paper's single start runs on torch's own L-BFGS; recorded, on the batched one,
    # which follows torch's iterates up to float rounding (tests/test_lbfgs_batched.py).
    _, _, release = release_for(lenet_spec("idlg", batch=1))
    params = {"restarts": 1, "lbfgs_max_iter": 3}
    eager = _final("idlg", release, params, 4)
    stand_in = _captured_here(monkeypatch)
    captured = _final("idlg", release, {**params, "captured": True}, 4)
    assert stand_in.recorded == 1
    (a,), (b,) = eager.candidates, captured.candidates
    assert b.loss == pytest.approx(a.loss, rel=1e-3)
    torch.testing.assert_close(b.images, a.images, rtol=0, atol=1e-3)


def test_each_race_stage_is_recorded_once(monkeypatch):
    # The audit preset's race of 8 starts: 8, then 4, 2 and 1 running (its rungs at steps 2,
    # 4 and 10 of 40), each a graph recorded after its own first evaluations.
    _, _, release = release_for(lenet_spec("idlg", batch=1))
    stand_in = _captured_here(monkeypatch)
    running = []
    evaluate = RecordedRows.__call__
    monkeypatch.setattr(
        RecordedRows,
        "__call__",
        lambda self, rows: running.append(len(self.running)) or evaluate(self, rows),
    )
    config, _ = build_attack_config("idlg", {"captured": True, "lbfgs_max_iter": 2}, "audit")
    control = RunControl(40, emit_every=1, race=PLAN)
    run = get_attack("idlg").run(release.observation, release.knowledge, config, control, 0)
    final = list(run)[-1].final
    assert sorted(set(running), reverse=True) == [8, 4, 2, 1]
    assert stand_in.recorded == 4
    assert sum(c.stop_reason == "completed" for c in final.candidates) == 1


def test_a_captured_evaluation_is_refused_on_the_cpu_and_for_dlm_with_adam(monkeypatch):
    _, _, release = release_for(lenet_spec("dlg"))
    config, _ = build_attack_config("dlg", {"captured": True})
    with pytest.raises(AttackUnsupportedError, match="dlg cannot record its step as a CUDA"):
        get_attack("dlg").run(release.observation, release.knowledge, config, RunControl(2), 0)
    _, _, release = release_for(lenet_spec("dlm"))
    adam, _ = build_attack_config("dlm", {"captured": True, "optimizer": "adam"})
    with pytest.raises(AttackUnsupportedError, match="with Adam its step runs eagerly"):
        get_attack("dlm").run(release.observation, release.knowledge, adam, RunControl(2), 0)


def test_a_captured_evaluation_attacks_a_samples_updates_one_after_another():
    for attack in L_BFGS:
        config, _ = build_attack_config(attack, {"captured": True})
        why = get_attack(attack).why_updates_apart(config, False)
        assert why == f"{attack} traces one update's step (captured=true)"
        plain, _ = build_attack_config(attack, {})
        assert get_attack(attack).why_updates_apart(plain, False) is None
    # Asked anyway (past the engine's check), the updates' rows refuse to be recorded: a
    # graph would hold the first set of rows' targets.
    releases = [release_for(lenet_spec("dlg", offset=u))[2] for u in range(2)]
    config, _ = build_attack_config("dlg", {"captured": True, "restarts": 2})
    run = get_attack("dlg").run_updates(
        [r.observation for r in releases],
        [r.knowledge for r in releases],
        config,
        RunControl(2),
        [0, 0],
    )
    with pytest.raises(ValueError, match="a captured evaluation attacks one update"):
        list(run)


@CUDA
@pytest.mark.usefixtures("reproducible_cuda")
@pytest.mark.parametrize("attack", L_BFGS)
def test_each_lbfgs_attack_captured_as_a_cuda_graph_ends_where_it_ends_eager_there(
    monkeypatch, attack
):
    # Deterministic kernels: cuDNN's default backward may sum with atomics, and DLG's unit
    # steps grow the last bits two runs of one attack then differ by.
    _dense(monkeypatch)
    recorded = count_recordings(monkeypatch)
    spec = dataclasses.replace(lenet_spec(attack, batch=1), device="cuda")
    _, _, release = release_for(spec)
    params = _PARAMS[attack]
    eager = _final(attack, release, params, 4)
    captured = _final(attack, release, {**params, "captured": True}, 4)
    assert len(recorded) == 1  # a real graph, replayed
    for a, b in zip(eager.candidates, captured.candidates, strict=True):
        assert b.images.device.type == "cpu" and b.steps == a.steps
        assert b.loss == pytest.approx(a.loss, rel=5e-3)
        torch.testing.assert_close(b.images, a.images, rtol=0, atol=5e-3)
