"""The reading of issue 55's device figures (``benchmarks.device.issue55_check``): each item
of the issue's list holds, does not hold, or is unmeasured, from the files a call wrote."""

from __future__ import annotations

import json

from auditlib.reconstruction import EAGER, RECORDED
from benchmarks.device.issue55_check import CASE, check


def _run(side, seed, steps, seconds, psnr, starts=1):
    return {
        "side": side,
        "starts": starts,
        "seed": seed,
        "steps": steps,
        "seconds": seconds,
        "psnr": psnr,
    }


def _write(folder, name, result):
    (folder / name).write_text(json.dumps(result))


def test_nothing_written_is_unmeasured_not_a_pass(tmp_path):
    items = check(tmp_path)
    assert [i.holds for i in items] == [None, None, None, None]
    assert items[0].line().startswith("IG 1 start, >= 5x breaching, same PSNR: unmeasured")


def test_each_item_is_judged_against_the_issue_s_bar(tmp_path):
    runs = [
        *(_run("ours captured", s, 200, 2.0, 7.0 + 0.1 * s) for s in range(3)),  # 100 steps/s
        *(_run("breaching", s, 200, 10.0, 7.2) for s in range(3)),  # 20 steps/s: 5.0x
        _run("ours captured", 0, 1600, 2.6, 6.9, starts=8),  # 1.30x one start's 2.0 s
    ]
    _write(tmp_path, f"compiled_step-{CASE}-captured.json", {"runs": runs})
    budget = {"paper_budget": _run("ours captured", 0, 24_000, 290.0, 9.1)}
    _write(tmp_path, f"compiled_step-{CASE}-captured-budget.json", budget)
    plan = {
        "runs": [
            {"at_once": False, "steps": 3060, "planned_steps": 3060, "seconds": 75.0},
            {"at_once": True, "steps": 2900, "planned_steps": 3060, "seconds": 40.0},
        ]
    }
    _write(tmp_path, f"attacks_at_once-{CASE}-captured.json", plan)
    one, eight, paper, whole = check(tmp_path)
    assert one.holds is True and "(5.0x;" in one.words and "-0.10 dB" in one.words
    assert eight.holds is False and "(1.30x)" in eight.words
    assert paper.holds is True and "24,000 steps in 290 s, PSNR 9.10 dB" in paper.words
    assert whole.holds is False  # the one whole plan took 75 s; at once did not finish it


def test_a_psnr_away_from_breaching_s_fails_the_first_item_at_any_speed(tmp_path):
    runs = [
        *(_run("ours captured", s, 200, 1.0, 6.0) for s in range(3)),
        *(_run("breaching", s, 200, 10.0, 7.0) for s in range(3)),
    ]
    _write(tmp_path, f"compiled_step-{CASE}-captured.json", {"runs": runs})
    one, eight, _, _ = check(tmp_path)
    assert one.holds is False and "(10.0x;" in one.words
    assert eight.holds is None  # no run of several starts


def test_a_run_asked_to_record_that_did_not_is_named_beside_its_figures(tmp_path):
    failed = "its recording as a CUDA graph failed (RuntimeError: x); it ran eagerly"
    runs = [
        *(_run("ours captured", s, 200, 1.0, 7.0) for s in range(3)),  # 10x, same PSNR
        *(_run("breaching", s, 200, 10.0, 7.0) for s in range(3)),
    ]
    runs[0] |= {"step": EAGER, "step_note": failed}
    runs[1] |= {"step": RECORDED, "step_note": None}
    _write(tmp_path, f"compiled_step-{CASE}-captured.json", {"runs": runs})
    plan = {
        "runs": [
            {
                "at_once": True,
                "steps": 3060,
                "planned_steps": 3060,
                "seconds": 30.0,
                "attacks": [
                    {"label": "ig", "skipped": None, "step": RECORDED},
                    {"label": "dlg", "skipped": None, "step": EAGER, "step_note": failed},
                    {"label": "gi", "skipped": "no BatchNorm", "step": None},
                ],
            }
        ]
    }
    _write(tmp_path, f"attacks_at_once-{CASE}-captured.json", plan)
    one, _, _, whole = check(tmp_path)
    # The figures are what ran, and the words say which runs did not record their step.
    assert one.holds is True
    assert one.words.endswith(f"; asked to record but did not: ours captured: eager ({failed})")
    assert whole.holds is True
    assert whole.words.endswith(f"; asked to record but did not: dlg: eager ({failed})")
    runs[0] |= {"step": RECORDED, "step_note": None}
    _write(tmp_path, f"compiled_step-{CASE}-captured.json", {"runs": runs})
    assert "asked to record" not in check(tmp_path)[0].words
