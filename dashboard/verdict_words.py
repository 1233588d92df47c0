"""A verdict in words and colours: the table cell, the outcome's alert style, a finding in
a few words. The verdict itself is the library's (``auditlib.metrics.verdict``)."""

from __future__ import annotations

from auditlib.metrics.verdict import Finding, Verdict

NO_VERDICT = "no verdict (recorded before verdicts)"
# How each outcome is drawn: Streamlit's alert (red, green, yellow) and an icon.
OUTCOME_STYLE = {
    "leaks": ("error", ":material/warning:"),
    "labels_leak": ("error", ":material/label:"),
    "defense_held": ("success", ":material/shield:"),
    "inconclusive": ("warning", ":material/help:"),
}
SOK_CITATION = "Carletti et al., USENIX Security 2025"


def finding_words(finding: Finding | None) -> str:
    """A control's (or a run's) finding in a few words: its level, or that it recovered nothing."""
    if finding is None:
        return "n/a"
    if finding.leaked:
        return f"leaked ({finding.level}, {finding.images_recovered} of {finding.batch_size})"
    if finding.labels_beyond_chance:
        return f"leaked labels ({finding.labels_recovered} of {finding.batch_size})"
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
        text = f"{verdict.level}: labels leak"
    elif verdict.outcome == "defense_held":
        text = "Low: defense held"
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
