"""Attacks, registered by name (``ATTACKS``); importing this package registers them all."""

from auditlib.attacks import dlg, idlg, inverting_gradients  # noqa: F401  (registration)
from auditlib.attacks.base import (
    ATTACKS,
    AttackInfo,
    Candidate,
    ProgressEvent,
    Reconstruction,
    RunControl,
    build_attack_config,
    get_attack,
)

__all__ = [
    "ATTACKS",
    "AttackInfo",
    "Candidate",
    "ProgressEvent",
    "Reconstruction",
    "RunControl",
    "build_attack_config",
    "get_attack",
]
