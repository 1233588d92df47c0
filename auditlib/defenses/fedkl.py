"""FedKL: the key-lock module (GRNN thesis ch. 5; Ren et al., arXiv 2305.04095).

The defense changes the model, not the update: the client's model gets the key-lock
normalisation after its first convolution (``auditlib.models.keylock``), the client trains
the lock with everything else, and uploads everything but the lock. The key and the lock
never leave it. The server holds the same architecture with the lock as it can know it:

- ``random-key`` (the paper's main setting, its public code): the lock's initial weights
  (the server built the model, so at round 0 it knows them) fed a fresh U[0, 1) key of its
  own, since the client's key is secret;
- ``plain-bn``: the attacker replaces the lock by plain normalisation (gamma 1, beta 0);
- ``shared-key``: the client's key leaked to the server (the thesis's Table VII ablation,
  where GRNN succeeds again): the true key and the initial lock.

In every case the server's lock is frozen: its gradient is not shared, so no attack is
asked to match it. The update itself is sent as computed (``apply`` is the identity on
the shared part); compose FedKL with noise by running both in a sweep, not here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from auditlib.client.update import copy_state
from auditlib.config import check_ranges, param
from auditlib.defenses.base import DefenseInfo, ModelChange, copied, register
from auditlib.errors import AuditInputError
from auditlib.models.keylock import (
    LockActivation,
    insert_key_lock,
    key_lock_modules,
    private_parameter_names,
    random_key,
)
from auditlib.seeds import derive_seed
from auditlib.threat import KnownDefense

Attacker = Literal["random-key", "plain-bn", "shared-key"]
# What the adaptive attacker fits jointly with its images: the lock's output (gamma and
# beta per channel, all the forward pass depends on) or the key through the initial lock.
AdaptiveFit = Literal["affine", "key"]


@dataclass(frozen=True)
class FedKLConfig:
    key_length: int = param(
        1024, "S, entries of the client's secret U[0, 1) key (paper: 1024)", low=1, high=65536
    )
    activation: LockActivation = param(
        "none",
        "applied to the lock's gamma and beta: none (the paper's Eq. 29), or ReLU or sigmoid "
        "(the public code)",
    )
    gamma_bias: float = param(
        0.0,
        "offset of the scale lock's bias, so gamma starts near it (0: PyTorch's init, gamma "
        "near 0)",
    )
    attacker: Attacker = param(
        "random-key",
        "the server's lock: its initial weights with a key of its own (random-key, the paper), "
        "plain normalisation (plain-bn), or the client's leaked key (shared-key)",
    )
    adaptive_fit: AdaptiveFit = param(
        "affine",
        "what the adaptive attacker fits with its images: the lock's output gamma and beta "
        "per channel (affine), or the key through the initial lock",
    )

    def __post_init__(self) -> None:
        check_ranges(self)


def client_key(config: FedKLConfig, seed: int) -> torch.Tensor:
    return random_key(config.key_length, derive_seed(seed, "fedkl-key"))


def free_lock_affine(model: nn.Module) -> tuple[torch.Tensor, ...]:
    """Make each lock's gamma and beta free parameters of ``model``, started at what its
    lock gives now (the attacker's guess): the lock's weights zeroed, its biases fitted."""
    fitted: list[torch.Tensor] = []
    for _, lock in key_lock_modules(model):
        with torch.no_grad():
            gamma, beta = lock.affine()
            for layer, value in ((lock.lock_gamma, gamma), (lock.lock_beta, beta)):
                layer.weight.zero_()
                layer.bias.copy_(value)
                fitted.append(layer.bias.requires_grad_(True))
        lock.activation = "none"
    return tuple(fitted)


def free_lock_key(model: nn.Module) -> tuple[torch.Tensor, ...]:
    """Make each lock's key a free parameter of ``model`` (the lock's weights stay the
    initial ones the server built), started at the attacker's guess."""
    fitted: list[torch.Tensor] = []
    for _, lock in key_lock_modules(model):
        key = lock.key.detach().clone()
        del lock._buffers["key"]
        lock.key = nn.Parameter(key)
        fitted.append(lock.key)
    return tuple(fitted)


