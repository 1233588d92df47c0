"""The gradient-matching machinery of UTR on a decoder's LoRA adapters.

Next-token training makes the update linear in each loss term's target: the term of
position ``t`` of a sequence adds ``(1/N) H_t^T (E^T p_t - E[y])`` to the gradient, where
``H_t`` is the Jacobian of the final hidden state at ``t`` in the adapters' weights, ``E``
the (frozen) output embedding, ``p_t`` the predicted distribution and ``y`` the target. So
the correlation of a residual ``R`` with every candidate target's term is one
Jacobian-vector product, ``z = H_t R``, against ``E^T p_t - E[v]`` for all ``v`` at once.
"""

from __future__ import annotations

import math

import torch
from torch.func import functional_call, jvp
from torch.nn.attention import SDPBackend, sdpa_kernel

from auditlib.models.text import TextModel

Grads = dict[str, torch.Tensor]


class AdapterMatcher:
    """The server's model with the adapters' weights as it sent them, the observed update
    and what a candidate batch of ``count`` loss terms would give."""

    def __init__(self, model: TextModel, observed: Grads, count: int) -> None:
        named = dict(model.module.named_parameters())
        self.model = model
        self.names = list(observed)
        self.params = [named[k] for k in self.names]
        self.values = tuple(p.detach() for p in self.params)
        self.observed = {k: v.detach().to(torch.float32) for k, v in observed.items()}
        self.count = count  # N: the loss is the mean over N predicted tokens
        self.embeddings = model.backbone.get_output_embeddings().weight.detach()
        self._squared = (self.embeddings * self.embeddings).sum(-1)

    def _outputs(self, values, ids: torch.Tensor):
        out = functional_call(
            self.model.module,
            dict(zip(self.names, values, strict=True)),
            (ids,),
            {"output_hidden_states": True},
        )
        return out.hidden_states[-1], out.logits

    def correlations(self, ids: torch.Tensor, residual: Grads) -> tuple[torch.Tensor, torch.Tensor]:
        """Final hidden states' directional derivative along ``residual`` and the logits, at
        every position of ``ids`` (B x n x width, B x n x V). Attention runs as plain math
        there: the fused kernels have no forward-mode derivative."""
        tangent = tuple(residual[k] for k in self.names)
        with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
            (_, logits), (dh, _) = jvp(lambda *v: self._outputs(v, ids), self.values, tangent)
        return dh, logits

    def target_scores(self, dh: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """For each row (a position), every token's correlation as that position's target
        with the residual, over the term's length (up to the Jacobian's anisotropy), then
        standardised over the vocabulary (... x V)."""
        expected = logits.softmax(-1) @ self.embeddings  # E^T p
        numerator = (dh * expected).sum(-1, keepdim=True) - dh @ self.embeddings.T
        squared = (expected * expected).sum(-1, keepdim=True) + self._squared
        length = (squared - 2 * expected @ self.embeddings.T).clamp_min(1e-20).sqrt()
        s = numerator / length
        return (s - s.mean(-1, keepdim=True)) / s.std(-1, keepdim=True).clamp_min(1e-20)

    def term_gradient(self, ids: torch.Tensor, targets: torch.Tensor) -> Grads:
        """The update's part from each row's last position predicting ``targets``."""
        logits = self.model.module(input_ids=ids).logits[:, -1]
        loss = torch.nn.functional.cross_entropy(logits, targets, reduction="sum") / self.count
        grads = torch.autograd.grad(loss, self.params)
        return {k: g.detach() for k, g in zip(self.names, grads, strict=True)}

    def sequence_gradient(self, sequence: list[int]) -> Grads:
        """The update's part from one whole sequence (every position predicting the next)."""
        ids = torch.tensor([sequence], device=self.embeddings.device)
        logits = self.model.module(input_ids=ids).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum") / self.count
        grads = torch.autograd.grad(loss, self.params)
        return {k: g.detach() for k, g in zip(self.names, grads, strict=True)}


def minus(a: Grads, b: Grads) -> Grads:
    return {k: a[k] - b[k] for k in a}


def norm(a: Grads) -> float:
    return math.sqrt(sum(float(v.double().norm()) ** 2 for v in a.values()))
