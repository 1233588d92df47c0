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
the default.
"""

from __future__ import annotations

import contextlib
import itertools
import types
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


def why_not_compiled(knowledge: AttackerKnowledge) -> str | None:
    """Why this attack's step cannot be traced (None: it can): the traced step is the
    batched one, so whatever keeps restarts apart keeps the step eager."""
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
        self, objective: Objective, device: torch.device, backend: str = "inductor"
    ) -> None:
        """``backend``: torch.compile's; ``"aot_eager"`` traces the step (and its gradient)
        as the product does but runs the traced graph eagerly, without generating code."""
        self.objective = objective
        self.cuda = device.type == "cuda" and backend == "inductor"
        mode = "reduce-overhead" if self.cuda else None

        def value_and_grad(variables: tuple[torch.Tensor, ...], given: tuple[torch.Tensor, ...]):
            def total(*inputs: torch.Tensor):
                value, named = self.objective(*inputs)
                return value.sum(), (value.detach(), tree_map(torch.Tensor.detach, named))

            # The inputs not differentiated are the transformed function's own too, so that
            # the objective may write into them (a BatchNorm's running statistics in train
            # mode), which a captured tensor may not be under torch.func.grad.
            argnums = tuple(range(len(variables)))
            grads, (value, named) = torch.func.grad(total, argnums=argnums, has_aux=True)(
                *variables, *given
            )
            return grads, value, named

        # torch.compile keeps its traces on the function's code object, shared by every
        # instance's closure: each instance traces a code object of its own, so runs (and a
        # run's plans) never fill one shared cache, whose limit turns tracing off silently.
        own = types.FunctionType(
            value_and_grad.__code__.replace(co_name=f"attack_step_{next(_INSTANCES)}"),
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
    step traces one update's, so a sample's updates run one after another; else
    ``otherwise``'s reason, if any."""

    def why(config: Any, raced: bool) -> str | None:
        if config.compiled:
            return f"{attack} traces one update's step (compiled=true)"
        return None if otherwise is None else otherwise(config, raced)

    return why


def held(context: AbstractContextManager[None], events: Iterator[ProgressEvent]):
    """``events`` with ``context`` held exactly as long as the run (also when the consumer
    stops iterating early)."""
    with context:
        yield from events
