"""Model specifications and the registry of built-in architectures."""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from auditlib.errors import AuditInputError
from auditlib.models import architectures as arch
from auditlib.models import own_code, zoo

INITS = ("default", "uniform")
MAX_CLASSES = 100_000
MIN_SIDE, MAX_SIDE = 8, 512
CHANNELS = (3, 1)  # colour or grayscale: the two input depths a model may take
# Largest input side for which the ResNets default to the "cifar" stem.
CIFAR_STEM_MAX_SIDE = 64


@dataclass(frozen=True)
class ArchitectureInfo:
    """One architecture: what it is, where it comes from, and how to build it.

    ``source`` is "built-in" (``ARCHITECTURES``; the factory takes ``activation`` and, where
    ``accepts_stem``, ``stem``), "torchvision" (``torchvision:NAME``, see ``zoo``: the
    builder's own activations, no stem choice, PyTorch's default init only) or "own code"
    (``path/to/file.py:ClassName``, see ``own_code``: built only where running it is allowed).
    """

    name: str
    description: str
    default_activation: str | None
    has_batchnorm: bool
    factory: Callable[..., nn.Module]
    accepts_stem: bool = False
    source: str = "built-in"


ARCHITECTURES: dict[str, ArchitectureInfo] = {
    info.name: info
    for info in (
        ArchitectureInfo(
            "lenet",
            "LeNet of Deep Leakage from Gradients (Zhu et al. 2019), also used by iDLG and GRNN",
            "sigmoid",
            False,
            arch.LeNet,
        ),
        ArchitectureInfo(
            "convnet",
            "ConvNet (width 64, BatchNorm) of Inverting Gradients (Geiping et al. 2020)",
            "relu",
            True,
            arch.ConvNet,
        ),
        ArchitectureInfo(
            "resnet10",
            "ResNet-10 with basic blocks (He et al. 2016)",
            "relu",
            True,
            arch.resnet10,
            accepts_stem=True,
        ),
        ArchitectureInfo(
            "resnet18",
            "ResNet-18 (He et al. 2016), attacked in Inverting Gradients; sigmoid variant in GRNN",
            "relu",
            True,
            arch.resnet18,
            accepts_stem=True,
        ),
        ArchitectureInfo(
            "resnet20",
            "ResNet-20 for CIFAR, widths 16/32/64 (He et al. 2016)",
            "relu",
            True,
            arch.resnet20,
            accepts_stem=True,
        ),
        ArchitectureInfo(
            "resnet34",
            "ResNet-34 with basic blocks (He et al. 2016)",
            "relu",
            True,
            arch.resnet34,
            accepts_stem=True,
        ),
        ArchitectureInfo(
            "mlp",
            "Fully connected network (hidden 256, 256) of the analytic attacks (Phong et al. 2018)",
            "sigmoid",
            False,
            arch.MLP,
        ),
    )
}


def _as_int(value: object, what: str, expected: str) -> int:
    """``value`` as a Python int; bools and floats are refused rather than truncated."""
    if isinstance(value, bool):
        raise AuditInputError(f"{what} must be a whole number, got {value!r}; expected {expected}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise AuditInputError(
            f"{what} must be a whole number, got {value!r}; expected {expected}"
        ) from None


