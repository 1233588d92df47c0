"""A run's last writes (its result, or why it ended), kept until the store takes them.

Why: a worker may finish while the database is down (PostgreSQL restarting, a full disk).
Its result must not be lost, and the run must not stay "running" until a restart: the run
manager hands each ending here; one the store refuses for want of an answer is kept and
written again on every heartbeat (``engine.instance``), so the run ends with its true
status within a beat of the store's return. A progress write (an event, a live frame) is
not kept: the next one replaces it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from auditlib.result import AuditSummary
from auditlib.store import ORIGINALS, RECONSTRUCTION, RunFinishedError, Store, UnknownRunError

_LOG = logging.getLogger("auditlib.endings")


def store_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the store could not be reached or could not write (down,
    restarting, locked, its disk full), rather than that the write was wrong."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OSError)


@dataclass(frozen=True)
class Ending:
    """What ends one run: its final status with a summary or an error, and the images it
    still has to store (the originals when its start could not be written)."""

    run_id: str
    status: str
    summary: AuditSummary | None = None
    error: str | None = None
    reconstruction: tuple[int, bytes] | None = None  # (step, PNG)
    originals: bytes | None = None

    def write(self, store: Store) -> Ending | None:
        """Write what is left of it, images first, then the status (each once); returns what
        is still unwritten when the store stops answering part way."""
        ending = self
        try:
            if ending.originals is not None:
                store.add_image(self.run_id, 0, ORIGINALS, ending.originals)
                ending = replace(ending, originals=None)
            if ending.reconstruction is not None:
                step, png = ending.reconstruction
                store.add_image(self.run_id, step, RECONSTRUCTION, png)
                ending = replace(ending, reconstruction=None)
            store.finish(self.run_id, self.status, summary=self.summary, error=self.error)
        except Exception as exc:
            if store_unavailable(exc):
                return ending
            raise
        return None


class Endings:
    """The endings the store has not taken yet, by run id."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._kept: dict[str, Ending] = {}

    def write(self, ending: Ending) -> bool:
        """Write ``ending`` now, or keep it for the next heartbeat; True once written (or
        moot: the run was deleted, or already ended another way)."""
        try:
            left = ending.write(self.store)
        except (RunFinishedError, UnknownRunError):
            return True
        if left is None:
            return True
        _LOG.warning(
            "the store did not take the end of run %s; kept, and written again on every "
            "heartbeat until it does",
            ending.run_id,
        )
        with self._lock:
            self._kept[ending.run_id] = left
        return False

    def retry(self) -> int:
        """Write every kept ending the store now takes; returns how many remain."""
        with self._lock:
            kept = list(self._kept.values())
        for ending in kept:
            try:
                left = ending.write(self.store)
            except (RunFinishedError, UnknownRunError):
                left = None
            except Exception:
                _LOG.exception("the end of run %s cannot be written; dropped", ending.run_id)
                left = None
            with self._lock:
                if left is None:
                    self._kept.pop(ending.run_id, None)
                    _LOG.warning("the end of run %s is written", ending.run_id)
                else:
                    self._kept[ending.run_id] = left
        with self._lock:
            return len(self._kept)

    def holds(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._kept
