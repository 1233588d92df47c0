"""The span signal of self-attention gradients (DAGER's, and TIGER's continuous form of it).

A linear layer's weight gradient is a sum of outer products of its inputs with the errors
sent back to it, so the inputs' span contains every column the gradient has on its input
side: with fewer tokens in the batch than the model's width, a vector is one of the layer's
inputs only if it lies in that low-rank span. This module finds the span of the first
attention layers' query projections in an update, and what a candidate token or sequence
gives those layers as input.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from auditlib.client.text_update import TextUpdate
from auditlib.models.text import TextModel


@dataclass(frozen=True, eq=False)
class LayerSpan:
    """An orthonormal basis (in x rank) of the span of a layer's inputs, as the update shows."""

    layer: int
    basis: torch.Tensor  # float64
    rank: int
    width: int
    source: str  # the update's parameter the span is read from
    singular_values: torch.Tensor


class _Stop(Exception):
    pass


def _attention_stem(model: TextModel, layer: int) -> str:
    """The name of the projection whose input is what layer ``layer`` attends over."""
    model_type = model.architecture.model_type
    if model_type == "gpt2":
        return f"transformer.h.{layer}.attn.c_attn"
    if model_type == "bert":
        return f"bert.encoder.layer.{layer}.attention.self.query"
    return f"model.layers.{layer}.self_attn.q_proj"  # the LLaMA family


def attention_input_module(model: TextModel, layer: int) -> torch.nn.Module:
    """The projection whose input is what layer ``layer`` attends over (its query's)."""
    return model.backbone.get_submodule(_attention_stem(model, layer))


def _projection_stems(model: TextModel, layer: int, queries_only: bool) -> list[str]:
    """The projections that read the layer's input: GPT-2's one (queries, keys and values
    together), BERT's query, and the LLaMA family's three. There a position's query has no
    gradient where the causal softmax has one term (the first position), so its input is
    in the span of the keys' and values' gradients only; ``queries_only`` keeps the query's
    alone (the positions after the first: what the sequence filter tests)."""
    stem = _attention_stem(model, layer)
    if not model.architecture.rotary or queries_only:
        return [stem]
    return [stem, stem.replace(".q_proj", ".k_proj"), stem.replace(".q_proj", ".v_proj")]


def _gradient_for(
    model: TextModel, update: TextUpdate, layer: int, queries_only: bool = False
) -> tuple[str, torch.Tensor, int]:
    """The update's gradient whose input-side span is the layer's inputs: the weight's own,
    or with LoRA its A matrix's (rank at most the adapters' rank); and the input axis. Where
    several projections read the input, their gradients side by side (out axes joined)."""
    stems = _projection_stems(model, layer, queries_only)
    conv1d = model.architecture.model_type == "gpt2"  # in x out; Linear's is out x in
    grads = update.gradients
    full = [
        (name, grad)
        for stem in stems
        for name, grad in grads.items()
        if name.endswith(stem + ".weight") or name.endswith(stem + ".base_layer.weight")
    ]
    if full:
        if conv1d:
            return full[0][0], full[0][1], 0
        return ", ".join(n for n, _ in full), torch.cat([g for _, g in full], dim=0), 1
    adapters = [
        (name, grad) for stem in stems for name, grad in grads.items() if stem + ".lora_A" in name
    ]
    if adapters:  # lora_A is a Linear (rank x in)
        return ", ".join(n for n, _ in adapters), torch.cat([g for _, g in adapters], dim=0), 1
    raise KeyError(f"the update has no gradient for layer {layer}'s attention input ({stems[0]})")


def layer_span(
    model: TextModel,
    update: TextUpdate,
    layer: int,
    rank_tolerance: float,
    rank: int | None = None,
    queries_only: bool = False,
) -> LayerSpan:
    """The span of layer ``layer``'s inputs. Its rank is the count of singular values above
    ``rank_tolerance`` times the largest, unless ``rank`` is given. ``queries_only``: read
    from the query projection alone where the LLaMA family has three (``_projection_stems``)."""
    name, grad, in_axis = _gradient_for(model, update, layer, queries_only)
    m = grad.detach().to(torch.float64)
    m = m if in_axis == 0 else m.T
    u, s, _ = torch.linalg.svd(m, full_matrices=False)
    if rank is None:
        rank = int((s > rank_tolerance * s[0]).sum()) if s.numel() and s[0] > 0 else 0
    rank = min(rank, u.shape[1])
    return LayerSpan(layer, u[:, :rank].contiguous(), rank, m.shape[0], name, s)


