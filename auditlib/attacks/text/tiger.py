"""TIGER (Kalikman, Petrov, Dimitrov and Vechev, arXiv 2606.18312, 2026), as its abstract
states it: DAGER's span signal (``span.py``) turned into a continuous objective, the token
embeddings optimised to lie in the spans of the first attention layers' gradients, instead
of a discrete membership test that noise breaks and an encoder's search over combinations.

The paper's method section could not be read here (only its abstract), so the form below is
ours, written in docs/ALGORITHMS.md ("TIGER"):

1. The spans, of rank the token count the server knows (a noise floor as DAGER's ranked
   twin's is an option), and per position the ``candidates`` tokens whose first-layer
   input is closest to the first span.
2. Each position's embedding is a softmax mixture of its candidates' embeddings; the
   mixtures of all positions and sequences are optimised jointly (Adam) to bring every
   attention input of the first ``layers`` layers into that layer's span (squared relative
   distance), with an entropy term that grows over the run so each mixture ends on one token.
3. A decoder's positions enter the objective left to right over the first ``grow`` of the
   steps: a causal prefix settles before the positions that depend on it.
4. The starts begin apart: start i's first free position leans to the i-th closest
   candidate (otherwise every sequence may settle on the same one).
5. Every 1/20 of the run each mixture's heaviest tokens are scored on the objective; each
   start keeps its best. A decoder's last token (in no span) is read from the final
   LayerNorm's or the output head's gradient (DAGER's).
6. The sequences given are the starts of lowest objective whose tokens are not mostly
   another's (with more ``starts`` than sequences, more first tokens are tried).
7. The objective is a sum over sequences, blind to two starts settling on the same one: a
   further round re-seeks as many sequences as were found twice, its starts penalised
   where their mixtures agree with a sequence found already on more than ``overlap`` of
   the positions (a shared opening is allowed; the same verse is not).

It makes no exactness claim (``assumptions_hold`` None): it is the attacker that knows the
update is noised, and it assembles an encoder's batch without DAGER's bounded search.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from auditlib.attacks.text.base import (
    OnProgress,
    RecoveredText,
    StopCheck,
    TextProgress,
    TextTarget,
    never_stop,
    no_progress,
    stopped_note,
)
from auditlib.attacks.text.dager import complete_decoder, known_rank, with_openings
from auditlib.attacks.text.span import (
    LayerSpan,
    above_noise,
    attention_inputs,
    first_layer_distances,
    layer_span,
    relative_residual,
)
from auditlib.config import check_ranges, param
from auditlib.models.text import DECODER

NAME = "tiger"
SAME = 0.8  # two starts with this share of their positions alike found the same sequence


@dataclass(frozen=True)
class TigerConfig:
    layers: int = param(
        2, "attention layers whose spans the objective reads (0: every layer)", low=0, high=128
    )
    rotary_layers: int = param(
        3,
        "where positions rotate (the LLaMA family), the layers read instead of `layers`: the "
        "first layer's input carries no position there, so a third span orders the tokens "
        "(0: every layer)",
        low=0, high=128,
    )  # fmt: skip
    candidates: int = param(
        256, "tokens a position's mixture is over: the closest to the first span", low=2,
        high=100_000,
    )  # fmt: skip
    steps: int = param(400, "optimisation steps", low=1, high=100_000)
    learning_rate: float = param(0.1, "Adam's rate on the mixtures' logits", low=0, low_open=True)
    entropy_weight: float = param(
        0.05, "the entropy term's weight at the last step (it grows linearly from 0)", low=0
    )
    start_bias: float = param(
        4.0, "how far sequence b's first free position leans to the b-th closest token", low=0
    )
    noise_floor: float = param(
        1.0,
        "singular values above this times the first one past the token count the server "
        "knows count in a span's rank (1: that token count's leading directions; DAGER's "
        "ranked twin uses 3, which cut too much here: docs/ALGORITHMS.md)",
        low=1, high=1000,
    )  # fmt: skip
    rank_tolerance: float = param(
        1e-7, "without noise: singular values above this times the largest count", low=0,
        low_open=True, high=1e-2,
    )  # fmt: skip
    grow: float = param(
        0.8,
        "a decoder's positions enter the objective left to right over this share of the "
        "steps (0: all at once); a causal prefix settles before what depends on it",
        low=0, high=1,
    )  # fmt: skip
    starts: int = param(
        1,
        "starts per sequence the server expects, each leaning to another first token; the "
        "lowest-objective distinct ones are kept (the objective is a sum over sequences, "
        "blind to two settling on the same one)",
        low=1, high=64,
    )  # fmt: skip
    rounds: int = param(
        2,
        "rounds: each after the first re-seeks the sequences found more than once, its starts "
        "kept away from the distinct ones found (7.)",
        low=1, high=16,
    )  # fmt: skip
    overlap: float = param(
        0.5,
        "a re-seeking start is pushed away from a found sequence once its mixtures' weight on "
        "that sequence's tokens, over the positions, exceeds this",
        low=0, high=1,
    )  # fmt: skip
    rotary_order_weight: float = param(
        10.0,
        "where positions rotate (the LLaMA family), the weight of the spans past the first: "
        "the first layer's input carries no position there, so only they order the tokens, "
        "and a misplaced batch token moves an input far less than a wrong token (1: equal)",
        low=0, low_open=True, high=1000,
    )  # fmt: skip
    seed: int = param(0, "the mixtures' random start", low=0)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True, eq=False)
class _Problem:
    spans: tuple[LayerSpan, ...]
    positions: tuple[int, ...]  # the positions optimised
    skips_first: tuple[bool, ...]  # per span: the first position's input is not in it
    weights: tuple[float, ...]  # per span: its term's weight in the objective
    fixed: dict[int, int]  # position -> token (an encoder's [CLS] and [SEP])
    candidates: torch.Tensor  # len(positions) x k token ids, closest first
    table: torch.Tensor  # V x d word embeddings


def _problem(target: TextTarget, config: TigerConfig) -> _Problem:
    model = target.model
    count = model.backbone.config.num_hidden_layers
    rotary = model.architecture.rotary
    wanted = config.rotary_layers if rotary else config.layers
    layers = count if wanted == 0 else min(wanted, count)

    def span(layer: int, queries_only: bool) -> LayerSpan:
        read = layer_span(
            model, target.update, layer, config.rank_tolerance, queries_only=queries_only
        )
        return above_noise(read, known_rank(target), config.noise_floor)

    # Where positions rotate, the layers past the first are read from their queries alone,
    # as DAGER's sequence filter (span.layer_span): a repeated token would sit in the keys'.
    # Such a span lacks the first position's input: its query has no gradient (a causal
    # softmax over one term), so the objective does not ask that input to lie in it.
    queries_only = tuple(rotary and layer > 0 for layer in range(layers))
    spans = tuple(span(layer, q) for layer, q in enumerate(queries_only))
    tok = model.tokenizer
    if model.family == DECODER:  # the last position is in no span (no loss reads it)
        fixed: dict[int, int] = {}
        positions = tuple(range(target.length - 1))
        banned = {tok.pad_id}
    else:
        fixed = {0: int(tok.bos_id), target.length - 1: int(tok.eos_id)}
        positions = tuple(p for p in range(target.length) if p not in fixed)
        banned = {tok.pad_id, tok.bos_id, tok.eos_id}
    k = min(config.candidates, tok.vocab_size - len(banned))
    rows = []
    pool = max(k, known_rank(target))
    distances = first_layer_distances(model, spans[0], positions)
    for position in positions:
        d = distances[position]
        if position == 0 and rotary and layers > 1:  # DAGER's check of the openings
            d = with_openings(target, d, span(1, False), pool)
        d[sorted(b for b in banned if b is not None)] = float("inf")
        rows.append(torch.argsort(d)[:k])
    table = model.backbone.get_input_embeddings().weight.detach()
    weights = tuple(config.rotary_order_weight if q else 1.0 for q in queries_only)
    return _Problem(spans, positions, queries_only, weights, fixed, torch.stack(rows), table)


def _row_losses(
    problem: _Problem, inputs: list[torch.Tensor], horizon: int | None = None
) -> torch.Tensor:
    """Per sequence, the mean squared relative distance of its optimised positions' inputs
    to each layer's span (the first ``horizon`` positions only, where given), the layers
    weighted by ``problem.weights``."""
    kept = problem.positions[:horizon]
    device = inputs[0].device
    total = torch.zeros(inputs[0].shape[0], dtype=torch.float64, device=device)
    terms = zip(problem.spans, problem.skips_first, problem.weights, inputs, strict=True)
    for span, skips, weight, x in terms:
        index = torch.tensor([p for p in kept if p > 0] if skips else kept, device=device)
        if index.numel():
            residual = relative_residual(span, x[:, index])
            total = total + weight * (residual**2).sum(-1).mean(-1)
    return total / sum(problem.weights)


def _distinct(losses: torch.Tensor, choices: torch.Tensor, count: int) -> list[int]:
    """Up to ``count`` starts, lowest objective first, none the same sequence as another
    chosen one (``SAME`` of its positions alike; two verses may share an opening)."""
    losses, choices = losses.cpu(), choices.cpu()  # compared pair by pair: on the host, once
    chosen: list[int] = []
    for i in torch.argsort(losses).tolist():
        if all(float((choices[i] == choices[j]).float().mean()) < SAME for j in chosen):
            chosen.append(i)
        if len(chosen) == count:
            break
    return chosen


def _embeds(problem: _Problem, weights: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """The batch's input embeddings: each optimised position a mixture of its candidates."""
    mixed = torch.einsum("bpk,pkd->bpd", weights, problem.table[problem.candidates])
    out = torch.zeros(batch, length, problem.table.shape[1], dtype=mixed.dtype, device=mixed.device)
    out = out.index_copy(1, torch.tensor(problem.positions, device=mixed.device), mixed)
    for position, token in problem.fixed.items():
        out[:, position] = problem.table[token]
    return out


