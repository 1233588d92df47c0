"""Helpers shared by the benchmark scripts (not part of the library)."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import torch

from auditlib.fl.protocol import ClientProtocol
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, {cuda}, torch {torch.__version__}"


def lenet_spec(
    attack: str,
    *,
    offset: int = 0,
    iterations: int = 300,
    defense: ComponentSpec | None = None,
    seed: int = 0,
    num_classes: int = 100,
    attack_params: dict | None = None,
) -> RunSpec:
    """DLG's setting: LeNet (sigmoid, U(-0.5, 0.5) init), 32x32 photograph, batch 1, FedSGD."""
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", num_classes, (3, 32, 32), init="uniform", seed=seed)),
        data=DataSpec("samples", "photographs", batch_size=1, offset=offset),
        scenario=ScenarioSpec(protocol=ClientProtocol()),
        attack=ComponentSpec.of(attack, attack_params or {}),
        defense=defense or ComponentSpec.of("none"),
        budget=Budget(iterations),
        seed=seed,
    )


def replace_section(path: Path, marker: str, body: str) -> None:
    """Replace the text between <!-- marker:start --> and <!-- marker:end --> in ``path``."""
    text = path.read_text()
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no {start} ... {end} section")
    path.write_text(pattern.sub(lambda _: f"{start}\n{body.rstrip()}\n{end}", text))
