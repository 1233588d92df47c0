"""What one run recovered beyond a guess: per image and for the batch, with a level.

- Beyond the guess: an image counts as recovered when its reconstruction shows more than the
  best guess that uses no update (``metrics.baseline``) and is no worse than it where it
  matters. In structure: SSIM ``SSIM_MARGIN`` above the guess's, with PSNR no more than
  ``MARGIN_DB`` below it (a colour or brightness shift; GRNN's ``chelsea`` at the paper
  preset: 16.7 dB against the mean colour's 17.2 dB, SSIM 0.72 against 0.19, a recognisable
  cat). In pixels: PSNR ``MARGIN_DB`` above the guess's and at least FedLeak's lowest band
  (10 dB), with SSIM no lower than the guess's: a pixel gain with less structure than a flat
  guess is the image's brightness, not its content (FedLeak's batch of 16 at 16x16:
  ``hubble_deep_field`` 10.7 dB against 9.1 dB, SSIM 0.13 against 0.20, a dark noise field).
  SSIM alone is not enough either: at 16x16 its 11x11 window sees little more than the
  centre's coarse layout, and FedLeak's noise fields reach SSIM 0.40-0.57 against the
  guesses' 0.06-0.13 while 1.5-5 dB behind them in PSNR. And beyond every flat image
  (:func:`beyond_flat`, against the image's best flat images, ``metrics.baseline.flat_bar``):
  a flat image tells an image's colour, nothing of it, and never counts as recovered. The
  batch is beyond the guess when its means are, by the same test.
- Level: FedLeak's bands (Fan et al., USENIX Security 2025, Sec. 5.4): Very High >= 20 dB
  ("nearly all of a client's data can be reconstructed semantically"), High 15-20 ("most of
  it"), Medium 10-15 ("a small portion"). A recovered image gets the band of its PSNR. The
  batch gets the band of its mean PSNR (the paper's statistic) when the batch as a whole is
  beyond the guess, and Medium ("a small portion") when only some of its images are; a run
  that recovered nothing gets no level at all: whether that says anything about a defense
  is the verdict's question (``metrics.verdict``), never a "Low" by itself.
- Nothing shown (held): an image shows nothing of itself only when its reconstruction is
  below the best guess by a stated margin in both measures, PSNR ``HELD_MARGIN_DB`` and SSIM
  ``HELD_SSIM_MARGIN`` under the guess's (or SSIM under ``HELD_SSIM_FLOOR``, no structure at
  all, and no higher than the guess's). Between "recovered" and "nothing shown" lies a
  reconstruction that is no better than the guess yet not clearly worse (pruning at 0.999
  against GRNN's twin: 10.18 dB / SSIM 0.179 against the guess's 11.56 dB / 0.141): the
  verdict calls that Inconclusive, never "defense held".
- Labels: a label recovered when the attacker did not know it is a disclosure when the count
  of correct labels (as label accuracy counts them: the multiset overlap) is beyond what the
  same guesses match on the batch's labels with the classes relabelled at random, a
  permutation test at ``LABEL_ALPHA`` (:func:`label_test`): the attacker's best guess
  without the update, whatever its rule outputs (B distinct classes meet B distinct labels in
  at least 2B - C whatever the update says, and the test knows it).
- Success rate: the share of matched images whose metric passes a threshold, over a range
  of thresholds (the curves of the GRNN thesis, Fig. 3.5): PSNR >= t, SSIM >= t, MSE <= t.
- RDLV (Hatamizadeh et al., TMI 2023, as the Shadow paper uses it, Eq. 19):
  (SSIM(x, x_hat) - SSIM(x, prior)) / SSIM(x, prior), prior = the data's mean image; above 0
  the reconstruction reveals more than the template does. Computed per matched pair (the
  Hungarian matching of every other metric, not the authors' best match over all of a
  client's images). The audit passes the data source's mean image as the prior
  (``engine.victim.data_prior``); where there is none the scores say why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from auditlib.metrics import image as image_metrics

LEVELS: tuple[tuple[str, float], ...] = (
    ("Very High", 20.0),
    ("High", 15.0),
    ("Medium", 10.0),
    ("Low", float("-inf")),
)
LEVEL_MEANING = {
    "Very High": "nearly all of the client's images can be reconstructed recognisably",
    "High": "most of the client's images can be reconstructed recognisably",
    "Medium": "a small portion of the client's images can be reconstructed",
    "Low": "these attacks, the one that knows the defense included, which broke the "
    "undefended update at the same budget, showed nothing beyond a guess under the defense",
}
# A verdict's sentence: how well (the level's band), with how many from the count, never the
# band's share alone (FedLeak's "a small portion" beside "4 of 4 images recovered").
LEVEL_QUALITY = {
    "Very High": "recognisably (FedLeak's Very High band: mean PSNR 20 dB or more)",
    "High": "recognisably in the main (FedLeak's High band: mean PSNR 15 to 20 dB)",
    "Medium": "in part, coarse shapes and colours more than details (FedLeak's Medium band: "
    "mean PSNR 10 to 15 dB, or only some images beyond the guess)",
}
MARGIN_DB = 1.0  # PSNR gain over the best guess that counts as recovered pixels
SSIM_MARGIN = 0.1  # SSIM gain over the best guess that counts as recovered structure
RECOVERED_FLOOR_DB = 10.0  # FedLeak's lowest band: below it nothing meaningful is visible
# "Nothing shown": below the best guess by these margins in both measures (the verdict's
# "defense held" needs every image so). Chosen from benchmarks/results/defenses.json
# (docs/METRICS.md): the held runs beside a leaking control sit 4-7 dB and 0.08-0.14 SSIM
# under the astronaut's guess (11.56 dB / 0.141); pruning at 0.999 (10.18 / 0.179) does not.
HELD_MARGIN_DB = 1.0
HELD_SSIM_MARGIN = 0.05
# ... or, where the guess itself has little structure (a small or textured image against a
# flat guess), SSIM no higher than the guess's and at most this: no structure at all. Noise
# reconstructions in the benchmarks reach -0.013 to 0.036 (verdicts.json dlg rows 3, 6, 12,
# 13, 33; defenses.json privacy rows 15, 21, 24); the lab's 32 px astronaut under DLG with
# Gaussian noise scores 0.019 against a guess of 0.040.
HELD_SSIM_FLOOR = 0.05
# Labels: beyond chance when the relabelling test's p-value is below LABEL_ALPHA
# (:func:`label_test`); where it is not exact, from LABEL_RELABELLINGS random relabellings
# drawn from one fixed seed, so a run's p-value is the same each time it is judged.
LABEL_ALPHA = 0.01
LABEL_RELABELLINGS = 9999
LABEL_NULL_SEED = 50
RECOVERED_RULE = (
    f"an image counts as recovered when its reconstruction beats the best guess without the "
    f"update (per image) in structure, SSIM {SSIM_MARGIN:g} above the guess's with PSNR at most "
    f"{MARGIN_DB:g} dB below it, or in pixels, PSNR {MARGIN_DB:g} dB above the guess's and at "
    f"least {RECOVERED_FLOOR_DB:g} dB with SSIM no lower than the guess's, and beats every flat "
    f"image (PSNR {MARGIN_DB:g} dB above the image's own mean colour's, or SSIM "
    f"{SSIM_MARGIN:g} above the best flat image's): a flat image is never a recovery"
)
HELD_RULE = (
    f"an image shows nothing of itself when its reconstruction is at least {HELD_MARGIN_DB:g} dB "
    f"below the best guess's PSNR and at least {HELD_SSIM_MARGIN:g} below its SSIM, or at most "
    f"{HELD_SSIM_FLOOR:g} (no structure) and no higher than the guess's (PSNR alone where SSIM "
    "is unavailable)"
)
LABEL_RULE = (
    "labels the attacker did not know count as recovered when k correct of B (the multiset "
    "overlap label accuracy counts) is beyond what the same guesses match on the batch's "
    "labels with the classes relabelled at random (the attacker's best guess without the "
    f"update): a one-sided permutation p-value below {LABEL_ALPHA:g}, exact (hypergeometric) "
    "where the guesses or the labels repeat no class, else from "
    f"{LABEL_RELABELLINGS:,} relabellings of a fixed seed; with several attacks, the best of "
    "them against the best of them on each relabelling"
)
PSNR_THRESHOLDS = (10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0)
SSIM_THRESHOLDS = (0.2, 0.4, 0.6, 0.8, 0.9)


def level_sentence(level: str, recovered: int, batch: int) -> str:
    """What a leak's level says, with the share from the count: 'all 4 of the client's
    images can be reconstructed in part, ...', '1 of the client's 4 images can be ...'."""
    if batch == 1:
        share = "the client's image"
    elif recovered >= batch:
        share = f"all {batch} of the client's images"
    else:
        share = f"{recovered} of the client's {batch} images"
    return f"{share} can be reconstructed {LEVEL_QUALITY[level]}"


def leakage_level(psnr_db: float) -> str:
    """FedLeak's band for a PSNR in dB."""
    return next(name for name, floor in LEVELS if psnr_db >= floor)


