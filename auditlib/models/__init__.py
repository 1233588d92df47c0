"""Victim models: built-in architectures, their specs, and safe loading of user weights."""

from auditlib.models.loading import describe_model, last_linear, load_trusted_archive, load_weights
from auditlib.models.registry import ARCHITECTURES, ArchitectureInfo, ModelSpec, build_model

__all__ = [
    "ARCHITECTURES",
    "ArchitectureInfo",
    "ModelSpec",
    "build_model",
    "describe_model",
    "last_linear",
    "load_trusted_archive",
    "load_weights",
]
