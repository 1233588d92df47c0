"""Text models: ``transformers`` architectures, a decoder (GPT-2 family, next-token training)
and an encoder (BERT family, sequence classification), built from a preset with random
weights or read from the auditor's folder (config.json, model.safetensors, tokenizer.json)
without running any code from it; optionally wrapped in LoRA adapters (``peft``), the
backbone frozen.

Dropout is off: the client's update is computed as in the papers' experiments (TAG, LAMP,
DAGER), one deterministic pass; docs/ALGORITHMS.md says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as transformers_logging

from auditlib.data.text_tokenizer import TextTokenizer, demo_tokenizer, load_tokenizer
from auditlib.errors import AuditInputError

# transformers' advice (padding masks, loss names) is for its own users: our batches carry
# their masks, and the warnings would bury the audit's own lines.
transformers_logging.set_verbosity_error()

MAX_TEXT_PARAMETERS = 400_000_000
MAX_CONFIG_BYTES = 1024 * 1024
DECODER, ENCODER = "decoder", "encoder"

# name -> (family, layers, width, heads, feed-forward width); the papers' sizes, and a tiny one
# per family for tests.
PRESETS: dict[str, tuple[str, int, int, int, int]] = {
    "gpt2": (DECODER, 12, 768, 12, 3072),  # GPT-2 small (DAGER's, TAG's and LAMP's GPT-2)
    "gpt2-tiny": (DECODER, 2, 128, 2, 512),
    "bert-base": (ENCODER, 12, 768, 12, 3072),  # BERT-base (TAG, LAMP, DAGER)
    "tinybert": (ENCODER, 4, 312, 12, 1200),  # TinyBERT-4 (TAG, LAMP)
    "bert-tiny": (ENCODER, 2, 128, 2, 512),
}
LORA_TARGETS = {DECODER: ["c_attn"], ENCODER: ["query", "value"]}
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")  # an auditor's folder


@dataclass(frozen=True, eq=False)
class TextModel:
    """A text model and what an attacker who knows it (the server) knows."""

    module: torch.nn.Module  # GPT2LMHeadModel / BertForSequenceClassification, or its peft wrap
    tokenizer: TextTokenizer
    family: str  # DECODER or ENCODER
    name: str  # the preset's name, or "own"
    source: str  # where the weights came from, in words
    lora_rank: int | None = None  # None: every weight trains

    @property
    def backbone(self) -> torch.nn.Module:
        """The transformers model under any adapters (its embeddings and blocks)."""
        module = self.module
        return module.get_base_model() if hasattr(module, "get_base_model") else module

    @property
    def width(self) -> int:
        return int(self.backbone.config.hidden_size)

    @property
    def max_positions(self) -> int:
        config = self.backbone.config
        return int(getattr(config, "n_positions", None) or config.max_position_embeddings)


def _config(family: str, layers: int, width: int, heads: int, ff: int, tok: TextTokenizer):
    if family == DECODER:
        return GPT2Config(
            vocab_size=tok.vocab_size, n_positions=1024, n_embd=width, n_layer=layers,
            n_head=heads, n_inner=ff, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=tok.pad_id, eos_token_id=tok.pad_id, pad_token_id=tok.pad_id,
        )  # fmt: skip
    return BertConfig(
        vocab_size=tok.vocab_size, hidden_size=width, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=ff, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=tok.pad_id, num_labels=2,
    )  # fmt: skip


def _module(family: str, config) -> torch.nn.Module:
    cls = GPT2LMHeadModel if family == DECODER else BertForSequenceClassification
    return cls(config).eval()


def build_text_model(preset: str, seed: int = 0) -> TextModel:
    """The preset's architecture with random weights (seeded) and the demo tokenizer."""
    if preset not in PRESETS:
        raise AuditInputError(f"text model {preset!r}; expected one of {', '.join(PRESETS)}")
    family, layers, width, heads, ff = PRESETS[preset]
    tok = demo_tokenizer("bpe" if family == DECODER else "wordpiece")
    torch.manual_seed(seed)
    module = _module(family, _config(family, layers, width, heads, ff, tok))
    return TextModel(module, tok, family, preset, f"{preset}, random weights (seed {seed})")


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
        raise AuditInputError(
            f"{folder}: expected a config.json of at most {MAX_CONFIG_BYTES} bytes there"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AuditInputError(f"{path.name}: not JSON ({exc})") from None
    if not isinstance(config, dict) or config.get("model_type") not in ("gpt2", "bert"):
        raise AuditInputError(
            f"{path.name}: model_type {config.get('model_type') if isinstance(config, dict) else None!r}; "
            "expected 'gpt2' (a decoder) or 'bert' (an encoder)"
        )
    # Code a config could name is never run: auto_map and remote code are ignored, and only
    # the two known classes are built.
    config.pop("auto_map", None)
    return config


def load_text_model(folder: Path) -> TextModel:
    """The auditor's own text model: config.json, model.safetensors and tokenizer.json."""
    folder = Path(folder)
    config_dict = _read_config(folder)
    tok = load_tokenizer(folder / "tokenizer.json")
    family = DECODER if config_dict["model_type"] == "gpt2" else ENCODER
    config_cls = GPT2Config if family == DECODER else BertConfig
    try:
        config = config_cls.from_dict(config_dict)
    except (TypeError, ValueError) as exc:
        raise AuditInputError(f"config.json: not a valid {config_cls.__name__} ({exc})") from None
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob",
                "attention_probs_dropout_prob"):  # fmt: skip
        if hasattr(config, key):
            setattr(config, key, 0.0)
    if config.vocab_size != tok.vocab_size:
        raise AuditInputError(
            f"config.json says {config.vocab_size} tokens and tokenizer.json has "
            f"{tok.vocab_size}; expected the same"
        )
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise AuditInputError(f"{folder}: expected model.safetensors (pickled weights are refused)")
    with torch.device("meta"):
        probe = _module(family, config)
    count = sum(p.numel() for p in probe.parameters())
    if count > MAX_TEXT_PARAMETERS:
        raise AuditInputError(f"{count:,} parameters; at most {MAX_TEXT_PARAMETERS:,} are audited")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise AuditInputError(f"model.safetensors: not a safetensors file ({exc})") from None
    module = _module(family, config)
    missing, unexpected = module.load_state_dict(state, strict=False)
    allowed_missing = {"lm_head.weight"} if family == DECODER else set()
    untrained = [k for k in missing if k.startswith(("classifier.", "bert.pooler."))]
    left = [k for k in missing if k not in allowed_missing and k not in untrained]
    if left or unexpected:
        raise AuditInputError(
            f"model.safetensors does not fit config.json: missing {left[:3]}, "
            f"unexpected {list(unexpected)[:3]}"
        )
    if family == DECODER:
        module.tie_weights()
    source = f"the auditor's model in {folder.name}"
    if untrained:
        source += " (its classification head is not in the file: random, seeded)"
    return TextModel(module.eval(), tok, family, "own", source)


def with_lora(model: TextModel, rank: int = 8, alpha: int = 16) -> TextModel:
    """The model with LoRA adapters on its attention (peft); only the adapters train."""
    from peft import LoraConfig, get_peft_model

    if not 1 <= rank <= 256:
        raise AuditInputError(f"LoRA rank {rank}; expected 1 to 256")
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=LORA_TARGETS[model.family],
        fan_in_fan_out=model.family == DECODER,
    )  # fmt: skip
    wrapped = get_peft_model(model.backbone, config).eval()
    return replace(
        model, module=wrapped, lora_rank=rank, source=model.source + f", LoRA rank {rank}"
    )
