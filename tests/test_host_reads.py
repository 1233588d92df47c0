"""An attack's step reads nothing back from the device (issue 55): on a GPU each such read
waits for every kernel queued before it, so the host stops launching while the device
drains. The restart loop reads the losses back every few steps (``attacks.loop``); the
steps in between must not. On the CPU the test counts the reads the product's own code makes
inside a step (a value, a list, a truth value, a copy to the host, a list used as an index);
on CUDA, torch's own synchronisation check stops any (``set_sync_debug_mode``).

A restart whose objective stops being finite is still told apart without a read: its
images at the first such step are kept on the device, and it is scored by them."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch._dynamo

from auditlib.attacks import (
    ATTACKS,
    RunControl,
    build_attack_config,
    dlm_starts,
    fedleak,
    fedleak_step,
    gradinversion,
    grnn_restarts,
    inverting_gradients,
)
from auditlib.attacks.restarts import AUDIT_PRESET, run_attack_updates
from auditlib.attacks.restarts import run_attack as run_preset
from auditlib.attacks.row_index import RowIndex
from tests.test_attacks import lenet_spec, release_for, resnet20_spec

AUDITLIB = str(Path(inverting_gradients.__file__).resolve().parents[1])
ROW_INDEX = RowIndex.__call__.__code__
READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")
# Besides those, a list used as an index and a tensor made from host values (torch.tensor):
# both are a copy to the device at each use, which on a GPU waits for the work queued.
# The class whose ``step`` the restart loop calls, per attack (restarts together: the audit
# preset's four raced starts).
STEPPERS = {
    "ig": inverting_gradients._Restarts,
    "gi": gradinversion._Rows,
    "grnn": grnn_restarts.GrnnRestarts,
    "fedleak": fedleak_step.Restarts,
}


def _release(device: str = "cpu"):
    return release_for(resnet20_spec("gi", batch=1, device=device))[2]


def run_attack(name: str, release, steps: int, preset: str = AUDIT_PRESET, **control):
    """The attack at a preset (the audit one: its raced starts together), as a run makes it."""
    config, _ = build_attack_config(name, {}, preset)
    info = ATTACKS[name]
    control = RunControl(steps, **control)
    events = list(
        run_preset(info, release.observation, release.knowledge, config, control, 0, preset)
    )
    return events, events[-1].final


@contextlib.contextmanager
def _reads_in_steps(monkeypatch, stepper):
    """The host reads made by auditlib's code while ``stepper.step`` runs: (name, line).

    The spies are undone when the block ends, and torch.compile's rules (which it reads
    once from torch's functions and Tensor's methods, possibly while they were spied on)
    forgotten, so that a later trace in the process sees torch's own."""
    try:
        with monkeypatch.context() as patch:
            yield from _spied(patch, stepper)
    finally:
        torch._dynamo.trace_rules.clear_lru_cache()


def reads_while(monkeypatch) -> tuple[list[tuple[str, str]], Callable]:
    """Spies on the host reads auditlib's code makes (name, line), and ``watched``: a
    function wrapped so that the spies count while it runs (what a step, or a CUDA graph's
    recording, must not make)."""
    seen: list[tuple[str, str]] = []
    on = [False]

    def watched(run: Callable) -> Callable:
        def counting(*args, **kwargs):
            on[0] = True
            try:
                return run(*args, **kwargs)
            finally:
                on[0] = False

        return counting

    def spy(name, real):
        def wrapper(self, *args, **kwargs):
            caller = sys._getframe(1).f_code
            if on[0] and caller.co_filename.startswith(AUDITLIB):
                seen.append((name, f"{caller.co_filename}:{sys._getframe(1).f_lineno}"))
            return real(self, *args, **kwargs)

        return wrapper

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, spy(name, getattr(torch.Tensor, name)))
    real_getitem = torch.Tensor.__getitem__

    def getitem(self, key):
        if on[0] and isinstance(key, list):  # copied to the device at each use
            caller = sys._getframe(1)
            seen.append(("list index", f"{caller.f_code.co_filename}:{caller.f_lineno}"))
        return real_getitem(self, key)

    monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)
    real_tensor = torch.tensor

    def tensor(data, *args, **kwargs):
        caller = sys._getframe(1).f_code
        # On a GPU: a copy that waits, but RowIndex's (once per set of rows, from pinned
        # memory on CUDA, which does not wait).
        if on[0] and caller.co_filename.startswith(AUDITLIB) and caller is not ROW_INDEX:
            seen.append(("torch.tensor", f"{caller.co_filename}:{sys._getframe(1).f_lineno}"))
        return real_tensor(data, *args, **kwargs)

    monkeypatch.setattr(torch, "tensor", tensor)
    return seen, watched


def _spied(monkeypatch, stepper):
    seen, watched = reads_while(monkeypatch)
    monkeypatch.setattr(stepper, "step", watched(stepper.step))
    yield seen


