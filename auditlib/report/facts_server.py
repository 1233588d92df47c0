"""What the report states about a server that changes the model it sends (the malicious-server
threat model, the SoK's F-H) and about secure aggregation, as plain values and words: what the
server changed and whether the client could have noticed (the lines of each run's threat card,
``metrics.verdict.threat_card``), the images it recovered of the batch and attributed to
their client, and what the client's model check saw. Pure functions over the subject's
entries, like ``facts``; ``sections_results.server_section`` lays them out.

A run's threat model is read from its spec (stored with the run, or recorded in its summary's
``config``); the card's lines from its summary's verdict (``verdict.scope.threat``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from auditlib.metrics.verdict import INDIVIDUAL_UPDATES, MANIPULATION, NOTICEABLE, ThreatCard
from auditlib.report.subject import ReportEntry
from auditlib.report.text import NOT_RECORDED
from auditlib.report.verdict_facts import no_verdict_reason, recovered_words
from auditlib.words import count_of

MALICIOUS = "malicious"
# The threat card's lines of an active server and of secure aggregation (their items in
# ``metrics.verdict.threat_card``).
CHANGED, INDIVIDUAL = MANIPULATION, INDIVIDUAL_UPDATES
MODEL_CHECK = "model_check"  # the key of the model check's finding in its privacy report


def scenario_of(entry: ReportEntry | None) -> Mapping[str, object]:
    """The run's scenario as its spec holds it: the typed spec's, else the one its summary's
    ``config`` recorded; {} where neither is there."""
    if entry is None:
        return {}
    if entry.spec is not None:
        scenario = entry.spec.scenario
        return {"server": scenario.server, "secure_aggregation": scenario.secure_aggregation}
    if entry.result is not None:
        recorded = dict(entry.result.config.spec).get("scenario")
        if isinstance(recorded, Mapping):
            return recorded
    return {}


def server_of(entry: ReportEntry | None) -> str:
    """'honest' or 'malicious' (runs recorded before the malicious server: 'honest')."""
    return str(scenario_of(entry).get("server") or "honest")


def clients_of(entry: ReportEntry | None) -> int | None:
    """How many clients' updates the server saw summed; None without secure aggregation."""
    clients = scenario_of(entry).get("secure_aggregation")
    return clients if isinstance(clients, int) and clients > 1 else None


def is_malicious(entry: ReportEntry | None) -> bool:
    return server_of(entry) == MALICIOUS


def server_words(entry: ReportEntry | None) -> str:
    """The scenario's 'Server' row."""
    if entry is None or (entry.spec is None and entry.result is None):
        return NOT_RECORDED
    if is_malicious(entry):
        return "malicious: it changes the model it sends so that the update holds the images"
    return "honest-but-curious: it sends the model as it is and observes the update"


def aggregation_words(entry: ReportEntry | None) -> str:
    """The scenario's 'Secure aggregation' row."""
    clients = clients_of(entry)
    if clients is None:
        return "off: the server sees the client's own update"
    return (
        f"the server sees only the example-weighted sum of {clients} clients' updates; the "
        "private images are split over them in order"
    )


def attacker_words(entry: ReportEntry | None) -> tuple[str, str]:
    """What the executive summary says the server did and whose update it attacked:
    ('changed the model it sent, then ran', "the summed update of 4 clients holding, in
    all,") or ('ran', 'the update of one client holding')."""
    did = "changed the model it sent, then ran" if is_malicious(entry) else "ran"
    clients = clients_of(entry)
    whose = (
        "the update of one client holding"
        if clients is None
        else f"the summed update of {clients} clients holding, in all,"
    )
    return did, whose


# ------------------------------------------------------------------------------ the section


@dataclass(frozen=True)
class ServerChange:
    """What the server changed, whether the client could have noticed, and what secure
    aggregation hid, for the runs whose threat cards say the same."""

    changed: str
    noticeable: str
    aggregation: str | None  # the card's "individual updates" line; None without it
    labels: tuple[str, ...]  # the runs it describes


