"""The one definition of a client update, used by the victim and by every attacker.

The victim calls it once on its private batch (``differentiable=False``); an optimisation
attack calls it on its candidate batch with ``differentiable=True`` so the distance between
candidate and observed update can be back-propagated to the candidate images. Sharing the
code guarantees the attacker simulates exactly what the client computed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from auditlib.client.exact_batchnorm import exact_batchnorm
from auditlib.client.protocol import ADAM_BETAS, ADAM_EPS, ClientProtocol
from auditlib.errors import AttackUnsupportedError

# A block whose store forward hooks fill while it runs (``HeldHooks.recording``).
Recording = Callable[[], contextlib.AbstractContextManager[Any]]


def recording_block(recording: Recording | None) -> contextlib.AbstractContextManager[Any]:
    """``recording``'s block, or, without one, a block whose store stays empty (an empty
    store, not None: ``torch.func``'s auxiliary outputs and ``vmap``'s take only tensors)."""
    return recording() if recording is not None else contextlib.nullcontext({})


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; ``labels`` are class ids (long) or probability rows (float).

    Probability rows are the soft labels that DLG optimises jointly with the images; for a
    one-hot row this is exactly the cross-entropy of the class id.
    """
    if labels.dtype == torch.long:
        return F.cross_entropy(logits, labels)
    return torch.mean(torch.sum(-labels * F.log_softmax(logits, dim=-1), dim=-1))


def set_training_mode(model: nn.Module, training: bool) -> None:
    """``model.train(training)``, except for torch.export modules, whose mode is fixed at export."""
    with contextlib.suppress(NotImplementedError):
        model.train(training)


def _scripted_gradient(
    model: torch.jit.ScriptModule,
    parameters: Mapping[str, torch.Tensor],
    images,
    labels,
    protocol,
    differentiable,
) -> tuple[torch.Tensor, ...]:
    # TorchScript modules refuse torch.func's stateless calls, so the gradient is taken with
    # respect to the module's own parameters; only FedSGD needs nothing more.
    if protocol.algorithm != "fedsgd":
        raise AttackUnsupportedError(
            "FedAvg needs functional parameters, which TorchScript models do not allow; "
            "use FedSGD, or weights for a built-in architecture"
        )
    own = dict(model.named_parameters())
    if any(own.get(name) is not tensor for name, tensor in parameters.items()):
        raise ValueError("a TorchScript model's update is taken at its own parameters")
    saved = {name: b.clone() for name, b in model.named_buffers()}
    loss = classification_loss(model(images), labels)
    grads = torch.autograd.grad(loss, list(parameters.values()), create_graph=differentiable)
    with torch.no_grad():  # keep BatchNorm statistics as the server sent them
        for name, b in model.named_buffers():
            b.copy_(saved[name])
    return tuple(grads)


