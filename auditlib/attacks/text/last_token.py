"""A decoder's last tokens under next-token training, which DAGER's span check cannot see.

The last token of a sequence is an input no loss reads (nothing follows it), so it is in no
attention layer's span; it is the target of the position before. The loss is linear in the
targets' one-hot vectors, so once every earlier token is known the server can compute the
update with those last targets taken out; what is left in the final LayerNorm's bias
gradient is ``(1/N) * sum_i E[v_i]`` (E the output embedding, N the count of predicted
tokens): a sum of ``B`` vocabulary rows, recovered greedily. The LayerNorm's weight gradient
(``(1/N) * sum_i E[v_i] * h_i``, with ``h_i`` the normalised hidden state before the last
position) says which sequence ends with which of them. This completes DAGER for next-token
training (the paper's decoders were trained with a classification head); docs/ALGORITHMS.md.
"""

from __future__ import annotations

import torch

from auditlib.attacks.text.base import TextTarget


def _gradient(target: TextTarget, suffix: str) -> torch.Tensor | None:
    for name, grad in target.update.gradients.items():
        if name.endswith("transformer.ln_f." + suffix):
            return grad.to(torch.float64)
    return None


def recover_last_tokens(target: TextTarget, prefixes: list[list[int]]) -> list[int] | None:
    """Each prefix's last token (the prefixes are each sequence but its last token), or None
    where the update does not allow it (no final LayerNorm gradient, or not one prefix per
    sequence of the full length)."""
    bias, weight = _gradient(target, "bias"), _gradient(target, "weight")
    n = target.length
    if bias is None or weight is None or len(prefixes) != target.batch_size:
        return None
    if any(len(p) != n - 1 for p in prefixes):
        return None
    backbone = target.model.backbone
    ids = torch.tensor([[*p, target.model.tokenizer.pad_id] for p in prefixes])
    hidden_states: list[torch.Tensor] = []
    ln_f = backbone.transformer.ln_f
    hook = ln_f.register_forward_pre_hook(lambda _m, args: hidden_states.append(args[0]))
    try:
        logits = backbone(input_ids=ids).logits.to(torch.float64)
    finally:
        hook.remove()
    count = ids.shape[0] * (n - 1)
    log_probs = logits.log_softmax(-1)
    known = -log_probs[:, : n - 2].gather(-1, ids[:, 1 : n - 1, None]).sum()
    # The last targets' terms without their one-hot part: logsumexp is log_probs' offset.
    unknown = torch.logsumexp(logits[:, n - 2], dim=-1).sum()
    g_weight, g_bias = torch.autograd.grad((known + unknown) / count, [ln_f.weight, ln_f.bias])
    sum_rows = (g_bias.to(torch.float64) - bias) * count
    sum_scaled = (g_weight.to(torch.float64) - weight) * count
    embeddings = backbone.get_output_embeddings().weight.detach().to(torch.float64)
    norms = (embeddings * embeddings).sum(-1)
    residual, picked = sum_rows.clone(), []
    for _ in range(len(prefixes)):
        gain = 2 * embeddings @ residual - norms
        best = int(torch.argmax(gain))
        picked.append(best)
        residual -= embeddings[best]
    tokens = sorted(set(picked))
    h = hidden_states[0][:, n - 2].detach().to(torch.float64)
    h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(
        h.var(-1, unbiased=False, keepdim=True) + ln_f.eps
    )
    # Columns: sequence i ending with token k; solve for the mix, take each sequence's best.
    columns = torch.stack([embeddings[t] * h[i] for i in range(len(prefixes)) for t in tokens], 1)
    mix = torch.linalg.lstsq(columns, sum_scaled.unsqueeze(1)).solution.view(
        len(prefixes), len(tokens)
    )
    return [tokens[int(k)] for k in mix.argmax(dim=1)]
