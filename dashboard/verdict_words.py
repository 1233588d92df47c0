"""A verdict in words and colours: the table cell, the outcome's alert style, a finding in
a few words. The verdict itself is the library's (``auditlib.metrics.verdict``)."""

from __future__ import annotations

from auditlib.metrics.verdict import (
    INDIVIDUAL_UPDATES,
    MANIPULATION,
    NOTICEABLE,
    REFUSED,
    Finding,
    ThreatCard,
    Verdict,
)
from auditlib.result import AuditSummary

NO_VERDICT = "no verdict (recorded before verdicts)"
# How each outcome is drawn: Streamlit's alert (red, green, yellow) and an icon.
OUTCOME_STYLE = {
    "leaks": ("error", ":material/warning:"),
    "labels_leak": ("error", ":material/label:"),
    "defense_held": ("success", ":material/shield:"),
    "inconclusive": ("warning", ":material/help:"),
    "unavailable": ("info", ":material/visibility_off:"),  # nothing to score against
}
SOK_CITATION = "Carletti et al., USENIX Security 2025"
# The threat card's lines of an active server and of secure aggregation (the items of
# ``auditlib.metrics.verdict.threat_card``), with the headings the result view gives them.
SERVER_LINES = {
    MANIPULATION: "What the server changed",
    NOTICEABLE: "Could the client have noticed",
    INDIVIDUAL_UPDATES: "Secure aggregation",
}


def finding_words(finding: Finding | None) -> str:
    """A control's (or a run's) finding in a few words: its level, or that it recovered nothing."""
    if finding is None:
        return "n/a"
    if finding.leaked:
        return f"leaked ({finding.level}, {finding.images_recovered} of {finding.batch_size})"
    if finding.labels_beyond_chance:
        return f"leaked labels ({finding.labels_recovered} of {finding.batch_size}), no image"
    cut = f", {finding.stop_reason}" if finding.cut_short else ""
    return f"recovered nothing{cut}"


def verdict_cell(verdict: Verdict | None, *, control: bool = True) -> str:
    """The verdict in a table cell: level and outcome, and the control's result where the
    run had a defense. Only a finding carries a level (an image band, "Labels" for a label
    leak, "Low" for a defense that held); anything else reads "Inconclusive"."""
    if verdict is None:
        return NO_VERDICT
    if verdict.outcome == "leaks":
        text = f"{verdict.level}: leaks"
    elif verdict.outcome == "labels_leak":
        text = f"{verdict.level}: labels leak{images_beside_labels(verdict)}"
    elif verdict.outcome == "defense_held":
        text = "Low: defense held"
    elif verdict.scope.refused:  # said in the table too: a refused model is no run's leak
        text = f"Inconclusive: {REFUSED}"
    else:
        text = "Inconclusive"
        if verdict.finding.cut_short:
            text += f" ({verdict.finding.stop_reason})"
    if control and verdict.scope.defense != "none":
        if verdict.control is not None:
            text += f" · control {finding_words(verdict.control)}"
        else:
            text += " · no control result yet"
    return text


def images_beside_labels(verdict: Verdict) -> str:
    """What a "Labels" verdict knows of the images, for a table cell: ', images held' or
    ', images not shown safe'; '' for a verdict recorded before it said."""
    if not verdict.images_words:
        return ""
    return f", images {verdict.images_words.split(':')[0].split(' (')[0]}"


def server_lines(card: ThreatCard) -> list[tuple[str, str]]:
    """What an active server (SoK model F-H) changed in the model it sent and whether the
    client could have noticed, and what secure aggregation hid from the server, as
    (heading, words); [] for an honest server that saw one client's update."""
    return [
        (SERVER_LINES[k.item], k.detail.removeprefix(LEGACY_AGGREGATION))
        for k in card.knowledge
        if k.item in SERVER_LINES and k.detail and (k.known or k.item == INDIVIDUAL_UPDATES)
    ]


# Results recorded before issue 52 begin their aggregation line with its heading's words.
LEGACY_AGGREGATION = "secure aggregation: "


def whose_images_words(card: ThreatCard, result: AuditSummary) -> str | None:
    """Under secure aggregation, whether the server could tell whose image it was: yes
    where an attack attributed the images it recovered to their clients (LOKI: each client
    got a model of its own), no where it read them off the sum alone; None without secure
    aggregation."""
    if not any(k.item == INDIVIDUAL_UPDATES for k in card.knowledge):
        return None
    attributed = attributed_words(result)
    if attributed:
        return (
            f"the server could tell whose image it was: {attributed} (each client trained a "
            "model of its own, so each image came back through its client's part)"
        )
    return (
        "the server could not tell whose image it was: it read the images off the sum of "
        "the clients' updates, which does not say which client held which (no attack here "
        "attributes images to clients)"
    )


def attributed_words(result: AuditSummary) -> str | None:
    """'8 of 8 attributed to the client that held them' where an attack attributes the
    images it recovered to clients (LOKI under secure aggregation); None otherwise."""
    counts = [a.images_attributed for a in result.attacks if a.images_attributed is not None]
    if not counts:
        return None
    batch = len(result.metrics.per_image) or len(result.victim.data.names)
    return f"{max(counts)} of {batch} attributed to the client that held them"