def _build_torchvision(name: str, num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    return zoo.build(name, num_classes, input_shape, MAX_SIDE)


@functools.cache
def _torchvision_info(name: str) -> ArchitectureInfo:
    return ArchitectureInfo(
        name,
        zoo.description(name),
        None,
        zoo.has_batchnorm(name),
        functools.partial(_build_torchvision, name),
        source="torchvision",
    )


@functools.cache
def _own_info(name: str) -> ArchitectureInfo:
    file, cls = own_code.parts(name)
    # has_batchnorm: unknown until the class is built, which only its own process does; what
    # needs it there reads the built model's modules.
    return ArchitectureInfo(
        name,
        f"{cls}, a model class of your own code ({file})",
        None,
        False,
        functools.partial(_own_factory, name),
        source=own_code.SOURCE,
    )


def _own_factory(name: str, *_: Any, **__: Any) -> nn.Module:
    # ``construct`` builds an own class with its constructor arguments (``model_args``); the
    # factory stands for it where only the info is read.
    raise AuditInputError(f"{name} is built from its ModelSpec (with its model_args)")


def architecture_info(architecture: str) -> ArchitectureInfo:
    """The built-in architecture, the ``torchvision:NAME`` model or the class of the user's
    own code (``path/to/file.py:ClassName``) of that (checked) name."""
    if architecture in ARCHITECTURES:
        return ARCHITECTURES[architecture]
    if own_code.is_own_class(architecture):
        return _own_info(architecture.strip())
    return _torchvision_info(zoo.checked_name(architecture))


def _architecture(value: object) -> str:
    """A built-in name, ``torchvision:NAME`` or ``path/to/file.py:ClassName``, normalised;
    else a refusal that names the close matches among the first two and says how to list
    them all."""
    builtin = ", ".join(ARCHITECTURES)
    expected = (
        f"one of {builtin}, {zoo.PREFIX}NAME for a torchvision classification model, or "
        "path/to/file.py:ClassName for a model class of your own code"
    )
    if not isinstance(value, str):
        raise AuditInputError(f"architecture must be a name, got {value!r}; expected {expected}")
    if own_code.is_own_class(value):
        return value.strip()
    if zoo.is_torchvision(value):
        return zoo.checked_name(value)
    name = value.strip().lower()
    if name in ARCHITECTURES:
        return name
    # A bare torchvision name means the torchvision model, unless a built-in has it.
    candidates = {n: zoo.PREFIX + n for n in zoo.torchvision_names()} | {
        n: n for n in ARCHITECTURES
    }
    if name in zoo.torchvision_names():
        matches = [zoo.PREFIX + name]
    else:
        matches = [candidates[m] for m in zoo.close_matches(name, list(candidates))]
    close = ""
    if len(matches) == 1:
        close = f" (did you mean {matches[0]}?)"
    elif matches:
        close = f" (close matches: {', '.join(matches)})"
    raise AuditInputError(
        f"architecture {value!r} is not known; expected {expected}{close}; {zoo.LIST_HINT}"
    )


def _as_name(value: object, what: str, allowed: tuple[str, ...]) -> str:
    expected = f"one of {', '.join(allowed)}"
    if not isinstance(value, str):
        raise AuditInputError(f"{what} must be a name, got {value!r}; expected {expected}")
    name = value.strip().lower()
    if name not in allowed:
        raise AuditInputError(f"{what} {value!r} is not known; expected {expected}")
    return name


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a victim model exactly: architecture, shape and init.

    Fields are checked (and names lower-cased) on construction, so a spec that exists is valid.
    """

    architecture: str
    num_classes: int = 10
    input_shape: tuple[int, int, int] = (3, 32, 32)
    # "default" = PyTorch's init; "uniform" = every weight and bias ~ U(-0.5, 0.5), the
    # initialisation DLG and GRNN use because it makes gradients easier to invert.
    init: str = "default"
    activation: str | None = None
    stem: str | None = None
    seed: int = 0
    # A class of the user's own code: its constructor's arguments, canonical JSON (None: none).
    model_args: str | None = None

    def __post_init__(self) -> None:
        # Normalised values are written back, which a frozen dataclass only allows this way.
        for name, value in self._checked().items():
            object.__setattr__(self, name, value)

    def _checked(self) -> dict[str, Any]:
        architecture = _architecture(self.architecture)
        info = architecture_info(architecture)
        num_classes = _as_int(self.num_classes, "num_classes", f"2 to {MAX_CLASSES}")
        if not 2 <= num_classes <= MAX_CLASSES:
            raise AuditInputError(
                f"num_classes must be between 2 and {MAX_CLASSES}, got {num_classes}"
            )
        shape_expected = "(channels, height, width) with 1 or 3 channels, e.g. (3, 32, 32)"
        if isinstance(self.input_shape, str | bytes) or not hasattr(self.input_shape, "__len__"):
            raise AuditInputError(
                f"input_shape must be three numbers, got {self.input_shape!r}; "
                f"expected {shape_expected}"
            )
        if len(self.input_shape) != 3:
            raise AuditInputError(
                f"input_shape must have 3 entries, got {len(self.input_shape)} "
                f"({tuple(self.input_shape)}); expected {shape_expected}"
            )
        shape = tuple(_as_int(v, "input_shape", shape_expected) for v in self.input_shape)
        channels, height, width = shape
        if channels not in CHANNELS:
            raise AuditInputError(
                f"input_shape has {channels} channels; expected 1 (grayscale) or 3 (colour)"
            )
        if not (MIN_SIDE <= height <= MAX_SIDE and MIN_SIDE <= width <= MAX_SIDE):
            raise AuditInputError(
                f"input_shape is {height}x{width} pixels; expected height and width between "
                f"{MIN_SIDE} and {MAX_SIDE}"
            )
        init = _as_name(self.init, "init", INITS)
        activation = self.activation
        if activation is not None:
            activation = _as_name(activation, "activation", arch.ACTIVATIONS)
        if info.source == "torchvision":
            _check_torchvision(architecture, shape, init, activation)
        model_args = own_code.canonical_args(self.model_args)
        if info.source == own_code.SOURCE:
            if activation is not None:
                raise AuditInputError(
                    f"activation {activation!r} was given for {architecture}, a class of your "
                    "own code, which keeps its own activations; expected no activation"
                )
        elif model_args is not None:
            raise AuditInputError(
                f"constructor arguments were given for {architecture}; expected them only for a "
                "model class of your own code (path/to/file.py:ClassName)"
            )
        stem = self.stem
        if stem is not None:
            if not info.accepts_stem:
                raise AuditInputError(
                    f"stem={stem!r} was given for {architecture}, which has no stem choice; "
                    "expected no stem, or a resnet architecture"
                )
            stem = _as_name(stem, "stem", arch.STEMS)
        seed = _as_int(self.seed, "seed", "a number from 0 to 2**63 - 1")
        if not 0 <= seed < 2**63:
            raise AuditInputError(f"seed must be between 0 and 2**63 - 1, got {seed}")
        return {
            "architecture": architecture,
            "num_classes": num_classes,
            "input_shape": shape,
            "init": init,
            "activation": activation,
            "stem": stem,
            "seed": seed,
            "model_args": model_args,
        }

    @property
    def info(self) -> ArchitectureInfo:
        return architecture_info(self.architecture)

    def resolved(self) -> ModelSpec:
        """This spec with the architecture's defaults filled in for activation and stem."""
        activation = self.activation or self.info.default_activation
        stem = self.stem
        if self.info.accepts_stem and stem is None:
            _, height, width = self.input_shape
            small = max(height, width) <= CIFAR_STEM_MAX_SIDE
            stem = "cifar" if small or self.architecture == "resnet20" else "imagenet"
        return dataclasses.replace(self, activation=activation, stem=stem)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the input shape as a list)."""
        data = dataclasses.asdict(self)
        data["input_shape"] = list(self.input_shape)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        """The inverse of :meth:`as_dict`; unknown keys are refused."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise AuditInputError(
                f"model spec has unknown fields {', '.join(unknown)}; expected only "
                f"{', '.join(sorted(fields))}"
            )
        values = dict(data)
        if isinstance(values.get("input_shape"), list):
            values["input_shape"] = tuple(values["input_shape"])
        return cls(**values)


