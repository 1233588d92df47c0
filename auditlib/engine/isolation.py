"""Running an audit whose model runs the user's code (a trusted archive, a model class of
the user's own code) in a separate process.

TorchScript and torch.export archives can execute code when loaded, so they are loaded only
in a freshly spawned child process, never in the caller's. The child reports back through a
pipe as JSON text and ``.npy`` arrays read with ``allow_pickle=False``: nothing the child
sends is unpickled, so code smuggled in through the archive cannot reach the caller.
"""

from __future__ import annotations

import io
import json
import multiprocessing
from collections.abc import Callable
from typing import Any

import numpy as np

from auditlib.attacks import ProgressEvent
from auditlib.spec import RunSpec


def _array_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _child(spec: RunSpec, conn, kwargs: dict[str, Any]) -> None:
    from auditlib.attacks import ProgressEvent
    from auditlib.engine.audit import AuditResult, iter_audit
    from auditlib.errors import AuditInputError
    from auditlib.models import own_code

    # This process exists to run the user's code: the parent starts it only after the
    # trust flag (a trusted archive, a model class of the user's own code).
    own_code.allow_own_code()
    try:
        for item in iter_audit(spec, allow_trusted_archive=True, **kwargs):
            if isinstance(item, AuditResult):
                summary = item.summary.to_json()
                conn.send_bytes(json.dumps({"type": "result", "summary": summary}).encode())
                conn.send_bytes(_array_bytes(item.originals))
                conn.send_bytes(_array_bytes(item.reconstruction))
            elif isinstance(item, ProgressEvent):
                message = {
                    "type": "event",
                    "step": item.step,
                    "total": item.total_steps,
                    "elapsed": item.elapsed_s,
                    "losses": dict(item.losses),
                }
                conn.send_bytes(json.dumps(message).encode())
    except AuditInputError as exc:
        conn.send_bytes(json.dumps({"type": "input-error", "message": str(exc)}).encode())
    except Exception as exc:  # reported to the parent, which raises it as a failure
        conn.send_bytes(
            json.dumps({"type": "error", "message": f"{type(exc).__name__}: {exc}"}).encode()
        )
    finally:
        conn.close()


def run_isolated(
    spec: RunSpec, on_event: Callable[[ProgressEvent], None] | None = None, **kwargs: Any
):
    """Run ``spec`` in a spawned process; same result type as :func:`run_audit`."""
    from auditlib.engine.audit import AuditResult
    from auditlib.errors import AuditInputError
    from auditlib.result import AuditSummary

    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(spec, child, kwargs), daemon=True)
    process.start()
    child.close()
    try:
        while True:
            try:
                message = json.loads(parent.recv_bytes())
            except EOFError as exc:
                raise RuntimeError(
                    f"the isolated audit process ended unexpectedly (exit code {process.exitcode})"
                ) from exc
            kind = message.get("type")
            if kind == "event" and on_event is not None:
                on_event(
                    ProgressEvent(
                        message["step"], message["total"], message["elapsed"], message["losses"]
                    )
                )
            elif kind == "result":
                originals = np.load(io.BytesIO(parent.recv_bytes()), allow_pickle=False)
                reconstruction = np.load(io.BytesIO(parent.recv_bytes()), allow_pickle=False)
                summary = AuditSummary.from_json(message["summary"])
                return AuditResult(summary, originals, reconstruction)
            elif kind == "input-error":
                raise AuditInputError(message["message"])
            elif kind == "error":
                raise RuntimeError(message["message"])
    finally:
        parent.close()
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
