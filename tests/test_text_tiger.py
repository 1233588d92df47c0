"""TIGER's continuous span objective: it recovers what DAGER's exact check recovers, keeps
recovering where noise leaves that check nothing to test, and counts in the verdict as the
attacker that knows the noise."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditlib.attacks.text.base import TextTarget
from auditlib.attacks.text.dager import run_dager
from auditlib.attacks.text.span import attention_inputs
from auditlib.attacks.text.tiger import TigerConfig, _problem, _row_losses, run_tiger
from auditlib.client.text_update import text_update
from auditlib.data.text_samples import TextRows, demo_batch, make_batch
from auditlib.defenses import build_defense
from auditlib.engine.text_audit import TextAuditSpec, defended, run_text_audit
from auditlib.errors import AuditInputError
from auditlib.metrics.text import score_text
from auditlib.models.text import build_text_model

FEW = TigerConfig(steps=200)  # enough at this size (100 recovered it all)


@pytest.fixture(scope="module")
def tiny():
    model = build_text_model("gpt2-tiny", seed=0)
    batch = demo_batch(model.tokenizer, 2, 8, seed=0)
    return model, batch, text_update(model, batch)


def _noised(update, sigma: float):
    """The update under dp-gaussian (clip 30), the noise drawn as the text audit draws it."""
    return defended(
        build_defense("dp-gaussian", {"sigma": str(sigma), "clip": "30"})[0], 0, update
    )[0]


def _scores(batch, recovered):
    return score_text(batch.texts, batch.input_ids.tolist(), recovered.texts, recovered.token_ids)


def test_tiger_recovers_an_undefended_decoder_batch(tiny):
    model, batch, update = tiny
    seen = []
    recovered = run_tiger(TextTarget(model, update, 2, 8), FEW, on_progress=seen.append)
    scores = _scores(batch, recovered)
    assert scores.exact >= 1 and scores.token_accuracy >= 0.8
    assert recovered.assumptions_hold is None  # an optimisation claims no exactness
    assert seen[-1].note == "done" and len(seen) > 2 and seen[0].texts
    assert any("last tokens read" in n for n in recovered.notes)


def test_under_noise_the_exact_check_tests_nothing_and_tiger_still_recovers(tiny):
    model, batch, update = tiny
    target = TextTarget(model, _noised(update, 1e-4), 2, 8)
    exact = run_dager(target)
    assert exact.token_ids == () and exact.assumptions_hold is False
    assert _scores(batch, run_tiger(target, FEW)).rouge1 >= 0.8


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_the_true_batch_is_at_the_objectives_floor(preset):
    """Where positions rotate, the spans past the first are read from the queries alone and
    the first position's query has no gradient: its input is not asked to lie in them
    (otherwise the true batch scored 0.02 to 0.03 on llama-tiny and was not the minimum)."""
    model = build_text_model(preset, seed=0)
    batch = demo_batch(model.tokenizer, 2, 12, seed=0)
    problem = _problem(TextTarget(model, text_update(model, batch), 2, 12), TigerConfig())
    embeds = model.backbone.get_input_embeddings()(batch.input_ids).detach()
    inputs = attention_inputs(model, len(problem.spans), inputs_embeds=embeds)
    assert float(_row_losses(problem, inputs).max()) < 1e-9


def test_a_rotary_model_reads_its_own_count_of_layers():
    """Where positions rotate the first layer orders nothing, so TIGER reads `rotary_layers`
    there (3 by default: llama-small 16 x 32 went from ROUGE-1 0.22 to 0.40) and `layers`
    elsewhere (GPT-2 small gained nothing from a third)."""
    config = TigerConfig(layers=1, rotary_layers=2)
    spans = {}
    for preset in ("gpt2-tiny", "llama-tiny"):
        model = build_text_model(preset, seed=0)
        batch = demo_batch(model.tokenizer, 2, 12, seed=0)
        target = TextTarget(model, text_update(model, batch), 2, 12)
        spans[preset] = len(_problem(target, config).spans)
    assert spans == {"gpt2-tiny": 1, "llama-tiny": 2}


def test_verses_that_share_their_opening_are_each_sought_not_found_twice():
    model = build_text_model("gpt2-tiny", seed=0)
    verses = (
        "Verily I say unto you, Among them that are born of women there hath not risen",
        "Verily I say unto you, Whatsoever ye shall bind on earth shall be bound in heaven",
        "And he arose, and came to his father. But when he was yet a great way off",
    )
    batch = make_batch(model.tokenizer, TextRows(verses, None), 3, 12, seed=0, full_only=True)
    target = TextTarget(model, text_update(model, batch), 3, 12)
    recovered = run_tiger(target, replace(FEW, rounds=2))
    assert len(set(recovered.token_ids)) == 3  # one start per verse, none found twice
    assert _scores(batch, recovered).token_accuracy >= 0.75
    assert any("2 round(s)" in n for n in recovered.notes)


def test_tiger_is_the_attacker_that_knows_the_noise_in_the_verdict():
    result = run_text_audit(
        TextAuditSpec(
            model="gpt2-tiny",
            batch_size=2,
            length=8,
            attacks=("tiger",),
            defense="dp-gaussian",
            defense_params={"sigma": "1e-4", "clip": "30"},
            iterations=200,
        )
    )
    assert [r.attack for r in result.runs] == ["tiger"]
    assert result.verdict.adaptive == "ran"
    assert result.verdict.outcome == "leaks"  # it broke the noised update


def test_tiger_settings_out_of_range_are_refused():
    with pytest.raises(AuditInputError, match=r"steps|candidates"):
        TigerConfig(steps=0)
    with pytest.raises(AuditInputError, match=r"steps|candidates"):
        TigerConfig(candidates=1)
