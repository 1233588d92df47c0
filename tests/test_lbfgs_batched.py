"""Specification of the batched L-BFGS (attacks/lbfgs_batched.py) and of L-BFGS starts that
advance together in DLG, iDLG and DLM.

Each start must follow torch.optim.LBFGS's iterates (its own history, step size, line
search and stopping tests), whether it runs alone or beside others; a start that converges
or diverges stops without moving the others.
"""

from __future__ import annotations

import math

import pytest
import torch

from auditlib.attacks import RunControl, build_attack_config, get_attack
from auditlib.attacks.base import Clock
from auditlib.attacks.lbfgs import LbfgsTogether
from auditlib.attacks.lbfgs_batched import BatchedLbfgs
from auditlib.attacks.lbfgs_histories import Histories
from auditlib.attacks.loop import PLAN, StepInterrupted
from auditlib.attacks.objectives import UpdateMatcher, random_images, random_label_logits
from auditlib.client.protocol import ClientProtocol
from auditlib.defenses import build_defense
from auditlib.engine.audit import prepare_victim
from auditlib.fl.scenario import release_update
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

N = 12
LINE_SEARCHES = [None, "strong_wolfe"]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def problems(starts: int, dtype=torch.float64):
    """Per start a convex quartic 0.5 x'Ax - b'x + 0.1 sum x^4 of its own (a line search
    has work to do) and its own starting point; seeded."""
    generator = torch.Generator().manual_seed(7)
    a = []
    for k in range(starts):
        m = torch.randn(N, N, generator=generator, dtype=dtype)
        a.append(m @ m.T / N + 0.2 * (k + 1) * torch.eye(N, dtype=dtype))
    b = torch.randn(starts, N, generator=generator, dtype=dtype)
    x0 = torch.randn(starts, N, generator=generator, dtype=dtype)
    return torch.stack(a), b, x0


def quartic(a, b, x):
    return 0.5 * x @ a @ x - b @ x + 0.1 * (x**4).sum()


def torch_iterates(a, b, x0, steps, **options):
    """torch.optim.LBFGS on one problem: the point after each step and its evaluations."""
    x = x0.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([x], **options)

    def closure():
        optimizer.zero_grad()
        loss = quartic(a, b, x)
        loss.backward()
        return loss

    points, losses = [], []
    for _ in range(steps):
        losses.append(float(optimizer.step(closure).detach()))
        points.append(x.detach().clone())
    return torch.stack(points), losses, optimizer.state[x]["func_evals"]


def batched_iterates(a, b, x0, steps, rows=None, optimizer=None, **options):
    """``steps`` steps of BatchedLbfgs over the problems (of ``rows``); ``optimizer``: go on
    with that one's variables and histories."""
    starts = x0.shape[0]
    if optimizer is None:
        x = x0.clone().requires_grad_(True)
        optimizer = BatchedLbfgs([x], starts, **options)
    (x,) = optimizer.variables

    def objective(asked):
        return torch.stack([quartic(a[r], b[r], x[r]) for r in asked])

    points, losses = [], []
    for _ in range(steps):
        losses.append(optimizer.step(objective, rows))
        points.append(x.detach().clone())
    return torch.stack(points), losses, optimizer


def two_loop(pairs: list[tuple[torch.Tensor, torch.Tensor]], grad: torch.Tensor, h: float):
    """torch.optim.LBFGS's direction from its history (oldest first), as torch writes it."""
    q, al = grad.neg(), [None] * len(pairs)
    for i in range(len(pairs) - 1, -1, -1):
        s, y = pairs[i]
        al[i] = s.dot(q) / y.dot(s)
        q = q - al[i] * y
    r = q * h
    for i, (s, y) in enumerate(pairs):
        r = r + s * (al[i] - y.dot(r) / y.dot(s))
    return r


