"""How many updates advance together before memory runs out: the sample's memory plan.

Updates together (``engine.together``) stack every update's starts as rows of one batched
objective, and a row's memory grows with the model and the image size: one row of a
gradient-matching objective on ResNet-18 at 224 px holds its forward activations, the
first backward's graph (kept for the second) and the second backward's buffers. 64 updates
of 8 starts there would need far more than a workstation has, so the updates are split into
chunks that advance together one chunk after another.

The plan measures rather than guesses: :func:`measure_rows` runs the real batched
evaluation (forward, update, distance and backward) for one row and for two, on the device
the audit uses, and takes the peak memory of each (CUDA: the allocator's peak; CPU: the
process's peak resident set, reset through ``/proc/self/clear_refs`` before each probe).
Their difference is what a row costs, the rest what any evaluation costs. The chunk is as
many updates as fit in a share (``SHARE``) of the memory free now, never fewer than one.
Where no peak can be read (a CPU without ``/proc``), the plan says so and keeps the
updates together, as before the planner.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

SHARE = 0.6  # of the memory free at the start: the rest is for the run's other needs
# Of the memory free before any update is prepared: what the prepared updates may hold
# together (each its own model, release and attacker's copies until it is judged), so that
# the attack's steps still have room.
PREPARED_SHARE = 0.3
# Readings of a peak on a CPU, the lowest kept (``_lowest_peak``).
CPU_READINGS = 2
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass(frozen=True)
class RowCost:
    """Peak memory of one batched evaluation: a fixed part and a part per row (bytes)."""

    fixed: int
    per_row: int

    def of(self, rows: int) -> int:
        return self.fixed + self.per_row * rows


@dataclass(frozen=True)
class MemoryPlan:
    """How the updates are chunked, and from what."""

    updates: int
    chunk: int  # updates that advance together at a time
    rows_per_update: int  # starts (rows) each update brings
    cost: RowCost | None  # None: no peak could be measured here
    free: int | None  # bytes free when planned
    device: str

    @property
    def chunks(self) -> int:
        return math.ceil(self.updates / self.chunk)

    @property
    def words(self) -> str:
        """What the run says of its memory."""
        if self.cost is None or self.free is None:
            return (
                f"memory: {self.updates} updates together, unplanned (no peak memory can be "
                f"read on {self.device} here)"
            )
        need = self.cost.of(self.updates * self.rows_per_update)
        each = self.cost.of(self.chunk * self.rows_per_update)
        if self.chunk >= self.updates:
            return (
                f"memory: {self.updates} updates together need about {_gb(need)} of the "
                f"{_gb(self.free)} free on {self.device}"
            )
        return (
            f"memory: {self.updates} updates together would need about {_gb(need)}, more "
            f"than {SHARE:.0%} of the {_gb(self.free)} free on {self.device}: "
            f"{self.chunks} chunks of up to {self.chunk} (about {_gb(each)} each)"
        )


def _gb(size: int) -> str:
    return f"{size / 1e9:.1f} GB"


def free_bytes(device: torch.device) -> int | None:
    """Memory free on ``device`` now: CUDA's free memory, or the machine's available memory
    (``MemAvailable``); None where neither can be read."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    found = re.search(r"MemAvailable:\s+(\d+) kB", text)
    return int(found.group(1)) * 1024 if found else None


def peak_bytes(run: Callable[[], None], device: torch.device) -> int | None:
    """The peak memory while ``run`` runs, above what was in use before it; None where it
    cannot be read."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before)
    _trim()
    try:
        before = _resident_kb("VmRSS")
        _CLEAR_REFS.write_text("5")  # the peak resident set starts again from now
    except OSError:
        return None
    run()
    return max(0, (_resident_kb("VmHWM") - before) * 1024)


def _lowest_peak(run: Callable[[], None], device: torch.device) -> int | None:
    """:func:`peak_bytes` of ``run``; on a CPU the lowest of ``CPU_READINGS``: the resident
    set is the whole process's, which other threads' work at the same time (a server's, a
    finished test's) can only raise, and one raised reading of the single row made a row
    read 36 MB where it held 50."""
    readings = [
        peak_bytes(run, device) for _ in range(1 if device.type == "cuda" else CPU_READINGS)
    ]
    return None if None in readings else min(readings)


def _trim() -> None:
    """Give the memory the C allocator keeps after frees back to the system, so what a probe
    reuses of an earlier one's is not counted as free of charge (glibc keeps freed blocks
    up to 32 MB in its heap once it has seen them freed)."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to give back
        ctypes.CDLL(None).malloc_trim(0)


def _resident_kb(field: str) -> int:
    found = re.search(rf"{field}:\s+(\d+) kB", _STATUS.read_text())
    if found is None:
        raise OSError(f"no {field} in {_STATUS}")
    return int(found.group(1))


def measure_rows(evaluate: Callable[[int], None], device: torch.device) -> RowCost | None:
    """What ``evaluate(rows)`` (one batched evaluation of that many rows) costs at its peak,
    from runs of one row and of two; None where no peak can be read."""
    evaluate(1)  # a first call's one-off allocations (kernels, caches) are not the rows'
    one = _lowest_peak(lambda: evaluate(1), device)
    two = _lowest_peak(lambda: evaluate(2), device)
    if one is None or two is None:
        return None
    per_row = max(two - one, 1)
    return RowCost(fixed=max(one - per_row, 0), per_row=per_row)


def plan_updates(
    updates: int,
    rows_per_update: int,
    cost: RowCost | None,
    device: torch.device,
    free: int | None = None,
) -> MemoryPlan:
    """Chunk ``updates`` so each chunk's evaluation fits in ``SHARE`` of the free memory
    (``free``, or what :func:`free_bytes` reads now)."""
    free = free_bytes(device) if free is None else free
    if cost is None or free is None:
        return MemoryPlan(updates, updates, rows_per_update, None, free, str(device))
    budget = SHARE * free - cost.fixed
    fit = int(budget // (cost.per_row * rows_per_update)) if budget > 0 else 0
    chunk = min(updates, max(1, fit))
    return MemoryPlan(updates, chunk, rows_per_update, cost, free, str(device))


@dataclass(frozen=True)
class GroupPlan:
    """How many of a sample's updates are prepared, attacked and judged at a time."""

    updates: int
    size: int
    per_update: int | None  # bytes one prepared update held at its peak; None: unmeasured
    free: int | None
    device: str

    @property
    def groups(self) -> int:
        return math.ceil(self.updates / self.size)

    @property
    def words(self) -> str:
        held = "unmeasured" if self.per_update is None else f"about {_gb(self.per_update)}"
        free = "unknown" if self.free is None else _gb(self.free)
        return (
            f"memory: {self.updates} updates prepared {self.size} at a time, {self.groups} "
            f"group(s) (one prepared update holds {held}; {free} free on {self.device})"
        )


def plan_groups(
    updates: int, per_update: int | None, device: torch.device, free: int | None = None
) -> GroupPlan:
    """As many prepared updates at a time as fit in ``PREPARED_SHARE`` of the free memory
    (all of them where nothing could be measured)."""
    free = free_bytes(device) if free is None else free
    if not per_update or free is None:
        return GroupPlan(updates, updates, per_update, free, str(device))
    size = min(updates, max(1, int(PREPARED_SHARE * free // per_update)))
    return GroupPlan(updates, size, per_update, free, str(device))