def above_noise(span: LayerSpan, known: int, noise_floor: float) -> LayerSpan:
    """The span cut to the singular values above the noise floor: ``noise_floor`` times the
    first value past ``known``, the token count the server knows (at least the inputs' span's
    rank, so that value is noise's). More tokens than the width: nothing is surely noise."""
    s = span.singular_values
    if known >= s.numel():
        return span
    floor = noise_floor * float(s[known])
    rank = max(1, min(int((s > floor).sum()), known, span.basis.shape[1]))
    return replace(span, basis=span.basis[:, :rank], rank=rank)


def relative_residual(span: LayerSpan, vectors: torch.Tensor) -> torch.Tensor:
    """Each vector scaled to length 1 (float64), less its projection on the span: the part
    of it the span does not hold."""
    v = vectors.to(torch.float64)
    v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    return v - (v @ span.basis) @ span.basis.T


def distance_to_span(span: LayerSpan, vectors: torch.Tensor) -> torch.Tensor:
    """Each vector's distance to the span, relative to its length (0: inside, 1: orthogonal)."""
    if span.rank == 0:
        return torch.ones(vectors.shape[:-1], dtype=torch.float64, device=vectors.device)
    return relative_residual(span, vectors).norm(dim=-1)


@torch.no_grad()
def first_layer_inputs(model: TextModel, position: int) -> torch.Tensor:
    """What the first attention layer gets for every token of the vocabulary at
    ``position`` (vocabulary x width): token and position embeddings, normalised. Where
    positions rotate queries and keys (the LLaMA family) no position is added: the input is
    the token's normalised embedding, the same at every position."""
    backbone = model.backbone
    model_type = model.architecture.model_type
    if model_type == "gpt2":
        t = backbone.transformer
        return t.h[0].ln_1(t.wte.weight + t.wpe.weight[position])
    if model.architecture.rotary:
        core = backbone.model
        return core.layers[0].input_layernorm(core.embed_tokens.weight)
    vocab, device = backbone.config.vocab_size, model.device
    ids = torch.arange(vocab, device=device).unsqueeze(1)
    positions = torch.full((vocab, 1), position, dtype=torch.int64, device=device)
    return backbone.bert.embeddings(input_ids=ids, position_ids=positions)[:, 0]


def first_layer_distances(
    model: TextModel, span: LayerSpan, positions: range | tuple[int, ...]
) -> dict[int, torch.Tensor]:
    """Per position, every vocabulary token's first-layer input's distance to ``span``
    (``distance_to_span``). Where positions rotate the input carries no position: computed
    once, each position given its own copy."""
    if model.architecture.rotary:
        same = distance_to_span(span, first_layer_inputs(model, 0))
        return {p: same.clone() for p in positions}
    return {p: distance_to_span(span, first_layer_inputs(model, p)) for p in positions}


def attention_inputs(
    model: TextModel,
    layers: int,
    *,
    input_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """What the first ``layers`` attention layers get for each token (each B x n x width),
    from token ids or input embeddings; the forward pass stops there, its graph kept."""
    captured: list[torch.Tensor] = []

    def grab(_module, args):
        captured.append(args[0])
        if len(captured) == layers:
            raise _Stop

    handles = [
        attention_input_module(model, layer).register_forward_pre_hook(grab)
        for layer in range(layers)
    ]
    given = input_ids if input_ids is not None else inputs_embeds
    if attention_mask is None:
        attention_mask = torch.ones(given.shape[:2], dtype=torch.int64, device=given.device)
    try:
        model.backbone(
            input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    return captured


@torch.no_grad()
def layer_inputs(
    model: TextModel,
    layer: int,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """What attention layer ``layer`` gets for each token of ``input_ids`` (B x n x width)."""
    inputs = attention_inputs(model, layer + 1, input_ids=input_ids, attention_mask=attention_mask)
    return inputs[layer]