def test_each_rows_direction_is_torchs_two_loop_over_its_own_history():
    """Four rows whose histories differ: one wraps its ring twice (size 3), one holds fewer
    pairs than the longest, one refuses a pair (y.s <= 1e-10, as torch skips it), one starts
    again after a reset over the stale products of its earlier pairs; asked all together
    and as a subset, each row's direction is the two-loop recursion over its own pairs."""
    generator = torch.Generator().manual_seed(3)
    size, n = 3, N
    histories = Histories(4, size, n, torch.zeros(1, dtype=torch.float64))
    kept: list[list] = [[] for _ in range(4)]
    h = [1.0] * 4

    def add(rows, bad=()):
        grad = torch.randn(len(rows), n, generator=generator, dtype=torch.float64)
        s = torch.randn(len(rows), n, generator=generator, dtype=torch.float64)
        y = s + 0.3 * torch.randn(len(rows), n, generator=generator, dtype=torch.float64)
        for i in bad:
            y[i] = -s[i]  # y.s < 0: not a curvature pair
        got = histories.direction(rows, grad, y, s)
        for i, row in enumerate(rows):
            if i not in bad:
                kept[row] = (kept[row] + [(s[i], y[i])])[-size:]
                h[row] = float(y[i].dot(s[i]) / y[i].dot(y[i]))
            expected = two_loop(kept[row], grad[i], h[row])
            torch.testing.assert_close(got[i], expected, rtol=1e-10, atol=1e-12)

    for step in range(7):
        add([0, 1, 2, 3] if step != 1 else [0, 2, 3])  # row 1 sits out a step: fewer pairs
    histories.reset(3)
    kept[3], h[3] = [], 1.0
    add([0, 1, 2, 3], bad=(2,))
    add([1, 3])  # a subset, row 3 with one pair over its stale ones
    add([0, 1, 2, 3], bad=(0,))
    assert histories.count == [3, 3, 3, 3] and histories.head != [0, 0, 0, 0]


@pytest.mark.parametrize("line_search", LINE_SEARCHES)
def test_one_start_follows_torch_lbfgs(line_search):
    a, b, x0 = problems(1)
    options = {"lr": 1.0, "max_iter": 6, "history_size": 4, "line_search_fn": line_search}
    expected, expected_losses, evaluations = torch_iterates(a[0], b[0], x0[0], 5, **options)
    points, losses, optimizer = batched_iterates(a, b, x0, 5, **options)
    torch.testing.assert_close(points[:, 0], expected, rtol=0, atol=1e-12)
    assert [loss[0] for loss in losses] == pytest.approx(expected_losses, rel=1e-12)
    assert optimizer.evaluations[0] == evaluations  # the same stopping tests, step by step


@pytest.mark.parametrize("line_search", LINE_SEARCHES)
def test_starts_together_end_where_each_ends_alone_and_where_torch_ends(line_search):
    """Four problems at once: each start's history (here wrapping around: 3 pairs), step
    size and line search are its own; every start matches torch's run of its problem."""
    a, b, x0 = problems(4)
    options = {"lr": 0.8, "max_iter": 7, "history_size": 3, "line_search_fn": line_search}
    points, _, optimizer = batched_iterates(a, b, x0, 6, **options)
    for k in range(4):
        expected, _, evaluations = torch_iterates(a[k], b[k], x0[k], 6, **options)
        torch.testing.assert_close(points[:, k], expected, rtol=0, atol=1e-10)
        assert optimizer.evaluations[k] == evaluations
    if line_search is not None:  # the line searches took different numbers of evaluations
        assert len(set(optimizer.evaluations)) > 1


