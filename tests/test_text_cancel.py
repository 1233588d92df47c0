"""A Cancel stops a text audit between two steps: the running attack returns what it had
(said in its notes), nothing after it starts, what was recovered is scored, and the verdict
claims only what was measured. Through the dashboard's run manager on Ray, the run ends
"cancelled" with that partial result stored."""

from __future__ import annotations

import itertools
import time

import pytest
from ray_waits import WORKER_START_S

from auditlib.attacks.text import run_text_attack
from auditlib.attacks.text.base import TextTarget
from auditlib.attacks.text.dager import DagerConfig
from auditlib.attacks.text.lamp import lamp_config
from auditlib.attacks.text.tag import tag_config
from auditlib.attacks.text.tiger import TigerConfig
from auditlib.attacks.text.utr import UtrConfig
from auditlib.client.text_update import text_update
from auditlib.data.text_samples import demo_batch
from auditlib.engine.text_audit import TextAuditSpec, run_text_audit
from auditlib.models.text import build_text_model, with_lora

B, N = 2, 8


def _after(calls: int):
    """A stop check that says "stop" from its ``calls``-th question on."""
    counter = itertools.count(1)
    return lambda: next(counter) >= calls


@pytest.fixture(scope="module")
def full_target() -> TextTarget:
    model = build_text_model("gpt2-tiny", seed=0)
    batch = demo_batch(model.tokenizer, B, N, seed=0)
    return TextTarget(model, text_update(model, batch), B, N)


@pytest.fixture(scope="module")
def lora_target() -> TextTarget:
    model = with_lora(build_text_model("gpt2-tiny", seed=0), rank=4)
    batch = demo_batch(model.tokenizer, B, N, seed=0)
    return TextTarget(model, text_update(model, batch), B, N)


# attack -> (config, target, the question on which the stop comes: inside the main loop)
CASES = {
    "tag": (tag_config(steps=400, restarts=2, progress_every=5), "full", 10),
    "lamp": (  # its start asks 3 times (2 draws, 2 orders), then once a step; the audited
        # decoder as the prior (the public-text one trains for up to 60 s on first use)
        lamp_config(
            steps=400,
            init_candidates=2,
            swap_candidates=5,
            progress_every=5,
            prior="audited-model",
        ),
        "full",
        10,
    ),
    "tiger": (TigerConfig(steps=400), "full", 10),
    "dager": (DagerConfig(mode="ranked"), "full", 4),  # once a position
    "utr": (UtrConfig(refine_iterations=50), "lora", 4),  # once a greedy position
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_text_attack_stops_between_steps_and_returns_what_it_had(
    name, full_target, lora_target
):
    config, kind, when = CASES[name]
    target = full_target if kind == "full" else lora_target
    seen = []
    recovered = run_text_attack(name, target, config, seen.append, should_stop=_after(when))
    assert recovered.stopped
    (note,) = [n for n in recovered.notes if n.startswith("stopped on request after")]
    assert not note.startswith("stopped on request after 0 ")  # inside its loop, not before
    assert 0 < len(recovered.texts) <= B  # what it had: sequences, not nothing
    assert seen[-1].note == "done"
    # Never asked to stop, the same attack is not marked stopped (its budget ran out).
    if name in ("dager", "utr"):
        assert not run_text_attack(name, target, config).stopped


def test_a_cancelled_audit_scores_what_it_had_skips_the_rest_and_claims_no_safety():
    spec = TextAuditSpec(
        model="gpt2-tiny", batch_size=B, length=N, attacks=("tag", "dager"),
        defense="dp-gaussian", defense_params={"sigma": "1e-6", "clip": "30"},
        iterations=400,
    )  # fmt: skip
    events = []
    result = run_text_audit(spec, events.append, should_stop=_after(20))
    assert result.stopped
    assert [r.attack for r in result.runs] == ["tag"]  # DAGER never started
    assert result.controls == ()  # nor the undefended control
    assert result.runs[0].recovered.stopped
    assert result.verdict.outcome in ("inconclusive", "leaks")
    if result.verdict.outcome == "inconclusive":  # nothing measured: no claim of safety
        assert "cancelled" in result.verdict.sentence
    assert events[-1].stage == "done"


def test_a_cancelled_audit_that_had_found_a_leak_keeps_it():
    """DAGER recovers the batch exactly before TAG is reached: the leak was measured."""
    spec = TextAuditSpec(
        model="gpt2-tiny", batch_size=B, length=N, attacks=("dager", "tag"), iterations=400
    )
    asked = []

    def stop_once_dager_is_done() -> bool:
        asked.append(1)
        return len(result_so_far) > 0

    result_so_far: list = []
    result = run_text_audit(
        spec,
        lambda e: result_so_far.append(e) if e.stage == "scored" else None,
        should_stop=stop_once_dager_is_done,
    )
    assert result.stopped and [r.attack for r in result.runs] == ["dager"]
    assert result.verdict.outcome == "leaks"
    assert "2 sequences of 2 recovered" in result.verdict.headline


def test_a_run_cancelled_before_any_attack_ran_ends_with_nothing_scored():
    from auditlib.engine.text_runs import TextUploads, text_messages

    spec = TextAuditSpec(model="gpt2-tiny", batch_size=B, length=N, attacks=("tag",))
    messages = list(text_messages(spec, TextUploads(), is_cancelled=lambda: True))
    assert messages[-1] == {"kind": "cancelled"}
    assert not any(m["kind"] == "result" for m in messages)


@pytest.mark.slow
def test_the_run_manager_cancels_a_text_run_cooperatively_on_ray(tmp_path, ray_session):
    from auditlib.engine.text_runs import STOPPED_REASON, TextRunManager, TextUploads
    from auditlib.store import Store
    from auditlib.text_result_read import read_text_result

    spec = TextAuditSpec(
        model="gpt2-tiny", batch_size=B, length=N, attacks=("tag",), iterations=100_000
    )
    with Store(f"sqlite:///{tmp_path / 'audit.db'}") as store:
        manager = TextRunManager(store, instance="c" * 32)
        try:
            run_id = manager.start(spec, TextUploads(), owner="alice")
            # Cancel once TAG is under way (its first progress event stored); a cold worker
            # may take long to start on a loaded machine (``ray_waits``).
            began = time.monotonic()
            while time.monotonic() - began < WORKER_START_S:
                record = manager.runs.get(run_id)
                if record.live and record.live.get("stage") == "progress":
                    break
                manager.wait(run_id, 0.1)
            assert record.live and record.live.get("stage") == "progress", record
            manager.cancel(run_id)
            assert manager.wait(run_id, 60)  # well before the hard stop would be needed
            record = manager.runs.get(run_id)
            assert record.status == "cancelled" and record.error == STOPPED_REASON
            result = read_text_result(record.result)
            assert result.stopped and result.runs[0].stopped
            assert result.verdict.outcome in ("inconclusive", "leaks")
        finally:  # after a failure, no run of 100,000 steps left holding a worker
            manager.shutdown()
