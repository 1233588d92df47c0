"""The sample's memory plan: what a row of a batched evaluation costs, measured, and how
many updates then advance together at a time."""

from __future__ import annotations

import torch

from auditlib.engine.memory_plan import RowCost, measure_rows, plan_updates

CPU = torch.device("cpu")
MB = 1_000_000


def test_a_row_costs_what_its_evaluation_holds_at_its_peak():
    def evaluate(rows: int) -> None:
        fixed = torch.ones(20 * MB // 4)
        held = [torch.ones(50 * MB // 4) for _ in range(rows)]  # 50 MB per row, at once
        assert float(fixed[0] + sum(h[-1] for h in held)) == rows + 1

    cost = measure_rows(evaluate, CPU)
    assert cost is not None
    assert 40 * MB < cost.per_row < 60 * MB, cost
    assert cost.fixed < 40 * MB, cost


def test_a_peak_raised_by_other_work_beside_it_is_not_taken_for_the_rows():
    # The resident set is the whole process's: other work's memory at the same moment raises
    # a reading (here 30 MB beside the first reading of one row), never lowers it.
    calls = [0]

    def evaluate(rows: int) -> None:
        calls[0] += 1
        fixed = torch.ones(20 * MB // 4)
        held = [torch.ones(50 * MB // 4) for _ in range(rows)]
        beside = torch.ones(30 * MB // 4) if calls[0] == 2 else torch.zeros(1)  # 1: warm-up
        assert float(fixed[0] + sum(h[-1] for h in held) + beside[-1]) >= rows + 1

    cost = measure_rows(evaluate, CPU)
    assert cost is not None
    assert 40 * MB < cost.per_row < 60 * MB, cost


def test_updates_are_chunked_to_fit_a_share_of_the_free_memory():
    cost = RowCost(fixed=1_000 * MB, per_row=500 * MB)
    plan = plan_updates(64, 8, cost, CPU, free=24_000 * MB)
    # 60 % of 24 GB, less 1 GB fixed: 13.4 GB; an update's 8 rows take 4 GB: 3 at a time.
    assert (plan.chunk, plan.chunks) == (3, 22)
    assert "22 chunks of up to 3" in plan.words and "257.0 GB" in plan.words
    roomy = plan_updates(16, 8, RowCost(fixed=10 * MB, per_row=1 * MB), CPU, free=24_000 * MB)
    assert (roomy.chunk, roomy.chunks) == (16, 1)
    assert "16 updates together need about 0.1 GB" in roomy.words
    # One update that alone needs more than the share still runs (alone): it may fit.
    huge = plan_updates(4, 8, RowCost(fixed=0, per_row=10_000 * MB), CPU, free=24_000 * MB)
    assert huge.chunk == 1


def test_without_a_peak_to_read_the_plan_keeps_the_updates_together_and_says_so():
    plan = plan_updates(8, 4, None, CPU, free=24_000 * MB)
    assert plan.chunk == 8 and "unplanned" in plan.words
