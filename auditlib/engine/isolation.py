"""Running an audit whose model runs the user's code (a trusted archive, a model class of
the user's own code) in a separate process.

TorchScript and torch.export archives can execute code when loaded, and an own class's file
runs when it is imported, so they are loaded only in a freshly spawned child process, never
in the caller's: the command line's after ``--i-trust-this-file``, a dashboard run's Ray
worker where an admin allows trusted code (``access.trusted_code``; the run manager checks
it before the run is queued). The child sends every item of the audit (``iter_audit``'s:
start, progress, live frames, utility rounds, result) through a pipe as JSON text and
``.npy`` arrays read with ``allow_pickle=False``: nothing the child sends is unpickled, so
code smuggled in through the archive or the class cannot reach the caller.

An own class's file uploaded to the dashboard (``ModelRef.code_asset``) is written by the
child to a private temporary folder and built from there (``own_code.provide_file``), in
place of the path training.json names, which is the client's. A cancelled run's child is
killed: the caller's ``is_cancelled`` is asked between the child's messages, at least every
half second.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from auditlib.attacks import ProgressEvent
from auditlib.spec import RunSpec

POLL_S = 0.5  # how often a waiting caller asks is_cancelled


def runs_own_code(spec: RunSpec) -> bool:
    """Whether the run's model runs the user's code (a trusted archive, an own class): it
    then runs in a process of its own."""
    from auditlib.models import own_code

    return bool(spec.model.trusted_archive) or spec.model.spec.info.source == own_code.SOURCE


def isolated_in_dashboard(spec: RunSpec) -> bool:
    """Whether a dashboard run of ``spec`` (``RunManager``) runs in a process of its own: a
    model class of the user's own code, built from the file they uploaded, where an admin
    allows trusted code on this server. Refused in one line where such a run may not run
    here at all: a trusted archive (command line only), an own class without its uploaded
    file (training.json's path is the client's: this server imports none of its files), or
    the admin setting off."""
    from auditlib.access.users import trusted_code_setting
    from auditlib.errors import AuditInputError
    from auditlib.observed.upload import own_class_refusal

    if spec.model.trusted_archive is not None:
        raise AuditInputError(
            "a trusted model archive runs code when it is loaded; the dashboard does not load "
            "one (python -m auditlib audit --trusted-model FILE --i-trust-this-file does)"
        )
    if not runs_own_code(spec):
        return False
    name = spec.model.spec.architecture
    if not trusted_code_setting().allowed:
        raise AuditInputError(own_class_refusal(name))
    if spec.model.code_asset is None:
        raise AuditInputError(
            f"the model {name} is built on this server only from its .py file uploaded on the "
            "Setup page beside the bundle, never from a path on the server"
        )
    return True


def _array_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _send(conn, header: dict[str, Any], *arrays: np.ndarray) -> None:
    conn.send_bytes(json.dumps({**header, "arrays": len(arrays)}).encode())
    for array in arrays:
        conn.send_bytes(_array_bytes(array))


def _send_item(conn, item) -> None:
    from auditlib.engine.audit import AuditResult, AuditStart, LiveFrame
    from auditlib.engine.utility import UtilityProgress

    if isinstance(item, AuditResult):
        labels = [label for label, _ in item.by_attack]
        header = {"type": "result", "summary": item.summary.to_json(), "by_attack": labels}
        pictures = [images for _, images in item.by_attack]
        _send(conn, header, item.originals, item.reconstruction, *pictures)
    elif isinstance(item, AuditStart):
        header = {"type": "start", "names": list(item.names), "labels": list(item.labels)}
        _send(conn, header, item.originals)
    elif isinstance(item, LiveFrame):
        _send(conn, {"type": "frame", "step": item.step, "psnr": item.psnr_mean}, item.images)
    elif isinstance(item, UtilityProgress):
        fields = (item.round, item.rounds, item.accuracy, item.elapsed_s, item.budget_s)
        _send(conn, {"type": "utility", "fields": list(fields)})
    elif isinstance(item, ProgressEvent):
        message = {
            "type": "event",
            "step": item.step,
            "total": item.total_steps,
            "elapsed": item.elapsed_s,
            "losses": dict(item.losses),
        }
        _send(conn, message)


def _provide_code(spec: RunSpec, assets: Mapping[str, bytes], folder: Path) -> None:
    """Write an uploaded own class's file where the child builds it from."""
    from auditlib.errors import AuditInputError
    from auditlib.models import own_code

    sha = spec.model.code_asset
    if sha is None:
        return
    if sha not in assets:
        raise AuditInputError(
            f"the model's file (upload {sha[:12]}...) was not handed to the worker; upload it "
            "again on the Setup page"
        )
    named, _ = own_code.parts(spec.model.spec.architecture)
    path = folder / Path(named).name
    path.write_bytes(assets[sha])
    own_code.provide_file(named, path)


