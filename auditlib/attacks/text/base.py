"""What every text attack takes and gives: the server's knowledge (the model it sent, the
update it received, the shape of the batch it may assume) and the recovered sequences, with
progress as the run goes and a stop request read between steps (a Cancel: the attack then
returns what it had, ``RecoveredText.stopped``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from auditlib.client.text_update import TextUpdate
from auditlib.models.text import TextModel


@dataclass(frozen=True, eq=False)
class TextTarget:
    """The server's knowledge. ``batch_size`` and ``length`` are what the server may assume
    (FedAvg clients report their example counts; the sequence length is the federation's
    setting); ``labels`` only where the attack's paper assumes them known."""

    model: TextModel
    update: TextUpdate
    batch_size: int
    length: int
    labels: torch.Tensor | None = None


@dataclass(frozen=True)
class TextProgress:
    step: int
    total: int
    texts: tuple[str, ...]  # the best sequences so far
    note: str = ""


@dataclass(frozen=True)
class RecoveredText:
    attack: str
    token_ids: tuple[tuple[int, ...], ...]  # each recovered sequence's real tokens
    texts: tuple[str, ...]
    seconds: float
    notes: tuple[str, ...] = ()  # what held and what did not, in words
    assumptions_hold: bool | None = None  # None: the attack has no exactness assumptions
    stopped: bool = False  # stopped on request before its budget: what it had then


OnProgress = Callable[[TextProgress], None]
StopCheck = Callable[[], bool]  # True once the run is asked to stop


def no_progress(_: TextProgress) -> None:
    return None


def never_stop() -> bool:
    return False


def stopped_note(done: int, total: int, unit: str) -> str:
    return f"stopped on request after {done} of {total} {unit}: what it had recovered then"