@dataclass(frozen=True)
class ServerRecovery:
    """One run under the malicious server: what it recovered, attributed, and what the
    client's model check saw."""

    label: str
    defense: str
    recovered: str  # "6 of 8 images recovered beyond the best guess", or why there is none
    attributed: str | None  # "8 of 8 attributed to the client that held them"
    model_check: str | None  # "flagged ..." / "passed ...", where the defense is model-check


@dataclass(frozen=True)
class MaliciousServer:
    changes: tuple[ServerChange, ...]
    runs: tuple[ServerRecovery, ...]

    @property
    def attributes(self) -> bool:
        return any(r.attributed is not None for r in self.runs)

    @property
    def checks(self) -> bool:
        return any(r.model_check is not None for r in self.runs)


def card_of(entry: ReportEntry) -> ThreatCard | None:
    """The run's threat card, as its summary's verdict recorded it (else the composed one)."""
    verdict = entry.result.verdict if entry.result is not None else None
    verdict = verdict or entry.verdict
    return None if verdict is None else verdict.scope.threat


def change_lines(card: ThreatCard) -> tuple[str, str, str | None] | None:
    """(changed, noticeable, aggregation) from a card of an active server; None otherwise."""
    lines = {k.item: k for k in card.knowledge}
    changed, noticeable = lines.get(CHANGED), lines.get(NOTICEABLE)
    if changed is None or not changed.known or noticeable is None:
        return None
    hidden = lines.get(INDIVIDUAL)
    # Cards recorded before issue 52 began the line with its heading's words.
    aggregation = None if hidden is None else hidden.detail.removeprefix("secure aggregation: ")
    return changed.detail, noticeable.detail, aggregation


def attributed_words(entry: ReportEntry) -> str | None:
    """'8 of 8 attributed to the client that held them' where an attack attributed the
    images it recovered (LOKI under secure aggregation); None otherwise."""
    result = entry.result
    if result is None:
        return None
    counts = [a.images_attributed for a in result.attacks if a.images_attributed is not None]
    if not counts:
        return None
    batch = len(result.metrics.per_image) or len(result.victim.data.names)
    return f"{max(counts)} of {count_of(batch, 'image')} attributed to the client that held them"


def model_check_words(entry: ReportEntry) -> str | None:
    """What the client's model check saw, from the run's defense report; None where the
    run's defense was not the model check."""
    if entry.result is None:
        return None
    seen = entry.result.defense_report.details.get(MODEL_CHECK)
    return None if seen is None else str(seen)


def recovery(entry: ReportEntry) -> ServerRecovery:
    defense = entry.spec.defense.name if entry.spec is not None else None
    if defense is None:
        defense = entry.result.defense if entry.result is not None else NOT_RECORDED
    verdict = entry.verdict
    if verdict is None or not entry.has_result:
        recovered = no_verdict_reason(entry)
    else:
        recovered = f"{recovered_words(verdict.finding)} recovered beyond the best guess"
    return ServerRecovery(
        entry.label, defense, recovered, attributed_words(entry), model_check_words(entry)
    )


def malicious_server(entries: Sequence[ReportEntry]) -> MaliciousServer | None:
    """The section's facts for the runs under the malicious server; None where no run of
    the subject was (the section is then left out)."""
    chosen = [e for e in entries if e.run is not None and is_malicious(e)]
    if not chosen:
        return None
    changes: list[ServerChange] = []
    for entry in chosen:
        card = card_of(entry) if entry.has_result else None
        lines = None if card is None else change_lines(card)
        if lines is None:
            continue
        for i, known in enumerate(changes):
            if (known.changed, known.noticeable, known.aggregation) == lines:
                changes[i] = ServerChange(*lines, (*known.labels, entry.label))
                break
        else:
            changes.append(ServerChange(*lines, (entry.label,)))
    return MaliciousServer(tuple(changes), tuple(recovery(e) for e in chosen))