def test_float32_start_matches_torch_to_float_rounding():
    a, b, x0 = (t.float() for t in problems(2))
    options = {"lr": 1.0, "max_iter": 5, "history_size": 10}
    points, _, _ = batched_iterates(a, b, x0, 3, **options)
    for k in range(2):
        expected, _, _ = torch_iterates(a[k], b[k], x0[k], 3, **options)
        # A rounding difference (torch.dot against a row-wise product) grows with the steps.
        torch.testing.assert_close(points[0, k], expected[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(points[:, k], expected, rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
@pytest.mark.parametrize("line_search", LINE_SEARCHES)
def test_starts_together_on_cuda_follow_torch_on_the_cpu(line_search):
    """On a GPU (where each round's scalars come back in one transfer and the indices go
    out without waiting) every start still takes torch's steps and evaluations, with one
    start dropped halfway (its rows picked by an index, not all rows)."""
    a, b, x0 = problems(4)
    options = {"lr": 0.8, "max_iter": 7, "history_size": 3, "line_search_fn": line_search}
    cuda = [t.cuda() for t in (a, b, x0)]
    early, _, optimizer = batched_iterates(*cuda, 2, **options)
    later, _, _ = batched_iterates(*cuda, 4, rows=[0, 2, 3], optimizer=optimizer)
    for k in range(4):
        expected, _, evaluations = torch_iterates(a[k], b[k], x0[k], 6 if k != 1 else 2, **options)
        ours = torch.cat([early[:, k], later[:, k]]) if k != 1 else early[:, k]
        torch.testing.assert_close(ours.cpu(), expected, rtol=0, atol=1e-9)
        assert optimizer.evaluations[k] == evaluations


def test_a_converged_start_stops_while_the_others_go_on():
    """Start 1 begins at its minimum (gradient zero): each step evaluates it once and it never
    moves, as torch does; starts 0 and 2 go on exactly as alone."""
    a, b, x0 = problems(3)
    b[1] = a[1] @ x0[1] + 0.4 * x0[1] ** 3  # x0[1] is then a stationary point of start 1
    options = {"lr": 1.0, "max_iter": 5, "history_size": 5}
    points, _, optimizer = batched_iterates(a, b, x0, 4, **options)
    assert torch.equal(points[:, 1], x0[1].expand(4, N))
    assert optimizer.evaluations[1] == 4  # one per step: torch's first-order test, then stop
    for k in (0, 2):
        expected, _, evaluations = torch_iterates(a[k], b[k], x0[k], 4, **options)
        torch.testing.assert_close(points[:, k], expected, rtol=0, atol=1e-10)
        assert optimizer.evaluations[k] == evaluations > 4


def test_a_diverged_start_keeps_its_last_finite_state_and_the_others_go_on():
    """Start 1's objective turns NaN once x[0] < 0 (a log barrier it steps over): it is put
    back at its last full step, marked diverged and skipped; the others are untouched."""
    a, b, x0 = problems(3)
    x0[1, 0] = 0.5
    x = x0.clone().requires_grad_(True)
    optimizer = BatchedLbfgs([x], 3, lr=1.0, max_iter=5, history_size=5)

    def objective(rows):
        values = []
        for r in rows:
            value = quartic(a[r], b[r], x[r])
            if r == 1:  # pulled toward x[0] < 0 by a steep slope, then log of a negative
                value = value + 50 * x[r, 0] + torch.log(x[r, 0])
            values.append(value)
        return torch.stack(values)

    history, steps = [x.detach().clone()], 0
    while not optimizer.diverged(1) and steps < 10:
        losses = optimizer.step(objective)
        steps += 1
        history.append(x.detach().clone())
    assert optimizer.diverged(1) and math.isnan(losses[1])
    assert torch.equal(x.detach()[1], history[-2][1])  # its last full step, finite
    assert torch.isfinite(x.detach()[1]).all()
    frozen = optimizer.evaluations[1]
    optimizer.step(objective)
    assert optimizer.evaluations[1] == frozen  # skipped from then on
    assert math.isnan(optimizer.step(objective)[1])
    for k in (0, 2):
        expected, _, _ = torch_iterates(
            a[k], b[k], x0[k], steps + 2, lr=1.0, max_iter=5, history_size=5
        )
        torch.testing.assert_close(x.detach()[k], expected[-1], rtol=0, atol=1e-10)


def test_dropped_rows_are_not_evaluated_and_the_others_are_unchanged():
    """The race drops starts by leaving their rows out of the step."""
    a, b, x0 = problems(3)
    options = {"lr": 1.0, "max_iter": 4, "history_size": 4}
    x = x0.clone().requires_grad_(True)
    optimizer = BatchedLbfgs([x], 3, **options)
    asked: list[list[int]] = []

    def objective(rows):
        asked.append(list(rows))
        return torch.stack([quartic(a[r], b[r], x[r]) for r in rows])

    optimizer.step(objective)
    after_one = x.detach()[1].clone()
    for _ in range(2):
        optimizer.step(objective, [0, 2])
    assert all(1 not in rows for rows in asked[-6:])
    assert torch.equal(x.detach()[1], after_one)
    for k in (0, 2):
        expected, _, _ = torch_iterates(a[k], b[k], x0[k], 3, **options)
        torch.testing.assert_close(x.detach()[k], expected[-1], rtol=0, atol=1e-10)


# --- DLG's objective on a small LeNet -----------------------------------------------------


def dlg_release():
    spec = RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 16, 16), init="uniform")),
        data=DataSpec("samples", "photographs", batch_size=1),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(10),
        seed=0,
    )
    victim = prepare_victim(spec)
    return release_update(
        victim.model,
        victim.batch,
        ClientProtocol(),
        build_defense("none", None)[0],
        normalization=victim.normalization,
        num_classes=10,
        labels_known=False,
        seed=0,
    )