def success_rate(
    values: Sequence[float], thresholds: Sequence[float], higher_is_better: bool = True
) -> list[dict[str, float]]:
    """The share of ``values`` passing each threshold (>= t, or <= t for an error metric)."""
    array = np.asarray(values, dtype=np.float64)
    passed = (lambda t: array >= t) if higher_is_better else (lambda t: array <= t)
    return [{"threshold": float(t), "rate": float(passed(t).mean())} for t in thresholds]


def rdlv(reconstruction: np.ndarray, original: np.ndarray, prior: np.ndarray) -> float | None:
    """Relative data leakage value of one pair (H x W x C in [0, 1]); None when the prior
    is as dissimilar as it can be (SSIM <= 0), where the ratio means nothing."""
    return rdlv_of(
        image_metrics.ssim(reconstruction, original), image_metrics.ssim(prior, original)
    )


def rdlv_of(ssim: float, prior_ssim: float) -> float | None:
    """RDLV from the reconstruction's and the prior's SSIM to the original."""
    if prior_ssim <= 0:
        return None
    return (ssim - prior_ssim) / prior_ssim


def beyond(psnr: float, ssim: float | None, guess_psnr: float, guess_ssim: float | None) -> bool:
    """Whether a reconstruction (or a batch's means) shows more than the best guess: in
    structure (SSIM by its margin, pixels at most the margin behind) or in pixels (PSNR by
    the margin, past the lowest band, structure no worse). Without SSIM, pixels alone."""
    if ssim is None or guess_ssim is None:
        return psnr >= max(guess_psnr + MARGIN_DB, RECOVERED_FLOOR_DB)
    by_structure = ssim >= guess_ssim + SSIM_MARGIN and psnr >= guess_psnr - MARGIN_DB
    by_pixels = psnr >= max(guess_psnr + MARGIN_DB, RECOVERED_FLOOR_DB) and ssim >= guess_ssim
    return by_structure or by_pixels


