"""An attack's step traced and compiled: the objective of the running restarts and its
gradient to the attack's variables as one graph (issue 55).

Eager, one step of an optimisation attack is hundreds of small kernels launched one at a
time from Python (the double backward of the simulated client update); on a GPU the
launches, not the arithmetic, bound it. ``torch.compile`` traces the step once per shape
(the number of restarts still running) into one graph: fused kernels by Inductor on the
CPU, and on CUDA the same graph captured as a CUDA graph (``mode="reduce-overhead"``), one
launch per step.

The traced objective is the same function the eager step differentiates
(``UpdateMatcher.together``, one batched pass over the restarts), with two differences,
both exact: its gradient is taken by ``torch.func.grad`` instead of ``Tensor.backward``,
and a Linear weight's gradient is formed densely (the factored form reads the layer's
output gradient through a forward hook, which the tracer cannot register). BatchNorm on
batch statistics normalises by composite operations throughout the run
(``client.exact_batchnorm``), as the batched eager step does. Values agree with the eager
step's up to float summation order (tests/test_compiled_step.py).

Compiling costs seconds to minutes per shape before the first step (measured in
docs/PERFORMANCE.md), so it is asked for (``compiled`` in the attack's configuration), not
the default. On a CPU a trace is kept for the process's later runs of the same objective:
where torch's guards pass (the same model structure, shapes and settings; the weights, the
target update and the variables are the trace's inputs), a later run steps without
compiling (on CUDA only where asked for: ``KEEP_ON_CUDA``).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.utils._pytree import tree_map

from auditlib.attacks.base import ProgressEvent
from auditlib.attacks.objectives import why_not_together
from auditlib.client.exact_batchnorm import exact_batchnorm
from auditlib.errors import AttackUnsupportedError
from auditlib.threat import AttackerKnowledge

# Stacked variables (then any inputs not differentiated) in; per restart, the objective, and
# named outputs: losses (one value each) or any tensors the step needs besides (FedLeak's
# masks), reported, not differentiated.
Objective = Callable[..., tuple[torch.Tensor, dict[str, Any]]]
_INSTANCES = itertools.count()
# torch.compile keeps its traces on the traced function's code object. A code object is kept
# per objective for later runs (at most KEPT, the least recently used let go), whose steps
# reuse its traces where their guards pass: on an H200 each run of IG at 224 px spent 43-45 s
# tracing a step that the run before had traced. A code object takes at most torch's
# recompile limit of traces (8) and past it runs the step eagerly, silently: one holding half
# that many is set aside for a fresh one, so a run (a race's 4, 2 and 1 starts: 3 traces)
# never reaches the limit. On CUDA a kept trace would also keep its CUDA graph's memory pool
# (the step's working memory) between runs, which the sample audit's memory plan and other
# runs would lose: not kept there until measured (benchmarks/compiled_step.py --keep-traces).
KEPT = 8
KEEP_ON_CUDA = False
_kept: OrderedDict[tuple, types.CodeType] = OrderedDict()
_kept_lock = threading.Lock()
_fresh = threading.local()


@contextlib.contextmanager
def fresh_traces() -> Iterator[None]:
    """Within (this thread): compiled steps trace on code objects of their own, neither
    reusing kept traces nor keeping theirs. A time estimate measures within it the
    compiling that a run in another process (a Ray worker) may have to pay."""
    before = getattr(_fresh, "on", False)
    _fresh.on = True
    try:
        yield
    finally:
        _fresh.on = before


def traces_on(code: types.CodeType) -> int | None:
    """How many traces torch keeps on ``code`` (its cache entries); None where this torch
    does not say (its debugging accessor is not public), and nothing is kept then."""
    entries = getattr(torch._dynamo.eval_frame, "_debug_get_cache_entry_list", None)
    return None if entries is None else len(entries(code))


def _recompile_limit() -> int:
    return getattr(torch._dynamo.config, "recompile_limit", 8)  # cache_size_limit before 2.6


def _kept_code(template: types.CodeType, key: tuple) -> types.CodeType:
    """The code object to trace ``key``'s step on: the one kept from an earlier run, or a
    fresh one where none is kept or it holds half of torch's recompile limit."""
    fresh = template.replace(co_name=f"attack_step_{next(_INSTANCES)}")
    on_cuda = key[-1] == "cuda"
    if getattr(_fresh, "on", False) or (on_cuda and not KEEP_ON_CUDA) or traces_on(fresh) is None:
        return fresh
    with _kept_lock:
        code = _kept.pop(key, None)
        if code is None or traces_on(code) >= _recompile_limit() // 2:
            code = fresh
        _kept[key] = code
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
        return code


