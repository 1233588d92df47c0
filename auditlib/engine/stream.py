"""An audit as a stream of messages: what a worker sends to the run's consumer.

The messages are ``engine.messages``' typed ones, sent in their wire form (plain dicts of
JSON-able values and PNG bytes), so they cross process and machine boundaries (Ray's
object store) without the consumer having to trust or unpickle library objects.
"""

from __future__ import annotations

import io
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from auditlib.attacks import ProgressEvent
from auditlib.engine.audit import (
    AuditResult,
    AuditStart,
    LiveFrame,
    UtilityProgress,
    iter_audit,
)
from auditlib.engine.isolation import iter_isolated
from auditlib.engine.messages import (
    ErrorMessage,
    EventMessage,
    FrameMessage,
    Message,
    ResultMessage,
    StartMessage,
    UtilityMessage,
    to_wire,
)
from auditlib.engine.together import iter_together
from auditlib.errors import AuditInputError, RunCancelledError
from auditlib.grids import comparison_grid, image_row
from auditlib.metrics import LPIPS_NETS
from auditlib.spec import RunSpec

# stop_reason of a finished attack -> run status in the store
STATUS_BY_STOP_REASON = {
    "completed": "completed",
    "diverged": "completed",  # finished, with a result; the summary says it diverged
    "time budget": "timed_out",
    "cancelled": "cancelled",
}


def png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def row_png(images: np.ndarray) -> bytes:
    return png_bytes(image_row(images))


def audit_messages(
    spec: RunSpec,
    assets: Mapping[str, bytes] | None = None,
    *,
    is_cancelled: Callable[[], bool] | None = None,
    emit_every: int = 10,
    image_every: int = 50,
    lpips_nets: tuple[str, ...] = LPIPS_NETS,
    isolated: bool = False,
) -> Iterator[dict[str, Any]]:
    """Run ``spec`` and yield wire messages (``engine.messages``): start, event, frame ...,
    utility (one per training round), then result or error. ``isolated``: in a process of
    its own (``engine.isolation``: a model class of the user's own code)."""
    audit = iter_isolated if isolated else iter_audit
    for message in _messages(
        audit, spec, assets, is_cancelled, emit_every, image_every, lpips_nets
    ):
        yield to_wire(message)


def _messages(
    audit, spec, assets, is_cancelled, emit_every, image_every, lpips_nets
) -> Iterator[Message]:
    try:
        for item in audit(
            spec,
            assets=assets,
            is_cancelled=is_cancelled,
            emit_every=emit_every,
            image_every=image_every,
            lpips_nets=lpips_nets,
        ):
            yield message_of(item)
    except Exception as exc:
        yield error_message(exc)


def message_of(
    item: AuditStart | ProgressEvent | LiveFrame | UtilityProgress | AuditResult,
) -> Message:
    """One item of an audit (``iter_audit``'s) as the message the consumer stores."""
    if isinstance(item, AuditStart):
        return StartMessage(item.names, item.labels, row_png(item.originals))
    if isinstance(item, ProgressEvent):
        return EventMessage(item.step, item.total_steps, item.elapsed_s, dict(item.losses))
    if isinstance(item, LiveFrame):
        return FrameMessage(item.step, row_png(item.images), item.psnr_mean)
    if isinstance(item, UtilityProgress):
        return UtilityMessage(item.round, item.rounds, item.accuracy, item.elapsed_s, item.budget_s)
    return ResultMessage(
        STATUS_BY_STOP_REASON.get(item.summary.stop_reason, "completed"),
        item.summary,
        png_bytes(comparison_grid(item.originals, item.reconstruction)),
    )


def error_message(exc: Exception) -> ErrorMessage:
    """Why a run ended without a result: the user's input, a cancellation, or a failure
    (the consumer marks the run failed and keeps the error)."""
    if isinstance(exc, AuditInputError):
        return ErrorMessage(str(exc), input_error=True)
    if isinstance(exc, RunCancelledError):
        return ErrorMessage(str(exc), input_error=False, cancelled=True)
    return ErrorMessage(
        f"{type(exc).__name__}: {exc}",
        input_error=False,
        traceback=traceback.format_exc(limit=20),
    )


def together_messages(
    specs: Sequence[RunSpec],
    assets: Mapping[str, bytes] | None = None,
    *,
    is_cancelled: Callable[[], bool] | None = None,
    emit_every: int = 10,
    image_every: int = 50,
    lpips_nets: tuple[str, ...] = LPIPS_NETS,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """A sample's updates run together (``engine.together.iter_together``) as one stream:
    (update, wire message), each update's messages those of its run alone; where the shared
    computation fails, an error for every update without a result yet."""
    finished: set[int] = set()
    try:
        for u, item in iter_together(
            specs,
            assets=assets,
            is_cancelled=is_cancelled,
            emit_every=emit_every,
            image_every=image_every,
            lpips_nets=lpips_nets,
        ):
            if u is None:  # how the updates were grouped: the command line prints it
                continue
            if isinstance(item, AuditResult):
                finished.add(u)
            yield u, to_wire(message_of(item))
    except Exception as exc:
        error = to_wire(error_message(exc))
        for u in range(len(specs)):
            if u not in finished:
                yield u, error
