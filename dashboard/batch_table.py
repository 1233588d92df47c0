"""The table of a comparison or sweep: one row per run, as the Compare and Trade-off pages
show it, and the utility it is read against (the undefended accuracy and chance).

Numbers come from ``auditlib.report.subject.run_rows`` (``RunRow``, the rows the PDF
prints); each column's heading and format from the metric catalogue.
"""

from __future__ import annotations

from collections.abc import Sequence

from auditlib.engine.controls import WITH_RESULT
from auditlib.metrics.catalogue import CATALOGUE
from auditlib.metrics.verdict import Verdict
from auditlib.report.subject import RunRow, learns_nothing
from dashboard.verdict_words import verdict_cell

PSNR, ACCURACY, EPSILON = CATALOGUE["psnr"], CATALOGUE["accuracy"], CATALOGUE["epsilon"]
# The attack's metrics in the table, by catalogue key.
ATTACK_METRICS = ("psnr", "ssim", "lpips", "mse", "label_accuracy", "recovered", "rdlv")
# Where the adaptive twin ran: the plain attack's PSNR and the PSNR of the attack that knows
# the defense (the verdict takes the stronger).
PLAIN_PSNR = f"plain attack {PSNR.label}"
ADAPTIVE_PSNR = f"knowing the defense {PSNR.label}"
UTILITY_ACCURACY = f"Utility {ACCURACY.label.lower()}"
# Beside the verdict of a setting whose defended model learns nothing (subject.learns_nothing).
NOT_USABLE = "not usable: the model learns nothing"


def undefended_accuracy(rows: Sequence[RunRow]) -> float | None:
    """The utility accuracy without any defense: the batch's "none" member's, or else the
    undefended control's of a defended member (the same spec, utility training included)."""
    ordered = sorted(rows, key=lambda r: r.series != "none")
    return next((r.utility_undefended for r in ordered if r.utility_undefended is not None), None)


def chance_accuracy(rows: Sequence[RunRow]) -> float | None:
    """The accuracy of a guess by class, where the utility training reports it (optional)."""
    return next((r.utility_chance for r in rows if r.utility_chance is not None), None)


def display_rows(
    rows: Sequence[RunRow],
    verdicts: Sequence[Verdict | None] | None = None,
    first: str = "defense",
) -> list[dict[str, str]]:
    """The rows as the tables show them: formatted, 'n/a' where there is no value.

    The leakage column is the verdict (with the control's result), never the run's band
    alone, marked not usable where the defended model learns nothing; the utility beside the
    undefended accuracy and chance, where known. ``first``: the heading of the rows' own
    column (a comparison's and a sweep's defense, a sample's update).
    """
    out = []
    for i, r in enumerate(rows):
        verdict = verdicts[i] if verdicts is not None else None
        if r.status in (*WITH_RESULT, "cancelled") and r.psnr is not None:
            leakage = verdict_cell(verdict)
            if learns_nothing(r):
                leakage += f" · {NOT_USABLE}"
        else:
            leakage = "n/a"
        row = {first: r.label, "status": r.status, "verdict": leakage}
        for key in ATTACK_METRICS:
            info = CATALOGUE[key]
            row[info.heading] = info.text(r.metric(key))
        row[PLAIN_PSNR] = PSNR.text(r.plain_psnr)
        row[ADAPTIVE_PSNR] = PSNR.text(r.adaptive_psnr)
        row[UTILITY_ACCURACY] = ACCURACY.text(r.utility_accuracy)
        row[EPSILON.heading] = EPSILON.text(r.epsilon)
        if r.utility_accuracy is not None:
            beside = []
            if r.utility_without_key is not None:
                beside.append(f"no key {ACCURACY.text(r.utility_without_key)}")
            if r.utility_undefended is not None and r.series != "none":
                beside.append(f"no defense {ACCURACY.text(r.utility_undefended)}")
            if r.utility_chance is not None:
                beside.append(f"chance {ACCURACY.text(r.utility_chance)}")
            if r.utility_cut_short:
                beside.append(r.utility_cut_short)
            if beside:
                row[UTILITY_ACCURACY] += f" ({', '.join(beside)})"
        out.append(row)
    return out
