"""Moved to :mod:`auditlib.client.protocol` (below the defenses, which use it).

Kept only for the importers not yet moved (``auditlib/cli.py``, ``dashboard/run_choices.py``);
delete it once they import ``auditlib.client.protocol``.
"""

from auditlib.client.protocol import Algorithm, BatchNormMode, ClientProtocol, Shared

__all__ = ["Algorithm", "BatchNormMode", "ClientProtocol", "Shared"]
