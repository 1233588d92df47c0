"""UTR on LoRA updates of a tiny GPT-2: it reads the adapters' update alone, recovers text
clearly better than a guess, reports its progress, and refuses what it cannot read."""

from __future__ import annotations

import pytest
import torch

from auditlib.attacks.text import TEXT_ATTACKS
from auditlib.attacks.text.base import TextTarget
from auditlib.attacks.text.utr import UtrConfig, run_utr
from auditlib.client.text_update import text_update
from auditlib.data.text_samples import demo_batch
from auditlib.errors import AuditInputError
from auditlib.metrics.text import score_text
from auditlib.models.text import build_text_model, with_lora

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
FAST = UtrConfig(refine_iterations=3, start_candidates=256)


@pytest.fixture(scope="module")
def lora_case():
    torch.manual_seed(0)
    model = with_lora(build_text_model("gpt2-tiny", seed=0), rank=8)
    batch = demo_batch(model.tokenizer, 2, 8, seed=0)
    update = text_update(model, batch)
    return model, batch, TextTarget(model, update, 2, 8)


def _random_guess_rouge1(model, batch) -> float:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.tokenizer.vocab_size, tuple(batch.input_ids.shape), generator=g)
    texts = [model.tokenizer.decode(r) for r in ids.tolist()]
    return score_text(batch.texts, batch.input_ids.tolist(), texts, ids.tolist()).rouge1


def test_first_round_update_carries_the_inputs_only_through_lora_B(lora_case):
    _, _, target = lora_case
    a = [g for k, g in target.update.gradients.items() if "lora_A" in k]
    b = [g for k, g in target.update.gradients.items() if "lora_B" in k]
    assert a and all(float(g.abs().max()) == 0 for g in a)
    assert all(float(g.norm()) > 0 for g in b)


def test_utr_recovers_text_from_lora_update_well_above_a_random_guess(lora_case):
    model, batch, target = lora_case
    events = []
    result = run_utr(target, FAST, on_progress=events.append)
    scores = score_text(batch.texts, batch.input_ids.tolist(), result.texts, result.token_ids)
    assert len(result.token_ids) == 2 and all(len(s) == 8 for s in result.token_ids)
    assert scores.rouge1 >= 0.15
    assert scores.rouge1 >= _random_guess_rouge1(model, batch) + 0.1
    assert any("first round" in note for note in result.notes)
    assert events and events[-1].note == "done" and events[-1].step == events[-1].total
    assert any(e.note == "greedy" for e in events)


def test_utr_reads_a_later_round_where_both_adapter_matrices_move():
    torch.manual_seed(0)
    model = with_lora(build_text_model("gpt2-tiny", seed=0), rank=4)
    with torch.no_grad():  # adapters after some training: B no longer zero
        for name, p in model.module.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.05)
    batch = demo_batch(model.tokenizer, 1, 6, seed=1)
    update = text_update(model, batch)
    assert all(float(g.norm()) > 0 for k, g in update.gradients.items() if "lora_A" in k)
    result = run_utr(
        TextTarget(model, update, 1, 6), UtrConfig(refine_iterations=1, start_candidates=128)
    )
    assert any("later round" in note for note in result.notes)
    assert len(result.token_ids) == 1 and len(result.token_ids[0]) == 6


def test_utr_refuses_an_update_without_adapters():
    model = build_text_model("gpt2-tiny", seed=0)
    batch = demo_batch(model.tokenizer, 1, 6, seed=0)
    target = TextTarget(model, text_update(model, batch), 1, 6)
    with pytest.raises(AuditInputError, match="LoRA adapters"):
        run_utr(target, FAST)


@pytest.mark.parametrize(
    "field, value",
    [("prior_weight", -0.1), ("bigram_weight", 1.0), ("start_candidates", 0),
     ("refine_iterations", -1), ("refine_proposals", 0), ("refine_seconds", 0.0)],
)  # fmt: skip
def test_utr_config_refuses_out_of_range_values(field, value):
    with pytest.raises(AuditInputError):
        UtrConfig(**{field: value})


def test_utr_is_in_the_text_attack_catalogue_as_an_adapter_attack():
    info = TEXT_ATTACKS["utr"]
    assert info.config is UtrConfig and info.adapters_update and not info.full_update
