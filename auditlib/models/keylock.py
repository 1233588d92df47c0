"""The FedKL key-lock module (Ren et al., thesis ch. 5; arXiv 2305.04095), as model surgery.

The first convolution-normalisation block of a network gets a private affine: the batch
normalisation keeps its statistics but loses its own scale and shift, and
gamma = W_g k + b_g, beta = W_b k + b_b come from two fully connected "lock" layers fed a
private, fixed random key k (length 1024, i.i.d. U[0, 1) in the public code). The key and
the lock stay on the client; everything else is shared by FedAvg as usual.

``insert_key_lock`` finds the first ``nn.Conv2d`` of any model: when a ``BatchNorm2d`` over
its output channels comes next it is replaced by the key-lock normalisation; otherwise (LeNet
has no BatchNorm) the convolution is followed by one. ``private_parameter_names`` lists what
must never leave the client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from auditlib.errors import AuditInputError

LockActivation = Literal["none", "relu", "sigmoid"]
KEY_LENGTH = 1024  # S in the paper


def random_key(length: int, seed: int) -> torch.Tensor:
    """A client's key: i.i.d. U[0, 1) entries from its own seed (the public code's draw)."""
    return torch.rand(length, generator=torch.Generator().manual_seed(seed))


class KeyLockNorm(nn.Module):
    """BatchNorm without its own affine; scale and shift come from the key through the lock.

    ``activation`` is the public code's ReLU or Sigmoid on gamma and beta ("none" is the
    paper's Eq. 29). ``gamma_bias`` offsets the scale lock's bias so gamma starts near that
    value (0, the default nn.Linear init, leaves gamma near 0 with a U[0,1) key).
    """

    def __init__(
        self,
        channels: int,
        key: torch.Tensor,
        activation: LockActivation = "none",
        gamma_bias: float = 0.0,
    ) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(channels, affine=False)
        self.lock_gamma = nn.Linear(key.numel(), channels)
        self.lock_beta = nn.Linear(key.numel(), channels)
        self.activation = activation
        self.register_buffer("key", key.detach().clone().float())
        if gamma_bias:
            with torch.no_grad():
                self.lock_gamma.bias.add_(gamma_bias)

    def affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        gamma, beta = self.lock_gamma(self.key), self.lock_beta(self.key)
        if self.activation == "relu":
            gamma, beta = F.relu(gamma), F.relu(beta)
        elif self.activation == "sigmoid":
            gamma, beta = torch.sigmoid(gamma), torch.sigmoid(beta)
        return gamma, beta

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.affine()
        return gamma.view(1, -1, 1, 1) * self.norm(u) + beta.view(1, -1, 1, 1)


@dataclass(frozen=True)
class KeyLockSite:
    """Where the lock went: the module name of the ``KeyLockNorm`` and what it replaced."""

    lock: str
    convolution: str
    replaced_batchnorm: bool


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, child = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), child


def _call_order(model: nn.Module, input_shape: tuple[int, ...]) -> list[tuple[str, nn.Module]]:
    """Leaf modules in the order a forward pass calls them (registration order can differ:
    a ResNet may register its max-pool before the stem's BatchNorm)."""
    order: list[tuple[str, nn.Module]] = []
    hooks = [
        m.register_forward_pre_hook(lambda mod, _a, n=n: order.append((n, mod)))
        for n, m in model.named_modules()
        if not list(m.children())
    ]
    training = model.training
    try:
        model.eval()
        with torch.no_grad():
            device = next(model.parameters()).device
            model(torch.zeros(1, *input_shape, device=device))
    finally:
        for h in hooks:
            h.remove()
        model.train(training)
    return order


def insert_key_lock(
    model: nn.Module,
    key: torch.Tensor,
    input_shape: tuple[int, int, int],
    activation: LockActivation = "none",
    gamma_bias: float = 0.0,
    lock_seed: int = 0,
) -> KeyLockSite:
    """Put the key-lock normalisation after the first convolution of ``model``, in place.

    "First" is in the order a forward pass on ``input_shape`` calls the layers. The lock's
    initial weights come from ``lock_seed`` (all clients start from the same lock, as in the
    public code); the global torch RNG is left as it was.
    """
    order = _call_order(model, input_shape)
    position = next((i for i, (_, m) in enumerate(order) if isinstance(m, nn.Conv2d)), None)
    if position is None:
        raise AuditInputError(
            "the key-lock module needs a convolution to follow; this model has no nn.Conv2d"
        )
    conv_name, conv = order[position]
    # The first normalisation after the convolution, if nothing else that mixes channels
    # (a convolution or linear layer) comes between them.
    batchnorm = None
    for name, module in order[position + 1 :]:
        if isinstance(module, nn.BatchNorm2d):
            if module.num_features == conv.out_channels:
                batchnorm = name
            break
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            break
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(lock_seed)
        lock = KeyLockNorm(conv.out_channels, key, activation, gamma_bias)
    lock.to(device=conv.weight.device)
    if batchnorm is not None:
        parent, child = _parent(model, batchnorm)
        setattr(parent, child, lock)
        return KeyLockSite(batchnorm, conv_name, True)
    parent, child = _parent(model, conv_name)
    setattr(parent, child, nn.Sequential(conv, lock))
    return KeyLockSite(f"{conv_name}.1", f"{conv_name}.0", False)


def key_lock_modules(model: nn.Module) -> list[tuple[str, KeyLockNorm]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, KeyLockNorm)]


def private_parameter_names(model: nn.Module) -> set[str]:
    """The lock's parameters: trained by the client, never uploaded or averaged."""
    names = set()
    for prefix, module in key_lock_modules(model):
        for local, _ in module.named_parameters():
            if local.startswith(("lock_gamma", "lock_beta")):
                names.add(f"{prefix}.{local}")
    return names