def _raced_to_one(attack: str, release):
    """The audit preset's race run until one start is left alone (24 steps, a rung every
    2), so that the steps after the race dropped starts (GRNN's rows cut to the running
    ones, a lone start through plain autograd) are checked too: its final result."""
    _, final = run_attack(attack, release, 24, emit_every=2, image_every=2)
    ran = sorted(c.steps for c in final.candidates)
    assert ran[-1] == 24 and ran[-2] < 24  # one start ran alone
    return final


@pytest.mark.parametrize("attack", sorted(STEPPERS))
def test_a_step_of_restarts_together_reads_nothing_back(monkeypatch, attack):
    release = _release()
    with _reads_in_steps(monkeypatch, STEPPERS[attack]) as seen:
        final = _raced_to_one(attack, release)
    assert len(final.candidates) == 4 and final.steps > 0  # the preset's four starts ran
    assert seen == []


@pytest.mark.parametrize("attack", sorted(STEPPERS))
def test_a_step_of_one_restart_alone_reads_nothing_back(monkeypatch, attack):
    stepper = gradinversion._Restart if attack == "gi" else STEPPERS[attack]
    with _reads_in_steps(monkeypatch, stepper) as seen:
        _, final = run_attack(attack, _release(), 6, "paper", emit_every=3, image_every=3)
    assert len(final.candidates) == 1 and final.steps == 6  # the paper's one start
    assert seen == []


# (attack, its parameters): GRNN's label branch, and its labels inferred (a row each).
UPDATES_TOGETHER = [
    ("ig", {}),
    ("grnn", {}),
    ("grnn", {"labels": "inferred"}),
    ("fedleak", {}),
]


def _several_updates(attack: str, params: dict, device: str = "cpu") -> dict:
    """Three LeNet updates' audit-preset starts as rows of one step: each update's final."""
    torch.manual_seed(0)
    releases = [
        release_for(dataclasses.replace(lenet_spec(offset=u), device=device))[2] for u in range(3)
    ]
    config, _ = build_attack_config(attack, params, AUDIT_PRESET)
    events = run_attack_updates(
        ATTACKS[attack],
        [r.observation for r in releases],
        [r.knowledge for r in releases],
        config,
        RunControl(6, emit_every=3, image_every=3),
        [7] * len(releases),
        AUDIT_PRESET,
    )
    finals = {u: e.final for u, e in events if e.final is not None}
    assert sorted(finals) == [0, 1, 2] and all(f.steps > 0 for f in finals.values())
    return finals


@pytest.mark.parametrize(("attack", "params"), UPDATES_TOGETHER)
def test_a_step_of_several_updates_together_reads_nothing_back(monkeypatch, attack, params):
    """A sample audit's updates as rows of one step, each against its own update's target
    (``attacks.updates``): the rows' targets are gathered by an index made once per set of
    rows, not copied to the device at each step."""
    with _reads_in_steps(monkeypatch, STEPPERS[attack]) as seen:
        _several_updates(attack, params)
    assert seen == []


def test_a_step_of_dlm_s_adam_starts_reads_nothing_back(monkeypatch):
    """DLM with Adam (the paper's MLP optimiser): its one start of the paper's preset, its
    four starts raced together, and three updates' rows at once: a step reads nothing back
    (L-BFGS's steps read their per-start tests once a round, ``lbfgs_batched``)."""
    from tests.test_attack_dlm import release_for as fedavg_release

    adam = {"optimizer": "adam", "lr": 0.1}
    config, _ = build_attack_config("dlm", adam, AUDIT_PRESET)
    paper, _ = build_attack_config("dlm", adam, "paper")
    pairs = [fedavg_release(offset=u)[1:] for u in range(3)]
    control = RunControl(6, emit_every=3, image_every=3)
    with _reads_in_steps(monkeypatch, dlm_starts.Starts) as seen:
        observation, knowledge = pairs[0]
        alone = ATTACKS["dlm"].run(observation, knowledge, paper, control, 0)
        assert list(alone)[-1].final.steps == 6  # one start, alone
        events = run_preset(ATTACKS["dlm"], observation, knowledge, config, control, 0, "audit")
        final = list(events)[-1].final
        observations, knowledges = zip(*pairs, strict=True)
        updates = run_attack_updates(
            ATTACKS["dlm"], observations, knowledges, config, control, [7] * 3, AUDIT_PRESET
        )
        finals = {u: e.final for u, e in updates if e.final is not None}
    assert len(final.candidates) == 4 and final.steps > 0  # the preset's four starts ran
    assert sorted(finals) == [0, 1, 2]
    assert seen == []


