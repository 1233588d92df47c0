"""Attacks, registered by name (``ATTACKS``); importing this package registers them all."""

from importlib import import_module

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

# Each module registers its attack when imported.
_MODULES = ("dlg", "idlg", "inverting_gradients", "gradinversion", "grnn", "dlm", "fedleak")
for _module in _MODULES:
    import_module(f"auditlib.attacks.{_module}")

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