def _child(spec: RunSpec, conn, assets: dict[str, bytes], kwargs: dict[str, Any]) -> None:
    from auditlib.engine.audit import iter_audit
    from auditlib.errors import AuditInputError
    from auditlib.models import own_code

    # This process exists to run the user's code: the parent starts it only after the
    # trust flag, or the admin's setting and the user's tick (a trusted archive, a model
    # class of the user's own code).
    own_code.allow_own_code()
    try:
        with tempfile.TemporaryDirectory(prefix="auditlib-own-code-") as folder:  # mode 0700
            _provide_code(spec, assets, Path(folder))
            for item in iter_audit(spec, allow_trusted_archive=True, assets=assets, **kwargs):
                _send_item(conn, item)
    except AuditInputError as exc:
        _send(conn, {"type": "input-error", "message": str(exc)})
    except Exception as exc:  # reported to the parent, which raises it as a failure
        _send(conn, {"type": "error", "message": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()
    # Everything is sent, the pipe closed and the temporary folder removed: end without the
    # interpreter's teardown (a second or more with torch loaded, which the parent's join
    # waits for). Nothing of this process is wanted after its last message; its own output
    # is flushed first. An exception that escaped above ends it the usual way instead.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _item_of(message: dict[str, Any], arrays: list[np.ndarray]):
    from auditlib.engine.audit import AuditResult, AuditStart, LiveFrame
    from auditlib.engine.utility import UtilityProgress
    from auditlib.errors import AuditInputError
    from auditlib.result import AuditSummary

    kind = message.get("type")
    if kind == "event":
        return ProgressEvent(
            message["step"], message["total"], message["elapsed"], message["losses"]
        )
    if kind == "start":
        labels = tuple(int(v) for v in message["labels"])
        return AuditStart(arrays[0], tuple(message["names"]), labels)
    if kind == "frame":
        return LiveFrame(message["step"], arrays[0], message["psnr"])
    if kind == "utility":
        return UtilityProgress(*message["fields"])
    if kind == "result":
        by_attack = tuple(zip(message["by_attack"], arrays[2:], strict=True))
        summary = AuditSummary.from_json(message["summary"])
        return AuditResult(summary, arrays[0], arrays[1], by_attack)
    if kind == "input-error":
        raise AuditInputError(message["message"])
    raise RuntimeError(message.get("message", f"the isolated audit sent {kind!r}"))


def iter_isolated(
    spec: RunSpec,
    *,
    assets: Mapping[str, bytes] | None = None,
    is_cancelled: Callable[[], bool] | None = None,
    **kwargs: Any,
) -> Iterator[Any]:
    """``iter_audit(spec, ...)``'s items, computed in a spawned process. ``kwargs`` go to
    ``iter_audit`` (``emit_every``, ``image_every``, ``lpips_nets``); a cancelled run ends
    the child and raises ``RunCancelledError``; closing the generator ends the child."""
    from auditlib.errors import RunCancelledError

    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(
        target=_child, args=(spec, child, dict(assets or {}), kwargs), daemon=True
    )
    process.start()
    child.close()
    finished = False
    try:
        while True:
            while not parent.poll(POLL_S):
                if is_cancelled is not None and is_cancelled():
                    raise RunCancelledError("cancelled; its isolated process was stopped")
                if not process.is_alive() and not parent.poll():
                    break  # gone without a word: recv_bytes says so below
            try:
                message = json.loads(parent.recv_bytes())
                arrays = [
                    np.load(io.BytesIO(parent.recv_bytes()), allow_pickle=False)
                    for _ in range(int(message.get("arrays", 0)))
                ]
            except EOFError as exc:
                raise RuntimeError(
                    f"the isolated audit process ended unexpectedly (exit code {process.exitcode})"
                ) from exc
            item = _item_of(message, arrays)
            finished = message["type"] == "result"
            yield item
            if finished:
                return
    finally:
        parent.close()
        if not finished:  # cancelled, failed or abandoned: nothing more is wanted of it
            process.kill()
        process.join(timeout=10)
        if process.is_alive():
            process.kill()


def run_isolated(
    spec: RunSpec, on_event: Callable[[ProgressEvent], None] | None = None, **kwargs: Any
):
    """Run ``spec`` in a spawned process; same result type as :func:`run_audit`."""
    from auditlib.engine.audit import AuditResult

    for item in iter_isolated(spec, **kwargs):
        if isinstance(item, ProgressEvent) and on_event is not None:
            on_event(item)
        elif isinstance(item, AuditResult):
            return item
    raise RuntimeError("the isolated audit process ended without a result")
