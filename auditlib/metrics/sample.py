"""The verdict over a sample: many updates (each one client's batch of the auditor's set),
the share of images recovered with its 95 % interval, and the worst case.

One update's verdict is an anecdote: which image the auditor happened to pick decides it.
Over a sample, the question is how often a client's data comes back. Each update is judged
on its own (``verdict.judge``, with its own control where it has a defense); this module
only counts what those verdicts found. An image counts as recovered where its update's
attack rebuilt it beyond the best guess (``ImageScore.beyond_guess``, the verdict's rule);
the share's interval is Clopper-Pearson's exact binomial interval, which never claims more
than the count supports (at 0 of n the upper end is still above zero). Images in updates
whose verdict is inconclusive count as not recovered, and the sample verdict says how many
updates were inconclusive, so a low share is not read as safety.

The images of one update are attacked together, in one optimisation against one gradient,
and tend to come back together or not at all, so m updates of B images are not m·B
independent draws: the interval counts the updates, each by the share of its images
recovered (``SampleVerdict.interval``). That is exact where an update's images come back all
or none and wider than needed where they come back independently; with one image an update
it is the images' own interval. The images' interval, as if they were independent, is kept
beside it (``interval_if_independent``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scipy.stats import beta

from auditlib.metrics.scores import ImageScore
from auditlib.metrics.verdict import Verdict

CONFIDENCE = 0.95
# Each verdict outcome as a count of updates reads it: "3 leaked, 1 inconclusive".
OUTCOME_COUNTED = {
    "leaks": "leaked",
    "labels_leak": "leaked labels only",
    "defense_held": "held against these attacks",
    "inconclusive": "inconclusive",
    "unavailable": "unscored",
}


def clopper_pearson(k: float, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval of a binomial proportion k / n.

    A fractional k (updates counted by the share of their images recovered) takes the same
    beta quantiles."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"expected 0 <= k <= n and n > 0, got k={k}, n={n}")
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if k == 0 else float(beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1.0 - tail, k + 1, n - k))
    return low, high


@dataclass(frozen=True)
class UpdateOutcome:
    """One update of the sample: which images it held and what its verdict found."""

    index: int  # the update's place in the sample (0-based)
    names: tuple[str, ...]  # its images
    outcome: str  # its verdict's outcome ("leaks", "defense_held", "inconclusive", ...)
    headline: str
    images_recovered: int  # beyond the best guess, by the verdict's rule
    psnr_mean: float | None
    worst_psnr: float | None  # its worst case: the best-reconstructed image it recovered,
    worst_image: str | None  # or its best reconstruction where it recovered none
    seconds: float | None = None
    worst_recovered: bool | None = None  # whether that image is beyond its best guess (None:
    # not known, a result scored before the guesses or a record from before this field)

    @classmethod
    def of(
        cls,
        index: int,
        verdict: Verdict,
        per_image: Sequence[ImageScore],
        seconds: float | None = None,
    ) -> UpdateOutcome:
        recovered = sum(1 for p in per_image if p.beyond_guess)
        # A recovered image before any that is not: PSNR alone would name a flat photograph
        # a flat guess matches as the worst case, over one the attack did rebuild.
        best = max(per_image, key=lambda p: (bool(p.beyond_guess), p.psnr), default=None)
        finding = verdict.finding
        return cls(
            index=index,
            names=tuple(p.name for p in per_image),
            outcome=verdict.outcome,
            headline=verdict.headline,
            images_recovered=recovered,
            psnr_mean=None if finding is None else finding.psnr_mean,
            worst_psnr=None if best is None else best.psnr,
            worst_image=None if best is None else best.name,
            seconds=seconds,
            worst_recovered=None if best is None else best.beyond_guess,
        )

    @property
    def worst_label(self) -> str:
        """What its worst image is called: the best reconstruction where it did not come back,
        a worst case where it did or where that is not known."""
        return "Best reconstruction" if self.worst_recovered is False else "Worst case"

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "names": list(self.names)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UpdateOutcome:
        return cls(**{**data, "names": tuple(data["names"])})


@dataclass(frozen=True)
class SampleVerdict:
    """What the sample's updates found together."""

    updates: tuple[UpdateOutcome, ...]
    confidence: float = CONFIDENCE

    @property
    def images(self) -> int:
        return sum(len(u.names) for u in self.updates)

    @property
    def images_recovered(self) -> int:
        return sum(u.images_recovered for u in self.updates)

    @property
    def share(self) -> float:
        return self.images_recovered / self.images if self.images else 0.0

    @property
    def largest_update(self) -> int:
        return max((len(u.names) for u in self.updates), default=0)

    @property
    def interval(self) -> tuple[float, float]:
        """Clopper-Pearson's interval over the updates, each counting the share of its images
        recovered (the module's docstring says why not over the images)."""
        updates = len(self.updates)
        counted = self.images_recovered * updates / self.images if self.images else 0.0
        return clopper_pearson(counted, updates, self.confidence)

    @property
    def interval_if_independent(self) -> tuple[float, float]:
        """Clopper-Pearson's interval over the images, as if each were an independent draw:
        the same as ``interval`` with one image an update, too narrow where an update's images
        come back together."""
        return clopper_pearson(self.images_recovered, self.images, self.confidence)

    @property
    def worst(self) -> UpdateOutcome | None:
        """The sample's worst case: the update with the best-reconstructed image recovered
        beyond its best guess, or, where no image was, with the best reconstruction."""
        scored = [u for u in self.updates if u.worst_psnr is not None]
        return max(scored, key=lambda u: (bool(u.worst_recovered), u.worst_psnr), default=None)

    def count(self, outcome: str) -> int:
        return sum(1 for u in self.updates if u.outcome == outcome)

    @property
    def headline(self) -> str:
        low, high = self.interval
        return (
            f"{self.images_recovered} of {self.images} images recovered beyond the best guess "
            f"({self.share:.0%}; {self.confidence:.0%} interval {low:.0%} to {high:.0%}) "
            f"over {len(self.updates)} update{'s' if len(self.updates) != 1 else ''}"
        )

    @property
    def sentence(self) -> str:
        parts = []
        for outcome, words in OUTCOME_COUNTED.items():
            n = self.count(outcome)
            if n:
                parts.append(f"{n} {words}")
        worst = self.worst
        words = f"Per update: {', '.join(parts)}." if parts else ""
        if worst is not None:
            where = f" {worst.worst_label}: {worst.worst_image} (update {worst.index + 1})"
            words += {
                True: f"{where}, recovered at {worst.worst_psnr:.2f} dB.",
                False: f"{where} at {worst.worst_psnr:.2f} dB, not beyond its best guess.",
                None: f"{where} at {worst.worst_psnr:.2f} dB.",  # not known
            }[worst.worst_recovered]
        if self.largest_update > 1:
            low, high = self.interval_if_independent
            words += (
                f" The interval counts the {len(self.updates)} updates, each by the share of "
                "its images recovered: the images of one update are attacked together and may "
                f"come back together, so they are not {self.images} independent draws (taken "
                f"as independent, {low:.0%} to {high:.0%})."
            )
        inconclusive = self.count("inconclusive")
        if inconclusive:
            words += (
                f" {inconclusive} update{'s were' if inconclusive != 1 else ' was'} "
                "inconclusive: their images count as not recovered, which is not evidence "
                "that they are safe."
            )
        return words.strip()

    def to_json(self) -> dict[str, Any]:
        low, high = self.interval
        worst = self.worst
        return {
            "updates": [u.to_json() for u in self.updates],
            "images": self.images,
            "images_recovered": self.images_recovered,
            "share": self.share,
            "confidence": self.confidence,
            "interval": [low, high],
            "interval_counts": "updates",
            "interval_if_independent": list(self.interval_if_independent),
            "worst": None if worst is None else worst.index,
            "headline": self.headline,
            "sentence": self.sentence,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SampleVerdict:
        return cls(
            tuple(UpdateOutcome.from_json(u) for u in data["updates"]),
            float(data.get("confidence", CONFIDENCE)),
        )
