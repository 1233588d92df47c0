"""Scoring a reconstruction against the private batch: the one metric definition.

1. De-normalise with the batch's mean/std and clamp to [0, 1].
2. Match reconstructions to originals (Hungarian, on MSE).
3. Per matched pair: MSE, PSNR (data range 1), SSIM (Gaussian 11/1.5), LPIPS (AlexNet and
   VGG, ``normalize=True``) or the reason LPIPS is unavailable.
4. Labels: order-free multiset accuracy.
5. Summaries: mean, std, min and max over the batch.
6. The guesses that use no update, scored the same way (``metrics.baseline``), and what the
   reconstruction recovered beyond the best of them (``metrics.risk``), with success-rate
   curves.

Two selections are kept apart: the candidate the attacker would pick (lowest attack loss)
and the oracle best (highest mean PSNR, which needs the ground truth).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from auditlib.data.normalization import Normalization
from auditlib.metrics import image as image_metrics
from auditlib.metrics.baseline import (
    MEAN_IMAGE,
    GuessScore,
    baseline_record,
    best_guess_per_image,
    score_guesses,
)
from auditlib.metrics.lpips_metric import availability, lpips_distances
from auditlib.metrics.matching import label_accuracy, match
from auditlib.metrics.risk import rdlv_of, risk_summary
from auditlib.metrics.scores import Evaluation, Scores
from auditlib.reconstruction import Candidate, Reconstruction
from auditlib.threat import PrivateBatch

LPIPS_NETS = ("alex", "vgg")


def to_unit_range(images: torch.Tensor, normalization: Normalization) -> np.ndarray:
    """Model-space B x C x H x W -> B x H x W x C float64 in [0, 1] (non-finite pixels -> 0)."""
    pixels = normalization.denormalize(images.detach().cpu().to(torch.float64))
    pixels = torch.nan_to_num(pixels, nan=0.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0)
    return pixels.permute(0, 2, 3, 1).numpy()


def _summary(values: Sequence[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(array.mean()),
        "std": float(array.std()),
        "min": float(array.min()),
        "max": float(array.max()),
    }


def score(
    candidate_images: torch.Tensor,
    candidate_labels: torch.Tensor | None,
    truth: PrivateBatch,
    normalization: Normalization,
    lpips_nets: Sequence[str] = LPIPS_NETS,
    *,
    prior: np.ndarray | None = None,
    prior_unavailable_reason: str = "no prior image (the data's mean) was given",
    matched_already: bool = False,
    guess_scores: tuple[GuessScore, ...] | None = None,
    public_means: Mapping[str, np.ndarray] | None = None,
) -> Scores:
    """``matched_already``: the candidate's image i is already paired with original i (the
    per-image union of several attacks' matched picks), so the identity matching is used
    and each image keeps the scores it had in its attack's own pick. ``guess_scores``: the
    guesses already scored against these originals with this prior (``score_guesses``;
    they do not depend on the candidate), else scored here. ``public_means``: the mean image
    of each public set the server holds, guesses too (``metrics.baseline.guesses``)."""
    originals = to_unit_range(truth.images, normalization)
    order, matched = _matched(candidate_images, originals, normalization, matched_already)

    per_image: list[dict[str, Any]] = []
    for i, name in enumerate(truth.names):
        value = image_metrics.mse(matched[i], originals[i])
        per_image.append(
            {
                "name": name,
                "reconstruction_index": int(order[i]),
                "mse": value,
                "psnr": image_metrics.psnr_from_mse(value),
                "true_label": int(truth.labels[i]),
            }
        )
    result: dict[str, Any] = {}
    for key in ("mse", "psnr"):
        for stat, v in _summary([p[key] for p in per_image]).items():
            result[f"{key}_{stat}"] = v

    height, width = originals.shape[1:3]
    ssim_reason = image_metrics.ssim_unavailable_reason(height, width)
    if ssim_reason is None:
        for i, p in enumerate(per_image):
            p["ssim"] = image_metrics.ssim(matched[i], originals[i])
        for stat, v in _summary([p["ssim"] for p in per_image]).items():
            result[f"ssim_{stat}"] = v
    else:
        result["ssim_mean"] = None
        result["ssim_unavailable_reason"] = ssim_reason

    for net in LPIPS_NETS:
        key = "lpips" if net == "alex" else f"lpips_{net}"
        reason = None
        if net not in lpips_nets:
            reason = f"LPIPS-{net} not requested"
        elif not availability(net).available:
            reason = availability(net).reason
        else:
            try:
                values = lpips_distances(net, matched, originals)
            except RuntimeError as exc:  # e.g. images too small for the backbone's pooling
                reason = f"LPIPS-{net} could not be computed: {exc}"
            else:
                for i, p in enumerate(per_image):
                    p[f"lpips_{net}"] = values[i]
                for stat, v in _summary(values).items():
                    result[f"{key}_{stat}"] = v
        if reason is not None:
            result[f"{key}_mean"] = None
            result[f"{key}_unavailable_reason"] = reason

    if guess_scores is None:
        guess_scores = score_guesses(originals, prior, public_means)
    rdlv_reason = ssim_reason or (prior_unavailable_reason if prior is None else None)
    if rdlv_reason is None:
        # The prior's SSIM to each original is the mean-image guess's, already scored.
        prior_ssim = next(g.ssim for g in guess_scores if g.name == MEAN_IMAGE)
        for i, p in enumerate(per_image):
            p["rdlv"] = rdlv_of(p["ssim"], prior_ssim[i])
        values = [p["rdlv"] for p in per_image if p["rdlv"] is not None]
        if values:
            for stat, v in _summary(values).items():
                result[f"rdlv_{stat}"] = v
        else:
            rdlv_reason = "the prior's SSIM to every original is <= 0, where RDLV is undefined"
    if rdlv_reason is not None:
        result["rdlv_mean"] = None
        result["rdlv_unavailable_reason"] = f"RDLV: {rdlv_reason}"

    result["baseline"] = baseline_record(guess_scores)
    result["risk"] = risk_summary(per_image, best_guess_per_image(guess_scores))

    if candidate_labels is None:
        result["label_accuracy"] = None
        result["label_accuracy_unavailable_reason"] = "the attack does not recover labels"
    else:
        predicted = [int(v) for v in candidate_labels.reshape(-1)]
        result["label_accuracy"] = label_accuracy(predicted, [int(v) for v in truth.labels])
        result["recovered_labels"] = predicted
        for p in per_image:
            p["recovered_label"] = predicted[p["reconstruction_index"]]
    result["per_image"] = per_image
    # Assembled in result.json's flat form, typed at the boundary: one reader for both.
    return Scores.from_json(result)


def _matched(
    candidate_images: torch.Tensor,
    originals: np.ndarray,
    normalization: Normalization,
    matched_already: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """The matching (reconstruction index per original) and the reconstructions in the
    originals' order, in [0, 1]."""
    recon = to_unit_range(candidate_images, normalization)
    order = np.arange(len(originals)) if matched_already else match(recon, originals)
    return order, recon[order]


