"""Text models: ``transformers`` architectures, decoders trained on next-token prediction
(the GPT-2 family, and the LLaMA family: LLaMA and Qwen2, rotary positions and RMSNorm) and
an encoder (the BERT family, sequence classification), built from a preset with random
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
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.utils import logging as transformers_logging

from auditlib.data.text_tokenizer import TextTokenizer, demo_tokenizer, load_tokenizer
from auditlib.errors import AuditInputError

# transformers' advice (padding masks, loss names) is for its own users: our batches carry
# their masks, and the warnings would bury the audit's own lines.
transformers_logging.set_verbosity_error()

MAX_TEXT_PARAMETERS = 800_000_000  # an audit at the limit peaks at 14 GB (PERFORMANCE.md)
MAX_TEXT_LAYERS = 256
MAX_CONFIG_BYTES = 1024 * 1024
DECODER, ENCODER = "decoder", "encoder"


@dataclass(frozen=True)
class Architecture:
    """One ``transformers`` architecture the audit builds: its config.json ``model_type``,
    classes, family, and the projections LoRA adapts (each family's usual choice)."""

    model_type: str
    config_class: type
    model_class: type
    family: str  # DECODER or ENCODER
    lora_targets: tuple[str, ...]
    rotary: bool = False  # positions rotate queries and keys; no position embedding is added


ARCHITECTURES: dict[str, Architecture] = {
    a.model_type: a
    for a in (
        Architecture("gpt2", GPT2Config, GPT2LMHeadModel, DECODER, ("c_attn",)),
        Architecture(
            "bert", BertConfig, BertForSequenceClassification, ENCODER, ("query", "value")
        ),
        Architecture("llama", LlamaConfig, LlamaForCausalLM, DECODER, ("q_proj", "v_proj"), True),
        Architecture("qwen2", Qwen2Config, Qwen2ForCausalLM, DECODER, ("q_proj", "v_proj"), True),
    )
}

# name -> (model_type, layers, width, heads, feed-forward width); the papers' sizes, and a
# tiny one per architecture for tests.
PRESETS: dict[str, tuple[str, int, int, int, int]] = {
    "gpt2": ("gpt2", 12, 768, 12, 3072),  # GPT-2 small (DAGER's, TAG's and LAMP's GPT-2)
    "gpt2-tiny": ("gpt2", 2, 128, 2, 512),
    "bert-base": ("bert", 12, 768, 12, 3072),  # BERT-base (TAG, LAMP, DAGER)
    "tinybert": ("bert", 4, 312, 12, 1200),  # TinyBERT-4 (TAG, LAMP)
    "bert-tiny": ("bert", 2, 128, 2, 512),
    # The LLaMA architecture (DAGER's LLaMA-2, UTR's and federated fine-tuning's family) at
    # GPT-2 small's size, and a tiny one.
    "llama-small": ("llama", 12, 768, 12, 2048),
    "llama-tiny": ("llama", 2, 128, 4, 344),
}
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")  # an auditor's folder


@dataclass(frozen=True, eq=False)
class TextModel:
    """A text model and what an attacker who knows it (the server) knows."""

    module: torch.nn.Module  # the architecture's model class (ARCHITECTURES), or its peft wrap
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
    def architecture(self) -> Architecture:
        return ARCHITECTURES[self.backbone.config.model_type]

    @property
    def width(self) -> int:
        return int(self.backbone.config.hidden_size)

    @property
    def device(self) -> torch.device:
        """Where the model's weights are: the attacks make their tensors there."""
        return next(self.module.parameters()).device

    @property
    def max_positions(self) -> int:
        config = self.backbone.config
        return int(getattr(config, "n_positions", None) or config.max_position_embeddings)


def _config(model_type: str, layers: int, width: int, heads: int, ff: int, tok: TextTokenizer):
    if model_type == "gpt2":
        return GPT2Config(
            vocab_size=tok.vocab_size, n_positions=1024, n_embd=width, n_layer=layers,
            n_head=heads, n_inner=ff, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=tok.pad_id, eos_token_id=tok.pad_id, pad_token_id=tok.pad_id,
        )  # fmt: skip
    if model_type == "llama":
        return LlamaConfig(
            vocab_size=tok.vocab_size, hidden_size=width, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads, intermediate_size=ff,
            max_position_embeddings=1024, attention_dropout=0.0, tie_word_embeddings=False,
            bos_token_id=tok.pad_id, eos_token_id=tok.pad_id, pad_token_id=tok.pad_id,
        )  # fmt: skip
    return BertConfig(
        vocab_size=tok.vocab_size, hidden_size=width, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=ff, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=tok.pad_id, num_labels=2,
    )  # fmt: skip


def _module(model_type: str, config) -> torch.nn.Module:
    return ARCHITECTURES[model_type].model_class(config).eval()


def build_text_model(preset: str, seed: int = 0) -> TextModel:
    """The preset's architecture with random weights (seeded) and the demo tokenizer."""
    if preset not in PRESETS:
        raise AuditInputError(f"text model {preset!r}; expected one of {', '.join(PRESETS)}")
    model_type, layers, width, heads, ff = PRESETS[preset]
    family = ARCHITECTURES[model_type].family
    tok = demo_tokenizer("bpe" if family == DECODER else "wordpiece")
    torch.manual_seed(seed)
    module = _module(model_type, _config(model_type, layers, width, heads, ff, tok))
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
    if not isinstance(config, dict) or config.get("model_type") not in ARCHITECTURES:
        raise AuditInputError(
            f"{path.name}: model_type {config.get('model_type') if isinstance(config, dict) else None!r}; "
            "expected 'gpt2', 'llama' or 'qwen2' (decoders) or 'bert' (an encoder)"
        )
    # Code a config could name is never run: auto_map and remote code are ignored, and only
    # the known classes are built.
    config.pop("auto_map", None)
    return config


def load_text_model(folder: Path) -> TextModel:
    """The auditor's own text model: config.json, model.safetensors and tokenizer.json."""
    folder = Path(folder)
    config_dict = _read_config(folder)
    tok = load_tokenizer(folder / "tokenizer.json")
    architecture = ARCHITECTURES[config_dict["model_type"]]
    family, config_cls = architecture.family, architecture.config_class
    # Before transformers reads it: its config fills a list a layer long, and the meta build
    # below makes a module object a layer, however large the count.
    for key in ("num_hidden_layers", "n_layer"):
        layers = config_dict.get(key, 1)
        if type(layers) is not int or not 0 < layers <= MAX_TEXT_LAYERS:
            raise AuditInputError(f"config.json: {key} {layers!r}; expected 1 to {MAX_TEXT_LAYERS}")
    try:  # transformers' own checks (StrictDataclassError: a field against another)
        config = config_cls.from_dict(config_dict)
    except (TypeError, ValueError, StrictDataclassError) as exc:
        reason = exc.__cause__ if isinstance(exc, StrictDataclassError) and exc.__cause__ else exc
        raise AuditInputError(
            f"config.json: not a valid {config_cls.__name__} ({reason})"
        ) from None
    try:
        with torch.device("meta"):  # the shapes it implies, before any weight is read
            probe = _module(architecture.model_type, config)
    except (TypeError, ValueError, RuntimeError) as exc:  # BERT: a width its heads do not divide
        raise AuditInputError(f"config.json: not a valid {config_cls.__name__} ({exc})") from None
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob",
                "attention_probs_dropout_prob", "attention_dropout"):  # fmt: skip
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
    count = sum(p.numel() for p in probe.parameters())
    if count > MAX_TEXT_PARAMETERS:
        raise AuditInputError(f"{count:,} parameters; at most {MAX_TEXT_PARAMETERS:,} are audited")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise AuditInputError(f"model.safetensors: not a safetensors file ({exc})") from None
    module = _module(architecture.model_type, config)
    missing, unexpected = module.load_state_dict(state, strict=False)
    # A decoder whose head is its token table (tied) is saved without it.
    tied = family == DECODER and getattr(config, "tie_word_embeddings", True)
    allowed_missing = {"lm_head.weight"} if tied else set()
    untrained = [k for k in missing if k.startswith(("classifier.", "bert.pooler."))]
    left = [k for k in missing if k not in allowed_missing and k not in untrained]
    if left or unexpected:
        raise AuditInputError(
            f"model.safetensors does not fit config.json: missing {left[:3]}, "
            f"unexpected {list(unexpected)[:3]}"
        )
    if tied:
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
        r=rank, lora_alpha=alpha, lora_dropout=0.0,
        target_modules=list(model.architecture.lora_targets),
        fan_in_fan_out=model.architecture.model_type == "gpt2",  # GPT-2's Conv1D: in x out
    )  # fmt: skip
    wrapped = get_peft_model(model.backbone, config).eval()
    return replace(
        model, module=wrapped, lora_rank=rank, source=model.source + f", LoRA rank {rank}"
    )
