"""LAMP's discrete moves: reorderings of a sequence's free positions (special tokens stay).

Cycled as in eth-sri/lamp's ``swap_tokens``: swap two tokens, move one token elsewhere, move
a span elsewhere, move a prefix to the end. Each yields a full order of the positions.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def _swap(free: list[int], rng: np.random.Generator) -> list[int]:
    i, j = rng.integers(len(free), size=2)
    out = list(free)
    out[i], out[j] = out[j], out[i]
    return out


def _move_token(free: list[int], rng: np.random.Generator) -> list[int]:
    out = list(free)
    token = out.pop(int(rng.integers(len(free))))
    out.insert(int(rng.integers(len(free))), token)
    return out


def _move_span(free: list[int], rng: np.random.Generator) -> list[int]:
    b, e = sorted(int(x) for x in rng.integers(len(free) + 1, size=2))
    span, rest = free[b:e], free[:b] + free[e:]
    at = int(rng.integers(len(rest) + 1))
    return rest[:at] + span + rest[at:]


def _prefix_to_end(free: list[int], rng: np.random.Generator) -> list[int]:
    i = int(rng.integers(1, len(free))) if len(free) > 1 else 0
    return free[i:] + free[:i]


MOVES = (_swap, _move_token, _move_span, _prefix_to_end)


def reorderings(
    length: int, free: list[int], count: int, rng: np.random.Generator
) -> Iterator[list[int]]:
    """``count`` orders of ``range(length)``, each one move applied to the free positions."""
    for k in range(count):
        moved = MOVES[(k + 1) % len(MOVES)](free, rng) if free else []
        order = list(range(length))
        for position, source in zip(free, moved, strict=True):
            order[position] = source
        yield order