def beyond_flat(
    psnr: float, ssim: float | None, flat_psnr: float | None, flat_ssim: float | None
) -> bool:
    """Whether a reconstruction shows more than any flat image could (its image's best flat
    images, ``metrics.baseline.flat_bar``): PSNR ``MARGIN_DB`` above its own mean colour's,
    or SSIM ``SSIM_MARGIN`` above the best flat image's. A flat image fails both by
    construction, so it never counts as recovered: it tells an image's colour, nothing of
    it. ``flat_psnr`` None: scored without the bar (no flat image to clear)."""
    if flat_psnr is None:
        return True
    by_pixels = psnr >= flat_psnr + MARGIN_DB
    by_structure = ssim is not None and flat_ssim is not None and ssim >= flat_ssim + SSIM_MARGIN
    return by_pixels or by_structure


def nothing_shown(
    psnr: float, ssim: float | None, guess_psnr: float, guess_ssim: float | None
) -> bool:
    """Whether a reconstruction shows nothing of its image: below the best guess by
    ``HELD_MARGIN_DB`` in PSNR, and in SSIM by ``HELD_SSIM_MARGIN`` or, with no more than the
    guess's, under ``HELD_SSIM_FLOOR`` (no structure at all); PSNR alone without SSIM.
    Neither this nor :func:`beyond`: between the guess and the recovered line."""
    below_pixels = psnr <= guess_psnr - HELD_MARGIN_DB
    if ssim is None or guess_ssim is None:
        return below_pixels
    no_structure = ssim <= min(guess_ssim, HELD_SSIM_FLOOR)
    return below_pixels and (ssim <= guess_ssim - HELD_SSIM_MARGIN or no_structure)


