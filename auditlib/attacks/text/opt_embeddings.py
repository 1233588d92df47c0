"""The continuous half that TAG and LAMP share: dummy input embeddings run through the
model's ``inputs_embeds`` path, the gradient they cause matched to the observed update, and
each position projected to its nearest token.

The word-embedding matrix is left out of the matching (as in LAMP's code and breaching's
TAG): inputs given as embeddings never touch it, so its dummy gradient would lack the
input half that the observed one holds (and GPT-2 ties it to the output head).

Targets. An encoder classifies: its labels are given where the server knows them, else
optimised as free logits beside the embeddings (DLG's and TAG's joint labels). A decoder
predicts the next token, so its targets are the input tokens themselves: ``joint`` keeps
free logits per position (the DLG/TAG reading, breaching's TAG), ``tied`` derives them from
the embeddings (a softmax of each position's cosine similarity to the token table), so the
sequence is one variable.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from auditlib.attacks.text.base import TextTarget
from auditlib.models.text import DECODER

JOINT, TIED = "joint", "tied"
L2_L1, COSINE = "l2_l1", "cosine"
TIED_TEMPERATURE = 0.1  # LAMP's softmax temperature over cosine distances (get_perplexity)


@dataclass(frozen=True, eq=False)
class MatchingProblem:
    """What the optimisation matches against, read once from the server's knowledge."""

    target: TextTarget
    params: tuple[torch.nn.Parameter, ...]  # the matched weights
    observed: tuple[torch.Tensor, ...]  # their observed gradients
    table: torch.Tensor  # V x d word embeddings
    allowed: torch.Tensor  # V bool: tokens a free position may hold
    fixed: dict[int, int]  # position -> token held fixed (an encoder's [CLS] and [SEP])

    @property
    def decoder(self) -> bool:
        return self.target.model.family == DECODER

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.target.batch_size, self.target.length, int(self.table.shape[1]))

    @functools.cached_property
    def observed_norms(self) -> tuple[torch.Tensor | None, ...]:
        """Each observed gradient's norm, None where it is zero: read once, so a step's
        cosine distance asks the device nothing back."""
        norms = [o.norm() for o in self.observed]
        return tuple(None if float(n) == 0 else n for n in norms)

    @property
    def free_positions(self) -> list[int]:
        return [p for p in range(self.target.length) if p not in self.fixed]

    def label_shape(self, decoder_targets: str) -> tuple[int, ...] | None:
        """Shape of the free label logits, or None where no labels are optimised."""
        b, n, _ = self.shape
        if self.decoder:
            return (b, n, int(self.table.shape[0])) if decoder_targets == JOINT else None
        if self.target.labels is not None:
            return None
        return (b, int(self.target.model.backbone.config.num_labels))


def matching_problem(target: TextTarget) -> MatchingProblem:
    model = target.model
    word = model.backbone.get_input_embeddings().weight
    named = dict(model.module.named_parameters())
    params, observed = [], []
    for name, grad in target.update.gradients.items():
        p = named[name]
        if p is word:
            continue
        params.append(p)
        observed.append(grad.detach().to(device=p.device, dtype=p.dtype))
    tok = model.tokenizer
    allowed = torch.ones(int(word.shape[0]), dtype=torch.bool, device=word.device)
    specials = {tok.pad_id, tok.bos_id, tok.eos_id} - {None}
    for name in ("[UNK]", "[MASK]"):
        token = tok.tokenizer.token_to_id(name)
        if token is not None:
            specials.add(token)
    allowed[sorted(specials)] = False
    fixed = {}
    if model.family != DECODER:  # [CLS] tokens [SEP], as the client's batch
        fixed = {0: int(tok.bos_id), target.length - 1: int(tok.eos_id)}
    return MatchingProblem(
        target, tuple(params), tuple(observed), word.detach().clone(), allowed, fixed
    )


@contextlib.contextmanager
def twice_differentiable() -> Iterator[None]:
    """Attention through the math kernel: the fused CPU kernels have no double backward."""
    with sdpa_kernel(SDPBackend.MATH):
        yield


def fix_positions(problem: MatchingProblem, embeds: torch.Tensor) -> None:
    """Hold the fixed positions at their tokens' embeddings (LAMP's fix_special_tokens)."""
    with torch.no_grad():
        for position, token in problem.fixed.items():
            embeds[:, position] = problem.table[token]


def tied_targets(problem: MatchingProblem, embeds: torch.Tensor) -> torch.Tensor:
    """A decoder's soft targets read from the embeddings themselves (``tied``)."""
    sim = F.normalize(embeds, dim=-1) @ F.normalize(problem.table, dim=-1).T
    sim = sim.masked_fill(~problem.allowed, -1e4)
    return torch.softmax(sim / TIED_TEMPERATURE, dim=-1)


def client_loss(
    problem: MatchingProblem, embeds: torch.Tensor, labels: torch.Tensor | None, targets: str
) -> torch.Tensor:
    """The client's training loss on dummy inputs: ``labels`` are free logits (None: known
    labels, or ``tied`` decoder targets)."""
    logits = problem.target.model.module(inputs_embeds=embeds).logits
    if problem.decoder:
        probs = labels.softmax(-1) if targets == JOINT else tied_targets(problem, embeds)
        shifted = logits[:, :-1].reshape(-1, logits.shape[-1])
        return F.cross_entropy(shifted, probs[:, 1:].reshape(-1, probs.shape[-1]))
    if labels is None:
        return F.cross_entropy(logits, problem.target.labels)
    return F.cross_entropy(logits, labels.softmax(-1))


