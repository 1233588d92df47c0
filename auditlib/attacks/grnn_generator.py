"""GRNN's generator (Ren, Deng, Xie 2022, Fig. 3.2 and Table 3.1): a latent to an image
branch (a transposed-conv stem, up-sampling blocks of conv, BatchNorm and GLU, a sigmoid)
and a label branch (linear, softmax), sized as in the public ``Generator/model.py``, and
its images fitted to the model's input. ``grnn.py`` trains one per restart."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from auditlib.threat import AttackerKnowledge


class GLU(nn.Module):
    """Gated linear unit over channels: x[:, :C/2] * sigmoid(x[:, C/2:]) (thesis Table 3.1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[1] // 2
        return x[:, :half] * torch.sigmoid(x[:, half:])


def up_block(in_channels: int, out_channels: int) -> nn.Sequential:
    """Nearest x2, conv 3x3 (no bias) to twice the channels, BatchNorm, GLU (Table 3.1)."""
    return nn.Sequential(
        nn.Upsample(scale_factor=2, mode="nearest"),
        nn.Conv2d(in_channels, out_channels * 2, 3, 1, 1, bias=False),
        nn.BatchNorm2d(out_channels * 2),
        GLU(),
    )


def generated_side(height: int, width: int) -> int:
    """The generator makes square power-of-two images (4 * 2^k); the smallest that covers."""
    return max(8, 1 << math.ceil(math.log2(max(height, width))))


class GrnnGenerator(nn.Module):
    """The two branches of Fig. 3.2, sized as in the public ``Generator/model.py``."""

    def __init__(
        self, latent_dim: int, num_classes: int, channels: int, side: int, width: int
    ) -> None:
        super().__init__()
        blocks = int(math.log2(side)) - 3  # 4x4 map, `blocks` upsamplings, one to the image
        self.label_branch = nn.Linear(latent_dim, num_classes)
        self.stem = nn.Sequential(
            nn.ConvTranspose2d(latent_dim, width * 2**blocks * 2, 4, 1, 0), GLU()
        )
        self.blocks = nn.Sequential(
            *(up_block(width * 2 ** (b + 1), width * 2**b) for b in reversed(range(blocks)))
        )
        self.out = up_block(width, channels)

    def forward(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.softmax(self.label_branch(latent), dim=-1)
        x = self.stem(latent[:, :, None, None])
        images = torch.sigmoid(self.out(self.blocks(x)))
        return images, labels


def _normal_init(module: nn.Module, generator: torch.Generator) -> None:
    # What the public code's weight_init(0, 0.02) means to do (its loop never reaches the
    # layers inside the Sequential containers, so the code runs with PyTorch's init).
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, nn.Linear | nn.Conv2d | nn.ConvTranspose2d):
                layer.weight.normal_(0.0, 0.02, generator=generator)
                if layer.bias is not None:
                    layer.bias.zero_()


def build_generator(
    knowledge: AttackerKnowledge, config: Any, generator: torch.Generator
) -> GrnnGenerator:
    """A freshly initialised generator, deterministic for ``generator``'s state."""
    channels, height, width = knowledge.input_shape
    side = generated_side(height, width)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    # PyTorch's default init draws from the global RNG: seed it locally and restore it.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = GrnnGenerator(config.latent_dim, knowledge.num_classes, channels, side, config.width)
    if config.generator_init == "normal":
        _normal_init(net, generator)
    return net.to(knowledge.device).train()  # BatchNorm on batch statistics, as in the code


def fit_to_input(images: torch.Tensor, height: int, width: int, mode: str) -> torch.Tensor:
    """Generated side x side images to the model's height x width: centre crop or resize."""
    side = images.shape[-1]
    if (height, width) == (side, side):
        return images
    if mode == "resize":
        return F.interpolate(images, size=(height, width), mode="area")
    top, left = (side - height) // 2, (side - width) // 2
    return images[:, :, top : top + height, left : left + width]
