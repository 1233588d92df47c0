"""The malicious server: what it builds into the model it sends before a round.

An honest-but-curious server sends the global model as trained; a malicious one inserts
layers whose update the client's data imprints exactly (Robbing the Fed's bins, Curious
Abandon Honesty's trap weights, LOKI's per-client kernels). This package builds those models
and says, in a :class:`ServerModification`, what it changed; the attacks in
``auditlib.attacks`` read the update back, and ``auditlib.defenses.model_check`` is the
client's look at the model before it trains.
"""

from auditlib.server.bins import PUBLIC_PRIORS, MeasurePrior, public_prior
from auditlib.server.blocks import (
    ClientKernels,
    ImprintBlock,
    LokiBlock,
    MaliciousModel,
    ServerBlock,
    ToPixels,
    TrapBlock,
)
from auditlib.server.modification import BuildContext, ServerModification

__all__ = [
    "PUBLIC_PRIORS",
    "BuildContext",
    "ClientKernels",
    "ImprintBlock",
    "LokiBlock",
    "MaliciousModel",
    "MeasurePrior",
    "ServerBlock",
    "ServerModification",
    "ToPixels",
    "TrapBlock",
    "public_prior",
]
