"""The second layer's input of a prefix extended by one token in a decoder whose positions
rotate queries and keys (the LLaMA family: LLaMA, Qwen2), for many prefixes and tokens at
once, without running the prefixes again (DAGER's sequence filter's cost).

Layer 0's key and value at a position depend on that position's token and the position alone
(its input is the token's normalised embedding; the position rotates the key), so a prefix's
are computed once; a new token's output of layer 0 is then one query against them and its
own key. The layer's own modules are called (adapters, biases and grouped key-value heads
included), and ``tests/test_text_llama.py`` checks the result against the model's forward.
"""

from __future__ import annotations

import importlib

import torch


@torch.no_grad()
def rotary_second_layer_inputs(
    backbone, prefixes: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    """``prefixes`` (P x p token ids, p >= 0) each extended by every token of ``tokens``
    (T): layer 1's input at the new position, P x T x width."""
    core = backbone.model
    layer, nxt = core.layers[0], core.layers[1]
    attn = layer.self_attn
    config = backbone.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(attn, "head_dim", None) or config.hidden_size // heads
    scaling = getattr(attn, "scaling", head_dim**-0.5)
    rotate = importlib.import_module(type(layer).__module__).apply_rotary_pos_emb
    n_prefixes, p = prefixes.shape
    n_tokens = tokens.numel()
    table = core.embed_tokens.weight
    positions = torch.arange(p + 1, device=table.device).unsqueeze(0)
    cos, sin = core.rotary_emb(table[:1].unsqueeze(0), positions)

    def project(x: torch.Tensor, module, count: int) -> torch.Tensor:  # ... x n x count x hd
        return module(x).view(*x.shape[:-1], count, head_dim)

    # The new token at position p: its query, key and value (T x heads x hd).
    new_h = table[tokens]
    new_a = layer.input_layernorm(new_h)
    q = project(new_a, attn.q_proj, heads).unsqueeze(2)  # T x heads x 1 x hd
    k_new = project(new_a, attn.k_proj, kv_heads).unsqueeze(2)
    q, k_new = rotate(q, k_new, cos[:, p : p + 1], sin[:, p : p + 1])
    v_new = project(new_a, attn.v_proj, kv_heads)
    # The prefixes' keys and values at positions 0..p-1 (P x kv_heads x p x hd).
    pre_a = layer.input_layernorm(table[prefixes])
    k_pre = project(pre_a, attn.k_proj, kv_heads).transpose(1, 2)
    _, k_pre = rotate(k_pre, k_pre, cos[:, :p], sin[:, :p])
    v_pre = project(pre_a, attn.v_proj, kv_heads).transpose(1, 2)
    group = heads // kv_heads  # grouped-query attention: each key-value head serves a group
    k_pre, v_pre = k_pre.repeat_interleave(group, 1), v_pre.repeat_interleave(group, 1)
    k_new, v_new = k_new[:, :, 0].repeat_interleave(group, 1), v_new.repeat_interleave(group, 1)
    q = q[:, :, 0]  # T x heads x hd
    scores = torch.cat(
        [
            torch.einsum("thd,phkd->pthk", q, k_pre) * scaling,  # P x T x heads x p
            ((q * k_new).sum(-1) * scaling)[None, :, :, None].expand(n_prefixes, -1, -1, 1),
        ],
        dim=-1,
    )
    weights = scores.softmax(dim=-1)
    mixed = torch.einsum("pthk,phkd->pthd", weights[..., :p], v_pre) + weights[..., p:] * v_new
    out = attn.o_proj(mixed.reshape(n_prefixes, n_tokens, heads * head_dim))
    hidden = new_h + out
    hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return nxt.input_layernorm(hidden)