def dummy_gradients(
    problem: MatchingProblem,
    embeds: torch.Tensor,
    labels: torch.Tensor | None,
    targets: str,
    create_graph: bool,
) -> list[torch.Tensor]:
    loss = client_loss(problem, embeds, labels, targets)
    grads = torch.autograd.grad(loss, problem.params, create_graph=create_graph, allow_unused=True)
    return [
        torch.zeros_like(p) if g is None else g for p, g in zip(problem.params, grads, strict=True)
    ]


def l1_layer_weights(count: int, scheme: str) -> list[float]:
    """The L1 term's weight per matched weight: uniform (TAG as LAMP ran it), or breaching's
    linear decrease from 1 (the first weight) to 1/count (the last)."""
    if scheme == "linear":
        return [(count - i) / count for i in range(count)]
    return [1.0] * count


def gradient_distance(
    problem: MatchingProblem,
    dummy: list[torch.Tensor],
    kind: str,
    l1_weight: float,
    layer_weights: list[float] | None = None,
) -> torch.Tensor:
    """``l2_l1``: sum over weights of ||d||^2 + l1_weight * w_layer * ||d||_1 (TAG; LAMP's
    L1+L2); ``cosine``: mean over weights of 1 - cos (LAMP), weights without gradient left
    out."""
    total = dummy[0].new_zeros(())
    if kind == L2_L1:
        weights = layer_weights or [1.0] * len(dummy)
        for g, o, w in zip(dummy, problem.observed, weights, strict=True):
            d = g - o
            total = total + d.square().sum() + l1_weight * w * d.abs().sum()
        return total
    norms = problem.observed_norms
    for g, o, norm in zip(dummy, problem.observed, norms, strict=True):
        if norm is None:
            continue  # nothing to align with (e.g. LoRA's A before B moved)
        total = total + 1 - (g * o).sum() / (g.norm() * norm + 1e-12)
    return total / max(sum(n is not None for n in norms), 1)


def matching_loss(
    problem: MatchingProblem,
    embeds: torch.Tensor,
    labels: torch.Tensor | None,
    targets: str,
    kind: str,
    l1_weight: float,
    layer_weights: list[float] | None = None,
    create_graph: bool = True,
) -> torch.Tensor:
    dummy = dummy_gradients(problem, embeds, labels, targets, create_graph)
    return gradient_distance(problem, dummy, kind, l1_weight, layer_weights)


def nearest_tokens(
    problem: MatchingProblem, embeds: torch.Tensor, labels: torch.Tensor | None, targets: str
) -> torch.Tensor:
    """Each position's nearest allowed token by cosine (LAMP's and breaching's projection);
    fixed positions keep their tokens. Under ``joint`` decoder targets, positions 1.. are
    read from their labels instead: a decoder's token p is the target of position p - 1,
    and the labels carry it more sharply than the embeddings do (the last input reaches no
    loss term at all)."""
    with torch.no_grad():
        sim = F.normalize(embeds, dim=-1) @ F.normalize(problem.table, dim=-1).T
        sim = sim.masked_fill(~problem.allowed, -2.0)
        ids = sim.argmax(-1)
        if problem.decoder and targets == JOINT and labels is not None:
            read = labels[:, 1:].masked_fill(~problem.allowed, float("-inf"))
            ids[:, 1:] = read.argmax(-1)
        for position, token in problem.fixed.items():
            ids[:, position] = token
    return ids


def projected_distance(
    problem: MatchingProblem,
    ids: torch.Tensor,
    labels: torch.Tensor | None,
    kind: str,
    l1_weight: float,
    layer_weights: list[float] | None = None,
) -> float:
    """The gradient distance of the token sequences themselves (a decoder's targets the
    tokens, an encoder's the known labels or the run's optimised ones): how one restart's
    result is scored against another's, on what is returned."""
    embeds = problem.table[ids]
    logits = problem.target.model.module(inputs_embeds=embeds).logits
    if problem.decoder:
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    elif labels is None:
        loss = F.cross_entropy(logits, problem.target.labels)
    else:
        loss = F.cross_entropy(logits, labels.detach().softmax(-1))
    grads = torch.autograd.grad(loss, problem.params, allow_unused=True)
    dummy = [
        torch.zeros_like(p) if g is None else g for p, g in zip(problem.params, grads, strict=True)
    ]
    return float(gradient_distance(problem, dummy, kind, l1_weight, layer_weights))


class LowestLoss:
    """The lowest loss a run has seen and the embeddings and labels that gave it, kept on
    their device (``torch.where``), so a step asks the device nothing back: on a GPU the
    host queues the next steps while one runs. Until the first step, the start.
    ``or_equal``: a later state of the same loss replaces the kept one (LAMP's ``<=``)."""

    def __init__(
        self, embeds: torch.Tensor, labels: torch.Tensor | None, or_equal: bool = False
    ) -> None:
        self.loss = torch.full((), float("inf"), device=embeds.device)
        self.embeds = embeds.detach().clone()
        self.labels = None if labels is None else labels.detach().clone()
        self.or_equal = or_equal

    def keep(self, loss: torch.Tensor, embeds: torch.Tensor, labels: torch.Tensor | None) -> None:
        loss = loss.detach()
        better = loss <= self.loss if self.or_equal else loss < self.loss  # never a NaN
        self.loss = torch.where(better, loss, self.loss)
        self.embeds = torch.where(better, embeds.detach(), self.embeds)
        if labels is not None:
            self.labels = torch.where(better, labels.detach(), self.labels)


def decode(problem: MatchingProblem, ids: torch.Tensor) -> tuple[tuple[int, ...], ...]:
    """Each sequence's tokens without the fixed special positions."""
    free = problem.free_positions
    return tuple(tuple(int(t) for t in row[free].tolist()) for row in ids)
