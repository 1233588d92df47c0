"""Several attacks of one run at once (``--attack all`` on CUDA, issue 55).

Each attack runs in a thread of its own, on a CUDA stream of its own, with a copy of the
model of its own (an attack holds hooks and patched BatchNorm layers on the model it is
given: ``attacks.compiled.held``, GradInversion's prior), and sends its progress events to
the caller's thread, which yields them in the order they come. PyTorch lets go of Python's
lock while an operator runs, so while one attack's thread launches kernels or waits for a
result on the host (an L-BFGS line search, a read-back), the others launch theirs: the GPU,
which one attack leaves idle between its small kernels, gets the work of all of them.

Each attack draws from its own generators and its own copy of the model, so without a time
budget the attacks end where they end one after another (tests/test_attacks_at_once.py).
On CUDA their peaks add up: each attack's is measured on one step first, and the attacks run
in groups that fit in the memory free (:func:`groups_that_fit`), one group after another.
On a CPU they run one after another: their threads share the same cores, which gained
little (``why_not_at_once``). On CUDA too, unless asked for, until their check against the
attacks one after another passes on a GPU (``UNCONFIRMED_ON_CUDA``).
"""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from auditlib.attacks import ProgressEvent, Reconstruction
from auditlib.engine.memory_plan import SHARE, free_bytes, peak_bytes
from auditlib.errors import AttackUnsupportedError, AuditInputError

# Measured on this project's 2-core CPU through the product's run (benchmarks.attacks_at_once,
# docs/PERFORMANCE.md, "Attacks at once"): the same plan at once took 0.93x of its time one
# after another on LeNet and on ResNet-18. Little, beside memory that adds up with no device
# memory to plan it by, and runs that share the machine's cores with other users' runs.
NO_CPU_GAIN = (
    "on a CPU the attacks run one after another: at once they share the same cores and "
    "gained little (the same plan in 0.93x of the time on 2 cores), while their memory adds up"
)
# The one check of the streams on a GPU (an H200, 2026-11-30) found an attack at once 1.33
# away from one after another, with no control run in turn twice to tell the GPU's own
# run-to-run spread (cuDNN's atomics) from a fault of the streams: until that control passes
# on a GPU, a run asks for attacks at once (``attacks_at_once=True``) rather than getting it.
UNCONFIRMED_ON_CUDA = (
    "at once on CUDA is asked for, not the default: its check against the attacks one after "
    "another has not yet passed on a GPU (tests/test_attacks_at_once.py, docs/ALGORITHMS.md)"
)
# How long the caller waits for an attack's thread to stop after it was told to (it stops
# at its next step): past this the thread is left to end on its own (a daemon thread).
JOIN_S = 60.0


def why_not_at_once(planned: Sequence, release_for: Callable) -> str | None:
    """Why a run's planned attacks (``engine.attack_phase.PlannedAttack``) run one after
    another, or None where they run at once: more than one, on a CUDA device (that of the
    first attack's release; the honest server's releases share the model's device) once
    the streams' check has passed on a GPU (``UNCONFIRMED_ON_CUDA`` until then)."""
    if len(planned) < 2:
        return "one attack to run"
    try:
        device = release_for(planned[0]).knowledge.device
    except AuditInputError as exc:  # one after another, each attack then says why
        return str(exc)
    return UNCONFIRMED_ON_CUDA if device.type == "cuda" else NO_CPU_GAIN


def groups_that_fit(calls: Mapping[int, object]) -> list[list[int]]:
    """The calls in groups to run at once, one group after another: on CUDA as many, in
    the plan's order, as fit together in ``memory_plan.SHARE`` of the memory free, each
    attack's peak measured on one step of its own (:func:`one_step_peak`); elsewhere one
    group (no device memory to plan)."""
    order = list(calls)
    if not order:
        return []
    device = calls[order[0]].knowledge.device
    if device.type != "cuda":
        return [order]
    peaks = {index: one_step_peak(call) for index, call in calls.items()}
    return fit_groups(peaks, int(SHARE * free_bytes(device)))


def fit_groups(peaks: Mapping[int, int | None], room: int) -> list[list[int]]:
    """Consecutive groups whose peaks add up to at most ``room`` bytes (an attack whose peak
    alone is over it is a group of its own; an unmeasured peak counts as nothing)."""
    groups: list[list[int]] = []
    held = 0
    for index, peak in peaks.items():
        peak = peak or 0
        if not groups or held + peak > room:
            groups.append([])
            held = 0
        groups[-1].append(index)
        held += peak
    return groups


def one_step_peak(call) -> int | None:
    """The peak memory of one step of ``call``'s attack (its starts' first step, on a copy
    of its model, as its thread will run it); None where it cannot be read, or where the
    attack refuses (its thread will say why)."""
    probe = _own_copy(call, threading.Event())
    probe = replace(probe, control=replace(probe.control, max_steps=1, max_seconds=None))

    def one_step() -> None:
        for _ in probe.events():
            pass

    try:
        return peak_bytes(one_step, call.knowledge.device)
    except AttackUnsupportedError:
        return None


@dataclass(frozen=True)
class Ended:
    """An attack's thread has ended: its final result, or what stopped it."""

    final: Reconstruction | None
    error: BaseException | None
    seconds: float


def run_at_once(calls: Mapping[int, object]) -> Iterator[tuple[int, ProgressEvent | Ended]]:
    """Run ``calls`` (index -> ``AttackCall``) at once: (index, event) pairs as the attacks
    send them, each attack's last pair an :class:`Ended`. Closing the iterator (or a
    cancellation) stops every attack at its next step."""
    stopping = threading.Event()
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    readied = {index: _own_copy(call, stopping) for index, call in calls.items()}
    threads = [
        threading.Thread(
            target=_work,
            args=(index, call, inbox, _current_stream(call.knowledge.device)),
            name=f"attack {call.attack.name}",
            daemon=True,
        )
        for index, call in readied.items()
    ]
    for thread in threads:
        thread.start()
    running = len(threads)
    try:
        while running:
            index, item = inbox.get()
            running -= isinstance(item, Ended)
            yield index, item
    finally:
        stopping.set()
        for thread in threads:
            thread.join(JOIN_S)


def _own_copy(call, stopping: threading.Event):
    """The call with a model of its own, and a control that also stops when the run does."""
    knowledge = replace(call.knowledge, model=copy.deepcopy(call.knowledge.model))
    cancelled = call.control.is_cancelled

    def is_cancelled() -> bool:
        return stopping.is_set() or cancelled()

    return replace(
        call, knowledge=knowledge, control=replace(call.control, is_cancelled=is_cancelled)
    )


def _current_stream(device: torch.device):
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


def _work(index: int, call, inbox: queue.SimpleQueue, origin) -> None:
    """One attack's thread; ``origin``: the caller's CUDA stream (None on a CPU), where the
    model's copy was made."""
    began = time.perf_counter()
    final, error = None, None
    device = call.knowledge.device
    stream = torch.cuda.Stream(device) if origin is not None else None
    if stream is not None:
        stream.wait_stream(origin)
    try:
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for event in call.events():
                if event.final is not None:
                    final = event.final
                inbox.put((index, event))
        if stream is not None:  # the caller reads the final tensors on its own stream
            stream.synchronize()
    except BaseException as exc:  # handed to the caller's thread, which decides
        error = exc
    inbox.put((index, Ended(final, error, time.perf_counter() - began)))
