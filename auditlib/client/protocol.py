"""What a federated client does with its private batch before the update leaves it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal, get_args

from auditlib.config import require, require_choice

Algorithm = Literal["fedsgd", "fedavg"]
Shared = Literal["delta", "weights"]
BatchNormMode = Literal["train", "eval"]


@dataclass(frozen=True)
class ClientProtocol:
    """The client's local computation, as the (honest-but-curious) server knows it.

    FedSGD: the client sends one gradient of the mean cross-entropy on its whole batch.
    FedAvg: the client runs ``local_steps`` SGD steps (or ``local_epochs`` passes) with
    learning rate ``local_lr`` over its batch in consecutive mini-batches of
    ``local_batch_size`` (no shuffling, so the schedule is reproducible by the server, as in
    Geiping et al. 2020, Sec. 5), then sends the weight difference or the new weights.
    """

    algorithm: Algorithm = "fedsgd"
    local_steps: int = 1
    local_epochs: int | None = None
    local_lr: float = 0.01
    local_batch_size: int | None = None  # None = the whole batch in every step
    shared: Shared = "delta"
    batchnorm_mode: BatchNormMode = "train"

    def __post_init__(self) -> None:
        require_choice(self.algorithm, get_args(Algorithm), "algorithm")
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
        return f"FedAvg: {amount} of SGD at lr {self.local_lr:g}{batch}; sends {sent}"
