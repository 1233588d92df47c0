"""Flower (flwr) integration: record a real federation's client updates as observed-update
bundles that ``python -m auditlib audit --observed`` audits.

- ``RecordingStrategy``: wraps a server strategy (Flower's Message API) and writes one bundle
  per client per round: the model the round started from, the model the client returned,
  and ``training.json`` (from the train configuration and the client's metrics);
- ``record_updates``: a client mod writing the same bundles on the client, for federations
  under secure aggregation, where the server never sees an individual update;
- ``RecordingLegacyStrategy``: the same as ``RecordingStrategy`` for Flower's legacy strategy
  API (``flwr.server.strategy``, ``ServerApp(server_fn=...)``, ``NumPyClient`` clients).

The edge adapter: the only package of ``auditlib`` that imports ``flwr`` (an import-linter
contract), and nothing else in ``auditlib`` imports it. docs/FLOWER.md walks through it.
"""

from auditlib.flower.legacy import RecordingLegacyStrategy
from auditlib.flower.mod import record_updates
from auditlib.flower.strategy import RecordingStrategy
from auditlib.flower.training import ASSUMED, KEYS, training_record

__all__ = [
    "ASSUMED",
    "KEYS",
    "RecordingLegacyStrategy",
    "RecordingStrategy",
    "record_updates",
    "training_record",
]