def _ids(problem: _Problem, choice: torch.Tensor, length: int) -> torch.Tensor:
    """Token ids (B x length) from each position's chosen candidate (B x positions)."""
    ids = torch.zeros(choice.shape[0], length, dtype=torch.int64, device=choice.device)
    picked = torch.gather(
        problem.candidates.unsqueeze(0).expand(choice.shape[0], -1, -1), 2, choice.unsqueeze(2)
    )[..., 0]
    ids[:, list(problem.positions)] = picked
    for position, token in problem.fixed.items():
        ids[:, position] = token
    return ids


@dataclass(frozen=True, eq=False)
class _Found:
    """One round's result per start: its best discrete objective and its tokens (candidate
    indices per position)."""

    best: torch.Tensor  # (starts,)
    choice: torch.Tensor  # (starts, positions)

    def chosen(self, count: int) -> list[int]:
        """The sequences given (6.): the distinct starts, then the next best where fewer."""
        distinct = _distinct(self.best, self.choice, count)
        rest = [i for i in torch.argsort(self.best).tolist() if i not in distinct]
        return distinct + rest[: count - len(distinct)]

    def then(self, other: _Found) -> _Found:
        return _Found(torch.cat([self.best, other.best]), torch.cat([self.choice, other.choice]))


def _overlap_penalty(weights: torch.Tensor, avoid: torch.Tensor, overlap: float) -> torch.Tensor:
    """How far each start's soft agreement with each sequence found already (its mixtures'
    weight on that sequence's tokens, averaged over positions) exceeds ``overlap``."""
    positions = torch.arange(weights.shape[1], device=weights.device).unsqueeze(0)
    positions = positions.expand_as(avoid)
    agree = weights[:, positions, avoid].mean(-1)  # starts x found
    return torch.relu(agree - overlap).sum(-1).mean()


