"""The words for an unscored run's reconstructions (an observed update audited without the
client's images), one definition for the command line, the page and the PDF: which row is
which attack, and why none is picked as the best.

The attacks' losses are each on their own objective (DLG's squared distance, IG's cosine
distance with a total-variation term, GRNN's ...), so a lower loss of one attack says
nothing against another's: the choice among attacks is not made without the images.
"""

from __future__ import annotations

from collections.abc import Sequence

LOSS_HEADING = "its own loss (ranks its restarts; not comparable across attacks)"
NO_PICK = (
    "Each loss is its attack's own objective on its own scale, so the losses are not "
    "comparable across attacks: without the client's images no attack's reconstruction is "
    "picked as the closest. Judge each row by eye, or audit the bundle with the client's "
    "images for scores."
)


def rows_caption(labels: Sequence[str]) -> str:
    """'One row per attack, top to bottom: DLG, iDLG, ...; each ...'."""
    if len(labels) == 1:
        return f"{labels[0]}'s reconstruction: its lowest-loss restart, chosen without the images."
    return (
        f"One row per attack, top to bottom: {', '.join(labels)}; each row is that attack's "
        "lowest-loss restart, chosen without the images."
    )
