"""Built-in victim architectures, as used by the gradient-inversion papers.

Every model takes ``num_classes`` and ``input_shape = (C, H, W)`` and derives the size of its
linear layers from the input shape, so the same class serves 32x32 and 64x64 data. Activations
are modules (never ``F.*`` calls) and nothing is in-place, because the attacks differentiate
the gradient a second time. Parameter names follow the reference code of each paper, so
checkpoints saved from it load here unchanged.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from auditlib.errors import AuditInputError

ACTIVATIONS = ("sigmoid", "relu")
STEMS = ("cifar", "imagenet")


def make_activation(name: str) -> nn.Module:
    """A fresh activation module: ``"sigmoid"`` or ``"relu"`` (never in-place)."""
    if name == "sigmoid":
        return nn.Sigmoid()
    if name == "relu":
        return nn.ReLU(inplace=False)
    raise AuditInputError(
        f"activation {name!r} is not supported; expected one of {', '.join(ACTIVATIONS)}"
    )


def _shape_text(input_shape: Sequence[int]) -> str:
    return "x".join(str(v) for v in input_shape)


def _pool_out(size: int, kernel: int) -> int:
    """Output size of ``MaxPool2d(kernel)`` (stride = kernel, no padding)."""
    return (size - kernel) // kernel + 1 if size >= kernel else 0


class LeNet(nn.Module):
    """The "LeNet" of Deep Leakage from Gradients (Zhu et al., NeurIPS 2019).

    Also the victim of iDLG (Zhao et al. 2020) and GRNN (Ren et al. 2022): three 5x5
    convolutions with 12 channels (strides 2, 2, 1) and one linear layer. Sigmoid by default,
    as in the paper: its smooth, non-zero second derivative is what makes DLG converge.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, int, int],
        *,
        activation: str = "sigmoid",
    ) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.num_classes = num_classes
        self.input_shape = tuple(input_shape)
        self.body = nn.Sequential(
            nn.Conv2d(channels, 12, kernel_size=5, padding=2, stride=2),
            make_activation(activation),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=2),
            make_activation(activation),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1),
            make_activation(activation),
        )
        # Two stride-2 convolutions with padding 2 map n pixels to ceil(n / 4).
        features = 12 * math.ceil(height / 4) * math.ceil(width / 4)
        self.fc = nn.Sequential(nn.Linear(features, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.body(x), 1))