def label_matches(predicted: Sequence[int], true: Sequence[int]) -> int:
    """Correct labels as label accuracy counts them (``metrics.matching.label_accuracy``):
    the overlap of the two multisets, order-free."""
    return int(sum((Counter(int(v) for v in predicted) & Counter(int(v) for v in true)).values()))


@dataclass(frozen=True)
class LabelTest:
    """Labels the attacker recovered, tested against its best guess without the update.

    ``correct`` of ``labels`` (over every update tested together), among ``classes``; the
    one-sided p-value of the relabelling test and how it was computed ("exact" or "monte
    carlo"); beyond chance when the p-value is below ``LABEL_ALPHA``."""

    correct: int
    labels: int
    classes: int
    p_value: float
    method: Literal["exact", "monte carlo"]
    relabellings: int | None = None  # monte carlo: the relabellings drawn

    @property
    def beyond_chance(self) -> bool:
        return self.p_value < LABEL_ALPHA

    @property
    def chance(self) -> float:
        """The chance of one label, 1/C: what a guess of one class gets right."""
        return 1.0 / self.classes

    def words(self) -> str:
        """'p = 0.0012 against the labels relabelled at random (exact)'."""
        how = (
            "exact"
            if self.method == "exact"
            else f"{self.relabellings:,} relabellings of a fixed seed"
        )
        return f"p = {self.p_value:.2g} against the labels relabelled at random ({how})"


@dataclass(frozen=True)
class LabelEvidence:
    """What a run's recovered labels show, for its verdict: ``correct`` of its batch among
    ``classes``; whether that is a finding; the test's p-value (None where the rule is exact
    by construction and needs none: ``attacks.labels.idlg_exact``) and, in words, how it was
    judged."""

    correct: int
    classes: int
    beyond_chance: bool
    p_value: float | None
    basis: str
    # The attacks whose labels these are: the one whose rule read them, or those whose own
    # labels reach ``correct``; (): not recorded (the run's attacks are named).
    by: tuple[str, ...] = ()


def _counts(labels: Sequence[int], classes: int) -> np.ndarray:
    array = np.asarray(labels, dtype=np.int64)
    if array.size and (array.min() < 0 or array.max() >= classes):
        raise ValueError(f"labels outside 0..{classes - 1}: {sorted(set(array.tolist()))}")
    return np.bincount(array, minlength=classes)