def _optimise(
    target: TextTarget,
    problem: _Problem,
    config: TigerConfig,
    first: list[int],
    avoid: torch.Tensor | None,
    seen: Callable[[_Found, int], None],
    should_stop: StopCheck = never_stop,
) -> tuple[_Found, int]:
    """One round: a start per entry of ``first`` (the candidate its first position leans
    to), kept away from the sequences ``avoid`` (candidate indices) where given. Returns
    what each start found and the steps taken (fewer on a stop request)."""
    model, n = target.model, target.length
    p, k = problem.candidates.shape
    rows = len(first)
    g = torch.Generator().manual_seed(config.seed + (0 if avoid is None else 1))
    logits = 0.01 * torch.randn(rows, p, k, generator=g)
    for i, candidate in enumerate(first):  # the starts begin apart (4.)
        logits[i, 0, candidate] += config.start_bias
    # Drawn on the CPU generator, then moved: a seed starts the same on every device.
    logits = logits.to(problem.table.device).requires_grad_(True)
    optimiser = torch.optim.Adam([logits], lr=config.learning_rate)
    layers = len(problem.spans)
    infinite = torch.full((rows,), float("inf"), dtype=torch.float64, device=logits.device)
    found = _Found(infinite, logits.detach().argmax(-1))
    report = max(1, config.steps // 20)
    growing = config.grow * config.steps if model.family == DECODER else 0

    def score(done: int) -> None:  # each start's current tokens on the objective (5.)
        choice = logits.detach().argmax(-1)
        with torch.no_grad():
            one_hot = torch.nn.functional.one_hot(choice, k).to(problem.table.dtype)
            embeds = _embeds(problem, one_hot, rows, n)
            discrete = _row_losses(
                problem, attention_inputs(target.model, layers, inputs_embeds=embeds)
            )
        better = discrete < found.best
        found.best[better], found.choice[better] = discrete[better], choice[better]
        seen(found, done)

    for step in range(config.steps):
        if should_stop():
            if step % report:  # what the steps since the last scoring reached
                score(step)
            return found, step
        horizon = p if step >= growing else max(1, int(p * (step + 1) / growing))
        weights = torch.softmax(logits, dim=-1)
        inputs = attention_inputs(
            target.model, layers, inputs_embeds=_embeds(problem, weights, rows, n)
        )
        loss = _row_losses(problem, inputs, horizon).mean()
        live = weights[:, :horizon]  # positions not yet in the objective stay soft
        entropy = -(live * torch.log(live.clamp_min(1e-12))).sum(-1).mean()
        loss = loss + config.entropy_weight * (step + 1) / config.steps * entropy
        if avoid is not None:
            loss = loss + _overlap_penalty(weights, avoid, config.overlap)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if step % report == report - 1 or step == config.steps - 1:
            score(step + 1)
    return found, config.steps


def run_tiger(
    target: TextTarget,
    config: TigerConfig = TigerConfig(),
    on_progress: OnProgress = no_progress,
    should_stop: StopCheck = never_stop,
) -> RecoveredText:
    started = time.perf_counter()
    problem = _problem(target, config)
    model, b, n = target.model, target.batch_size, target.length
    k = problem.candidates.shape[1]
    total = config.steps * config.rounds

    def show(done: int, found: _Found) -> None:
        ids = _ids(problem, found.choice[found.chosen(b)], n).tolist()
        on_progress(TextProgress(done, total, tuple(model.tokenizer.decode(r) for r in ids[:64])))

    rows = b * config.starts
    first = [i % k for i in range(rows)]
    found, steps = _optimise(
        target, problem, config, first, None, lambda f, step: show(step, f), should_stop
    )
    rounds_run, stopped = 1, steps < config.steps
    for _ in range(config.rounds - 1):  # re-seek what was found twice, away from the rest (7.)
        if stopped:
            break
        unique = _distinct(found.best, found.choice, b)
        missing = b - len(unique)
        if missing == 0:
            break
        done, before = rounds_run * config.steps, found
        again, taken = _optimise(
            target, problem, config, first[: missing * config.starts], found.choice[unique],
            lambda f, step, done=done, before=before: show(done + step, before.then(f)),
            should_stop,
        )  # fmt: skip
        found, rounds_run = found.then(again), rounds_run + 1
        steps, stopped = steps + taken, taken < config.steps
    chosen = found.chosen(b)
    ids = _ids(problem, found.choice[chosen], n).tolist()
    notes = [stopped_note(steps, total, "steps")] if stopped else []
    notes += [
        f"spans of the first {len(problem.spans)} attention layers, ranks "
        + ", ".join(str(s.rank) for s in problem.spans)
        + f" (the {known_rank(target)} tokens the server knows, noise floor {config.noise_floor})",
        f"{k} candidate tokens a position, {rows} starts for {b} sequences, {config.steps} "
        f"steps a round, {rounds_run} round(s); the chosen sequences' objective "
        f"{float(found.best[chosen].mean()):.3g} (0: every input in its span)",
    ]
    if model.family == DECODER:
        sequences = [row[: n - 1] for row in ids]
        notes += complete_decoder(target, sequences)
    else:
        tok = model.tokenizer
        specials = (tok.bos_id, tok.eos_id, tok.pad_id)
        sequences = [[t for t in row if t not in specials] for row in ids]
    texts = tuple(model.tokenizer.decode(s) for s in sequences)
    on_progress(TextProgress(steps if stopped else total, total, texts[:64], "done"))
    return RecoveredText(
        NAME, tuple(tuple(s) for s in sequences), texts, time.perf_counter() - started,
        tuple(notes), None, stopped,
    )  # fmt: skip