class ConvNet(nn.Module):
    """The ConvNet of Inverting Gradients (Geiping et al., NeurIPS 2020).

    Eight 3x3 convolutions with BatchNorm (widths w, 2w, 2w, 4w, 4w, 4w, 4w, 4w), a 3x3 max
    pool after the sixth and the eighth, then one linear layer (36w inputs at 32x32).
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, int, int],
        *,
        width: int = 64,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        channels, height, wide = input_shape
        pooled_h = _pool_out(_pool_out(height, 3), 3)
        pooled_w = _pool_out(_pool_out(wide, 3), 3)
        if pooled_h < 1 or pooled_w < 1:
            raise AuditInputError(
                f"convnet needs inputs of at least 9x9 pixels (it max-pools by 3 twice), got "
                f"{_shape_text(input_shape)}; expected a larger input shape"
            )
        self.num_classes = num_classes
        self.input_shape = tuple(input_shape)
        plan = [channels, width, 2 * width, 2 * width, 4 * width, 4 * width, 4 * width]
        plan += [4 * width, 4 * width]
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        for i in range(8):
            layers[f"conv{i}"] = nn.Conv2d(plan[i], plan[i + 1], kernel_size=3, padding=1)
            layers[f"bn{i}"] = nn.BatchNorm2d(plan[i + 1])
            layers[f"act{i}"] = make_activation(activation)
            if i in (5, 7):
                layers[f"pool{(i - 5) // 2}"] = nn.MaxPool2d(3)
        layers["flatten"] = nn.Flatten()
        layers["linear"] = nn.Linear(4 * width * pooled_h * pooled_w, num_classes)
        self.model = nn.Sequential(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a residual connection (He et al., CVPR 2016)."""

    def __init__(self, in_planes: int, planes: int, stride: int, activation: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.act1 = make_activation(activation)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.act2 = make_activation(activation)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act2(out + self.downsample(x))


class ResNet(nn.Module):
    """ResNet with basic blocks (He et al., CVPR 2016), as attacked by Inverting Gradients.

    ``depths`` gives the number of blocks per stage; the first stage keeps the resolution and
    every later one halves it. The ``"cifar"`` stem is one 3x3 convolution (He et al.'s CIFAR
    networks); the ``"imagenet"`` stem is a 7x7 stride-2 convolution and a 3x3 stride-2 max
    pool. With ``activation="sigmoid"`` every ReLU becomes a sigmoid, which is the ResNet-18
    of the GRNN thesis (Ren et al. 2022). Names match torchvision, so its checkpoints fit the
    ``"imagenet"`` stem.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, int, int],
        *,
        depths: Sequence[int] = (2, 2, 2, 2),
        widths: Sequence[int] = (64, 128, 256, 512),
        stem: str = "cifar",
        activation: str = "relu",
    ) -> None:
        super().__init__()
        if len(depths) != len(widths) or not depths or min(depths) < 1:
            raise AuditInputError(
                f"resnet needs one positive block count per stage width, got depths={depths} "
                f"widths={widths}; expected e.g. depths=(2, 2, 2, 2) widths=(64, 128, 256, 512)"
            )
        if stem not in STEMS:
            raise AuditInputError(
                f"resnet stem {stem!r} is not supported; expected one of {', '.join(STEMS)}"
            )
        channels = input_shape[0]
        self.num_classes = num_classes
        self.input_shape = tuple(input_shape)
        self.stem = stem
        first = widths[0]
        if stem == "cifar":
            self.conv1 = nn.Conv2d(channels, first, 3, stride=1, padding=1, bias=False)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(channels, first, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(first)
        self.act = make_activation(activation)
        in_planes = first
        for index, (depth, planes) in enumerate(zip(depths, widths, strict=True)):
            blocks = []
            for block in range(depth):
                stride = 2 if index > 0 and block == 0 else 1
                blocks.append(BasicBlock(in_planes, planes, stride, activation))
                in_planes = planes
            self.add_module(f"layer{index + 1}", nn.Sequential(*blocks))
        self.num_stages = len(depths)
        # Adaptive pooling makes the head independent of the input size.
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.act(self.bn1(self.conv1(x))))
        for index in range(self.num_stages):
            x = getattr(self, f"layer{index + 1}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


class MLP(nn.Module):
    """A fully connected network: flatten, hidden layers with activations, linear output.

    The multi-layer perceptron of the analytic attacks on fully connected layers (Phong et al.
    2018; Fan et al. 2020): the input of a linear layer is recoverable from its gradient.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, int, int],
        *,
        hidden: Sequence[int] = (256, 256),
        activation: str = "sigmoid",
    ) -> None:
        super().__init__()
        if any(h < 1 for h in hidden):
            raise AuditInputError(
                f"mlp hidden sizes must be positive, got {tuple(hidden)}; expected e.g. (256, 256)"
            )
        self.num_classes = num_classes
        self.input_shape = tuple(input_shape)
        self.flatten = nn.Flatten()
        sizes = [math.prod(input_shape), *hidden]
        layers: list[nn.Module] = []
        for n_in, n_out in itertools.pairwise(sizes):
            layers += [nn.Linear(n_in, n_out), make_activation(activation)]
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(sizes[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(self.flatten(x)))


def resnet10(num_classes: int, input_shape: tuple[int, int, int], **kwargs: str) -> ResNet:
    """ResNet-10: one basic block per stage, widths 64/128/256/512."""
    return ResNet(num_classes, input_shape, depths=(1, 1, 1, 1), **kwargs)


def resnet18(num_classes: int, input_shape: tuple[int, int, int], **kwargs: str) -> ResNet:
    """ResNet-18: two basic blocks per stage, widths 64/128/256/512."""
    return ResNet(num_classes, input_shape, depths=(2, 2, 2, 2), **kwargs)


def resnet34(num_classes: int, input_shape: tuple[int, int, int], **kwargs: str) -> ResNet:
    """ResNet-34: 3/4/6/3 basic blocks per stage, widths 64/128/256/512."""
    return ResNet(num_classes, input_shape, depths=(3, 4, 6, 3), **kwargs)


def resnet20(num_classes: int, input_shape: tuple[int, int, int], **kwargs: str) -> ResNet:
    """ResNet-20, He et al.'s CIFAR network: three stages of 3 blocks, widths 16/32/64."""
    return ResNet(num_classes, input_shape, depths=(3, 3, 3), widths=(16, 32, 64), **kwargs)