def dlg_starts(knowledge, starts):
    generator = torch.Generator().manual_seed(3)
    images, logits = [], []
    for _ in range(starts):
        images.append(random_images(knowledge, generator))
        logits.append(random_label_logits(knowledge, generator))
    return torch.stack(images), torch.stack(logits)


def test_dlg_objective_one_start_follows_torch_and_starts_together_follow_alone():
    """DLG on a 16-pixel LeNet: three inner iterations of L-BFGS (lr 1, no line search). A
    start alone follows torch's LBFGS, and three starts together (their update distances
    through vmap) follow each alone, to float rounding: DLG at a fixed step of 1 is chaotic,
    so differences of one rounding grow over a few dozen iterations, hence the short run."""
    release = dlg_release()
    matcher = UpdateMatcher(release.observation, release.knowledge, "l2")
    images, logits = dlg_starts(release.knowledge, 3)
    options = {"lr": 1.0, "max_iter": 3, "history_size": 100}

    def alone_with_torch(k):
        x, y = images[k].clone().requires_grad_(True), logits[k].clone().requires_grad_(True)
        optimizer = torch.optim.LBFGS([x, y], **options)

        def closure():
            optimizer.zero_grad()
            loss = matcher(x, torch.softmax(y, -1))
            loss.backward(inputs=[x, y])
            return loss

        optimizer.step(closure)
        return x.detach()

    x = images.clone().requires_grad_(True)
    y = logits.clone().requires_grad_(True)
    optimizer = BatchedLbfgs([x, y], 3, **options)

    def objective(rows):
        if len(rows) == 1:
            return matcher(x[rows[0]], torch.softmax(y[rows[0]], -1)).unsqueeze(0)
        return matcher.together(x[rows], torch.softmax(y[rows], -1))

    optimizer.step(objective)
    moved = False
    for k in range(3):
        expected = alone_with_torch(k)
        torch.testing.assert_close(x.detach()[k], expected, rtol=1e-3, atol=1e-3)
        moved = moved or float((expected - images[k]).abs().max()) > 1e-2
    assert moved  # the comparison is not between two starting points


def test_together_checks_the_budget_at_every_evaluation_and_restores_the_last_full_step():
    a, b, x0 = problems(2)
    x = x0.clone().requires_grad_(True)
    calls = {"n": 0}
    cancelled = {"now": False}
    clock = Clock(RunControl(10, is_cancelled=lambda: cancelled["now"]))

    def objective(rows):
        calls["n"] += 1
        if calls["n"] == 7:  # cancel in the middle of the second step
            cancelled["now"] = True
        return torch.stack([quartic(a[r], b[r], x[r]) for r in rows])

    steps = LbfgsTogether(
        [x], objective, clock, 2, lr=1.0, max_iter=5, history_size=5, line_search=None
    )
    steps.step([0, 1])
    full = x.detach().clone()
    with pytest.raises(StepInterrupted) as stop:
        steps.step([0, 1])
    assert stop.value.reason == "cancelled"
    assert calls["n"] == 7  # checked before the 8th evaluation, not after the step
    assert not torch.equal(x.detach(), full)  # the interrupted step had moved them
    steps.restore([0, 1])
    assert torch.equal(x.detach(), full)


