"""A run, described by one frozen, serialisable spec; its hash is the run's identity."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from auditlib.config import require
from auditlib.fl.protocol import ClientProtocol
from auditlib.models import ModelSpec


@dataclass(frozen=True)
class ModelRef:
    """A built-in architecture, optionally with uploaded weights or a trusted archive."""

    spec: ModelSpec
    weights: str | None = None  # safetensors / weights-only state_dict file
    trusted_archive: str | None = None  # TorchScript / torch.export, user marked it trusted
    weights_asset: str | None = None  # sha256 of uploaded weights handed to the worker as bytes
    content_sha256: str | None = None  # of the weights or archive file, for the identity


@dataclass(frozen=True)
class DataSpec:
    source: Literal["folder", "samples", "asset"]
    location: str  # a folder path, a bundled sample-set name, or the sha256 of an uploaded zip
    batch_size: int | None = None  # None: every image in the folder
    offset: int = 0
    labels_csv: str | None = None
    normalization: str = "none"  # "none" or "MEAN/STD", see Normalization.parse
    content_sha256: str | None = None  # of the images actually used

    def __post_init__(self) -> None:
        require(
            self.batch_size is None or 1 <= self.batch_size <= 64,
            f"batch size must be between 1 and 64, got {self.batch_size}",
        )
        require(self.offset >= 0, f"offset must be >= 0, got {self.offset}")


@dataclass(frozen=True)
class ScenarioSpec:
    protocol: ClientProtocol = field(default_factory=ClientProtocol)
    labels_known: bool = False  # threat model: the server learns the labels
    pretrain_rounds: int = 0  # attack stage: FedAvg rounds the global model trained before
    pretrain_data: str = "fashion-mnist"

    def __post_init__(self) -> None:
        require(
            0 <= self.pretrain_rounds <= 1000,
            f"pretrain rounds must be in [0, 1000], got {self.pretrain_rounds}",
        )


@dataclass(frozen=True)
class ComponentSpec:
    """An attack or defense by registry name, with its parameters and optional preset."""

    name: str
    params: tuple[tuple[str, str], ...] = ()
    preset: str | None = None

    @classmethod
    def of(
        cls, name: str, params: dict[str, Any] | None = None, preset: str | None = None
    ) -> ComponentSpec:
        return cls(name, tuple(sorted((k, str(v)) for k, v in (params or {}).items())), preset)

    def params_dict(self) -> dict[str, str]:
        return dict(self.params)


@dataclass(frozen=True)
class Budget:
    iterations: int
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        require(
            1 <= self.iterations <= 1_000_000,
            f"iterations must be in [1, 1000000], got {self.iterations}",
        )
        require(
            self.max_seconds is None or self.max_seconds > 0,
            f"time budget must be > 0 s, got {self.max_seconds}",
        )


@dataclass(frozen=True)
class RunSpec:
    model: ModelRef
    data: DataSpec
    scenario: ScenarioSpec
    attack: ComponentSpec
    defense: ComponentSpec
    budget: Budget
    seed: int = 0
    device: str = "cpu"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def identity(self) -> str:
        """sha256 of the canonical JSON of everything that determines the result.

        Paths are not part of the identity when a content hash stands for them; the device
        is, since CUDA kernels are not bit-identical to CPU ones.
        """
        payload = self.to_dict()
        if self.model.content_sha256:
            payload["model"]["weights"] = payload["model"]["trusted_archive"] = None
        if self.data.content_sha256:
            payload["data"]["location"] = payload["data"]["labels_csv"] = None
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()
