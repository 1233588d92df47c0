"""A reconstruction's scores as typed values: what ``metrics.evaluate`` returns.

The JSON form (result.json's ``metrics`` and ``oracle_best``) keeps the flat keys it has
always had (``psnr_mean``, ``ssim_unavailable_reason``, ...), so results stored by every
earlier version read back through :meth:`Scores.from_json`; keys a version did not write
(the guesses and the risk before they existed, RDLV) read as ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The metrics summarised over a batch, in the order result.json has always listed them.
SPREAD_METRICS = ("mse", "psnr", "ssim", "lpips", "lpips_vgg", "rdlv")
# Metrics that may be unavailable, each with its reason (label accuracy has no spread).
MAY_BE_UNAVAILABLE = ("ssim", "lpips", "lpips_vgg", "rdlv", "label_accuracy")


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Spread:
    """A metric over the batch's images."""

    mean: float
    std: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        import numpy as np

        array = np.asarray(values, dtype=np.float64)
        return cls(float(array.mean()), float(array.std()), float(array.min()), float(array.max()))


@dataclass(frozen=True)
class ImageScore:
    """One private image and the reconstruction matched to it."""

    name: str
    reconstruction_index: int
    mse: float
    psnr: float
    true_label: int
    ssim: float | None = None
    lpips_alex: float | None = None
    lpips_vgg: float | None = None
    rdlv: float | None = None  # None where undefined (the prior's SSIM <= 0) or not computed
    recovered_label: int | None = None
    guess_psnr: float | None = None  # the best guess without the update, for this image
    guess_ssim: float | None = None
    best_guess: str | None = None
    beyond_guess: bool | None = None  # None: scored before guesses existed
    leakage_level: str | None = None
    attack: str | None = None  # with several attacks: the one whose image this is
    nothing_shown: bool | None = None  # below the guess by the held margins; None: before them
    # The image's best flat images (``metrics.baseline.flat_bar``), a bar every recovered
    # image clears; None: scored before the bar.
    flat_psnr: float | None = None
    flat_ssim: float | None = None
    # Under secure aggregation: the client that held the image (1-based), and the client an
    # attack that attributes (LOKI) named for its reconstruction; None otherwise.
    client: int | None = None
    attributed_client: int | None = None

    def value(self, metric: str) -> float | None:
        """The per-image value of a catalogue metric ("lpips" is AlexNet's)."""
        return getattr(self, "lpips_alex" if metric == "lpips" else metric, None)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ImageScore:
        known = {k: data.get(k) for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass(frozen=True)
class SuccessPoint:
    threshold: float
    rate: float


@dataclass(frozen=True)
class Guess:
    """A guess that uses no update (grey, the data's mean image or colour), over the batch."""

    name: str
    psnr_mean: float
    ssim_mean: float | None


@dataclass(frozen=True)
class Risk:
    """What the run recovered beyond the best guess (``metrics.risk``)."""

    level: str | None  # FedLeak's band; None: nothing beyond the guess
    meaning: str
    basis: str
    images_recovered: int
    batch_size: int
    batch_beyond_guess: bool
    psnr_mean: float
    ssim_mean: float | None
    guess_psnr_mean: float
    guess_ssim_mean: float | None
    images_per_level: Mapping[str, int]
    psnr_success_rate: tuple[SuccessPoint, ...]
    ssim_success_rate: tuple[SuccessPoint, ...] | None = None
    images_held: int | None = None  # images showing nothing (``risk.nothing_shown``); None: before
    held_basis: str | None = None

    def psnr_rate_at(self, threshold_db: float) -> float | None:
        """The share of images at or above ``threshold_db`` (None: not a curve point)."""
        return next((p.rate for p in self.psnr_success_rate if p.threshold == threshold_db), None)

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["images_per_level"] = dict(self.images_per_level)
        for key in ("psnr_success_rate", "ssim_success_rate"):
            points = getattr(self, key)
            data[key] = None if points is None else [p.__dict__.copy() for p in points]
        if self.ssim_success_rate is None:
            del data["ssim_success_rate"]
        for key in ("images_held", "held_basis"):
            if data[key] is None:
                del data[key]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Risk:
        def points(key: str) -> tuple[SuccessPoint, ...] | None:
            raw = data.get(key)
            return None if raw is None else tuple(SuccessPoint(**p) for p in raw)

        return cls(
            level=data["level"],
            meaning=data["meaning"],
            basis=data["basis"],
            images_recovered=int(data["images_recovered"]),
            batch_size=int(data["batch_size"]),
            batch_beyond_guess=bool(data["batch_beyond_guess"]),
            psnr_mean=float(data["psnr_mean"]),
            ssim_mean=_float(data.get("ssim_mean")),
            guess_psnr_mean=float(data["guess_psnr_mean"]),
            guess_ssim_mean=_float(data.get("guess_ssim_mean")),
            images_per_level=dict(data.get("images_per_level") or {}),
            psnr_success_rate=points("psnr_success_rate") or (),
            ssim_success_rate=points("ssim_success_rate"),
            images_held=None if data.get("images_held") is None else int(data["images_held"]),
            held_basis=data.get("held_basis"),
        )


@dataclass(frozen=True)
class Scores:
    """One candidate scored against the private batch.

    ``spreads`` holds each metric that was computed; ``unavailable`` each one that could
    not be, with the reason (never an estimate in its place).
    """

    per_image: tuple[ImageScore, ...]
    spreads: Mapping[str, Spread]
    unavailable: Mapping[str, str] = field(default_factory=dict)
    label_accuracy: float | None = None
    recovered_labels: tuple[int, ...] | None = None
    guesses: tuple[Guess, ...] | None = None  # None: scored before guesses existed
    risk: Risk | None = None  # None: scored before the risk existed
    restart: int | None = None  # the candidate's restart, its attack loss and steps
    attack_loss: float | None = None
    steps: int | None = None
    # How the candidate was chosen, where it is not one attack's own pick (several attacks'
    # per-image union: ``engine.attack_phase.AUDITOR_VIEW``); None: the attacker's own pick.
    view: str | None = None

    def mean(self, metric: str) -> float | None:
        """The batch mean of a catalogue metric, or None where it is unavailable."""
        if metric == "label_accuracy":
            return self.label_accuracy
        spread = self.spreads.get(metric)
        return None if spread is None else spread.mean

    def why_unavailable(self, metric: str) -> str | None:
        return self.unavailable.get(metric)

    @property
    def psnr_mean(self) -> float:
        return self.spreads["psnr"].mean

    @property
    def ssim_mean(self) -> float | None:
        return self.mean("ssim")

    @property
    def lpips_mean(self) -> float | None:
        return self.mean("lpips")

    @property
    def mse_mean(self) -> float:
        return self.spreads["mse"].mean

    @property
    def rdlv_mean(self) -> float | None:
        return self.mean("rdlv")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for metric in SPREAD_METRICS:
            spread = self.spreads.get(metric)
            if spread is not None:
                for stat in ("mean", "std", "min", "max"):
                    data[f"{metric}_{stat}"] = getattr(spread, stat)
            elif metric in self.unavailable:
                data[f"{metric}_mean"] = None
        for metric, reason in self.unavailable.items():
            data[f"{metric}_unavailable_reason"] = reason
        if self.guesses is not None:
            data["baseline"] = {"guesses": [g.__dict__.copy() for g in self.guesses]}
        if self.risk is not None:
            data["risk"] = self.risk.to_json()
        data["label_accuracy"] = self.label_accuracy
        if self.recovered_labels is not None:
            data["recovered_labels"] = list(self.recovered_labels)
        data["per_image"] = [p.to_json() for p in self.per_image]
        data.update(restart=self.restart, attack_loss=self.attack_loss, steps=self.steps)
        if self.view is not None:
            data["view"] = self.view
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scores:
        spreads = {}
        for metric in SPREAD_METRICS:
            if data.get(f"{metric}_mean") is not None and f"{metric}_std" in data:
                spreads[metric] = Spread(
                    *(float(data[f"{metric}_{stat}"]) for stat in ("mean", "std", "min", "max"))
                )
        unavailable = {
            metric: str(data[f"{metric}_unavailable_reason"])
            for metric in MAY_BE_UNAVAILABLE
            if data.get(f"{metric}_unavailable_reason")
        }
        baseline = data.get("baseline")
        labels = data.get("recovered_labels")
        return cls(
            per_image=tuple(ImageScore.from_json(p) for p in data.get("per_image") or ()),
            spreads=spreads,
            unavailable=unavailable,
            label_accuracy=_float(data.get("label_accuracy")),
            recovered_labels=None if labels is None else tuple(int(v) for v in labels),
            guesses=None
            if baseline is None
            else tuple(Guess(**g) for g in baseline.get("guesses") or ()),
            risk=None if data.get("risk") is None else Risk.from_json(data["risk"]),
            restart=data.get("restart"),
            attack_loss=_float(data.get("attack_loss")),
            steps=data.get("steps"),
            view=data.get("view"),
        )


@dataclass(frozen=True)
class Evaluation:
    """The attacker's selection and the oracle best (which needs the ground truth)."""

    attacker_selected: Scores
    oracle_best: Scores
    restarts: int
    psnr_by_restart: Mapping[str, float]