def _check_torchvision(
    architecture: str, shape: tuple[int, int, int], init: str, activation: str | None
) -> None:
    """What a torchvision model refuses beyond the built-ins' checks: grayscale input, a
    ViT side off its patch grid, the uniform init, an activation choice."""
    zoo.check_input_shape(architecture, shape)
    if init != "default":
        raise AuditInputError(
            f"init {init!r} was given for {architecture}; expected init 'default' (the "
            "builder's own initialisation): DLG's U(-0.5, 0.5) init is for the shallow "
            "built-in networks, and it makes a deep network's activations overflow"
        )
    if activation is not None:
        raise AuditInputError(
            f"activation {activation!r} was given for {architecture}, which keeps its "
            "builder's activations; expected no activation"
        )


def trainable_init(spec: ModelSpec) -> str:
    """The initialisation from which SGD trains ``spec``'s activation: DLG's uniform one for
    sigmoid networks (PyTorch's default shrinks their signal about fourfold per layer and
    training stays at chance level) and PyTorch's default otherwise (the uniform one makes
    ReLU activations blow up and stall)."""
    return "uniform" if spec.resolved().activation == "sigmoid" else "default"


def _uniform_init(model: nn.Module, generator: torch.Generator) -> None:
    # DLG's weights_init touches every module's weight and bias, BatchNorm included; in the
    # built-in models those are all the parameters there are.
    with torch.no_grad():
        for param in model.parameters():
            param.uniform_(-0.5, 0.5, generator=generator)


def checked_spec(spec: ModelSpec) -> ModelSpec:
    """``spec`` with its fields checked again and its defaults resolved, as a build needs it."""
    if not isinstance(spec, ModelSpec):
        raise AuditInputError(f"build_model needs a ModelSpec, got {type(spec).__name__}")
    return dataclasses.replace(spec).resolved()  # replace() re-runs the field checks


def construct(spec: ModelSpec) -> nn.Module:
    """The architecture's factory called for a checked ``spec``, with the arguments it takes
    (the built-ins' activation, a stem where the architecture has one); no init, no RNG."""
    info = spec.info
    if info.source == own_code.SOURCE:  # refused unless running its code is allowed here
        return own_code.construct_own(spec.architecture, spec.model_args)
    kwargs: dict[str, Any] = {}
    if info.source == "built-in":
        kwargs["activation"] = spec.activation
    if info.accepts_stem:
        kwargs["stem"] = spec.stem
    return info.factory(spec.num_classes, spec.input_shape, **kwargs)


def build_model(spec: ModelSpec) -> nn.Module:
    """Build the model a spec describes: CPU, float32, eval mode, deterministic for its seed.

    The global torch RNG is left as it was. The resolved spec is kept on ``model.spec``.
    """
    spec = checked_spec(spec)
    # fork_rng(devices=[]) restores only the CPU generator, which is all a CPU build draws from.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = construct(spec)
        if spec.init == "uniform":
            _uniform_init(model, torch.Generator().manual_seed(spec.seed))
    model = model.to(device="cpu", dtype=torch.float32).eval()
    model.spec = spec
    return model