def label_test(
    guesses: Sequence[Sequence[Sequence[int]]],
    truths: Sequence[Sequence[int]],
    classes: int,
    *,
    relabellings: int = LABEL_RELABELLINGS,
) -> LabelTest:
    """Whether the labels recovered are beyond the attacker's best guess without the update.

    ``truths[u]``: the private labels of update u; ``guesses[a][u]``: attack a's labels for
    it (one list per attack, or one attack). The statistic is the best attack's correct
    labels over all updates, ``max_a sum_u label_matches(guesses[a][u], truths[u])``.

    The null: the update told the attacker nothing of the labels, and the private labels'
    distribution is the same under any relabelling of the classes (labels assigned to a
    folder without labels are so by construction, ``data.labels.assign_labels``; given
    labels are assumed so: the attacker knows no class a client is likelier to hold). Then,
    given the guesses and the labels' counts, every relabelling sigma of the classes, one
    for the whole sample, is as likely as the labels themselves, and the p-value is the
    share of relabellings whose statistic reaches the observed one. Exact, whatever rule
    made the guesses: B distinct guesses against B distinct labels of C classes overlap in
    at least 2B - C, and the relabelled labels do too.

    Computed exactly where one update and one set of guesses are tested and one of the two
    repeats no class (the overlap is then hypergeometric: the classes guessed among those
    the relabelled labels hold); otherwise from ``relabellings`` uniform relabellings drawn
    from ``LABEL_NULL_SEED``, as (1 + hits) / (1 + relabellings), a valid p-value.
    """
    if classes < 1 or not truths or not guesses:
        raise ValueError("a label test needs classes, labels and guesses")
    for guess in guesses:
        if len(guess) != len(truths):
            raise ValueError("every attack needs a guess for every update")
    truth_counts = np.stack([_counts(t, classes) for t in truths])  # U x C
    # Attacks whose guesses are the same multisets on every update are one guess.
    distinct: dict[tuple, np.ndarray] = {}
    for guess in guesses:
        counts = np.stack([_counts(g, classes) for g in guess])
        distinct.setdefault(counts.tobytes(), counts)
    guess_counts = list(distinct.values())
    observed = max(int(np.minimum(g, truth_counts).sum()) for g in guess_counts)
    labels = int(truth_counts.sum())
    if observed == 0:
        return LabelTest(0, labels, classes, 1.0, "exact")
    if len(truths) == 1 and len(guess_counts) == 1:
        guess, truth = guess_counts[0][0], truth_counts[0]
        if guess.max() <= 1 or truth.max() <= 1:
            # The overlap is the number of guessed classes among the classes the relabelled
            # labels hold: a uniform draw of that many of the C classes. scipy.stats is
            # imported here: half a second of a cold worker's start, for a verdict's test.
            from scipy.stats import hypergeom

            p = hypergeom.sf(observed - 1, classes, int((guess > 0).sum()), int((truth > 0).sum()))
            return LabelTest(observed, labels, classes, float(min(1.0, p)), "exact")
    hits = _relabelled_hits(guess_counts, truth_counts, observed, relabellings)
    p = (1 + hits) / (1 + relabellings)
    return LabelTest(observed, labels, classes, p, "monte carlo", relabellings)


