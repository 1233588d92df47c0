"""What a text attack recovered beyond the guess without the update, per sequence and for
the batch: the text counterpart of ``metrics.risk`` (docs/METRICS.md, "Text").

- A sequence is **recovered** when the attack got at least half of its words (ROUGE-1 at
  least ``RECOVERED_ROUGE1``) and clearly more than the best guess from public text got
  (``RECOVERED_MARGIN`` above its ROUGE-1): which words a person wrote is a disclosure even
  out of order (a name, a diagnosis).
- Its **level** says how much of the text reads back: **Very High** where the sequence is
  exact or its word pairs nearly all are (ROUGE-2 at least ``VERBATIM_ROUGE2``), **High**
  where most phrases are (ROUGE-2 at least ``PHRASES_ROUGE2``), **Medium** for words
  without their order.
- It **shows nothing** when the attack got no more of its words than the guess did, within
  ``HELD_MARGIN`` of ROUGE-1: only then can a defense be said to have held for it.
- The batch's level is the band of its mean ROUGE-2 where at least half its sequences were
  recovered, "Medium" (a portion of the sequences) where fewer were, none where none was.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from auditlib.metrics.text import TextScores
from auditlib.metrics.text_baseline import GuessBar

RECOVERED_ROUGE1 = 0.5
RECOVERED_MARGIN = 0.2
HELD_MARGIN = 0.05
VERBATIM_ROUGE2 = 0.9
PHRASES_ROUGE2 = 0.5
BATCH_SHARE = 0.5
VERY_HIGH, HIGH, MEDIUM = "Very High", "High", "Medium"
LEVEL_WORDS = {
    VERY_HIGH: "the text reads back verbatim",
    HIGH: "most phrases read back in order",
    MEDIUM: "words read back without their order",
}


@dataclass(frozen=True)
class TextRisk:
    recovered: tuple[bool, ...]  # per private sequence
    nothing_shown: tuple[bool, ...]
    levels: tuple[str | None, ...]
    level: str | None  # the batch's
    sequences: int

    @property
    def recovered_count(self) -> int:
        return sum(self.recovered)

    @property
    def held_count(self) -> int:
        return sum(self.nothing_shown)


def _band(rouge2: float, exact: bool) -> str:
    if exact or rouge2 >= VERBATIM_ROUGE2:
        return VERY_HIGH
    return HIGH if rouge2 >= PHRASES_ROUGE2 else MEDIUM


def text_risk(scores: TextScores, bar: GuessBar) -> TextRisk:
    recovered, held, levels = [], [], []
    for s, guess1 in zip(scores.per_sequence, bar.rouge1, strict=True):
        got = s.rouge1 >= RECOVERED_ROUGE1 and s.rouge1 >= guess1 + RECOVERED_MARGIN
        recovered.append(got)
        held.append(s.rouge1 <= guess1 + HELD_MARGIN)
        levels.append(_band(s.rouge2, s.exact) if got else None)
    count = len(recovered)
    if not any(recovered):
        level = None
    elif sum(recovered) >= BATCH_SHARE * count:
        mean2 = float(np.mean([s.rouge2 for s in scores.per_sequence]))
        level = _band(mean2, all(s.exact for s in scores.per_sequence))
    else:
        level = MEDIUM
    return TextRisk(tuple(recovered), tuple(held), tuple(levels), level, count)
