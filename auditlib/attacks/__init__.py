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

# The name of "every applicable attack" (engine.attack_phase): not an attack of its own.
ALL_ATTACKS = "all"
ALL_ATTACKS_LABEL = "every applicable attack"

# Each module registers its attack when imported.
_MODULES = ("dlg", "idlg", "inverting_gradients", "gradinversion", "grnn", "dlm", "fedleak")
for _module in _MODULES:
    import_module(f"auditlib.attacks.{_module}")

__all__ = [
    "ALL_ATTACKS",
    "ALL_ATTACKS_LABEL",
    "ATTACKS",
    "AttackInfo",
    "Candidate",
    "ProgressEvent",
    "Reconstruction",
    "RunControl",
    "build_attack_config",
    "get_attack",
]
