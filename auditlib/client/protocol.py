"""What a federated client does with its private batch before the update leaves it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal, get_args

from auditlib.config import require, require_choice

if TYPE_CHECKING:
    import torch

Algorithm = Literal["fedsgd", "fedavg"]
Shared = Literal["delta", "weights"]
BatchNormMode = Literal["train", "eval"]
Optimizer = Literal["sgd", "adam"]

# Adam as torch.optim.Adam runs it by default; a client with other betas or eps is not
# simulated here (``auditlib.observed`` refuses such a record).
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
# The fields added after the first protocol, with their defaults: a spec that keeps them
# leaves them out of its identity (``RunSpec.payload``), so runs recorded before keep theirs.
LATER_FIELDS = {"optimizer": "sgd", "momentum": 0.0, "weight_decay": 0.0, "shuffle": False}


@dataclass(frozen=True)
class ClientProtocol:
    """The client's local computation, as the (honest-but-curious) server knows it.

    FedSGD: the client sends one gradient of the mean cross-entropy on its whole batch.
    FedAvg: the client runs ``local_steps`` steps (or ``local_epochs`` passes) with
    learning rate ``local_lr`` over its batch in consecutive mini-batches of
    ``local_batch_size`` (in order, so the schedule is reproducible by the server, as in
    Geiping et al. 2020, Sec. 5), then sends the weight difference or the new weights.

    Each step is torch.optim's: ``optimizer`` "sgd" (plain SGD by default; ``momentum``
    with dampening 0, no Nesterov) or "adam" (``ADAM_BETAS``, ``ADAM_EPS``), both with L2
    ``weight_decay`` added to the gradient, the optimiser's state fresh for each round.
    ``shuffle``: the client draws the order of its mini-batches each epoch from a seed of
    its own, which the server does not know: the victim trains in that order, the attacker
    simulates them in order (``client_update``'s ``order_seed``).
    """

    algorithm: Algorithm = "fedsgd"
    local_steps: int = 1
    local_epochs: int | None = None
    local_lr: float = 0.01
    local_batch_size: int | None = None  # None = the whole batch in every step
    shared: Shared = "delta"
    batchnorm_mode: BatchNormMode = "train"
    optimizer: Optimizer = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    shuffle: bool = False

    def __post_init__(self) -> None:
        require_choice(self.algorithm, get_args(Algorithm), "algorithm")
        require_choice(self.optimizer, get_args(Optimizer), "local optimizer")
        for name in ("momentum", "weight_decay"):  # as floats: 0 and 0.0 are one protocol
            value = getattr(self, name)
            require(
                isinstance(value, int | float) and not isinstance(value, bool),
                f"local {name.replace('_', ' ')} must be a number, got {value!r}",
            )
            object.__setattr__(self, name, float(value))
        require(0 <= self.momentum < 1, f"local momentum must be in [0, 1), got {self.momentum}")
        require(
            self.optimizer == "sgd" or self.momentum == 0,
            f"momentum {self.momentum:g} was given for Adam, whose first moment is its beta1 "
            f"({ADAM_BETAS[0]}); expected momentum 0 with adam",
        )
        require(
            0 <= self.weight_decay <= 1,
            f"local weight decay must be in [0, 1], got {self.weight_decay}",
        )
        require(
            isinstance(self.shuffle, bool), f"shuffle must be true or false, got {self.shuffle!r}"
        )
        require_choice(self.shared, get_args(Shared), "shared update")
        require_choice(self.batchnorm_mode, get_args(BatchNormMode), "batch-norm mode")
        require(self.local_steps >= 1, f"local steps must be >= 1, got {self.local_steps}")
        require(self.local_steps <= 1000, f"local steps must be <= 1000, got {self.local_steps}")
        require(
            self.local_epochs is None or 1 <= self.local_epochs <= 100,
            f"local epochs must be between 1 and 100, got {self.local_epochs}",
        )
        require(
            0 < self.local_lr <= 10, f"local learning rate must be in (0, 10], got {self.local_lr}"
        )
        require(
            self.local_batch_size is None or self.local_batch_size >= 1,
            f"local batch size must be >= 1, got {self.local_batch_size}",
        )

    def steps_for(self, batch_size: int) -> int:
        """Number of local SGD steps on a batch of ``batch_size`` examples."""
        if self.algorithm == "fedsgd":
            return 1
        if self.local_epochs is not None:
            return self.local_epochs * math.ceil(batch_size / self.minibatch(batch_size))
        return self.local_steps

    def minibatch(self, batch_size: int) -> int:
        if self.algorithm == "fedsgd" or self.local_batch_size is None:
            return batch_size
        return min(self.local_batch_size, batch_size)

    def minibatch_slices(self, batch_size: int) -> list[slice]:
        """The consecutive mini-batch of each local step (cycling through the batch)."""
        size = self.minibatch(batch_size)
        per_epoch = math.ceil(batch_size / size)
        slices = []
        for step in range(self.steps_for(batch_size)):
            start = (step % per_epoch) * size
            slices.append(slice(start, min(start + size, batch_size)))
        return slices

    def minibatch_windows(
        self, batch_size: int, order_seed: int | None = None
    ) -> list[slice] | list[torch.Tensor]:
        """The examples of each local step: :meth:`minibatch_slices`, or where the client
        shuffles and ``order_seed`` (the client's own) is given, the same windows over a
        fresh permutation of the batch each epoch, drawn from that seed."""
        import torch  # here: the protocol's definitions load without torch (the dashboard's forms)

        slices = self.minibatch_slices(batch_size)
        if not self.shuffle or order_seed is None or self.algorithm == "fedsgd":
            return slices
        per_epoch = math.ceil(batch_size / self.minibatch(batch_size))
        generator = torch.Generator().manual_seed(order_seed)
        windows: list[torch.Tensor] = []
        for step, window in enumerate(slices):
            if step % per_epoch == 0:
                order = torch.randperm(batch_size, generator=generator)
            windows.append(order[window])
        return windows

    @property
    def observation_kind(self) -> str:
        if self.algorithm == "fedsgd":
            return "gradient"
        return "weight_delta" if self.shared == "delta" else "weights"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def describe(self) -> str:
        """The local training in words, as the server asked for it."""
        if self.algorithm == "fedsgd":
            return "FedSGD: one gradient of the whole batch"
        amount = (
            f"{self.local_epochs} local epoch(s)"
            if self.local_epochs is not None
            else f"{self.local_steps} local step(s)"
        )
        batch = f", mini-batches of {self.local_batch_size}" if self.local_batch_size else ""
        sent = "the weight change" if self.shared == "delta" else "the new weights"
        extras = [
            f"momentum {self.momentum:g}" if self.momentum else "",
            f"weight decay {self.weight_decay:g}" if self.weight_decay else "",
        ]
        step = " and ".join(e for e in extras if e)
        optimizer = "Adam" if self.optimizer == "adam" else "SGD"
        order = (
            "; the client shuffled its mini-batches (order unknown to the server, simulated "
            "in order)"
            if self.shuffle
            else ""
        )
        return (
            f"FedAvg: {amount} of {optimizer} at lr {self.local_lr:g}"
            f"{f' with {step}' if step else ''}{batch}{order}; sends {sent}"
        )
