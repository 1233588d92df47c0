"""Moved to :mod:`auditlib.client.update` (below the defenses and attacks, which use it).

Kept only for the importer not yet moved (``auditlib/engine/audit.py``); delete it once it
imports ``auditlib.client.update``.
"""

from auditlib.client.update import set_training_mode

__all__ = ["set_training_mode"]
