"""A defended run's attacks and their adaptive twins each get the run's time budget: the
plain attack has the budget it has in the undefended control (the same attack at the same
budget, which the verdict compares with), and the twin a budget of its own."""

from __future__ import annotations

import dataclasses

from auditlib.engine.audit import run_audit
from auditlib.spec import Budget, ComponentSpec
from tests.test_attacks import lenet_spec

BUDGET_S = 2.0


def test_the_twin_gets_a_budget_of_its_own_and_the_plain_attack_the_controls():
    defended = dataclasses.replace(
        lenet_spec("ig", defense=ComponentSpec.of("dp-gaussian", {"sigma": "0.1"})),
        budget=Budget(iterations=1_000_000, max_seconds=BUDGET_S),
    )
    result = run_audit(defended, lpips_nets=())
    plain, twin = result.summary.attacks
    assert not plain.skipped and not twin.skipped, (plain.skipped, twin.skipped)
    assert plain.stop_reason == twin.stop_reason == "time budget"
    # Each ran for about the whole budget (not half of it each): the run took about twice.
    assert result.summary.timing.seconds >= 1.6 * BUDGET_S, result.summary.timing.seconds
    assert plain.steps > 0 and twin.steps > 0