def matched_psnr_mean(
    candidate_images: torch.Tensor,
    originals: np.ndarray,
    normalization: Normalization,
    matched_already: bool = False,
) -> float:
    """The batch's mean PSNR after matching, as :func:`score` reports it (``psnr_mean``):
    what ranking candidates needs, without SSIM, LPIPS or the guesses."""
    _, matched = _matched(candidate_images, originals, normalization, matched_already)
    values = [
        image_metrics.psnr_from_mse(image_metrics.mse(m, o))
        for m, o in zip(matched, originals, strict=True)
    ]
    return _summary(values)["mean"]


def evaluate(
    reconstruction: Reconstruction,
    truth: PrivateBatch,
    normalization: Normalization,
    lpips_nets: Sequence[str] = LPIPS_NETS,
    *,
    prior: np.ndarray | None = None,
    prior_unavailable_reason: str | None = None,
    matched_already: bool = False,
    public_means: Mapping[str, np.ndarray] | None = None,
    guess_scores: tuple[GuessScore, ...] | None = None,
) -> Evaluation:
    """Scores of the attacker's selection and of the oracle-best candidate.

    ``prior`` (the data's mean image, H x W x C in [0, 1]) adds RDLV to both.
    ``matched_already``: score with the identity matching (see :func:`score`).
    ``public_means``: the mean image of each public set the server holds (guesses too).
    ``guess_scores``: the guesses already scored against these originals with this prior and
    these public means (``score_guesses``), as a run scoring several attacks' picks has them.
    """
    originals = to_unit_range(truth.images, normalization)
    if guess_scores is None:
        guess_scores = score_guesses(originals, prior, public_means)
    prior_args: dict[str, Any] = {
        "prior": prior,
        "matched_already": matched_already,
        "guess_scores": guess_scores,  # the same for every candidate
    }
    if prior_unavailable_reason is not None:
        prior_args["prior_unavailable_reason"] = prior_unavailable_reason

    def scored(candidate: Candidate) -> Scores:
        result = score(
            candidate.images, candidate.labels, truth, normalization, lpips_nets, **prior_args
        )
        # A combined candidate (several attacks' worst case) has no loss of its own: NaN.
        loss = candidate.loss if math.isfinite(candidate.loss) else None
        return replace(result, restart=candidate.restart, attack_loss=loss, steps=candidate.steps)

    selected = reconstruction.selected
    selected_scores = scored(selected)
    psnr_by_restart = {selected.restart: selected_scores.psnr_mean}
    oracle, oracle_psnr = selected, selected_scores.psnr_mean
    for candidate in reconstruction.candidates:
        if candidate is selected:
            continue
        # Ranking needs PSNR only; the full scores go to the winner alone.
        psnr = matched_psnr_mean(candidate.images, originals, normalization, matched_already)
        psnr_by_restart[candidate.restart] = psnr
        if psnr > oracle_psnr:
            oracle, oracle_psnr = candidate, psnr
    oracle_scores = selected_scores if oracle is selected else scored(oracle)
    return Evaluation(
        attacker_selected=selected_scores,
        oracle_best=oracle_scores,
        restarts=len(reconstruction.candidates),
        psnr_by_restart={str(k): v for k, v in sorted(psnr_by_restart.items())},
    )
