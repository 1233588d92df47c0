"""Defenses, registered by name (``DEFENSES``); importing this package registers them all."""

from auditlib.defenses import (  # noqa: F401  (registration side effect)
    clipping,
    dp_noise,
    fedboosting,
    fedkl,
    model_check,
    model_weights,
    outpost,
    pruning,
    quantization,
    shadow,
    soteria,
)
from auditlib.defenses.base import (
    DEFENSES,
    ClientContext,
    Defense,
    DefenseInfo,
    ModelChange,
    build_defense,
    build_defense_config,
    clip_update,
)

__all__ = [
    "DEFENSES",
    "ClientContext",
    "Defense",
    "DefenseInfo",
    "ModelChange",
    "build_defense",
    "build_defense_config",
    "clip_update",
]
