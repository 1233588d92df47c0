"""The simulated federation's settings: clients, data split, rounds, local training.

Plain configuration, apart from the training (``fl.federated``), so that specs and stored
results can name a federation without importing the training, the defenses or the attacks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, get_args

from auditlib.client.protocol import ClientProtocol
from auditlib.config import require, require_choice

Split = Literal["iid", "dirichlet"]


@dataclass(frozen=True)
class FederationSpec:
    """The simulated federation: clients, data split, rounds and local training."""

    clients: int = 10
    clients_per_round: int | None = None  # None: every client takes part in every round
    split: Split = "iid"
    alpha: float = 0.5  # Dirichlet concentration (smaller = more skewed label mix per client)
    rounds: int = 10
    local_epochs: int = 1
    local_lr: float = 0.05
    local_batch_size: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        require_choice(self.split, get_args(Split), "split")
        require(1 <= self.clients <= 1000, f"clients must be in [1, 1000], got {self.clients}")
        require(
            self.clients_per_round is None or 1 <= self.clients_per_round <= self.clients,
            f"clients per round must be between 1 and clients ({self.clients}), got "
            f"{self.clients_per_round}",
        )
        require(0 < self.alpha <= 1e4, f"Dirichlet alpha must be in (0, 1e4], got {self.alpha}")
        require(0 <= self.rounds <= 10_000, f"rounds must be in [0, 10000], got {self.rounds}")
        # ClientProtocol checks epochs, learning rate and batch size.
        self.protocol()

    def protocol(self) -> ClientProtocol:
        return ClientProtocol(
            algorithm="fedavg",
            local_epochs=self.local_epochs,
            local_lr=self.local_lr,
            local_batch_size=self.local_batch_size,
            shared="delta",
        )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
