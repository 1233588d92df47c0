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

A decoder whose output head is its own weight (untied, as the LLaMA family's) says it more
directly: with the known targets' terms taken out, what is left of the head's gradient is
``(1/N) * sum_i onehot(v_i) h_i^T``, so row ``v`` holds the hidden states of the sequences
that end with ``v``; each sequence's share of each row (least squares over the ``B``
hidden states) says which.
"""

from __future__ import annotations

import torch

from auditlib.attacks.text.base import TextTarget


def _gradient(target: TextTarget, name_end: str) -> torch.Tensor | None:
    for name, grad in target.update.gradients.items():
        if name.endswith(name_end):
            return grad.to(torch.float64)
    return None


def _known_terms(target: TextTarget, prefixes: list[list[int]], module: torch.nn.Module):
    """The loss without the last targets' one-hot terms (the server knows every other
    target), over the prefixes each with a placeholder last token (right-padded, masked, as
    the client's batch); the predicted-token count; and ``module``'s input at each
    sequence's position before its last."""
    device = target.model.device
    lengths = torch.tensor([len(p) + 1 for p in prefixes], device=device)  # each one's length
    n = max(len(p) + 1 for p in prefixes)
    pad = target.model.tokenizer.pad_id
    ids = torch.full((len(prefixes), n), pad, dtype=torch.int64)  # on the host: filled, moved
    for row, prefix in enumerate(prefixes):
        ids[row, : len(prefix)] = torch.tensor(prefix)  # on the host
    ids = ids.to(device)
    positions = torch.arange(n, device=device)
    mask = (positions[None] < lengths[:, None]).to(torch.int64)
    inputs: list[torch.Tensor] = []
    hook = module.register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
    try:
        logits = target.model.backbone(input_ids=ids, attention_mask=mask).logits
    finally:
        hook.remove()
    logits = logits.to(torch.float64)
    count = sum(len(p) for p in prefixes)  # (lengths - 1).sum(), without asking the device
    rows = torch.arange(len(prefixes), device=device)
    before_last = lengths - 2  # the position whose target is the unknown last token
    known_targets = positions[None, : n - 1] < before_last[:, None]
    log_probs = logits[:, : n - 1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    known = -(log_probs * known_targets).sum()
    # The last targets' terms without their one-hot part: logsumexp is log_probs' offset.
    unknown = torch.logsumexp(logits[rows, before_last], dim=-1).sum()
    hidden = inputs[0][rows, before_last].detach().to(torch.float64)
    return (known + unknown) / count, count, hidden


def _least_squares(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``lstsq(a, b)``'s solution, on the CPU's solver: CUDA's takes only full-rank systems
    with at least as many rows as columns, where a batch's columns may outnumber a small
    model's width (the CPU's gelsy takes any). The systems are a batch's size: the copy
    is small, and both devices solve them alike."""
    return torch.linalg.lstsq(a.cpu(), b.cpu()).solution.to(a.device)


def _from_output_head(target: TextTarget, prefixes: list[list[int]], observed: torch.Tensor):
    head = target.model.backbone.get_output_embeddings()
    loss, count, hidden = _known_terms(target, prefixes, head)
    (g_head,) = torch.autograd.grad(loss, [head.weight])
    rows = (g_head.to(torch.float64) - observed) * count  # V x width: sum of h_i per last token
    share = _least_squares(hidden.T, rows.T)  # B x V
    return [int(k) for k in share.argmax(dim=1)]


HEAD_SOURCE = "the output head's gradient"
LAYER_NORM_SOURCE = "the final LayerNorm's gradient"


def recover_last_tokens(
    target: TextTarget, prefixes: list[list[int]]
) -> tuple[list[int], str] | None:
    """Each prefix's last token (the prefixes are each sequence but its last token, shorter
    ones padded after it) and the gradient it was read from, in words; None where the update
    does not allow it (neither an untied output head's gradient nor the final LayerNorm's,
    or not one prefix per sequence, each shorter than the length)."""
    if len(prefixes) != target.batch_size or any(
        not 1 <= len(p) <= target.length - 1 for p in prefixes
    ):
        return None
    backbone = target.model.backbone
    config = backbone.config
    if target.model.architecture.model_type != "gpt2":
        # A head tied to the token table shares its gradient: the known terms' input side
        # is in the server's own gradient too, so what is left is the head's alone.
        tied = getattr(config, "tie_word_embeddings", False)
        head = _gradient(target, "embed_tokens.weight" if tied else "lm_head.weight")
        return None if head is None else (_from_output_head(target, prefixes, head), HEAD_SOURCE)
    bias = _gradient(target, "transformer.ln_f.bias")
    weight = _gradient(target, "transformer.ln_f.weight")
    if bias is None or weight is None:
        return None
    ln_f = backbone.transformer.ln_f
    loss, count, h = _known_terms(target, prefixes, ln_f)
    g_weight, g_bias = torch.autograd.grad(loss, [ln_f.weight, ln_f.bias])
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
    h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(
        h.var(-1, unbiased=False, keepdim=True) + ln_f.eps
    )
    # Columns: sequence i ending with token k; solve for the mix, take each sequence's best.
    columns = torch.stack([embeddings[t] * h[i] for i in range(len(prefixes)) for t in tokens], 1)
    mix = _least_squares(columns, sum_scaled.unsqueeze(1)).view(len(prefixes), len(tokens))
    return [tokens[int(k)] for k in mix.argmax(dim=1)], LAYER_NORM_SOURCE
