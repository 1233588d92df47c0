"""Specification: an adaptive attacker's fitted unknowns are each start's own (issue 55).

FedKL hides its lock (the first normalisation's scale and shift, or the key through it), so
its twin fits those parameters with its images, from the server's guess. Starts that advance
together fit them as rows of one leaf (``objectives.UnknownRows``): each row's candidate runs
through the model with its own row, so each start's objective and its gradient to its own
unknowns are what it would be alone, and the twin's starts end where they end apart.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from auditlib.attacks import RunControl
from auditlib.attacks.captured import WARMUP_STEPS
from auditlib.attacks.compiled import why_not_compiled
from auditlib.attacks.low_rank import LowRankRows
from auditlib.attacks.objectives import UpdateMatcher, unknown_rows, why_not_together
from auditlib.attacks.restarts import why_apart
from auditlib.attacks.updates import why_updates_apart
from auditlib.reconstruction import COMPILED, RECORDED, Stepped
from tests.test_attacks import lenet_spec, release_for
from tests.test_attacks_at_once import reproducible_cuda  # noqa: F401  (a fixture)
from tests.test_host_reads import reads_while
from tests.test_lbfgs_batched import run_named

torch.set_num_threads(1)
FITS = ["affine", "key"]


@functools.cache
def twin_release(fit: str, batch: int = 2, device: str = "cpu", offset: int = 0):
    """LeNet's update under FedKL, with the attacker that knows the lock's form."""
    spec = dataclasses.replace(lenet_spec("ig", batch=batch, offset=offset), device=device)
    _, _, release = release_for(spec, defense="fedkl", defense_params={"adaptive_fit": fit})
    knowledge = dataclasses.replace(release.knowledge, defense=release.known_defense)
    return dataclasses.replace(release, knowledge=knowledge)


@pytest.mark.parametrize("fit", FITS)
def test_each_row_of_the_unknowns_is_that_starts_own(fit):
    """Three rows, each its own unknowns (moved apart from the guess): the batched pass gives
    each row the objective, and the gradient to its images and its unknowns, that the model
    set to that row's unknowns gives alone."""
    release = twin_release(fit)
    matcher = UpdateMatcher(release.observation, release.knowledge, "cosine")
    assert why_not_together(release.knowledge) is None and matcher.unknowns
    rows = unknown_rows(matcher, 3)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for leaf in rows.leaves:
            leaf.add_(0.3 * torch.randn(leaf.shape, generator=generator))
    shape = (3, release.knowledge.batch_size, *release.knowledge.input_shape)
    images = torch.randn(shape, generator=generator).requires_grad_(True)
    labels = torch.tensor([1, 7])

    own = rows.rows(lambda leaf: leaf)
    # The lock changes the model, not the update: the classifier's gradient stays factored.
    assert any(isinstance(u, LowRankRows) for u in matcher.stacked_updates(images, labels, own))
    together = matcher.together(images, labels, unknowns=own)
    image_grads, *unknown_grads = torch.autograd.grad(together.sum(), [images, *rows.leaves])
    for r in range(3):
        with torch.no_grad():
            for own, leaf in zip(matcher.unknowns, rows.leaves, strict=True):
                own.copy_(leaf[r])
        alone_images = images[r].detach().requires_grad_(True)
        alone = matcher(alone_images, labels)
        grads = torch.autograd.grad(alone, [alone_images, *matcher.unknowns])
        assert float(together[r].detach()) == pytest.approx(float(alone.detach()), rel=1e-4)
        torch.testing.assert_close(image_grads[r], grads[0], rtol=1e-3, atol=1e-6)
        for got, want in zip(unknown_grads, grads[1:], strict=True):
            torch.testing.assert_close(got[r], want, rtol=1e-3, atol=1e-6)


def test_every_row_starts_at_the_attackers_guess_as_a_start_alone_does():
    release = twin_release("affine")
    matcher = UpdateMatcher(release.observation, release.knowledge, "l2")
    rows = unknown_rows(matcher, 4)
    assert rows.names and all(leaf.requires_grad for leaf in rows.leaves)
    for leaf, own in zip(rows.leaves, matcher.unknowns, strict=True):
        assert leaf.shape == (4, *own.shape)
        assert all(torch.equal(row, own.detach()) for row in leaf)
    assert unknown_rows(matcher, 1) is None  # one start fits the model's own