def trainable_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def named_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``model`` by its name."""
    return dict(model.named_parameters()) | dict(model.named_buffers())


def copy_state(model: nn.Module, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """Detached copies of the named parameters and buffers (e.g. a client's private part)."""
    tensors = named_tensors(model)
    return {n: tensors[n].detach().clone() for n in names}


@torch.no_grad()
def load_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy named parameters and buffers into ``model``, in place."""
    tensors = named_tensors(model)
    for name, value in state.items():
        tensors[name].copy_(value)


def client_update(
    model: nn.Module,
    parameters: Mapping[str, torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
    protocol: ClientProtocol,
    *,
    differentiable: bool,
    buffers: Mapping[str, torch.Tensor] | None = None,
    order_seed: int | None = None,
    replaced: Mapping[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """The update the client computes from ``parameters`` on (images, labels).

    Returns one tensor per entry of ``parameters`` (same order): the gradient (FedSGD), the
    weight difference after local training, or the new weights (FedAvg), per
    ``protocol.observation_kind``. ``parameters`` must require grad, unless ``buffers`` is
    given: then the gradients are taken with ``torch.func.grad`` over those parameters and
    buffers (a copy of its own per call, which BatchNorm may update), so the update can run
    under ``torch.func.vmap``, one restart per slice (``attacks.loop``).

    FedAvg's steps are the protocol's optimiser (:class:`LocalOptimizer`). ``order_seed``:
    the client's own seed for the order of its mini-batches where the protocol shuffles
    (the victim passes it; an attacker, who does not know it, passes none and simulates
    them in order). ``replaced``: parameters of ``model`` outside ``parameters`` to use in
    place of its own (an adaptive attacker's start's row of fitted unknowns).
    """
    update, _ = recorded_client_update(
        model,
        parameters,
        images,
        labels,
        protocol,
        differentiable=differentiable,
        buffers=buffers,
        order_seed=order_seed,
        replaced=replaced,
    )
    return update


def recorded_client_update(
    model: nn.Module,
    parameters: Mapping[str, torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
    protocol: ClientProtocol,
    *,
    differentiable: bool,
    buffers: Mapping[str, torch.Tensor] | None = None,
    order_seed: int | None = None,
    replaced: Mapping[str, torch.Tensor] | None = None,
    recording: Recording | None = None,
) -> tuple[tuple[torch.Tensor, ...], Any]:
    """:func:`client_update`, and what ``recording`` saw in the forward pass of the first
    local step (empty without one): ``recording()`` is a block whose store forward hooks
    fill (``attacks.forward_hooks.HeldHooks.recording``). Under ``torch.func.grad`` the
    store leaves the transform as its auxiliary output, still a function of the images (a
    hook's own store cannot leave it), so one ``vmap`` pass gives each row's update and what
    its forward computed (GradInversion's BatchNorm statistics)."""
    set_training_mode(model, protocol.batchnorm_mode == "train")
    if isinstance(model, torch.jit.ScriptModule):
        if recording is not None:
            raise ValueError("a TorchScript model's forward is not recorded through hooks")
        return _scripted_gradient(model, parameters, images, labels, protocol, differentiable), {}
    functional = buffers is not None
    # Buffers are copied so BatchNorm's running statistics in the caller's model stay as the
    # server sent them, however often the attacker simulates the client.
    if buffers is None:
        buffers = {name: b.clone() for name, b in model.named_buffers()}
    if replaced:
        buffers = {**buffers, **replaced}
    names = list(parameters)

    def gradient(current: Mapping[str, torch.Tensor], x, y, record: Recording | None):
        def loss_of(weights: Mapping[str, torch.Tensor], state: Mapping):
            with recording_block(record) as seen:
                logits = functional_call(model, ({**weights, **state},), (x,))
            return classification_loss(logits, y), seen

        if functional:  # the buffers are an input: BatchNorm in train mode updates them
            # torch.func's second derivative through fused batch_norm is not exact.
            with exact_batchnorm(model):
                found, seen = torch.func.grad(loss_of, has_aux=True)(dict(current), buffers)
            return tuple(found[n] for n in names), seen
        loss, seen = loss_of(current, buffers)
        found = torch.autograd.grad(loss, list(current.values()), create_graph=differentiable)
        return found, seen

    if protocol.algorithm == "fedsgd":
        return gradient(parameters, images, labels, recording)

    current = dict(parameters)
    optimizer = LocalOptimizer(protocol, keep_graph=differentiable)
    first_seen: Any = {}
    for index, window in enumerate(protocol.minibatch_windows(images.shape[0], order_seed)):
        # The first local step's forward is the one recorded.
        record = recording if index == 0 else None
        grads, seen = gradient(current, images[window], labels[window], record)
        if index == 0:
            first_seen = seen
        step = optimizer.step(current, grads)
        # The victim's loop needs no graph across steps; the attacker's does.
        current = (
            step if differentiable else {n: t.detach().requires_grad_() for n, t in step.items()}
        )
    if protocol.shared == "weights":
        weights = tuple(current[n] if differentiable else current[n].detach() for n in names)
        return weights, first_seen
    deltas = tuple(current[n] - parameters[n] for n in names)
    return (deltas if differentiable else tuple(d.detach() for d in deltas)), first_seen


def read_as_gradient(
    update: Sequence[torch.Tensor],
    parameters: Mapping[str, torch.Tensor],
    protocol: ClientProtocol,
    batch_size: int,
) -> tuple[torch.Tensor, ...]:
    """An update as the server reads it: one gradient of the batch loss.

    FedSGD shares the gradient itself. FedAvg shares w' - w (or w'), the sum of ``K`` local
    SGD steps w <- w - lr * g; the server knows lr and K, so -(w' - w) / (lr * K) is the mean
    of the K local gradients. Matching updates read this way keeps every objective at a
    gradient's scale whatever the local learning rate: matched raw, an L2 distance is
    (lr * K)^2 times smaller, and optimisers with absolute tolerances (torch's L-BFGS) stop
    long before they converge at a small lr (issue 16). Works on simulated updates (the
    graph is kept) and on observed ones alike.
    """
    if protocol.algorithm == "fedsgd":
        return tuple(update)
    if protocol.shared == "weights":
        update = [
            u - p.detach().to(u.device) for u, p in zip(update, parameters.values(), strict=True)
        ]
    factor = difference_per_gradient(protocol, batch_size)
    return tuple(u / factor for u in update)


def difference_per_gradient(protocol: ClientProtocol, batch_size: int) -> float:
    """The client's update (what a defense acts on) per unit of its reading as a gradient:
    1 for FedSGD, -(lr x local steps) for FedAvg's weight difference.

    With SGD's momentum m, K steps move the weights by lr x sum_k (1 - m^k) / (1 - m) times
    a constant gradient, the factor used then. Adam's steps are not proportional to the
    gradient (each is about lr x its sign): the reading is then only a scaled estimate.
    """
    if protocol.algorithm == "fedsgd":
        return 1.0
    steps = protocol.steps_for(batch_size)
    if protocol.optimizer == "sgd" and protocol.momentum:
        m = protocol.momentum
        return -protocol.local_lr * sum((1 - m**k) / (1 - m) for k in range(1, steps + 1))
    return -protocol.local_lr * steps


class LocalOptimizer:
    """The client's optimiser as torch.optim computes it, on plain tensors (functional):
    differentiable, and able to run under ``torch.func.vmap``.

    SGD: ``g + weight_decay * w``, then the momentum buffer (the first gradient itself,
    then ``m * buf + g``), then ``w - lr * buf``. Adam: torch.optim.Adam's defaults
    (``ADAM_BETAS``, ``ADAM_EPS``, L2 weight decay on the gradient, bias corrections).
    Plain SGD (no momentum, no weight decay) is ``w - lr * g``, exactly as before these
    options existed. The state is fresh for each round, as a client that makes its
    optimiser for each round has it. ``keep_graph``: keep the state's graph across steps
    (the attacker's simulation); else the state is detached after each step (the victim's).
    """

    def __init__(self, protocol: ClientProtocol, *, keep_graph: bool) -> None:
        self.protocol = protocol
        self.keep_graph = keep_graph
        self.steps = 0
        self.first: dict[str, torch.Tensor] = {}  # SGD's momentum buffer, Adam's first moment
        self.second: dict[str, torch.Tensor] = {}  # Adam's second moment

    def _kept(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.keep_graph else tensor.detach()

    def step(
        self, current: Mapping[str, torch.Tensor], grads: Sequence[torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        protocol = self.protocol
        lr = protocol.local_lr
        names = list(current)
        if protocol.optimizer == "sgd" and not protocol.momentum and not protocol.weight_decay:
            return {n: current[n] - lr * g for n, g in zip(names, grads, strict=True)}
        self.steps += 1
        out = {}
        for name, grad in zip(names, grads, strict=True):
            weights = current[name]
            if protocol.weight_decay:
                grad = grad.add(weights, alpha=protocol.weight_decay)
            if protocol.optimizer == "adam":
                out[name] = self._adam(name, weights, grad)
                continue
            if protocol.momentum:
                previous = self.first.get(name)
                grad = grad if previous is None else (previous * protocol.momentum).add(grad)
                self.first[name] = self._kept(grad)
            out[name] = weights.add(grad, alpha=-lr)
        return out

    def _adam(self, name: str, weights: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        beta1, beta2 = ADAM_BETAS
        first = self.first.get(name, torch.zeros_like(grad)).lerp(grad, 1 - beta1)
        second = (self.second.get(name, torch.zeros_like(grad)) * beta2).addcmul(
            grad, grad, value=1 - beta2
        )
        self.first[name], self.second[name] = self._kept(first), self._kept(second)
        step_size = self.protocol.local_lr / (1 - beta1**self.steps)
        root = (1 - beta2**self.steps) ** 0.5
        # sqrt's derivative is infinite at 0 (a parameter with no gradient yet): the zeros
        # take sqrt(1) in the branch that is not used, so no NaN reaches the attacker's graph.
        positive = second > 0
        norm = torch.where(positive, torch.where(positive, second, 1.0).sqrt(), 0.0)
        return weights.addcdiv(first, (norm / root).add(ADAM_EPS), value=-step_size)
