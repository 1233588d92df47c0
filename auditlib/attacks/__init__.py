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
_MODULES = (
    "dlg",
    "idlg",
    "inverting_gradients",
    "gradinversion",
    "grnn",
    "dlm",
    "fedleak",
    "rtf",
    "cah",
    "loki",
    "evading",
    "seer",
)
for _module in _MODULES:
    import_module(f"auditlib.attacks.{_module}")


def default_iterations(attack: str, preset: str | None) -> int:
    """The step budget per start that goes with the chosen settings, from the registry: the
    paper's count for the paper's settings, the audit preset's otherwise (each falls back on
    the other where an attack has only one); for every applicable attack, the longest of
    their audit budgets. The CLI and the dashboard's form both start from it."""
    if attack == ALL_ATTACKS:
        return max(a.audit.iterations for a in ATTACKS.values() if a.audit)
    info = get_attack(attack)
    audit = info.audit.iterations if info.audit is not None else None
    paper = preset is not None and preset.startswith("paper")
    counts = (info.paper_iterations, audit) if paper else (audit, info.paper_iterations)
    count = next((c for c in counts if c), None)
    if count is None:
        raise LookupError(  # a registry entry without a budget: a bug of the attack's module
            f"attack {attack} has neither an audit preset nor the paper's iteration count"
        )
    return count


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
    "default_iterations",
    "get_attack",
]