@pytest.mark.parametrize(
    ("attack", "params", "steps"),
    [
        # Unsigned Adam: the signed step turns rounding near a zero gradient into a full step.
        ("ig", {"signed": False}, 3),
        ("grnn", {}, 3),
        # One L-BFGS step of 3 evaluations: later, a float-order difference is another path.
        ("dlg", {"lbfgs_max_iter": 3}, 1),
    ],
)
def test_the_fedkl_twins_starts_together_end_where_they_end_apart(attack, params, steps):
    """Three starts, together and one after another: the same objectives to float rounding.
    The pixels are compared loosely: an Adam step on a pixel whose gradient is near 0 turns
    a rounding difference into a visible one (this CPU: 3e-5 after 3 steps on one image)."""
    release = twin_release("affine", batch=1)
    finals = [
        run_named(attack, release, steps, {"restarts": 3, "together": t, **params})[1]
        for t in (False, True)
    ]
    for apart, together in zip(*(f.candidates for f in finals), strict=True):
        assert together.restart == apart.restart and together.steps == apart.steps == steps
        assert together.loss == pytest.approx(apart.loss, rel=1e-3)
        torch.testing.assert_close(together.images, apart.images, rtol=0, atol=1e-2)


def test_a_fedkl_twins_step_of_starts_together_reads_nothing_back(monkeypatch):
    from auditlib.attacks import inverting_gradients

    seen, watched = reads_while(monkeypatch)
    stepper = inverting_gradients._Restarts
    monkeypatch.setattr(stepper, "step", watched(stepper.step))
    try:
        _, final = run_named("ig", twin_release("key"), 4, {"restarts": 3})
    finally:
        torch._dynamo.trace_rules.clear_lru_cache()
    assert len(final.candidates) == 3 and seen == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("attack", ["ig", "grnn"])
def test_on_cuda_a_fedkl_twins_raced_steps_never_wait_for_the_device(monkeypatch, attack):
    """The audit preset's race of the twin, on CUDA: its starts' rows of the lock, then a
    lone start with its own row, under torch's check that stops any synchronising call."""
    from auditlib.attacks import grnn_restarts, inverting_gradients
    from tests.test_host_reads import _never_waiting, _raced_to_one
    from tests.test_host_reads import run_attack as run_preset

    release = twin_release("affine", device="cuda")
    run_preset(attack, release, 2, emit_every=2)  # warm: the first kernels' set-up may wait
    stepper = {"ig": inverting_gradients._Restarts, "grnn": grnn_restarts.GrnnRestarts}
    _never_waiting(monkeypatch, stepper[attack])
    assert max(c.steps for c in _raced_to_one(attack, release).candidates) == 24


# The traced step takes each start's row of the lock as its input, one start too (a trace
# differentiates its inputs, not the model's own). Recorded here by the CPU's stand-in for
# a CUDA graph (tests/test_captured_step.py) after its eager first steps: each start where
# the eager run puts it, after the replays. DLG's evaluations formed densely in both arms,
# as a recording forms them (tests/test_captured_lbfgs.py).
# The pixel bound: GRNN's arms were 1e-5 apart on this CPU, and 4e-3 where the recorded
# step left the lock at the guess (one start, 6 steps).
CAPTURED_CASES = [
    ("ig", {"restarts": 2, "signed": False}, 5e-3),
    ("ig", {"restarts": 1, "signed": False}, 5e-3),
    ("grnn", {"restarts": 2}, 1e-3),
    ("grnn", {"restarts": 1}, 1e-3),
    ("dlg", {"restarts": 2, "lbfgs_max_iter": 3}, 5e-3),
]