def value_and_gradient(objective: Objective, inputs: tuple[torch.Tensor, ...], count: int):
    """The step a trace or a CUDA graph records: ``objective``'s per-start values, its
    named outputs (detached) and the gradient of the values' sum to its first ``count``
    inputs, by ``torch.func.grad``. The inputs not differentiated are the transformed
    function's own too, so that the objective may write into them (a BatchNorm's running
    statistics in train mode), which a captured tensor may not be under torch.func.grad."""

    def total(*values: torch.Tensor):
        value, named = objective(*values)
        return value.sum(), (value.detach(), tree_map(torch.Tensor.detach, named))

    argnums = tuple(range(count))
    grads, (value, named) = torch.func.grad(total, argnums=argnums, has_aux=True)(*inputs)
    return grads, value, named


def why_not_compiled(knowledge: AttackerKnowledge) -> str | None:
    """Why this attack's step cannot be traced (None: it can): the traced step is the
    batched one, so whatever keeps restarts apart keeps the step eager. An adaptive
    attacker's fitted unknowns are the step's inputs, a row per start (one start too)."""
    return why_not_together(knowledge)


class CompiledGradient:
    """``objective``'s gradient to its variables and its values, compiled.

    ``objective(*variables, *given)`` returns the per-restart objective (R values, the one
    differentiated) and named outputs (losses, R values each, or tensors such as masks;
    reported, not differentiated); a call ``(*variables, given=...)`` returns
    ``(gradients, objective, outputs)``, one gradient per variable. Each number of
    restarts is traced once (static shapes: a race's 4, 2 and 1 running restarts are three
    graphs). On CUDA each graph is replayed as a CUDA graph, whose outputs the next replay
    overwrites: the gradients are to be used before the next call (an attack step does),
    the values and losses are copies.
    """

    def __init__(
        self, objective: Objective, device: torch.device, backend: str = "inductor", role: str = ""
    ) -> None:
        """``backend``: torch.compile's; ``"aot_eager"`` traces the step (and its gradient)
        as the product does but runs the traced graph eagerly, without generating code.
        ``role``: which of a run's compiled steps of one objective this is (FedLeak's
        iterate and look-ahead), each kept apart for later runs."""
        self.objective = objective
        self.cuda = device.type == "cuda" and backend == "inductor"
        mode = "reduce-overhead" if self.cuda else None

        def value_and_grad(variables: tuple[torch.Tensor, ...], given: tuple[torch.Tensor, ...]):
            return value_and_gradient(self.objective, (*variables, *given), len(variables))

        # Traced on the code object kept for this objective (``_kept_code``), with this
        # run's closure: torch's guards decide whether an earlier run's trace serves it.
        key = (getattr(objective, "__code__", objective), role, backend, mode, device.type)
        self.code = _kept_code(value_and_grad.__code__, key)
        own = types.FunctionType(
            self.code,
            value_and_grad.__globals__,
            None,
            None,
            value_and_grad.__closure__,
        )
        self._step = torch.compile(own, backend=backend, mode=mode, dynamic=False, fullgraph=True)

    def __call__(
        self, *variables: torch.Tensor, given: tuple[torch.Tensor, ...] = ()
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, dict[str, Any]]:
        if self.cuda:  # the previous replay's outputs have been read: its memory may go
            torch.compiler.cudagraph_mark_step_begin()
        grads, value, named = self._step(tuple(v.detach() for v in variables), tuple(given))
        if self.cuda:  # kept past the next replay (the loop reads losses back every few steps)
            value, named = value.clone(), tree_map(torch.Tensor.clone, named)
        return grads, value, named


@contextlib.contextmanager
def traced_model(knowledge: AttackerKnowledge, *also: AbstractContextManager) -> Iterator[None]:
    """Held for a compiled run: the model's BatchNorm layers on composite operations, so the
    traced graphs see one fixed module (entering it inside the trace would patch modules),
    and ``also`` (an attack's forward hooks held for the run, ``forward_hooks.HeldHooks``)."""
    with exact_batchnorm(knowledge.model), contextlib.ExitStack() as stack:
        for context in also:
            stack.enter_context(context)
        yield


def refuse_unless_traceable(attack: str, reason: str | None) -> None:
    """An attack asked for ``compiled=true`` where ``reason`` keeps its step eager."""
    if reason is not None:
        raise AttackUnsupportedError(f"{attack} cannot compile its step here: {reason}")


def apart_when_compiled(
    attack: str, otherwise: Callable[[Any, bool], str | None] | None = None
) -> Callable[[Any, bool], str | None]:
    """``AttackInfo.why_updates_apart`` of an attack that can compile its step: a compiled
    (or captured: ``attacks.captured``) step traces one update's, so a sample's updates run
    one after another; else ``otherwise``'s reason, if any."""

    def why(config: Any, raced: bool) -> str | None:
        for way in ("compiled", "captured"):
            if getattr(config, way, False):
                return f"{attack} traces one update's step ({way}=true)"
        return None if otherwise is None else otherwise(config, raced)

    return why


def held(context: AbstractContextManager[None], events: Iterator[ProgressEvent]):
    """``events`` with ``context`` held exactly as long as the run (also when the consumer
    stops iterating early)."""
    with context:
        yield from events
