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

Labels the attacker did not know are pooled the same way: k correct of the N x B labels
(the multiset overlap label accuracy counts, per update), with the interval of the same
definition (``updates_interval``), and tested together against the labels relabelled at
random, one relabelling for the whole sample (``metrics.risk.label_test``), so one label an
update, at p = 1/C alone, is reportable over N of them. An update whose label an exact rule
read (``attacks.labels.idlg_exact``) is a finding by itself; the sample says how many.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from scipy.stats import beta

from auditlib.metrics.risk import LabelTest, label_matches, label_test
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


def updates_interval(
    recovered: int, total: int, updates: int, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """Clopper-Pearson's interval of a share recovered over ``updates`` updates, each
    counting the share of its items (images, labels) recovered: ``recovered`` of ``total``
    read as ``recovered * updates / total`` of ``updates`` (the module's docstring says why
    not over the items)."""
    counted = recovered * updates / total if total else 0.0
    return clopper_pearson(counted, updates, confidence)


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
    # Labels the attacker did not know and recovered: the private ones and the recovered
    # ones (the update's pick), among ``classes``; None where labels were known, none came
    # back, or recorded before; ``label_exact``: read by a rule exact by construction.
    true_labels: tuple[int, ...] | None = None
    recovered_labels: tuple[int, ...] | None = None
    classes: int | None = None
    label_exact: bool = False

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
        # Labels the attacker did not know and recovered, each image's as its pick had it.
        chance = (
            None if finding is None or finding.labels_recovered is None else finding.label_chance
        )
        guessed = [p.recovered_label for p in per_image]
        labelled = chance is not None and bool(per_image) and None not in guessed
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
            true_labels=tuple(p.true_label for p in per_image) if labelled else None,
            recovered_labels=tuple(int(v or 0) for v in guessed) if labelled else None,
            classes=round(1.0 / chance) if labelled and chance else None,
            # A label finding with no p-value, judged under version 3: an exact rule's.
            label_exact=labelled
            and finding is not None
            and bool(finding.labels_beyond_chance)
            and finding.label_p_value is None
            and bool(finding.label_basis),
        )

    @property
    def labels_recovered(self) -> int | None:
        """Correct labels, as label accuracy counts them; None without labels to count."""
        if self.true_labels is None or self.recovered_labels is None:
            return None
        return label_matches(self.recovered_labels, self.true_labels)

    @property
    def worst_label(self) -> str:
        """What its worst image is called: the best reconstruction where it did not come back,
        a worst case where it did or where that is not known."""
        return "Best reconstruction" if self.worst_recovered is False else "Worst case"

    def to_json(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "names": list(self.names),
            "true_labels": _listed(self.true_labels),
            "recovered_labels": _listed(self.recovered_labels),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UpdateOutcome:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(
            **{
                **known,
                "names": tuple(data["names"]),
                "true_labels": _tupled(data.get("true_labels")),
                "recovered_labels": _tupled(data.get("recovered_labels")),
            }
        )


def _listed(labels: tuple[int, ...] | None) -> list[int] | None:
    return None if labels is None else list(labels)


def _tupled(labels: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if labels is None else tuple(int(v) for v in labels)


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
        return updates_interval(
            self.images_recovered, self.images, len(self.updates), self.confidence
        )

    # --- labels ----------------------------------------------------------------------------

    @property
    def labelled(self) -> tuple[UpdateOutcome, ...]:
        """The updates whose labels the attacker did not know and recovered."""
        return tuple(u for u in self.updates if u.labels_recovered is not None)

    @property
    def labels(self) -> int:
        return sum(len(u.true_labels or ()) for u in self.labelled)

    @property
    def labels_recovered(self) -> int:
        return sum(u.labels_recovered or 0 for u in self.labelled)

    @property
    def label_interval(self) -> tuple[float, float]:
        """The labels' share's interval, by the images' definition (``updates_interval``)."""
        return updates_interval(
            self.labels_recovered, self.labels, len(self.labelled), self.confidence
        )

    @cached_property  # a Monte Carlo test where not exact: computed once per verdict
    def label_test(self) -> LabelTest | None:
        """The pooled labels against the labels relabelled at random (one relabelling for
        the whole sample); None without labels, or with updates of different classes."""
        labelled = self.labelled
        classes = {u.classes for u in labelled}
        if not labelled or len(classes) != 1 or None in classes:
            return None
        return label_test(
            [[u.recovered_labels or () for u in labelled]],
            [u.true_labels or () for u in labelled],
            int(classes.pop()),  # type: ignore[arg-type]
        )

    @property
    def labels_exact(self) -> int:
        """Updates whose label was read by a rule exact by construction, and right."""
        return sum(1 for u in self.labelled if u.label_exact)

    @property
    def labels_leak(self) -> bool:
        """Whether the sample's labels are a finding: pooled beyond chance, or read exactly."""
        test = self.label_test
        return self.labels_exact > 0 or (test is not None and test.beyond_chance)

    @property
    def label_words(self) -> str:
        """'labels: k of n recovered (s%; 95% interval a to b over N updates), p = ...: ...';
        '' where no update's labels were unknown to the attacker and recovered."""
        labelled = self.labelled
        if not labelled:
            return ""
        low, high = self.label_interval
        share = self.labels_recovered / self.labels if self.labels else 0.0
        words = (
            f"labels: {self.labels_recovered} of {self.labels} recovered ({share:.0%}; "
            f"{self.confidence:.0%} interval {low:.0%} to {high:.0%} over "
            f"{len(labelled)} update{'s' if len(labelled) != 1 else ''})"
        )
        test = self.label_test
        if test is not None:
            words += f", {test.words()}"
        if self.labels_exact:
            words += (
                f"; {self.labels_exact} of them read by a rule exact by construction, each a "
                "finding without a test"
            )
        verdict = "the private labels leak" if self.labels_leak else "not beyond chance"
        return f"{words}: {verdict}"

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
            + (f"; labels {self._label_short}" if self.labelled else "")
        )

    @property
    def _label_short(self) -> str:
        """'k of n recovered (s%; interval), beyond chance' for the headline."""
        low, high = self.label_interval
        share = self.labels_recovered / self.labels if self.labels else 0.0
        leak = "leaked" if self.labels_leak else "not beyond chance"
        return (
            f"{self.labels_recovered} of {self.labels} recovered ({share:.0%}; "
            f"{self.confidence:.0%} interval {low:.0%} to {high:.0%}), {leak}"
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
        if self.labelled:
            words += f" {self.label_words[0].upper()}{self.label_words[1:]}."
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
            **self._labels_json(),
            "headline": self.headline,
            "sentence": self.sentence,
        }

    def _labels_json(self) -> dict[str, Any]:
        if not self.labelled:
            return {}
        test = self.label_test
        return {
            "labels": self.labels,
            "labels_recovered": self.labels_recovered,
            "label_interval": list(self.label_interval),
            "label_p_value": None if test is None else test.p_value,
            "label_test": None if test is None else test.words(),
            "labels_exact": self.labels_exact,
            "labels_leak": self.labels_leak,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SampleVerdict:
        return cls(
            tuple(UpdateOutcome.from_json(u) for u in data["updates"]),
            float(data.get("confidence", CONFIDENCE)),
        )