@pytest.mark.parametrize(("attack", "params", "atol"), CAPTURED_CASES)
def test_a_fedkl_twins_recorded_step_fits_each_starts_own_lock(monkeypatch, attack, params, atol):
    from tests.test_captured_lbfgs import _dense
    from tests.test_captured_step import _captured_here, _ends_as_eager, _final

    release = twin_release("affine", batch=1)
    assert why_not_compiled(release.knowledge) is None
    if attack == "dlg":
        _dense(monkeypatch)
    steps = WARMUP_STEPS + 4
    eager = _final(attack, release, params, steps)
    stand_in = _captured_here(monkeypatch)
    captured = _final(attack, release, {**params, "captured": True}, steps)
    assert stand_in.recorded == 1 and captured.stepped == Stepped(RECORDED)
    _ends_as_eager(eager, captured, atol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.usefixtures("reproducible_cuda")  # DLG's unit steps grow atomics' last bits
@pytest.mark.parametrize(("attack", "params"), [(c[0], c[1]) for c in CAPTURED_CASES])
def test_on_cuda_a_fedkl_twins_step_recorded_as_a_cuda_graph_ends_where_eager_ends(
    monkeypatch, attack, params
):
    from tests.test_captured_lbfgs import _dense
    from tests.test_captured_step import _final, count_recordings
    from tests.test_compiled_step import _ends_as_eager_there

    release = twin_release("affine", batch=1, device="cuda")
    if attack == "dlg":
        _dense(monkeypatch)
    recorded = count_recordings(monkeypatch)
    eager = _final(attack, release, params, WARMUP_STEPS + 4)
    captured = _final(attack, release, {**params, "captured": True}, WARMUP_STEPS + 4)
    assert len(recorded) == 1 and captured.stepped == Stepped(RECORDED)  # a real graph
    _ends_as_eager_there(eager, captured)


def test_a_fedkl_twins_compiled_step_traces_the_lock_s_rows_too(monkeypatch):
    """The same objective traced by torch.compile (without generating code): it ends where
    the eager run ends, the lock's rows among the trace's inputs."""
    from auditlib.attacks import inverting_gradients
    from tests.test_compiled_step import _eager_and_compiled

    calls = []
    release = twin_release("affine", batch=1)
    params = {"restarts": 2, "signed": False}
    traced = (monkeypatch, inverting_gradients, calls)
    eager, compiled = _eager_and_compiled("ig", release, params, 6, traced=traced)
    assert [count for count, _ in calls] == [2] * 6 and compiled.stepped == Stepped(COMPILED)
    for a, b in zip(eager.candidates, compiled.candidates, strict=True):
        assert b.steps == a.steps == 6 and b.loss == pytest.approx(a.loss, rel=5e-3)
        torch.testing.assert_close(b.images, a.images, rtol=0, atol=5e-3)


# Past the first step (the first is taken at the guess, whatever rows the lock has): IG
# unsigned (the signed step turns rounding near a zero gradient into a full step), GRNN, and
# one L-BFGS step of DLG's of 3 evaluations (later, a float-order difference is another path).
UPDATE_CASES = [("ig", {"signed": False}, 3), ("grnn", {}, 3), ("dlg", {"lbfgs_max_iter": 3}, 1)]


@pytest.mark.parametrize(("name", "params", "steps"), UPDATE_CASES)
def test_a_fedkl_twins_updates_together_end_where_each_ends_alone(name, params, steps):
    """A sample's updates under FedKL: every start of every update a row with its own row of
    the lock, each update's starts where its run alone puts them, each fitting its own."""
    from tests.test_updates_together import _alone, _together

    releases = [twin_release("affine", batch=1, offset=u) for u in range(3)]
    knowledges = [r.knowledge for r in releases]
    assert why_updates_apart(knowledges) is None
    control = RunControl(max_steps=steps, emit_every=1, image_every=1)
    info, config, finals = _together(name, params, releases, control)
    assert why_apart(info, config, knowledges) is None and sorted(finals) == [0, 1, 2]
    for u, release in enumerate(releases):
        alone = _alone(info, config, release.observation, release.knowledge, control)
        for a, b in zip(alone.candidates, finals[u].candidates, strict=True):
            assert (a.restart, a.steps, a.stop_reason) == (b.restart, b.steps, b.stop_reason)
            assert b.loss == pytest.approx(a.loss, rel=1e-3, abs=1e-6)
            torch.testing.assert_close(b.images, a.images, rtol=1e-3, atol=1e-3)
    picks = [finals[u].selected.images for u in range(3)]
    assert not torch.allclose(picks[0], picks[1])  # each matched its own update
