"""Quantisation of the shared update (the FedLeak paper's baseline, Sec. 6.4, after Yue et al.).

FedLeak sweeps the bit width over {32, 16, 8, 4, 1} with the QSGD-style compressor of ROG.
Here, per tensor v:

- 32 bits: unchanged (float32 is what an unquantised client sends);
- 16 bits: rounded to IEEE half precision;
- 2-8 bits: QSGD (Alistarh et al. 2017) with s = 2^(bits-1) - 1 levels and one sign bit:
  the tensor is cut into buckets of ``bucket_size`` entries (512, the QSGD paper's
  experiments; 0 = one bucket per tensor) and in each bucket |v_i| / ||bucket||_2 is rounded
  to a neighbouring multiple of 1/s, up with probability equal to the remainder (unbiased,
  ``stochastic=True``, the default) or to the nearest one. Few levels on long buckets are
  very noisy (variance up to sqrt(d)/s times ||v||^2), which is QSGD's own trade-off;
- 1 bit: the sign, scaled by the mean magnitude of the tensor (1-bit SGD / signSGD with
  scale), since QSGD needs at least a zero level.

Quantisation is compression, not noise calibrated to a sensitivity: no DP guarantee.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from auditlib.config import check_ranges, param
from auditlib.defenses.base import DefenseInfo, copied, register, straight_through
from auditlib.likelihoods import STEP_FLOOR, QsgdLikelihood
from auditlib.threat import KnownDefense


@dataclass(frozen=True)
class QuantizationConfig:
    bits: int = param(
        8,
        "bits per entry: 32 unchanged, 16 half precision, 2-8 QSGD with 2^(bits-1) - 1 levels "
        "and a sign, 1 the sign times the mean magnitude",
        values=(1, 2, 3, 4, 5, 6, 7, 8, 16, 32),
    )
    stochastic: bool = param(
        True, "QSGD: round up or down at random, unbiased (false: to the nearest level)"
    )
    bucket_size: int = param(
        512,
        "QSGD: entries per bucket sharing one norm (QSGD's experiments: 512); 0: one bucket "
        "per tensor",
        low=0,
        high=10**8,
    )

    def __post_init__(self) -> None:
        check_ranges(self)


def _qsgd(
    t: torch.Tensor, levels: int, bucket: int, stochastic: bool, generator: torch.Generator
) -> torch.Tensor:
    flat = t.reshape(-1)
    size = bucket if 0 < bucket < flat.numel() else flat.numel()
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % size)).view(-1, size)
    norms = torch.linalg.vector_norm(padded, dim=1, keepdim=True)
    scaled = padded.abs() / norms.clamp_min(torch.finfo(t.dtype).tiny) * levels
    lower = torch.floor(scaled)
    if stochastic:
        draw = torch.rand(padded.shape, generator=generator, dtype=torch.float64)
        up = draw.to(device=t.device, dtype=t.dtype) < (scaled - lower)
        rounded = lower + up.to(t.dtype)
    else:
        rounded = torch.round(scaled)
    out = torch.sign(padded) * rounded * (norms / levels)
    return out.reshape(-1)[: flat.numel()].view_as(t)


class Quantization:
    def __init__(self, config: QuantizationConfig) -> None:
        self.config = config

    def apply(self, update, generator, context=None):
        bits = self.config.bits
        if bits == 32:
            return copied(update)
        if bits == 16:
            return tuple(t.to(torch.float16).to(t.dtype) for t in update)
        if bits == 1:
            return tuple(torch.sign(t) * t.abs().mean() for t in update)
        levels = 2 ** (bits - 1) - 1
        c = self.config
        return tuple(_qsgd(t, levels, c.bucket_size, c.stochastic, generator) for t in update)

    def known_to_attacker(self, observation, weights):
        c = self.config
        if c.bits == 32:
            return None
        if c.stochastic and 2 <= c.bits <= 8:
            noise = QsgdLikelihood.read(observation.tensors, 2 ** (c.bits - 1) - 1, c.bucket_size)
            return KnownDefense(
                "quantize",
                f"knows the update was quantised to {c.bits} bits by QSGD with stochastic "
                "rounding: reads each bucket's norm and every sign off the release, where "
                "they are exact, and weighs each entry's rounding by its bucket's step, no finer "
                f"than {STEP_FLOOR:g} of the coarsest (its likelihood), plus the image prior "
                "it weighs",
                noise=noise,
            )
        return KnownDefense(
            "quantize",
            f"knows the update was quantised to {c.bits} bits: quantises its candidate's "
            "update the same way (straight-through gradient) before comparing",
            transform=straight_through(lambda update: self.apply(update, None)),
        )

    def privacy_report(self) -> dict[str, Any]:
        return {
            "epsilon": None,
            "epsilon_unavailable_reason": "quantisation is compression, not calibrated "
            "noise: no DP guarantee",
            "bits_per_entry": self.config.bits,
        }


register(
    DefenseInfo(
        "quantize",
        "Quantise the update to `bits` per entry (QSGD levels for 2-8 bits, scaled sign for 1, "
        "half precision for 16).",
        QuantizationConfig,
        Quantization,
        strength="bits",
    )
)
