"""DAGER on text models' updates: exact where its assumptions hold, and saying when not."""

from __future__ import annotations

import pytest
import torch

from auditlib.attacks.text.base import TextTarget
from auditlib.attacks.text.dager import DagerConfig, run_dager
from auditlib.attacks.text.gpt2_extend import second_layer_inputs
from auditlib.attacks.text.span import layer_inputs, layer_span
from auditlib.client.text_update import text_update
from auditlib.data.text_samples import TextRows, demo_batch, make_batch
from auditlib.errors import AuditInputError
from auditlib.models.text import build_text_model, with_lora


@pytest.fixture(scope="module")
def gpt2_tiny():
    return build_text_model("gpt2-tiny", seed=0)


def _rows(batch) -> set[tuple[int, ...]]:
    return {
        tuple(batch.input_ids[i, : int(batch.attention_mask[i].sum())].tolist())
        for i in range(batch.size)
    }


def test_the_closed_form_extension_is_the_models_own_second_layer_input(gpt2_tiny):
    torch.manual_seed(0)
    prefixes = torch.randint(0, 8000, (3, 5))
    tokens = torch.tensor([7, 99, 1000, 5])
    fast = second_layer_inputs(gpt2_tiny.backbone, prefixes, tokens)
    whole = torch.cat([prefixes.repeat_interleave(4, 0), tokens.repeat(3)[:, None]], 1)
    slow = layer_inputs(gpt2_tiny, 1, whole)[:, -1].view(3, 4, -1)
    assert torch.allclose(fast, slow, atol=1e-4)


def test_dager_recovers_a_decoder_batch_exactly_with_its_last_tokens(gpt2_tiny):
    batch = demo_batch(gpt2_tiny.tokenizer, 4, 16, seed=0)
    update = text_update(gpt2_tiny, batch)
    result = run_dager(TextTarget(gpt2_tiny, update, 4, 16))
    assert result.assumptions_hold is True
    assert set(result.token_ids) == _rows(batch)
    assert any("final LayerNorm" in note for note in result.notes)
    assert sorted(result.texts) == sorted(batch.texts)


def test_the_span_rank_counts_every_token_but_the_last_of_each_sequence(gpt2_tiny):
    batch = demo_batch(gpt2_tiny.tokenizer, 2, 8, seed=1)
    span = layer_span(gpt2_tiny, text_update(gpt2_tiny, batch), 0, 1e-7)
    distinct = {(p, t) for row in batch.input_ids.tolist() for p, t in enumerate(row[:-1])}
    assert span.rank == len(distinct)


def test_noise_breaks_the_exact_check_and_it_says_so(gpt2_tiny):
    batch = demo_batch(gpt2_tiny.tokenizer, 2, 12, seed=0)
    update = text_update(gpt2_tiny, batch)
    generator = torch.Generator().manual_seed(0)
    noisy = update.scaled(1.0)
    for grad in noisy.gradients.values():
        grad += 1e-5 * torch.randn(grad.shape, generator=generator)
    exact = run_dager(TextTarget(gpt2_tiny, noisy, 2, 12))
    assert exact.token_ids == () and exact.assumptions_hold is False
    ranked = run_dager(TextTarget(gpt2_tiny, noisy, 2, 12), DagerConfig(mode="ranked"))
    assert len(ranked.token_ids) == 2  # the attacker that knows the noise still answers


def test_dager_on_lora_adapters_says_its_assumptions_do_not_hold(gpt2_tiny):
    model = with_lora(gpt2_tiny, rank=4)
    batch = demo_batch(model.tokenizer, 2, 8, seed=0)
    update = text_update(model, batch)
    assert update.adapters_only
    result = run_dager(TextTarget(model, update, 2, 8))
    assert result.assumptions_hold is False
    assert any("LoRA" in note for note in result.notes)


def test_an_encoder_sequence_is_read_from_the_token_filter():
    model = build_text_model("bert-tiny", seed=0)
    batch = demo_batch(model.tokenizer, 1, 12, seed=2)
    result = run_dager(TextTarget(model, text_update(model, batch), 1, 12))
    tok = model.tokenizer
    private = [t for t in batch.input_ids[0].tolist() if t not in (tok.bos_id, tok.eos_id)]
    assert list(result.token_ids[0]) == private


def test_dager_config_refuses_values_out_of_range():
    with pytest.raises(AuditInputError):
        DagerConfig(token_threshold=0)
    with pytest.raises(AuditInputError):
        DagerConfig(mode="fuzzy")


NOTES = (
    "The patient was admitted with chest pain and shortness of breath.",
    "No known allergies.",
    "Discharged home on aspirin and a beta blocker, follow up in two weeks.",
)


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_sequences_of_different_lengths_come_back_whole_with_their_last_tokens(preset):
    """A short note is padded after its last token, which no loss reads: it is read from the
    final LayerNorm's (GPT-2) or the output head's (LLaMA) gradient at its own position."""
    model = build_text_model(preset, seed=0)
    batch = make_batch(model.tokenizer, TextRows(NOTES, None), 3, 16, seed=0)
    assert sorted(int(m.sum()) for m in batch.attention_mask)[0] < 16  # one is padded
    result = run_dager(TextTarget(model, text_update(model, batch), 3, 16))
    assert {tuple(ids) for ids in result.token_ids} == _rows(batch), result.texts
    assert any(n.startswith("last tokens read from") for n in result.notes), result.notes
