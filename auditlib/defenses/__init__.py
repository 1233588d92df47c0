"""Defenses, registered by name (``DEFENSES``); importing this package registers them all."""

from auditlib.defenses import dp_noise, pruning  # noqa: F401  (registration side effect)
from auditlib.defenses.base import DEFENSES, Defense, DefenseInfo, build_defense, clip_update

__all__ = ["DEFENSES", "Defense", "DefenseInfo", "build_defense", "clip_update"]
