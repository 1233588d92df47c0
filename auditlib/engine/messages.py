"""The messages a worker sends to a run's consumer, typed, with one plain wire form.

On the wire a message is a dict of JSON-able values and PNG bytes (``to_wire``), so it
crosses process and machine boundaries (Ray's object store) without the consumer having
to trust or unpickle library objects; ``from_wire`` gives the typed message back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from auditlib.result import AuditSummary


@dataclass(frozen=True)
class StartMessage:
    """The victim is ready: its images' names, labels and a PNG row of them."""

    kind: ClassVar[str] = "start"
    names: tuple[str, ...]
    labels: tuple[int, ...]
    png: bytes


@dataclass(frozen=True)
class EventMessage:
    """An attack's progress: its step, planned steps, elapsed time and losses."""

    kind: ClassVar[str] = "event"
    step: int
    total: int
    elapsed: float
    losses: Mapping[str, float | None]


@dataclass(frozen=True)
class FrameMessage:
    """The attack's current images, matched to the originals, as a PNG row."""

    kind: ClassVar[str] = "frame"
    step: int
    png: bytes
    psnr_mean: float


@dataclass(frozen=True)
class UtilityMessage:
    """A round of the utility training done."""

    kind: ClassVar[str] = "utility"
    round: int
    rounds: int
    accuracy: float
    elapsed: float
    budget: float

    def stage(self) -> str:
        """What the run does now, in words (the store's stage column)."""
        return (
            f"utility training: {self.round} of {self.rounds} rounds done, "
            f"{self.elapsed:.0f} s of its {self.budget:g} s budget"
        )


@dataclass(frozen=True)
class ResultMessage:
    """The audit's result: the store's status, the summary and the comparison grid."""

    kind: ClassVar[str] = "result"
    status: str
    summary: AuditSummary
    png: bytes


@dataclass(frozen=True)
class ErrorMessage:
    kind: ClassVar[str] = "error"
    message: str
    input_error: bool  # the user's input was refused (not a failure of the tool)
    traceback: str | None = None
    cancelled: bool = False  # cancelled before anything was measured: not a failure


Message = StartMessage | EventMessage | FrameMessage | UtilityMessage | ResultMessage | ErrorMessage
_BY_KIND: dict[str, type] = {
    cls.kind: cls
    for cls in (
        StartMessage,
        EventMessage,
        FrameMessage,
        UtilityMessage,
        ResultMessage,
        ErrorMessage,
    )
}


def to_wire(message: Message) -> dict[str, Any]:
    """The plain dict form: ``type`` plus the fields (tuples as lists, the summary as JSON)."""
    wire: dict[str, Any] = {"type": message.kind}
    for f in fields(message):
        value = getattr(message, f.name)
        if isinstance(value, AuditSummary):
            value = value.to_json()
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        wire[f.name] = value
    return wire


def from_wire(wire: Mapping[str, Any]) -> Message:
    """The typed message of a wire dict; a ValueError names an unknown type."""
    cls = _BY_KIND.get(wire.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown message type {wire.get('type')!r}")
    values = {f.name: wire[f.name] for f in fields(cls) if f.name in wire}
    if cls is ResultMessage:
        values["summary"] = AuditSummary.from_json(values["summary"])
    elif cls is StartMessage:
        values["names"], values["labels"] = tuple(values["names"]), tuple(values["labels"])
    return cls(**values)