def private_names(model: nn.Module) -> frozenset[str]:
    """The lock's parameters and the key buffer: what never leaves the client."""
    keys = {f"{name}.key" for name, _ in key_lock_modules(model)}
    return frozenset(private_parameter_names(model) | keys)


class FedKL:
    def __init__(self, config: FedKLConfig) -> None:
        self.config = config

    def lock(self, model: nn.Module, key: torch.Tensor, input_shape, seed: int) -> str:
        """Insert the lock (initial weights from the run seed, the same for every client)."""
        c = self.config
        site = insert_key_lock(
            model,
            key,
            input_shape,
            activation=c.activation,
            gamma_bias=c.gamma_bias,
            lock_seed=derive_seed(seed, "fedkl-lock"),
        )
        return site.lock

    def change_model(self, model: nn.Module, input_shape, seed: int) -> ModelChange:
        """Lock ``model`` in place (the client's) and build the server's view beside it."""
        c = self.config
        if isinstance(model, torch.jit.ScriptModule) or not isinstance(model, nn.Module):
            raise AuditInputError(
                "fedkl inserts the key-lock into the model's Python modules; a TorchScript or "
                "torch.export archive cannot be changed: use weights for a built-in architecture"
            )
        server = copy.deepcopy(model)
        name = self.lock(model, client_key(c, seed), input_shape, seed)
        guess = {
            "random-key": random_key(c.key_length, derive_seed(seed, "fedkl-attacker-key")),
            "plain-bn": torch.zeros(c.key_length),
            "shared-key": client_key(c, seed),
        }[c.attacker]
        self.lock(server, guess, input_shape, seed)
        lock = server.get_submodule(name)
        if c.attacker == "plain-bn":  # gamma = 1, beta = 0 whatever the key
            with torch.no_grad():
                for layer, bias in ((lock.lock_gamma, 1.0), (lock.lock_beta, 0.0)):
                    layer.weight.zero_()
                    layer.bias.fill_(bias)
            lock.activation = "none"
        for p in lock.parameters():
            p.requires_grad_(False)
        notes = {
            "random-key": "FedKL: the server does not know the client's key or its lock "
            "gradient; it holds the initial lock with a random key of its own",
            "plain-bn": "FedKL: the server does not know the key; it replaces the lock by "
            "plain normalisation (gamma 1, beta 0)",
            "shared-key": "FedKL: the client's key has leaked to the server (ablation); the "
            "lock gradient is still private",
        }[c.attacker]
        return ModelChange(model, server, private_names(model), (notes,))

    def client_state(self, model: nn.Module, change: ModelChange, seed: int) -> dict:
        """A new client's private part in federated training: its own key (from ``seed``)
        and the lock at its initial weights, as every client starts (the public code)."""
        state = copy_state(model, change.private)
        for name in state:
            if name.endswith(".key"):
                state[name] = client_key(self.config, seed).to(state[name].device)
        return state

    def apply(self, update, generator, context=None):
        return copied(update)

    def known_to_attacker(self, observation, weights):
        fit = self.config.adaptive_fit
        what = (
            "the lock's scale and shift (gamma, beta per channel of the first block)"
            if fit == "affine"
            else f"the key ({self.config.key_length} values) through the lock's initial weights"
        )
        return KnownDefense(
            "fedkl",
            "knows the key-lock's place and form but not the client's key or lock: fits "
            f"{what} jointly with its images, started from its own guess "
            f"({self.config.attacker}), in every restart",
            unknowns=free_lock_affine if fit == "affine" else free_lock_key,
        )

    def privacy_report(self) -> dict[str, Any]:
        return {
            "epsilon": None,
            "epsilon_unavailable_reason": "the key-lock hides the first block's scale and "
            "shift; it is an obfuscation argument, not differential privacy",
            "private": "key and lock layers stay on the client",
            "attacker": self.config.attacker,
            "adaptive_fit": self.config.adaptive_fit,
        }


register(
    DefenseInfo(
        "fedkl",
        "FedKL key-lock: a private key through private lock layers sets the first "
        "normalisation's scale and shift; key and lock never leave the client.",
        FedKLConfig,
        FedKL,
        strength="key_length",
    )
)
