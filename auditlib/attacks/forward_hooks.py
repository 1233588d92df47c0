"""What forward passes compute, recorded by forward hooks: through hooks registered for one
block, or held for a whole run, as a traced step needs them (a trace cannot register hooks
but follows those already there). FedLeak's activation prior and GradInversion's stacked
BatchNorm prior read the model this way."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch import nn

# ``record(store, index, inputs, output)``: keep in ``store`` what the call of module
# ``index`` computed.
Record = Callable[[Any, int, tuple[Any, ...], Any], None]


class HeldHooks:
    """Forward hooks on ``modules``, registered while entered (held for a traced run); each
    :meth:`capture` block records into a store of its own (``fresh()``) and lets go of it at
    its end (a traced step must not keep its intermediate tensors); forwards outside a block
    record nothing. :meth:`recording` records a block whether entered or not."""

    def __init__(self, modules: Sequence[nn.Module], record: Record, fresh: Callable[[], Any]):
        self.modules = list(modules)
        self.record = record
        self.fresh = fresh
        self.store: Any = None
        self.entered = False
        self._handles: list[Any] = []

    def _hook(self, index: int):
        def hook(_module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            if self.store is not None:
                self.record(self.store, index, inputs, output)

        return hook

    def __enter__(self) -> HeldHooks:
        self._handles = [m.register_forward_hook(self._hook(i)) for i, m in enumerate(self.modules)]
        self.entered = True
        return self

    def __exit__(self, *_exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.entered = False

    def recording(self) -> contextlib.AbstractContextManager[Any]:
        """What the forwards inside the block compute: through these hooks where they are
        held, else by hooks registered for the block alone."""
        if self.entered:
            return self.capture()
        return recorded(self.modules, self.record, self.fresh)

    @contextlib.contextmanager
    def capture(self) -> Iterator[Any]:
        self.store = self.fresh()
        try:
            yield self.store
        finally:
            self.store = None


@contextlib.contextmanager
def recorded(
    modules: Sequence[nn.Module], record: Record, fresh: Callable[[], Any]
) -> Iterator[Any]:
    """What the forwards inside the block compute, by hooks registered for the block alone."""
    with HeldHooks(modules, record, fresh) as hooks, hooks.capture() as store:
        yield store
