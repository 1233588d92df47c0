"""DAGER (Petrov et al., NeurIPS 2024): exact recovery of a text batch from its update.

1. The first attention layer's inputs span its weight gradient (``span.py``); a token ``v``
   at position ``p`` is in the batch iff its input there (token plus position embedding,
   normalised) lies in that span: the token filter, over the whole vocabulary. Where
   positions rotate queries and keys (the LLaMA family, as the paper's LLaMA-2) the input
   is the token's alone: the filter gives the batch's tokens, the same at every position,
   and the sequence filter places them.
2. A decoder is causal, so the second layer's input at ``p`` depends on the prefix alone:
   sequences grow greedily, a prefix extended by each token that passed at ``p`` and kept
   iff its second-layer input lies in the second layer's span: the sequence filter.
   An encoder's second-layer inputs depend on the whole sequence: with one sequence the
   token filter gives it; with more, a bounded search (below) assembles them.

Exact only while the batch's token count is below the model's width (the span would fill
the space otherwise) and the update is the plain gradient of one step (FedSGD); the result
says when these do not hold, and what was found then is what it is.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Literal

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
from auditlib.attacks.text.gpt2_extend import second_layer_inputs
from auditlib.attacks.text.last_token import recover_last_tokens
from auditlib.attacks.text.rotary_extend import rotary_second_layer_inputs
from auditlib.attacks.text.span import (
    LayerSpan,
    above_noise,
    distance_to_span,
    first_layer_distances,
    layer_inputs,
    layer_span,
)
from auditlib.config import check_ranges, param
from auditlib.models.text import DECODER

NAME = "dager"


@dataclass(frozen=True)
class DagerConfig:
    token_threshold: float = param(
        1e-3,
        "a token passes where its first-layer input's relative distance to the span is below "
        "this (the paper tunes it per model, 1e-5 to 1e-3)",
        low=0, low_open=True, high=1,
    )  # fmt: skip
    sequence_threshold: float = param(
        1e-3, "the same bound for a sequence's second-layer input", low=0, low_open=True, high=1
    )
    rank_tolerance: float = param(
        1e-7,
        "singular values above this times the largest count in the span's rank",
        low=0, low_open=True, high=1e-2,
    )  # fmt: skip
    max_tokens_per_position: int = param(
        4096, "candidates kept per position (more: the span is not low-rank)", low=1, high=1_000_000
    )
    max_prefixes: int = param(
        8192, "the decoder search's bound on prefixes kept per position", low=1, high=1_000_000
    )
    encoder_combinations: int = param(
        20_000, "the encoder search's bound on sequences tested", low=1, high=10_000_000
    )
    mode: Literal["exact", "ranked"] = param(
        "exact",
        "exact: thresholds on the distances to the spans (the paper); ranked: the attacker that "
        "knows the update is noised: the span's rank from the token count it knows, and the "
        "closest candidates kept instead of those under a threshold",
    )
    beam: int = param(
        0, "ranked mode: prefixes kept per step (0: twice the batch size)", low=0, high=100_000
    )
    token_beam: int = param(
        256,
        "ranked mode: tokens kept per position, the closest (a token elsewhere in the batch "
        "lies in the span too, so many more than the batch size do)",
        low=1, high=100_000,
    )  # fmt: skip
    noise_floor: float = param(
        3.0,
        "ranked mode: singular values above this times the first one past the token count "
        "the server knows (noise's) count in the span's rank",
        low=1, high=1000,
    )  # fmt: skip

    def __post_init__(self) -> None:
        check_ranges(self)


def _beam(target: TextTarget, config: DagerConfig) -> int:
    return config.beam or 2 * target.batch_size


def known_rank(target: TextTarget) -> int:
    """The batch's token count the server can assume: every position of every sequence,
    but a decoder's last (no loss reads it, so no span holds it)."""
    per_sequence = target.length - 1 if target.model.family == DECODER else target.length
    return target.batch_size * per_sequence


def _above_noise(span: LayerSpan, target: TextTarget, config: DagerConfig) -> LayerSpan:
    return above_noise(span, known_rank(target), config.noise_floor)


