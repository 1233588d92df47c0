"""FedBoosting (Huang, thesis chapter 4): boosted aggregation with Paillier-encrypted,
quantised updates and "DP fusion" of the local models.

In federated training (``aggregate``, called by ``fl.training.fedavg_round``), each round:
the clients quantise and encrypt their weight differences (``fl.paillier``); for each
client i the server builds the fused model  G^_i = round(p^ P) g*_i + sum_{j != i}
round((1 - p^) P / (N - 1)) g*_j  homomorphically; every client decrypts each fused model
and reports its loss on its own validation split, V[i, j]; the server weighs client i by
the public code's rule r_i = (1 / mean_j V[i, j]) * ((1 / T_i) / sum_k 1 / T_k), p = r / sum r
(the thesis's Eq. 4.2 cannot be recovered: Eq. 4.3, which defines its terms, is lost, and the
code's rule is the one that produced the thesis's results), and sums round(p_i P) g*_i
homomorphically; the clients decrypt the sum and divide by the scale.

What an attacker sees: the server, only ciphertexts (it never holds the private key), so
no gradient attack applies to it. A curious client holds the shared key and decrypts the
fused model of every other client. In an audit (``attacker_view``), the victim is client 1 of the
thesis's two-client setting and the attacker is the other client: it decrypts the victim's
fused model and subtracts its own (known, exactly quantised) share in the integers, which
leaves the victim's update up to quantisation. The partner's values cancel exactly, so they
are drawn at random here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from auditlib.config import require
from auditlib.defenses.base import DefenseInfo, copied, register
from auditlib.fl.paillier import PaillierChannel, integer_weights
from auditlib.fl.update import set_training_mode


@dataclass(frozen=True)
class FedBoostingConfig:
    fused_share: float = 0.9  # p^: the target model's share of its fused model
    encrypt: bool = True
    key_bits: int = 128  # the thesis's setting; 2048 or more for real security
    scale: float = 1e32
    pieces: int = 100  # P
    validation_fraction: float = 0.1  # of each client's data, held out for cross-validation

    def __post_init__(self) -> None:
        require(
            0.5 < self.fused_share <= 1,
            f"fused_share must be in (0.5, 1] (the target keeps the largest share), "
            f"got {self.fused_share}",
        )
        require(
            self.key_bits in (128, 256, 512, 1024, 2048, 3072, 4096),
            f"key_bits must be one of 128, 256, 512, 1024, 2048, 3072, 4096; got {self.key_bits}",
        )
        require(1 <= self.scale <= 1e60, f"scale must be in [1, 1e60], got {self.scale}")
        require(1 <= self.pieces <= 10_000, f"pieces must be in [1, 10000], got {self.pieces}")
        require(
            0 < self.validation_fraction < 1,
            f"validation_fraction must be in (0, 1), got {self.validation_fraction}",
        )


def fusion_weights(clients: int, share: float, pieces: int) -> np.ndarray:
    """W[i, j]: the integer weight of client j's update in client i's fused model (Eq. 4.5)."""
    if clients == 1:
        return np.array([[pieces]])
    other = round((1 - share) * pieces / (clients - 1))
    weights = np.full((clients, clients), other, dtype=np.int64)
    np.fill_diagonal(weights, round(share * pieces))
    return weights


def boosting_weights(train_losses: Sequence[float], validation: np.ndarray) -> np.ndarray:
    """p_i from training losses T_i and validation losses V[i, j] (the public code's rule)."""
    inverse_train = 1.0 / np.maximum(np.asarray(train_losses, dtype=np.float64), 1e-12)
    raw = (1.0 / np.maximum(validation.mean(axis=1), 1e-12)) * inverse_train / inverse_train.sum()
    return raw / raw.sum()


@torch.no_grad()
def _loss_at(model, parameters, delta, images, labels) -> float:
    weights = {n: p.detach() + d for (n, p), d in zip(parameters.items(), delta, strict=True)}
    buffers = dict(model.named_buffers())
    set_training_mode(model, False)
    logits = functional_call(model, ({**weights, **buffers},), (images,))
    return float(F.cross_entropy(logits, labels))


class FedBoosting:
    def __init__(self, config: FedBoostingConfig) -> None:
        self.config = config
        self.validation_fraction = config.validation_fraction
        self.rounds: list[dict[str, Any]] = []  # per aggregated round: weights, time, bytes
        self.audit_cost: dict[str, float] | None = None

    def _channel(self) -> PaillierChannel:
        c = self.config
        return PaillierChannel(key_bits=c.key_bits, scale=c.scale, pieces=c.pieces)

    # -- federated training: the server's combination -------------------------------------
    def aggregate(
        self,
        model: nn.Module,
        parameters: dict[str, torch.Tensor],
        updates: Sequence[tuple[torch.Tensor, ...]],
        train_losses: Sequence[float],
        validation: Sequence[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, ...]:
        """The boosted sum of the clients' updates, through Paillier when ``encrypt``."""
        c = self.config
        n = len(updates)
        fusion = fusion_weights(n, c.fused_share, c.pieces)
        channel = self._channel() if c.encrypt else None
        if channel is not None:
            bound = int(fusion.sum(axis=1).max())
            encrypted = [channel.encrypt(channel.quantise(u, bound)) for u in updates]

        def mix(weights: Sequence[int]) -> tuple[torch.Tensor, ...]:
            """sum_j weights[j] / P * update_j: on ciphertexts, decrypted, when encrypting."""
            if channel is not None:
                plain = channel.decrypt(channel.combine(weights, encrypted))
                return channel.dequantise(plain, updates[0])
            return tuple(
                sum(w / c.pieces * u[k] for w, u in zip(weights, updates, strict=True))
                for k in range(len(updates[0]))
            )

        fused = [mix(fusion[i].tolist()) for i in range(n)]
        validation_losses = np.array(
            [
                [_loss_at(model, parameters, fused[i], *validation[j]) for j in range(n)]
                for i in range(n)
            ]
        )
        shares = boosting_weights(train_losses, validation_losses)
        weights = integer_weights(shares, c.pieces)
        combined = mix(weights)
        self.rounds.append(
            {
                "boosting_weights": shares.tolist(),
                "integer_weights": weights,
                "validation_losses": validation_losses.tolist(),
                **(channel.cost.as_dict() if channel is not None else {}),
            }
        )
        return combined

    def apply(self, update, generator, context=None):
        # The client's update leaves it as computed; the protocol protects it on the way
        # (encryption, fusion), which `aggregate` and `attacker_view` model.
        return copied(update)

    # -- an audit: what the curious partner of a two-client federation recovers ------------
    def attacker_view(self, update, generator):
        """The victim's released update as its curious partner decrypts and unmixes it."""
        c = self.config
        channel = self._channel()
        fusion = fusion_weights(2, c.fused_share, c.pieces)
        scale = float(torch.linalg.vector_norm(torch.cat([t.reshape(-1) for t in update])))
        size = math.sqrt(sum(t.numel() for t in update))
        partner = tuple(
            torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device) * scale / size
            for t in update
        )
        bound = int(fusion.sum(axis=1).max())
        victim_q, partner_q = channel.quantise(update, bound), channel.quantise(partner, bound)
        fused = channel.combine(
            fusion[0].tolist(), [channel.encrypt(victim_q), channel.encrypt(partner_q)]
        )
        decrypted = channel.decrypt(fused)  # the partner holds the shared private key
        own = int(fusion[0, 1])
        recovered = [value - own * mine for value, mine in zip(decrypted, partner_q, strict=True)]
        self.audit_cost = channel.cost.as_dict()
        return channel.dequantise(recovered, update, divisor=float(fusion[0, 0]) / c.pieces)

    def privacy_report(self) -> dict[str, Any]:
        c = self.config
        return {
            "epsilon": None,
            "epsilon_unavailable_reason": "FedBoosting's 'DP fusion' mixes fixed shares of "
            "other clients' updates; it adds no calibrated noise and has no DP guarantee",
            "server_view": f"Paillier ciphertexts only ({c.key_bits}-bit key held by the "
            "clients): no gradient attack applies to the server",
            "attacker": "a curious client of a two-client federation, holding the shared key; "
            "it removes its own share of the victim's fused model exactly",
            **({"cost": self.audit_cost} if self.audit_cost is not None else {}),
        }


register(
    DefenseInfo(
        "fedboosting",
        "FedBoosting protocol: boosted aggregation of Paillier-encrypted quantised updates "
        "with DP fusion; the server sees ciphertexts only, the audit attacks what a curious "
        "client decrypts. `fused_share` is the victim's share of its fused model.",
        FedBoostingConfig,
        FedBoosting,
        strength="fused_share",
    )
)
