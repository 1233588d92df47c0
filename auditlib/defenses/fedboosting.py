"""FedBoosting (Huang, thesis chapter 4): boosted aggregation with Paillier-encrypted,
quantised updates and "DP fusion" of the local models.

In federated training (``aggregate``, called by ``fl.training.fedavg_round``), each round:
the clients quantise and encrypt their weight differences (``client.paillier``); for each
client i the server builds the fused model  G^_i = round(p^_i P) g*_i + sum_{j != i}
round((1 - p^_i) P / (N - 1)) g*_j  homomorphically (Eq. 4.5), with p^_i drawn at random
and kept private by the server (Sec. 4.2.3, ``fusion="random"``) or fixed at ``fused_share``
(``fusion="fixed"``); every client decrypts each fused model and reports its loss on its
own validation split, V[i, j]; the server weighs client i by the public code's rule
r_i = (1 / mean_j V[i, j]) * ((1 / T_i) / sum_k 1 / T_k), p = r / sum r, with T_i the
client's training loss after its local training (Alg. 2, line 19) (the thesis's Eq. 4.2
cannot be recovered: Eq. 4.3, which defines its terms, is lost, and the code's rule is the
one that produced the thesis's results), and sums round(p_i P) g*_i homomorphically; the
clients decrypt the sum and divide by the scale.

Two adversaries, chosen by ``view`` (``attacker_view`` gives what each recovers of the
victim's update in the thesis's two-client setting):

- ``client``: the curious partner. It holds the clients' shared private key and decrypts
  the victim's fused model, which mixes its own update in. It knows its own quantised
  share, and the fusion weights are integers of at most P: for the right weight b of its
  own share, fused - b * own is the victim's integers times the victim's weight a, so the
  greatest common divisor of its coordinates is a (``recover_fusion_weights``). The
  partner finds both weights exactly whether they were drawn in private or not, and
  removes its share in the integers. ``weights_leaked`` hands it the weights instead.
- ``server``: it holds only ciphertexts and never the private key. A key it can factor
  (``client.paillier.factor_public_key``: up to 128 bits, the thesis's setting) gives it the
  private key and the victim's own ciphertexts; a larger key is refused as an attack that
  does not apply, with what that assumes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from auditlib.client.paillier import PaillierChannel, factor_public_key, integer_weights
from auditlib.client.update import set_training_mode
from auditlib.config import check_ranges, param
from auditlib.defenses.base import DefenseInfo, copied, register
from auditlib.errors import AttackUnsupportedError

Fusion = Literal["random", "fixed"]
View = Literal["client", "server"]
FUSIONS: tuple[str, ...] = ("random", "fixed")
VIEWS: tuple[str, ...] = ("client", "server")


@dataclass(frozen=True)
class FedBoostingConfig:
    # p^, the target model's share of its fused model: with fusion="fixed" every client's;
    # with fusion="random" the lowest share the server draws, p^_i ~ U[fused_share, 1].
    fused_share: float = param(
        0.9,
        "p^, a client's share of its own fused model: every client's with fusion=fixed, the "
        "lowest the server draws (U[fused_share, 1]) with fusion=random; the target keeps the "
        "largest share",
        low=0.5,
        low_open=True,
        high=1,
    )
    fusion: Fusion = param(
        "random",
        "fusion weights: drawn by the server and kept private (the thesis, Sec. 4.2.3), or "
        "fixed at fused_share",
    )
    view: View = param(
        "client",
        "the adversary audited: the curious partner client, which holds the private key, or "
        "the server, which must factor the public key",
    )
    weights_leaked: bool = param(
        False, "client view: the partner is handed the fusion weights instead of recovering them"
    )
    encrypt: bool = param(
        True, "aggregate through Paillier encryption (false: the same sums in the clear)"
    )
    key_bits: int = param(
        128,
        "Paillier key size in bits (the thesis: 128; 2048 or more for real security)",
        values=(128, 256, 512, 1024, 2048, 3072, 4096),
    )
    scale: float = param(
        1e32,
        "fixed-point scale: each value is encrypted as the integer round(value x scale / pieces)",
        low=1,
        high=1e60,
    )
    pieces: int = param(
        100,
        "P: a share p of a fused model becomes the integer weight round(p P)",
        low=1,
        high=10_000,
    )
    validation_fraction: float = param(
        0.1,
        "fraction of each client's data held out to cross-validate the fused models",
        low=0,
        low_open=True,
        high=1,
        high_open=True,
    )

    def __post_init__(self) -> None:
        check_ranges(self)


def fusion_matrix(shares: Sequence[float], pieces: int) -> np.ndarray:
    """W[i, j]: the integer weight of client j's update in client i's fused model (Eq. 4.5),
    client i keeping ``shares[i]`` of it and the others splitting the rest evenly."""
    clients = len(shares)
    if clients == 1:
        return np.array([[pieces]])
    weights = np.empty((clients, clients), dtype=np.int64)
    for i, share in enumerate(shares):
        weights[i, :] = round((1 - share) * pieces / (clients - 1))
        weights[i, i] = round(share * pieces)
    return weights


def fusion_weights(clients: int, share: float, pieces: int) -> np.ndarray:
    """Eq. 4.5 with one fixed p^ for every client."""
    return fusion_matrix([share] * clients, pieces)


def drawn_shares(clients: int, lowest: float, generator: torch.Generator | None) -> list[float]:
    """The server's private p^_i, uniform in [lowest, 1] (the thesis: drawn at random, the
    target always the largest; it does not say from what, so we draw uniformly above the
    configured share)."""
    draws = torch.rand(clients, generator=generator, dtype=torch.float64)
    return [lowest + (1 - lowest) * float(u) for u in draws]


def recover_fusion_weights(
    fused: Sequence[int], own: Sequence[int], pieces: int
) -> tuple[int, int]:
    """The partner's search for (a, b), fused = a * victim + b * own in the integers.

    For the right b, the greatest common divisor of fused - b * own is a times that of the
    victim's integers (1 for any real update quantised at a large scale); for a wrong b it is
    almost always 1. The target keeps the largest share, so a > b. A few coordinates screen
    each b; the survivor is checked on all of them.
    """
    screen = [k for k, (f, o) in enumerate(zip(fused, own, strict=True)) if f or o][:64]
    best: tuple[int, int] | None = None
    for b in range(pieces + 1):
        a = math.gcd(*(fused[k] - b * own[k] for k in screen))
        if not b < a <= pieces:
            continue
        a = math.gcd(*(f - b * o for f, o in zip(fused, own, strict=True)))
        if b < a <= pieces and (best is None or a > best[0]):
            best = (a, b)
    if best is None:
        raise AttackUnsupportedError(
            "the partner could not identify the fusion weights (no weight of its own share "
            "leaves a common divisor); the victim's update may be zero"
        )
    return best


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
        self.audit_record: dict[str, Any] | None = None  # what the audited adversary did

    def _channel(self) -> PaillierChannel:
        c = self.config
        return PaillierChannel(key_bits=c.key_bits, scale=c.scale, pieces=c.pieces)

    def _fusion(self, clients: int, generator: torch.Generator | None) -> np.ndarray:
        c = self.config
        if c.fusion == "fixed":
            return fusion_weights(clients, c.fused_share, c.pieces)
        return fusion_matrix(drawn_shares(clients, c.fused_share, generator), c.pieces)

    # -- federated training: the server's combination -------------------------------------
    def aggregate(
        self,
        model: nn.Module,
        parameters: dict[str, torch.Tensor],
        updates: Sequence[tuple[torch.Tensor, ...]],
        training: Sequence[tuple[torch.Tensor, torch.Tensor]],
        validation: Sequence[tuple[torch.Tensor, torch.Tensor]],
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """The boosted sum of the clients' updates, through Paillier when ``encrypt``.

        ``training`` and ``validation`` are each client's splits; T_i is the client's loss on
        its training split at its trained weights (Alg. 2, line 19)."""
        c = self.config
        n = len(updates)
        fusion = self._fusion(n, generator)
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

        train_losses = [
            _loss_at(model, parameters, update, *data)
            for update, data in zip(updates, training, strict=True)
        ]
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
                "fusion_weights": fusion.tolist(),  # the server's private draws
                "train_losses": train_losses,
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

    # -- an audit: what the chosen adversary recovers of the victim's update ---------------
    def attacker_view(self, update, generator):
        """The victim's update as the audited adversary recovers it (client 1 of two)."""
        if self.config.view == "server":
            return self._server_view(update)
        return self._partner_view(update, generator)

    def _partner_view(self, update, generator):
        c = self.config
        channel = self._channel()
        fusion = self._fusion(2, generator)
        scale = float(torch.linalg.vector_norm(torch.cat([t.reshape(-1) for t in update])))
        size = math.sqrt(sum(t.numel() for t in update))
        # The partner's own values cancel exactly in the integers, so any will do.
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
        if c.weights_leaked:
            victim_weight, own = int(fusion[0, 0]), int(fusion[0, 1])
        else:
            victim_weight, own = recover_fusion_weights(decrypted, partner_q, c.pieces)
        recovered = [value - own * mine for value, mine in zip(decrypted, partner_q, strict=True)]
        self.audit_cost = channel.cost.as_dict()
        self.audit_record = {
            "fusion_weights": [int(fusion[0, 0]), int(fusion[0, 1])],
            "partner_used": [victim_weight, own],
            "weights_found": not c.weights_leaked,
        }
        return channel.dequantise(recovered, update, divisor=victim_weight / c.pieces)

    def _server_view(self, update):
        c = self.config
        channel = self._channel()
        key, seconds = factor_public_key(channel.public_key)  # refuses a key it cannot factor
        ciphertexts = channel.encrypt(channel.quantise(update, c.pieces))
        plain = [key.decrypt(value) for value in ciphertexts]
        self.audit_cost = {**channel.cost.as_dict(), "factor_s": seconds}
        self.audit_record = {"key_factored_s": seconds}
        return channel.dequantise(plain, update, divisor=1 / c.pieces)

    def privacy_report(self) -> dict[str, Any]:
        c = self.config
        if c.view == "server":
            attacker = (
                f"the server: it holds the clients' Paillier ciphertexts and factors the "
                f"{c.key_bits}-bit public key, which gives it the private key and the victim's "
                "own update"
            )
        else:
            how = (
                "handed the fusion weights"
                if c.weights_leaked
                else "finding the fusion weights from the integers (they are at most P)"
            )
            attacker = (
                "a curious client of a two-client federation, holding the shared key: it "
                f"decrypts the victim's fused model and removes its own share exactly, {how}"
            )
        return {
            "epsilon": None,
            "epsilon_unavailable_reason": "FedBoosting's 'DP fusion' mixes shares of other "
            "clients' updates; it adds no calibrated noise and has no DP guarantee",
            "fusion": f"{c.fusion} (target share "
            + (
                f"{c.fused_share:g})"
                if c.fusion == "fixed"
                else f"drawn in [{c.fused_share:g}, 1])"
            ),
            "attacker": attacker,
            **({"recovered_by_attacker": self.audit_record} if self.audit_record else {}),
            **({"cost": self.audit_cost} if self.audit_cost is not None else {}),
        }


register(
    DefenseInfo(
        "fedboosting",
        "FedBoosting protocol: boosted aggregation of Paillier-encrypted quantised updates "
        "with DP fusion (weights drawn in private by the server). `view` picks the adversary: "
        "a curious client that decrypts the victim's fused model, or the server, which holds "
        "ciphertexts only and needs to factor the key. `fused_share` is the victim's lowest "
        "share of its fused model.",
        FedBoostingConfig,
        FedBoosting,
        strength="fused_share",
    )
)