OPENING_CHUNK = 2048  # tokens one pass of the openings' check holds (a vocabulary's MLP would not)


def with_openings(
    target: TextTarget, d: torch.Tensor, second: LayerSpan, pool: int
) -> torch.Tensor:
    """Position 0's distances in a decoder whose positions rotate (the LLaMA family), from
    the first layer's ``d`` (vocabulary): there every token of the batch passes the token
    filter at every position, the first included. A sequence's first token is told by the
    second layer: alone in its sequence it gives layer 1 an input of its own (it attends to
    itself alone), which lies in ``second`` (the span of layer 1's queries', keys' and
    values' gradients) only if some sequence opens with it. The ``pool`` tokens closest
    under ``d`` are checked so (the larger of both distances); the rest are out (inf)."""
    backbone = target.model.backbone
    tokens = torch.argsort(d)[:pool]
    empty = torch.zeros(1, 0, dtype=torch.int64, device=d.device)
    alone = [
        distance_to_span(second, rotary_second_layer_inputs(backbone, empty, chunk)[0])
        for chunk in tokens.split(OPENING_CHUNK)
    ]
    out = torch.full_like(d, float("inf"))
    out[tokens] = torch.maximum(d[tokens], torch.cat(alone))
    return out


def _token_candidates(target: TextTarget, span: LayerSpan, config: DagerConfig) -> list[list[int]]:
    """Per position, the tokens whose first-layer input lies in the span (best first); at a
    rotary decoder's first position, also the openings' check (``with_openings``)."""
    model = target.model
    candidates = []
    special = {target.model.tokenizer.pad_id} if model.family == DECODER else set()
    distances = first_layer_distances(model, span, range(target.length))
    if model.architecture.rotary:  # the batch's tokens pass everywhere: tell the openings
        second = layer_span(model, target.update, 1, config.rank_tolerance)
        ranked = config.mode == "ranked"
        if ranked:
            second = _above_noise(second, target, config)
        pool = (
            max(config.token_beam, known_rank(target)) if ranked else config.max_tokens_per_position
        )
        distances[0] = with_openings(target, distances[0], second, pool)
    for position in range(target.length):
        d = distances[position].cpu()  # read entry by entry below: on the host, once
        order = torch.argsort(d)
        if config.mode == "ranked":
            kept = [int(i) for i in order[: config.token_beam]]
        else:
            kept = [
                int(i)
                for i in order[: config.max_tokens_per_position]
                if d[i] < config.token_threshold
            ]
        candidates.append([t for t in kept if t not in special] or kept)
    return candidates


