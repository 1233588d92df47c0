"""An audit as a stream of messages: what a worker sends to the run's consumer.

The messages are ``engine.messages``' typed ones, sent in their wire form (plain dicts of
JSON-able values and PNG bytes), so they cross process and machine boundaries (Ray's
object store) without the consumer having to trust or unpickle library objects.
"""

from __future__ import annotations

import io
import traceback
from collections.abc import Callable, Iterator, Mapping
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
) -> Iterator[dict[str, Any]]:
    """Run ``spec`` and yield wire messages (``engine.messages``): start, event, frame ...,
    utility (one per training round), then result or error."""
    for message in _messages(spec, assets, is_cancelled, emit_every, image_every, lpips_nets):
        yield to_wire(message)


def _messages(spec, assets, is_cancelled, emit_every, image_every, lpips_nets) -> Iterator[Message]:
    try:
        for item in iter_audit(
            spec,
            assets=assets,
            is_cancelled=is_cancelled,
            emit_every=emit_every,
            image_every=image_every,
            lpips_nets=lpips_nets,
        ):
            if isinstance(item, AuditStart):
                yield StartMessage(item.names, item.labels, row_png(item.originals))
            elif isinstance(item, ProgressEvent):
                yield EventMessage(item.step, item.total_steps, item.elapsed_s, dict(item.losses))
            elif isinstance(item, LiveFrame):
                yield FrameMessage(item.step, row_png(item.images), item.psnr_mean)
            elif isinstance(item, UtilityProgress):
                yield UtilityMessage(
                    item.round, item.rounds, item.accuracy, item.elapsed_s, item.budget_s
                )
            elif isinstance(item, AuditResult):
                yield ResultMessage(
                    STATUS_BY_STOP_REASON.get(item.summary.stop_reason, "completed"),
                    item.summary,
                    png_bytes(comparison_grid(item.originals, item.reconstruction)),
                )
    except AuditInputError as exc:
        yield ErrorMessage(str(exc), input_error=True)
    except RunCancelledError as exc:
        yield ErrorMessage(str(exc), input_error=False, cancelled=True)
    except Exception as exc:  # the consumer marks the run failed and keeps the error
        yield ErrorMessage(
            f"{type(exc).__name__}: {exc}",
            input_error=False,
            traceback=traceback.format_exc(limit=20),
        )