def _relabelled_hits(
    guess_counts: list[np.ndarray], truth_counts: np.ndarray, observed: int, draws: int
) -> int:
    """How many of ``draws`` uniform relabellings of the labels' classes give some guess at
    least ``observed`` correct labels over all updates."""
    classes = truth_counts.shape[1]
    held = np.flatnonzero(truth_counts.sum(axis=0))  # the classes the labels hold
    # overlap[a][j, d]: attack a's correct labels, over the updates, when the labels' class
    # held[j] is relabelled d; a relabelling's statistic sums one entry per held class.
    overlap = [
        sum(np.minimum.outer(truth_counts[u, held], g[u]) for u in range(len(truth_counts)))
        for g in guess_counts
    ]
    rng = np.random.default_rng(LABEL_NULL_SEED)
    rows = np.arange(len(held))
    hits, left = 0, draws
    while left:
        chunk = min(left, max(1, 2_000_000 // classes))
        # The first len(held) entries of a uniform permutation: where the held classes go.
        sigma = rng.random((chunk, classes)).argsort(axis=1)[:, : len(held)]
        best = np.max([o[rows, sigma].sum(axis=1) for o in overlap], axis=0)
        hits += int((best >= observed).sum())
        left -= chunk
    return hits


def recovered_level(psnr: float) -> str:
    """The level of a recovered image (or batch): FedLeak's band of its PSNR, at least
    Medium (recovered in structure below the lowest band is still a portion recovered)."""
    return leakage_level(max(psnr, RECOVERED_FLOOR_DB))


def _mean(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else float(np.mean(values))


def risk_summary(per_image: Sequence[dict], best_guess: Sequence[dict]) -> dict:
    """What the run recovered, from its scored images (each with ``psnr``, maybe ``ssim``)
    and the best guess per image (``metrics.baseline.best_guess_per_image``)."""
    for image, guess in zip(per_image, best_guess, strict=True):
        image["guess_psnr"] = guess["psnr"]
        image["guess_ssim"] = guess["ssim"]
        image["best_guess"] = guess["guess"]
        image["flat_psnr"] = guess.get("flat_psnr")
        image["flat_ssim"] = guess.get("flat_ssim")
        # Recovered: beyond the best guess, and beyond every flat image (a flat grey from a
        # refused model beat the mid-grey guess on dark images: a colour, not a recovery).
        image["beyond_guess"] = beyond(
            image["psnr"], image.get("ssim"), guess["psnr"], guess["ssim"]
        ) and beyond_flat(image["psnr"], image.get("ssim"), image["flat_psnr"], image["flat_ssim"])
        image["nothing_shown"] = not image["beyond_guess"] and nothing_shown(
            image["psnr"], image.get("ssim"), guess["psnr"], guess["ssim"]
        )
        image["leakage_level"] = recovered_level(image["psnr"]) if image["beyond_guess"] else None
    recovered = sum(1 for i in per_image if i["beyond_guess"])
    held = sum(1 for i in per_image if i["nothing_shown"])
    psnr_mean = float(np.mean([i["psnr"] for i in per_image]))
    ssim_mean = _mean([i.get("ssim") for i in per_image])
    guess_psnr = float(np.mean([g["psnr"] for g in best_guess]))
    guess_ssim = _mean([g["ssim"] for g in best_guess])
    # The batch's means are judged only where some image was recovered (its means could beat
    # the guesses' means with no image doing so); otherwise nothing was recovered.
    batch_beyond = recovered > 0 and beyond(psnr_mean, ssim_mean, guess_psnr, guess_ssim)
    # A batch that is not beyond the guess as a whole, with some images that are: a portion.
    level = recovered_level(psnr_mean) if batch_beyond else ("Medium" if recovered else None)
    summary = {
        "level": level,
        "meaning": LEVEL_MEANING[level] if level else "nothing beyond the best guess was recovered",
        "basis": f"{RECOVERED_RULE}; the batch's level is FedLeak's band of its mean PSNR when "
        "the batch's means beat the guesses' means the same way, Medium when only some images do",
        "images_recovered": recovered,
        "images_held": held,
        "held_basis": HELD_RULE,
        "batch_size": len(per_image),
        "batch_beyond_guess": batch_beyond,
        "psnr_mean": psnr_mean,
        "ssim_mean": ssim_mean,
        "guess_psnr_mean": guess_psnr,
        "guess_ssim_mean": guess_ssim,
        "images_per_level": {
            name: sum(1 for i in per_image if i["leakage_level"] == name) for name, _ in LEVELS[:3]
        },
        "psnr_success_rate": success_rate([i["psnr"] for i in per_image], PSNR_THRESHOLDS),
    }
    if all("ssim" in i for i in per_image):
        summary["ssim_success_rate"] = success_rate([i["ssim"] for i in per_image], SSIM_THRESHOLDS)
    return summary
