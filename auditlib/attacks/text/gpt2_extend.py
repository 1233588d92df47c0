"""The second layer's input of a GPT-2 prefix extended by one token, for many prefixes and
tokens at once, without running the prefixes again (DAGER's sequence filter's cost).

Block 0's keys and values at a position depend on that position's token alone (its input is
the embeddings), so a prefix's are computed from its tokens directly; a new token's output
of block 0 is then one query against them. The same modules as the model's forward are
called (adapters included), and ``tests/test_text_dager.py`` checks the result against it.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def second_layer_inputs(backbone, prefixes: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``prefixes`` (P x p token ids, p >= 0) each extended by every token of ``tokens``
    (T): layer 1's input at the new position, P x T x width."""
    t = backbone.transformer
    block, nxt = t.h[0], t.h[1]
    heads = block.attn.num_heads
    p_count, length = prefixes.shape
    width = t.wte.weight.shape[1]
    head_dim = width // heads

    def qkv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = block.attn.c_attn(block.ln_1(x)).split(width, dim=-1)
        shape = (*x.shape[:-1], heads, head_dim)
        return q.view(shape), k.view(shape), v.view(shape)

    new_x = t.wte.weight[tokens] + t.wpe.weight[length]  # T x d
    q_new, k_new, v_new = qkv(new_x)  # T x h x hd
    scale = head_dim**-0.5
    self_score = (q_new * k_new).sum(-1) * scale  # T x h
    if length:
        _, k_pre, v_pre = qkv(t.wte.weight[prefixes] + t.wpe.weight[:length])  # P x p x h x hd
        pre_score = torch.einsum("thd,pjhd->pthj", q_new, k_pre) * scale  # P x T x h x p
        scores = torch.cat([pre_score, self_score.expand(p_count, -1, -1).unsqueeze(-1)], -1)
        weights = scores.softmax(-1)
        out = torch.einsum("pthj,pjhd->pthd", weights[..., :length], v_pre)
        out = out + weights[..., length:] * v_new.unsqueeze(0)
    else:
        out = v_new.unsqueeze(0).expand(p_count, -1, -1, -1)
    hidden = new_x + block.attn.c_proj(out.reshape(p_count, len(tokens), width))
    hidden = hidden + block.mlp(block.ln_2(hidden))
    return nxt.ln_1(hidden)
