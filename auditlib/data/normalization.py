"""The one definition of input normalisation: x_model = (x01 - mean) / std, per channel."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from auditlib.errors import AuditInputError


@dataclass(frozen=True)
class Normalization:
    """Per-channel mean and std that map [0, 1] pixels to the model's input space."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.mean) != len(self.std) or not self.mean:
            raise AuditInputError(
                f"normalisation needs one mean and one std per channel, got mean={self.mean} "
                f"std={self.std}"
            )
        if any(not (s > 0) for s in self.std):
            raise AuditInputError(f"normalisation std must be > 0 in every channel, got {self.std}")

    @classmethod
    def identity(cls, channels: int) -> Normalization:
        """No normalisation: the model sees [0, 1] pixels (DLG, GRNN: ToTensor only)."""
        return cls(mean=(0.0,) * channels, std=(1.0,) * channels)

    @classmethod
    def parse(cls, text: str, channels: int) -> Normalization:
        """Parse ``"none"`` or ``"m1,m2,m3/s1,s2,s3"`` (one value may stand for all channels)."""
        if text.strip().lower() in {"none", "identity", ""}:
            return cls.identity(channels)
        try:
            mean_text, std_text = text.split("/")
            mean = tuple(float(v) for v in mean_text.split(","))
            std = tuple(float(v) for v in std_text.split(","))
        except ValueError as exc:
            raise AuditInputError(
                f"normalisation {text!r} not understood; expected 'none' or 'MEAN/STD' with "
                "comma-separated per-channel values, e.g. '0.5,0.5,0.5/0.5,0.5,0.5'"
            ) from exc
        if len(mean) == 1:
            mean = mean * channels
        if len(std) == 1:
            std = std * channels
        if len(mean) != channels or len(std) != channels:
            raise AuditInputError(
                f"normalisation {text!r} gives {len(mean)} means and {len(std)} stds; the model "
                f"has {channels} input channels"
            )
        return cls(mean=mean, std=std)

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling():  # a traced step: constants of its graph
            return _made(self.mean, self.std, like.dtype, like.device)
        return _stats_on(self.mean, self.std, like.dtype, like.device)

    def normalize(self, images01: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(images01)
        return (images01 - mean) / std

    def denormalize(self, images: torch.Tensor) -> torch.Tensor:
        """Back to [0, 1] pixel space, unclamped (metrics clamp)."""
        mean, std = self._stats(images)
        return images * std + mean

    def pixel_bounds(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel bounds of valid pixels in model space (for box constraints)."""
        mean, std = self._stats(like)
        return (0 - mean) / std, (1 - mean) / std

    def as_dict(self) -> dict[str, list[float]]:
        return {"mean": list(self.mean), "std": list(self.std)}


def _made(
    mean: tuple[float, ...], std: tuple[float, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std shaped to broadcast over N x C x H x W. Made outside inference mode, so
    that autograd may save them (they are cached: read only, never written)."""
    shape = (1, len(mean), 1, 1)
    with torch.inference_mode(False):
        made = torch.tensor(mean, dtype=dtype, device=device).view(shape)
        return made, torch.tensor(std, dtype=dtype, device=device).view(shape)


# Made once per dtype and device: an attack normalises at every step, and on a GPU a tensor
# made from host values is a copy that waits for the work queued before it (issue 55).
_stats_on = functools.lru_cache(maxsize=64)(_made)