def _extension_distances(
    model, second: LayerSpan, prefixes: list[list[int]], tokens: list[int]
) -> torch.Tensor:
    """Distance to the second layer's span of every prefix extended by every token, in the
    order prefix-major (in closed form: ``gpt2_extend``, ``rotary_extend`` for the LLaMA
    family; chunks bound the memory)."""
    extend = rotary_second_layer_inputs if model.architecture.rotary else second_layer_inputs
    device = model.device
    token_ids = torch.tensor(tokens, device=device)
    out = []
    step = max(1, 8192 // max(1, len(tokens)))
    for start in range(0, len(prefixes), step):
        chunk = torch.tensor(prefixes[start : start + step], device=device)
        inputs = extend(model.backbone, chunk, token_ids)
        out.append(distance_to_span(second, inputs).reshape(-1))
    return torch.cat(out).cpu()  # read entry by entry by the search: on the host, once


def _decoder_sequences(
    target: TextTarget,
    second: LayerSpan,
    candidates: list[list[int]],
    config: DagerConfig,
    on_progress: OnProgress,
    should_stop: StopCheck = never_stop,
) -> tuple[list[list[int]], list[str], bool]:
    """The sequences, notes, and whether a stop request cut the search short."""
    model, notes, stopped = target.model, [], False
    prefixes: list[list[int]] = [[t] for t in candidates[0]]
    finished: list[list[int]] = []
    # Ranked, the last position is left to the final LayerNorm (no span holds it).
    last = target.length - 1 if config.mode == "ranked" else target.length
    for position in range(1, last):
        if should_stop():
            notes.append(stopped_note(position - 1, last - 1, "positions extended"))
            stopped = True
            break
        tokens = candidates[position]
        if not tokens or not prefixes:
            finished.extend(prefixes)
            prefixes = []
            break
        trials = [[*p, t] for p in prefixes for t in tokens]
        if config.mode == "exact" and len(trials) > config.max_prefixes:
            notes.append(
                f"position {position}: {len(trials)} extensions to test, over the bound of "
                f"{config.max_prefixes}; the best-scoring ones were kept"
            )
        d = _extension_distances(model, second, prefixes, tokens)
        if config.mode == "ranked":
            keep = torch.argsort(d).tolist()[: _beam(target, config)]
        else:
            keep = [i for i in torch.argsort(d).tolist() if d[i] < config.sequence_threshold]
            keep = keep[: config.max_prefixes]
        extended = {i // len(tokens) for i in keep}
        finished.extend(p for i, p in enumerate(prefixes) if i not in extended)
        prefixes = [trials[i] for i in keep]
        on_progress(
            TextProgress(
                position, target.length - 1, tuple(model.tokenizer.decode(p) for p in prefixes[:64])
            )
        )
    if config.mode == "ranked":  # the closest prefixes, one per sequence the server expects
        return [list(p) for p in prefixes[: target.batch_size]], notes, stopped
    sequences = prefixes + finished
    # The longest first: a finished prefix is also the start of the sequences that went on.
    sequences.sort(key=len, reverse=True)
    kept: list[list[int]] = []
    for seq in sequences:
        if not any(k[: len(seq)] == seq for k in kept):
            kept.append(seq)
    return kept, notes, stopped


def _encoder_sequences(
    target: TextTarget,
    second: LayerSpan,
    candidates: list[list[int]],
    config: DagerConfig,
    should_stop: StopCheck = never_stop,
) -> tuple[list[list[int]], list[str], bool]:
    """Sequences whose every second-layer input lies in the span, among the combinations of
    the positions' candidates (exhaustive up to the bound, then the best of each position)."""
    model = target.model
    if target.batch_size == 1 or all(len(c) == 1 for c in candidates):
        return [[c[0] for c in candidates]], [], False
    per_position = [c[: max(1, target.batch_size)] for c in candidates]
    total = 1
    for c in per_position:
        total *= len(c)
    notes, stopped = [], False
    if total > config.encoder_combinations:
        notes.append(
            f"the encoder search has {total:.3g} combinations, over the bound of "
            f"{config.encoder_combinations}: only the best-scoring sequences were assembled"
        )
        combos = [[c[min(i, len(c) - 1)] for c in per_position] for i in range(target.batch_size)]
    else:
        combos = [list(c) for c in itertools.product(*per_position)]
    scores = []
    for start in range(0, len(combos), 128):
        if start and should_stop():
            notes.append(stopped_note(start, len(combos), "combinations scored"))
            combos, stopped = combos[:start], True
            break
        chunk = torch.tensor(combos[start : start + 128], device=model.device)
        inputs = layer_inputs(model, 1, chunk)
        scores.append(distance_to_span(second, inputs).max(dim=1).values)
    s = torch.cat(scores).cpu()  # read entry by entry below: on the host, once
    order = torch.argsort(s).tolist()
    chosen = [combos[i] for i in order if s[i] < config.sequence_threshold][: target.batch_size]
    if not chosen:
        chosen = [combos[i] for i in order[: target.batch_size]]
        notes.append("no assembled sequence passed the sequence filter: the closest are given")
    return chosen, notes, stopped


def run_dager(
    target: TextTarget,
    config: DagerConfig = DagerConfig(),
    on_progress: OnProgress = no_progress,
    should_stop: StopCheck = never_stop,
) -> RecoveredText:
    started = time.perf_counter()
    model = target.model
    # Where positions rotate (the LLaMA family) the sequence filter reads the second layer's
    # query alone: a prefix of one token repeated gives layer 1 the input its first position
    # had, which the keys' and values' gradients hold, but no query past the first does.
    queries_only = model.architecture.rotary
    first = layer_span(model, target.update, 0, config.rank_tolerance)
    second = layer_span(model, target.update, 1, config.rank_tolerance, queries_only=queries_only)
    if config.mode == "ranked":
        first, second = _above_noise(first, target, config), _above_noise(second, target, config)
    notes: list[str] = [
        f"first-layer span: rank {first.rank} of width {first.width}, read from {first.source}"
    ]
    holds = first.rank < first.width and target.update.algorithm == "fedsgd"
    if first.rank >= first.width:
        notes.append(
            f"the update's first-layer gradient has full rank ({first.rank} of width "
            f"{first.width}): more tokens than the width, or noise; DAGER's exactness does not hold"
        )
    if target.update.algorithm != "fedsgd":
        notes.append(
            "the update is FedAvg's weight change over several steps, not one gradient: the "
            "span holds only approximately"
        )
    if target.update.adapters_only:
        notes.append(
            f"only LoRA adapters train: the span is read from the adapters' A matrix, of rank "
            f"at most {target.model.lora_rank}, far below the batch's token count"
        )
        holds = False
    if config.mode == "exact" and first.rank >= first.width:
        notes.append("the exact span check has no low-rank span to test against: nothing tested")
        on_progress(TextProgress(target.length, target.length, (), "done"))
        return RecoveredText(NAME, (), (), time.perf_counter() - started, tuple(notes), False)
    candidates = _token_candidates(target, first, config)
    found = sum(len(c) for c in candidates)
    notes.append(
        f"token filter: {found} (position, token) pairs in the span over {target.length} positions"
        if config.mode == "exact"
        else f"token filter: the {config.token_beam} closest tokens at each of {target.length} "
        f"positions (ranked; span rank {first.rank})"
    )
    if any(len(c) >= config.max_tokens_per_position for c in candidates):
        holds = False
    if model.family == DECODER:
        sequences, more, stopped = _decoder_sequences(
            target, second, candidates, config, on_progress, should_stop
        )
        more += complete_decoder(target, sequences)
    else:
        sequences, more, stopped = _encoder_sequences(
            target, second, candidates, config, should_stop
        )
        sequences = [_strip_encoder_specials(target, s) for s in sequences]
    notes.extend(more)
    if config.mode == "ranked":  # ranking claims no exactness: there are no assumptions to hold
        holds = None
    elif stopped:
        holds = False  # a search cut short proves nothing of what it did not reach
    texts = tuple(model.tokenizer.decode(s) for s in sequences)
    on_progress(TextProgress(target.length, target.length, texts[:64], "done"))
    return RecoveredText(
        NAME, tuple(tuple(s) for s in sequences), texts, time.perf_counter() - started,
        tuple(notes), holds, stopped,
    )  # fmt: skip


def complete_decoder(target: TextTarget, sequences: list[list[int]]) -> list[str]:
    """Under next-token training the last token is in no span: read it from the final
    LayerNorm's or the untied output head's gradient (``last_token.py``), in place."""
    if not sequences or any(len(s) >= target.length for s in sequences):
        return []
    read = recover_last_tokens(target, sequences)
    if read is None and len(sequences) != target.batch_size:
        return [
            f"{len(sequences)} sequences found for a batch of {target.batch_size}: each one's "
            "last token is in no layer's span and was not read (it is read for one sequence "
            "each)"
        ]
    if read is None:
        return [
            "each sequence's last token is in no layer's span (no loss reads it) and the update "
            "does not let it be read otherwise: sequences end one token short"
        ]
    last, source = read
    for seq, token in zip(sequences, last, strict=True):
        seq.append(token)
    return [f"last tokens read from {source} (next-token training)"]


def _strip_encoder_specials(target: TextTarget, seq: list[int]) -> list[int]:
    tok = target.model.tokenizer
    return [t for t in seq if t not in (tok.bos_id, tok.eos_id, tok.pad_id)]
