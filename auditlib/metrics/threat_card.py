"""The threat-model card of a verdict: what the attacker was given, line by line, in the
vocabulary of the SoK of gradient inversion (Carletti et al., USENIX Security 2025), whose
threat models A-H auditors know. The dashboard and the report read some lines by name."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


def from_fields(cls: type, data: dict[str, Any]) -> Any:
    """``cls`` from a stored dict, keeping only its fields (a record from another version)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Knowledge:
    """One line of the threat-model card: what the attacker was given."""

    item: str
    known: bool
    detail: str = ""


@dataclass(frozen=True)
class ThreatCard:
    """What the attacker knew, in the vocabulary of the SoK of gradient inversion (Carletti
    et al., USENIX Security 2025), whose threat models A-H auditors know."""

    sok_model: str  # "A".."H"
    sok_name: str
    knowledge: tuple[Knowledge, ...]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThreatCard:
        return cls(
            data["sok_model"],
            data["sok_name"],
            tuple(from_fields(Knowledge, k) for k in data["knowledge"]),
        )


SOK_MODELS = {
    "A": "Eavesdropper",
    "B": "Informed Eavesdropper",
    "C": "Parameter-Aware Eavesdropper",
    "D": "Data-Enhanced Eavesdropper",
    "E": "Statistical-Informed Eavesdropper",
    # The SoK's active threat models (F-H) let the server modify the model or inject clients;
    # the malicious server here modifies the model it sends and nothing else.
    "F-H": "Active server (modifies the model it sends)",
}
MALICIOUS_MODEL = "F-H"
# The threat card's lines that the dashboard and the report read by name.
MANIPULATION = "active manipulation of the model or clients"
NOTICEABLE = "whether the client could have noticed"
INDIVIDUAL_UPDATES = "individual updates"
BATCH_ORDER = "the order of the client's mini-batches"
ASSUMED_SETTINGS = "training settings the client did not report"


def threat_card(
    *,
    protocol: str,
    labels_known: bool,
    batchnorm_statistics: bool,
    batch_size: int,
    defense: tuple[bool, str] = (False, "no defense"),
    modification: tuple[str, str] | None = None,
    clients: int = 1,
    update: str = "what the server receives from the client",
    batch_order: str | None = None,
    assumed: str | None = None,  # an observed update's settings its client did not report
) -> ThreatCard:
    """The card of an honest-but-curious server of this tool: it sends the model, so it
    knows architecture and weights, and it asks for the local training (C); labels the
    client shares or BatchNorm statistics of the client's data inform it further (E).
    ``defense``: whether an adaptive attacker knew the defense, and what it did. No
    attack here uses surrogate data or manipulates the model or the client selection.
    ``update``: the shared update's line (an observed update says so); ``batch_order``:
    where the client shuffled its mini-batches, why the attacker did not know their order."""
    informed = labels_known or batchnorm_statistics
    training = protocol + ("; the client's only if the assumptions below hold" if assumed else "")
    model = "E" if informed else "C"
    knowledge = (
        Knowledge("the shared update", True, update),
        Knowledge("model architecture and weights", True, "the server sent them"),
        Knowledge("local training settings", True, training),
        Knowledge("batch size", True, str(batch_size)),
        Knowledge(
            "labels",
            labels_known,
            "shared by the client" if labels_known else "inferred or optimised by the attack",
        ),
        Knowledge(
            "BatchNorm statistics of the client's data",
            batchnorm_statistics,
            "used as a prior" if batchnorm_statistics else "not used",
        ),
        Knowledge("the defense's mechanism and public parameters", *defense),
        Knowledge("surrogate data", False, "not used by any attack here"),
    )
    if batch_order is not None:
        knowledge += (Knowledge(BATCH_ORDER, False, batch_order),)
    if assumed:
        knowledge += (Knowledge(ASSUMED_SETTINGS, False, assumed),)
    if clients > 1:
        knowledge += (
            Knowledge(
                INDIVIDUAL_UPDATES,
                False,
                f"only the example-weighted sum of {clients} clients' updates",
            ),
        )
    if modification is None:
        knowledge += (Knowledge(MANIPULATION, False, "honest-but-curious"),)
        return ThreatCard(model, SOK_MODELS[model], knowledge)
    changed, noticeable = modification
    knowledge += (
        Knowledge(MANIPULATION, True, changed),
        Knowledge(NOTICEABLE, True, noticeable),
    )
    return ThreatCard(MALICIOUS_MODEL, SOK_MODELS[MALICIOUS_MODEL], knowledge)
