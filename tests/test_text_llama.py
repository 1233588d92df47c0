"""The LLaMA family (LLaMA, Qwen2: rotary positions, RMSNorm, separate query, key and value
projections, an untied or tied output head) through the text audit: built from a preset or
read from the auditor's folder without code, DAGER exact on it (the batch's tokens, its
openings, the sequence filter in closed form, the last tokens from the output head), and
LoRA on its query and value projections."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen2Config, Qwen2ForCausalLM

from auditlib.attacks.text.base import TextTarget
from auditlib.attacks.text.dager import run_dager
from auditlib.attacks.text.rotary_extend import rotary_second_layer_inputs
from auditlib.attacks.text.span import layer_inputs
from auditlib.client.text_update import text_update
from auditlib.data.text_samples import demo_batch
from auditlib.data.text_tokenizer import demo_tokenizer
from auditlib.engine.text_audit import TextAuditSpec, run_text_audit
from auditlib.errors import AuditInputError
from auditlib.metrics.text import score_text
from auditlib.models.text import build_text_model, load_text_model, with_lora


def _qwen2_folder(folder, *, tied: bool) -> None:
    """An auditor's Qwen2 folder: grouped key-value heads (4 queries, 2 keys and values),
    biased projections, the demo tokenizer; config.json, model.safetensors, tokenizer.json."""
    tok = demo_tokenizer("bpe")
    config = Qwen2Config(
        vocab_size=tok.vocab_size, hidden_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=256,
        max_position_embeddings=256, tie_word_embeddings=tied, pad_token_id=tok.pad_id,
        bos_token_id=tok.pad_id, eos_token_id=tok.pad_id,
    )  # fmt: skip
    torch.manual_seed(5)
    module = Qwen2ForCausalLM(config)
    with torch.no_grad():  # biases drawn, so the closed form is checked with them
        for layer in module.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.1)
    state = {k: v.contiguous() for k, v in module.state_dict().items()}
    if tied:
        state.pop("lm_head.weight")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config.to_json_string())
    save_file(state, str(folder / "model.safetensors"))
    tok.tokenizer.save(str(folder / "tokenizer.json"))


def _ids(model, size: int, length: int):
    batch = demo_batch(model.tokenizer, size, length, seed=0)
    return batch, [row.tolist() for row in batch.input_ids]


@pytest.mark.parametrize("which", ["llama-tiny", "qwen2-gqa"])
def test_the_closed_form_second_layer_input_is_the_models_own_forward(which, tmp_path):
    if which == "llama-tiny":
        model = build_text_model("llama-tiny")
    else:
        _qwen2_folder(tmp_path / "qwen", tied=False)
        model = load_text_model(tmp_path / "qwen")
    ids = torch.tensor([[5, 77, 300, 12, 9], [9, 8, 7, 6, 5]])
    forward = layer_inputs(model, 1, ids)  # B x n x width, through the model's forward
    for p in (1, 2, 4):
        closed = rotary_second_layer_inputs(model.backbone, ids[:, :p], ids[:, p])
        for row in range(2):
            assert torch.allclose(closed[row, row], forward[row, p], atol=1e-5), (p, row)


def test_dager_recovers_a_llama_batch_exactly_with_its_openings_and_last_tokens():
    model = build_text_model("llama-tiny")
    batch, private = _ids(model, 4, 16)
    result = run_dager(TextTarget(model, text_update(model, batch), 4, 16))
    scores = score_text(batch.texts, private, result.texts, result.token_ids)
    assert scores.exact == 4 and scores.rouge2 == 1.0, result.texts
    assert result.assumptions_hold is True
    assert "k_proj" in result.notes[0] and "v_proj" in result.notes[0]  # the first position's
    assert any("output head's gradient" in n for n in result.notes), result.notes
    assert len(result.token_ids) == 4  # no opening but the four verses' own


@pytest.mark.parametrize("tied", [False, True])
def test_an_auditors_qwen2_folder_is_read_without_code_and_dager_reads_its_update(tmp_path, tied):
    _qwen2_folder(tmp_path / "qwen", tied=tied)
    model = load_text_model(tmp_path / "qwen")
    assert model.family == "decoder" and model.architecture.model_type == "qwen2"
    assert model.architecture.rotary and model.source.startswith("the auditor's model in qwen")
    batch, private = _ids(model, 3, 12)
    result = run_dager(TextTarget(model, text_update(model, batch), 3, 12))
    scores = score_text(batch.texts, private, result.texts, result.token_ids)
    assert scores.exact == 3, (batch.texts, result.texts)


def test_an_architecture_outside_the_four_is_refused_naming_them(tmp_path):
    _qwen2_folder(tmp_path / "qwen", tied=False)
    config = tmp_path / "qwen" / "config.json"
    config.write_text(config.read_text().replace('"qwen2"', '"mistral"'))
    with pytest.raises(AuditInputError, match="'gpt2', 'llama' or 'qwen2'"):
        load_text_model(tmp_path / "qwen")


def test_a_folder_past_the_size_limit_is_refused_before_its_weights_are_read(tmp_path):
    _qwen2_folder(tmp_path / "big", tied=True)
    config = json.loads((tmp_path / "big" / "config.json").read_text())
    # 16 layers of width 2048 (61M parameters each): past the 800M, where GPT2-Large (774M) fits
    config.update(hidden_size=2048, num_hidden_layers=16, intermediate_size=8192,
                  num_attention_heads=16, num_key_value_heads=4)  # fmt: skip
    config.pop("layer_types")  # one per layer: transformers fills them in
    (tmp_path / "big" / "config.json").write_text(json.dumps(config))
    (tmp_path / "big" / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(
        AuditInputError, match=r"^989,972,480 parameters; at most 800,000,000 are audited"
    ):
        load_text_model(tmp_path / "big")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"num_hidden_layers": 3}, r"not a valid Qwen2Config \(`num_hidden_layers` \(3\) must"),
        ({"num_hidden_layers": 10**7}, r"num_hidden_layers 10000000; expected 1 to 256"),
        ({"num_hidden_layers": "2"}, r"num_hidden_layers '2'; expected 1 to 256"),
    ],
)
def test_a_config_at_odds_with_itself_is_refused_in_one_line(tmp_path, change, said):
    _qwen2_folder(tmp_path / "odd", tied=True)
    config = json.loads((tmp_path / "odd" / "config.json").read_text())
    (tmp_path / "odd" / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(AuditInputError, match=said):
        load_text_model(tmp_path / "odd")


def test_lora_on_llama_adapts_its_query_and_value_and_dager_says_the_span_does_not_hold():
    model = with_lora(build_text_model("llama-tiny"), rank=4)
    batch, _ = _ids(model, 2, 12)
    update = text_update(model, batch)
    adapted = {name.split(".self_attn.")[1].split(".")[0] for name in update.gradients}
    assert adapted == {"q_proj", "v_proj"} and update.adapters_only
    result = run_dager(TextTarget(model, update, 2, 12))
    assert result.assumptions_hold is False
    assert any("only LoRA adapters train" in n for n in result.notes)


def test_the_text_audit_of_a_llama_preset_is_a_finding():
    result = run_text_audit(TextAuditSpec(model="llama-tiny", batch_size=2, length=12))
    [run] = result.runs
    assert run.attack == "dager" and run.scores.exact == 2
    assert result.verdict.outcome == "leaks" and result.verdict.level == "Very High"