# --- Through the attacks ------------------------------------------------------------------


def run_named(name, release, steps, params, race=None):
    config, _ = build_attack_config(name, params)
    control = RunControl(steps, emit_every=1, race=race)
    events = list(get_attack(name).run(release.observation, release.knowledge, config, control, 0))
    return events, events[-1].final


@pytest.mark.parametrize("name", ["dlg", "idlg"])
def test_attack_starts_together_match_apart_after_one_step(name):
    """One L-BFGS step of 3 starts (3 evaluations each): together and apart (torch's
    L-BFGS) agree to float rounding, start by start."""
    release = dlg_release()
    finals = [
        run_named(name, release, 1, {"restarts": 3, "together": t, "lbfgs_max_iter": 3})[1]
        for t in (False, True)
    ]
    for apart, together in zip(*(f.candidates for f in finals), strict=True):
        assert together.restart == apart.restart and together.steps == apart.steps == 1
        assert together.loss == pytest.approx(apart.loss, rel=1e-3)
        torch.testing.assert_close(together.images, apart.images, rtol=1e-3, atol=1e-3)


def test_dlg_race_together_drops_slices_and_keeps_every_candidate():
    release = dlg_release()
    events, final = run_named(
        "dlg", release, 12, {"restarts": 4, "together": True, "lbfgs_max_iter": 2}, race=PLAN
    )
    assert len(final.candidates) == 4
    dropped = [c for c in final.candidates if c.stop_reason.startswith("dropped")]
    assert dropped and all(c.steps < 12 for c in dropped)
    assert any(c.steps == 12 and c.stop_reason == "completed" for c in final.candidates)
    # Each restart's evaluations go on only while it runs: a dropped start's stop counting.
    last = {}
    for event in events:
        if "evaluations" in event.losses:
            last[event.restart] = event.losses["evaluations"]
    for candidate in dropped:
        assert last[candidate.restart] <= 2 * candidate.steps


def test_dlm_starts_together_report_each_starts_gamma():
    from tests.test_attack_dlm import release_for, run_attack

    _, observation, knowledge = release_for()
    events, final = run_attack(
        "dlm", observation, knowledge, 2, {"restarts": 3, "together": True}, "stable"
    )
    ratios = final.label_inference["gamma_ratio_by_restart"]
    assert sorted(ratios) == [0, 1, 2]
    assert all(math.isfinite(r) for r in ratios.values())
    steps = [e for e in events if "gamma" in e.losses]
    assert {e.restart for e in steps} == {0, 1, 2}


@pytest.mark.parametrize(
    "config",
    [
        {"gamma_on": "update"},
        {"gamma_on": "dummy"},
        {"norm": "frobenius"},
        {"norm": "layer-mean"},
    ],
    ids=["dlm-update", "dlm-dummy", "dlm+-frobenius", "dlm+-layer-mean"],
)
def test_dlm_objective_of_starts_together_is_each_starts_own(config):
    """DLM's and DLM+'s distance of 3 starts at once (each its own gamma) against each start
    alone: values and image gradients, to float rounding."""
    from auditlib.attacks.dlm import DlmConfig, DlmPlusConfig, ModelLeakageObjective
    from tests.test_attack_dlm import release_for

    _, observation, knowledge = release_for()
    kind = DlmPlusConfig if "norm" in config else DlmConfig
    objective = ModelLeakageObjective(observation, knowledge, kind(**config))
    images, logits = dlg_starts(knowledge, 3)
    images.requires_grad_(True)
    labels = torch.softmax(logits, -1)
    gamma = None if objective.plus else torch.tensor([80.0, 100.0, 130.0])
    together = objective.together(images, labels, gamma)
    (batched,) = torch.autograd.grad(together.sum(), images)
    assert together.shape == (3,)
    for r in range(3):
        alone = objective(images[r], labels[r], None if gamma is None else gamma[r])
        (own,) = torch.autograd.grad(alone, images)
        assert float(together[r]) == pytest.approx(float(alone), rel=1e-5)
        torch.testing.assert_close(batched[r], own[r], rtol=1e-4, atol=1e-6)