def _breaking(monkeypatch, attack: str, row: int, at_step: int) -> list[torch.Tensor]:
    """Make restart ``row``'s objective infinite from its step ``at_step`` on; the images it
    had at that step (as the attack scores them) are put in the list returned."""
    steps, first = [0], []
    if attack == "grnn":
        real_terms = grnn_restarts.GrnnRestarts._terms

        def terms(self, images, labels, alive):
            mse, wd = real_terms(self, images, labels, alive)
            steps[0] += 1
            if steps[0] >= at_step:
                if steps[0] == at_step:
                    first.append(images[alive.index(row)].detach().clone())
                mse = mse.clone().index_fill_(0, torch.tensor([alive.index(row)]), math.inf)
            return mse, wd

        monkeypatch.setattr(grnn_restarts.GrnnRestarts, "_terms", terms)
        return first
    real_evaluate = fedleak.Objective.evaluate_together

    def evaluate(self, x01, masks=None):
        current, value, distance, masks_used = real_evaluate(self, x01, masks)
        if masks is None:  # the step's own evaluation (the look-ahead reuses its masks)
            steps[0] += 1
            if steps[0] >= at_step:
                if steps[0] == at_step:
                    first.append(self.normalize(x01[row].detach().clone()))
                value = value.clone().index_fill_(0, torch.tensor([row]), math.inf)
        return current, value, distance, masks_used

    monkeypatch.setattr(fedleak.Objective, "evaluate_together", evaluate)
    return first


@pytest.mark.parametrize("attack", ["fedleak", "grnn"])
def test_a_restart_that_breaks_is_dropped_at_that_step_and_scored_by_its_images_then(
    monkeypatch, attack
):
    first = _breaking(monkeypatch, attack, row=1, at_step=3)
    _, final = run_attack(attack, _release(), 8, emit_every=100, image_every=100)
    reasons = {c.restart: (c.stop_reason, c.steps) for c in final.candidates}
    assert reasons[1] == ("diverged", 3), reasons
    assert all(r == "completed" for k, (r, _) in reasons.items() if k != 1), reasons
    broken = next(c for c in final.candidates if c.restart == 1)
    # Its images at step 3, not those its momentum moved it to before the loop's read.
    torch.testing.assert_close(broken.images, first[0], rtol=0, atol=0)


def _never_waiting(monkeypatch, stepper) -> None:
    """``stepper.step`` from now on under torch's ``set_sync_debug_mode("error")``, which
    stops any synchronising call inside it: a copy to the host, a value read, a pageable
    copy to the device, a nonzero."""
    real_step = stepper.step

    def step(self, alive):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return real_step(self, alive)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(stepper, "step", step)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("attack", sorted(STEPPERS))
def test_on_cuda_a_step_of_restarts_together_never_waits_for_the_device(monkeypatch, attack):
    release = _release("cuda")
    run_attack(attack, release, 2, emit_every=2)  # warm: the first kernels' set-up may wait
    _never_waiting(monkeypatch, STEPPERS[attack])
    final = _raced_to_one(attack, release)
    assert len(final.candidates) == 4 and final.steps > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_step_of_dlm_s_adam_starts_together_never_waits_for_the_device(monkeypatch):
    from tests.test_attack_dlm import release_for as fedavg_release

    _, observation, knowledge = fedavg_release(device="cuda")
    config, _ = build_attack_config("dlm", {"optimizer": "adam", "lr": 0.1}, AUDIT_PRESET)
    info = ATTACKS["dlm"]

    def run(steps: int):
        control = RunControl(steps, emit_every=3, image_every=3)
        return list(run_preset(info, observation, knowledge, config, control, 0, AUDIT_PRESET))

    run(2)  # warm: the first kernels' set-up may wait
    _never_waiting(monkeypatch, dlm_starts.Starts)
    final = run(6)[-1].final
    assert len(final.candidates) == 4 and final.steps > 0


def test_fedleaks_one_restart_that_breaks_is_scored_by_its_pixels_at_that_step(monkeypatch):
    steps, first = [0], []
    real_evaluate = fedleak.Objective.evaluate

    def evaluate(self, x01, masks=None):
        current, value, distance, masks_used = real_evaluate(self, x01, masks)
        if masks is None:  # the step's own evaluation (the look-ahead reuses its masks)
            steps[0] += 1
            if steps[0] == 3:
                first.append(self.normalize(x01.detach().clone()))
            if steps[0] >= 3:
                value = torch.full_like(value, math.inf)
        return current, value, distance, masks_used

    monkeypatch.setattr(fedleak.Objective, "evaluate", evaluate)
    _, final = run_attack("fedleak", _release(), 8, "paper", emit_every=100, image_every=100)
    (alone,) = final.candidates
    assert (alone.stop_reason, alone.steps) == ("diverged", 3)
    torch.testing.assert_close(alone.images, first[0], rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("attack", "params"), UPDATES_TOGETHER)
def test_on_cuda_a_step_of_several_updates_together_never_waits_for_the_device(
    monkeypatch, attack, params
):
    _several_updates(attack, params, "cuda")  # warm: the first kernels' set-up may wait
    _never_waiting(monkeypatch, STEPPERS[attack])
    _several_updates(attack, params, "cuda")
