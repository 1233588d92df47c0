"""An attack's step recorded from its eager run as a CUDA graph and replayed (issue 55).

A compiled step (``attacks.compiled``) saves the launches of hundreds of small kernels a
step, but traces first: 43-45 s for Inverting Gradients at 224 px on an H200 with
Inductor's cache warm, per count of running starts, which a plan of several attacks pays
once per attack. The launches can be saved without tracing: the same step (the objective
and its gradient by ``torch.func.grad``, as ``CompiledGradient`` takes it) runs eagerly for
its first ``WARMUP_STEPS`` steps at each count of starts, is then recorded once as a CUDA
graph (``torch.cuda.graph``: the eager kernels, unfused, launched by one call) and replayed
from then on. Recording costs about one eager step.

A graph reads its inputs from the addresses it was recorded with and writes its outputs to
its own: each call copies the step's variables and given inputs into the graph's buffers,
and the gradients it returns are overwritten by the next replay (an attack step uses them
at once); values and named outputs are copies, as ``CompiledGradient``'s on CUDA. Each
count of running starts is its own graph, with its own memory pool, kept until the next
count is recorded (a race's running starts only fall).

``captured`` in the attack's configuration is three-way: true asks for it (refused off CUDA),
false keeps the step eager, and none (the default) leaves it to the run (``by_default``),
which records on CUDA where the step can be traced once ``BY_DEFAULT_ON_CUDA`` is switched on:
it is off until its CUDA tests and figures are in (docs/PERFORMANCE.md, "The compiled step").
A step a graph cannot hold fails its recording, and the run goes on with the same step
eagerly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from auditlib.attacks.base import ProgressEvent
from auditlib.attacks.compiled import Objective, refuse_unless_traceable, value_and_gradient
from auditlib.errors import AttackUnsupportedError, AuditInputError
from auditlib.reconstruction import COMPILED, EAGER, RECORDED, Stepped
from auditlib.threat import AttackerKnowledge

# What ``captured`` set to none (its default) means, in both fields' words.
_LEFT_TO_THE_RUN = (
    "; none (the default): the run decides, recording where it runs on CUDA and can, once "
    "recording by default is switched on (it is off until its GPU figures are in); false: never"
)
# The ``captured`` field's words, one for every attack that can record its step.
CAPTURED_HELP = (
    "record the step as a CUDA graph after its first eager steps and replay it (CUDA only): "
    "faster steps where kernels are small, without compiling; the starts advance together, "
    "and several updates one after another" + _LEFT_TO_THE_RUN
)
# The same for the L-BFGS attacks, whose evaluations (up to 20 a step) are what is recorded.
CAPTURED_LBFGS_HELP = (
    "record the objective's evaluation as a CUDA graph after its first eager evaluations and "
    "replay it (CUDA only): faster evaluations where kernels are small; the starts advance "
    "together on the batched L-BFGS (one start too), and several updates one after another"
    + _LEFT_TO_THE_RUN
)

# Eager steps at each count of starts before it is recorded: CUDA's and cuBLAS's lazy
# set-up happens there, not inside the recording. cuBLAS keeps its handle and workspace per
# stream, so the eager steps run on the stream the recording is made on.
WARMUP_STEPS = 2

# ``record(run, stream)``: a graph of ``run()``'s kernels, recorded on ``stream`` (None off
# CUDA), and ``run()``'s outputs, which each call of the returned replay rewrites in place.
# ``cuda_graph`` records without running anything.
Recorder = Callable[..., tuple[Callable[[], None], Any]]
_recording = threading.Lock()
_LOG = logging.getLogger(__name__)
# Whether a run on CUDA records its step without being asked (``by_default``): off until its
# CUDA tests and figures are in (issue 55); ``benchmarks.attacks_at_once --captured`` turns
# it on to measure a plan of every attack with it.
BY_DEFAULT_ON_CUDA = False


def cuda_graph(
    run: Callable[[], Any], stream: torch.cuda.Stream | None
) -> tuple[Callable[[], None], Any]:
    """``run`` recorded on ``stream`` as a CUDA graph on a memory pool of its own. Other
    threads' CUDA calls stay allowed while it records (attacks at once: ``engine.at_once``),
    and one thread records at a time (entering a recording empties torch's cache of free
    blocks)."""
    graph = torch.cuda.CUDAGraph()
    with _recording, torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        outputs = run()
    return graph.replay, outputs


@contextlib.contextmanager
def _on(stream: torch.cuda.Stream | None) -> Iterator[None]:
    """Within: work on ``stream`` after the current stream's, which then waits for it (no
    stream off CUDA)."""
    if stream is None:
        yield
        return
    current = torch.cuda.current_stream(stream.device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        yield
    current.wait_stream(stream)


def stepped(config: Any) -> bool:
    """Whether an attack's configuration asks for its step traced: compiled or captured (the
    L-BFGS attacks have no compiled step; captured left to the run, None, is not asked)."""
    return bool(getattr(config, "compiled", False) or config.captured)


def by_default(config: Any, knowledge: AttackerKnowledge, reason: str | None) -> Any:
    """``config`` with ``captured`` decided where it was left to the run (None): on, on CUDA
    with ``BY_DEFAULT_ON_CUDA``, where the step can be traced (``reason``, the attack's own,
    is None) and compiling was not asked for; else off. An explicit true or false stays, so
    ``captured=false`` keeps a run on CUDA eager whatever the default becomes."""
    if config.captured is not None:
        return config
    decided = bool(
        BY_DEFAULT_ON_CUDA
        and knowledge.device.type == "cuda"
        and reason is None
        and not getattr(config, "compiled", False)
    )
    if decided:
        _LOG.info("the step is recorded as a CUDA graph (captured=false keeps it eager)")
    return dataclasses.replace(config, captured=decided)


def stepping(
    attack: str, config: Any, knowledge: AttackerKnowledge, reason: str | None
) -> tuple[Any, HowStepped]:
    """The configuration a run of ``attack`` steps by, ``captured`` true or false: refused
    where it asks for a traced step that cannot be had here (:func:`refuse_unless_stepped`;
    ``reason``, the attack's own, is what keeps its step eager), captured where it was left
    to the run and the run records its step (:func:`by_default`); and what tells the run's
    final event how its step was computed (:class:`HowStepped`)."""
    refuse_unless_stepped(attack, config, knowledge, reason)
    decided = by_default(config, knowledge, reason)
    return decided, HowStepped(decided, by_the_run=config.captured is None)


class HowStepped:
    """How one run of an attack computes its step, told in the run's final event
    (:meth:`told`): its configuration as :func:`stepping` decided it, and the recorded
    gradients its starts made (:meth:`made`), since a recording that fails leaves the step
    eager and a run that ends within its eager first steps records nothing."""

    def __init__(self, config: Any, *, by_the_run: bool) -> None:
        self.config, self.by_the_run = config, by_the_run
        self.gradients: list[CapturedGradient] = []

    def made(self, *gradients: Any) -> None:
        """The step's gradients a group of starts made (a compiled one or None: not kept)."""
        self.gradients += [g for g in gradients if isinstance(g, CapturedGradient)]

    def stepped(self) -> Stepped:
        if getattr(self.config, "compiled", False):
            return Stepped(COMPILED)
        if not self.config.captured:
            return Stepped(EAGER)
        chose = (
            "the run's choice on CUDA; captured=false keeps it eager" if self.by_the_run else None
        )
        failed = next((g.unrecorded for g in self.gradients if g.unrecorded), None)
        if any(g.replayed for g in self.gradients):
            later = failed and f"a later recording failed ({failed}), and those steps ran eagerly"
            return Stepped(RECORDED, "; ".join(n for n in (chose, later) if n) or None)
        if failed:
            return Stepped(
                EAGER, f"its recording as a CUDA graph failed ({failed}); it ran eagerly"
            )
        return Stepped(
            EAGER,
            f"nothing was recorded: each count of its starts stopped within the first "
            f"{WARMUP_STEPS} steps (L-BFGS: evaluations), which run eagerly before the recording",
        )

    def told(self, events: Iterator[ProgressEvent]) -> Iterator[ProgressEvent]:
        """``events``, the final one telling how the step was computed."""
        with contextlib.closing(events):  # closed with this: a held context lets go at once
            for event in events:
                if event.final is not None:
                    final = dataclasses.replace(event.final, stepped=self.stepped())
                    event = dataclasses.replace(event, final=final)
                yield event


def one_way_of_stepping(config: Any) -> None:
    """A configuration's check (``__post_init__``): compiled or captured, not both."""
    if config.compiled and config.captured:
        raise AuditInputError(
            "compiled and captured are two ways to run one step: ask for one of them"
        )


def refuse_unless_stepped(
    attack: str, config: Any, knowledge: AttackerKnowledge, reason: str | None
) -> None:
    """An attack asked for ``compiled`` or ``captured`` where ``reason`` (the attack's own:
    what keeps its step eager) or, for a CUDA graph, the device refuses it."""
    if config.captured:
        if reason is None and knowledge.device.type != "cuda":
            reason = f"a CUDA graph needs a CUDA device (this run is on {knowledge.device})"
        if reason is not None:
            raise AttackUnsupportedError(
                f"{attack} cannot record its step as a CUDA graph here: {reason}"
            )
    elif getattr(config, "compiled", False):
        refuse_unless_traceable(attack, reason)


class _Recorded:
    """One count of starts' graph: its input buffers, its replay and its outputs."""

    def __init__(self, inputs: tuple[torch.Tensor, ...], replay: Callable[[], None], outputs):
        self.inputs, self.replay, self.outputs = inputs, replay, outputs

    def __call__(self, inputs: tuple[torch.Tensor, ...]):
        for buffer, value in zip(self.inputs, inputs, strict=True):
            buffer.copy_(value)
        self.replay()
        return self.outputs


class CapturedGradient:
    """``objective``'s gradient to its variables and its values, as ``CompiledGradient``
    computes them (the same call and results), recorded as a CUDA graph per count of
    starts after ``WARMUP_STEPS`` eager steps. ``record``: how a step is recorded
    (``cuda_graph``; a test's stand-in on the CPU)."""

    cuda = True  # the next call overwrites the gradients returned (as a CUDA graph's)

    def __init__(
        self, objective: Objective, device: torch.device, role: str = "", *, record=None
    ) -> None:
        """``device`` and ``role`` as ``CompiledGradient``'s: a graph records on its inputs'
        device, and each object keeps its own graphs (FedLeak's iterate and look-ahead)."""
        self.device, self.role = device, role
        self.objective = objective
        self.record: Recorder = record or cuda_graph
        self.eager_steps: dict[tuple, int] = {}
        self.graphs: dict[tuple, _Recorded] = {}
        self.replayed = 0  # steps the graphs computed (the others ran eagerly)
        self._stream: torch.cuda.Stream | None = None
        # Why a recording failed (a host read or another call a CUDA graph cannot hold,
        # e.g. BatchNorm's cumulative average, momentum None): the run then steps eagerly,
        # the same computation, and says why in its log.
        self.unrecorded: str | None = None

    def _side(self, inputs: tuple[torch.Tensor, ...]) -> torch.cuda.Stream | None:
        """The stream of this object's eager steps and recordings (None off CUDA)."""
        if self._stream is None and inputs and inputs[0].device.type == "cuda":
            self._stream = torch.cuda.Stream(inputs[0].device)
        return self._stream

    def _eager(self, inputs: tuple[torch.Tensor, ...], count: int):
        side = self._side(inputs)
        with _on(side):
            result = value_and_gradient(self.objective, inputs, count)
        if side is not None:  # used on the current stream: its memory waits for that use
            for tensor in tree_flatten(result)[0]:
                tensor.record_stream(torch.cuda.current_stream(side.device))
        return result

    def __call__(
        self, *variables: torch.Tensor, given: tuple[torch.Tensor, ...] = ()
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, dict[str, Any]]:
        inputs = tuple(v.detach() for v in (*variables, *given))
        shape = tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)
        graph = self.graphs.get(shape)
        if graph is None:
            done = self.eager_steps.get(shape, 0)
            if done < WARMUP_STEPS or self.unrecorded is not None:
                self.eager_steps[shape] = done + 1
                return self._eager(inputs, len(variables))
            buffers = tuple(t.clone() for t in inputs)
            count = len(variables)
            try:
                replay, outputs = self.record(
                    lambda: value_and_gradient(self.objective, buffers, count), self._side(inputs)
                )
            except Exception as error:  # not recordable: the same step, eagerly
                self.unrecorded = f"{type(error).__name__}: {error}"[:500]
                _LOG.warning(
                    "the step could not be recorded as a CUDA graph (%s); it runs eagerly",
                    self.unrecorded,
                )
                return self._eager(inputs, len(variables))
            # The graph of an earlier count of starts is let go, and its memory pool (that
            # count's working memory) with it: a race's running starts only fall, and a
            # count that came back would be recorded again, without eager steps.
            graph = _Recorded(buffers, replay, outputs)
            self.graphs = {shape: graph}
        grads, value, named = graph(inputs)
        self.replayed += 1
        # Kept past the next replay (the loop reads losses back every few steps).
        return grads, value.clone(), tree_map(torch.Tensor.clone, named)
