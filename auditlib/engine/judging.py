"""A run's attacks judged: their picks scored against the private batch (with several
attacks, per image the best of their own picks: the auditor's view) and the verdict on
them; or, with no private images to compare with (an observed update audited without the
client's images), each attack's pick as it made it, its own losses, and the verdict that
says the run could not be scored, never a figure in its place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from auditlib.attacks import Reconstruction
from auditlib.engine.attack_phase import AUDITOR_VIEW, AttackRun, PlannedAttack, worst_case
from auditlib.engine.releases import client_of_image
from auditlib.engine.victim import NO_PRIVATE_IMAGES, Victim
from auditlib.metrics import evaluate, to_unit_range
from auditlib.metrics.risk import labels_beyond_chance
from auditlib.metrics.scores import Evaluation, ImageScore, Scores
from auditlib.metrics.verdict import Finding, Scope, Verdict, judge, unscored
from auditlib.result import AttackRecord
from auditlib.spec import RunSpec
from auditlib.threat import PrivateBatch


@dataclass(frozen=True, eq=False)
class Judged:
    """What scoring (or its absence) gives a run: its scores, attack records and verdict,
    and the reconstruction shown (matched to the originals where there are originals)."""

    metrics: Scores | None
    oracle_best: Scores | None
    psnr_by_restart: dict[str, float]
    attacks: tuple[AttackRecord, ...]
    verdict: Verdict
    label_inference: dict[str, Any]
    reconstruction: np.ndarray
    by_attack: tuple[tuple[str, np.ndarray], ...] = ()
    unscored: str | None = None


def scored(
    spec: RunSpec,
    planned: list[PlannedAttack],
    ran: list[AttackRun],
    victim: Victim,
    batch: PrivateBatch,
    scope: Scope,
    stop_reason: str,
    lpips_nets: tuple[str, ...],
) -> Judged:
    """The attacks' picks scored against the private batch, and the verdict on them."""
    truth = PrivateBatch(batch.images.cpu(), batch.labels.cpu(), batch.names)
    score_args = {
        "prior": victim.prior,
        "prior_unavailable_reason": victim.prior_unavailable_reason,
    }
    per_attack: list[Evaluation] = []
    if len(planned) == 1:
        final = ran[0].final
        scores = evaluate(final, truth, victim.normalization, lpips_nets, **score_args)
        selected_scores = scores.attacker_selected
    else:  # per image, the best of the attacks' own picks: the auditor's view
        for run in ran:
            per_attack.append(evaluate(run.final, truth, victim.normalization, (), **score_args))
        picks = [e.attacker_selected.per_image for e in per_attack]
        combined, sources = worst_case(ran, picks)
        final = Reconstruction((combined,), stop_reason, sum(r.final.steps for r in ran))
        # Already paired with the originals: the identity matching keeps each image's scores
        # as its attack's own pick had them, so no image recovered there is lost here.
        scores = evaluate(
            final, truth, victim.normalization, lpips_nets, matched_already=True, **score_args
        )
        selected_scores = replace(
            scores.attacker_selected,
            per_image=tuple(
                replace(image, attack=sources[image.reconstruction_index])
                for image in scores.attacker_selected.per_image
            ),
            view=AUDITOR_VIEW,
        )
        _check_carried_over(selected_scores, picks, [r.label for r in ran])
    selected = final.selected
    order = [p.reconstruction_index for p in selected_scores.per_image]
    reconstruction = to_unit_range(selected.images, victim.normalization)[order]

    assert selected_scores.risk is not None  # scored now: the risk is always there
    finding = Finding.from_scores(
        selected_scores.risk,
        stop_reason,
        scope.steps,
        sum(p.planned_steps for p in planned),
        labels=_labels_found(spec, [selected_scores, *(e.attacker_selected for e in per_attack)]),
    )
    owners = client_of_image(batch, spec.scenario.clients)
    return Judged(
        metrics=selected_scores,
        oracle_best=scores.oracle_best,
        psnr_by_restart=dict(scores.psnr_by_restart),
        attacks=tuple(
            attack_record(r, s, _attributed(r, s or scores, owners))
            for r, s in zip(ran, per_attack or [None], strict=False)
        ),
        verdict=judge(finding, scope, defended=spec.defense.name != "none"),
        label_inference=dict(final.label_inference or {}),
        reconstruction=reconstruction,
    )


def unscored_runs(ran: list[AttackRun], scope: Scope, stop_reason: str, normalization) -> Judged:
    """No private images to compare with: each attack's own pick as it made it (its order,
    its loss), no score, and the verdict that says the run could not be scored."""
    by_attack = tuple((r.label, to_unit_range(r.final.selected.images, normalization)) for r in ran)
    only = ran[0].final if len(ran) == 1 else None
    return Judged(
        metrics=None,
        oracle_best=None,
        psnr_by_restart={},
        attacks=tuple(attack_record(r, None) for r in ran),
        verdict=unscored(scope, NO_PRIVATE_IMAGES, stop_reason),
        label_inference=dict(only.label_inference or {}) if only is not None else {},
        reconstruction=by_attack[0][1],
        by_attack=by_attack,
        unscored=NO_PRIVATE_IMAGES,
    )


def _attributed(run: AttackRun, scored: Evaluation | None, owners: tuple[int, ...]) -> int | None:
    """Images recovered and attributed to the client that held them, for an attack that
    attributes (LOKI under secure aggregation); None otherwise."""
    if scored is None or run.final is None or run.final.selected.clients is None:
        return None
    clients = run.final.selected.clients
    return sum(
        1
        for i, image in enumerate(scored.attacker_selected.per_image)
        if image.beyond_guess and clients[image.reconstruction_index] == owners[i]
    )


def _check_carried_over(
    combined: Scores, picks: list[tuple[ImageScore, ...]], labels: list[str]
) -> None:
    """Each image of the combination scores as it did in the pick of the attack it came
    from: the count of images recovered can only be the union's."""
    for i, image in enumerate(combined.per_image):
        own = picks[labels.index(image.attack or "")][i]
        if image.beyond_guess != own.beyond_guess or abs(image.psnr - own.psnr) > 1e-6:
            raise AssertionError(
                f"the combined scores of {image.name} differ from {image.attack}'s own pick"
            )


def _labels_found(spec: RunSpec, scored: list[Scores]) -> tuple[int, float, bool] | None:
    """Labels the attacker did not know: the most any attack's own pick (or the combination)
    got right, the chance of one (1/classes), and whether that is beyond chance
    (``metrics.risk.labels_beyond_chance``); None where labels were known or none came back."""
    if spec.scenario.labels_known:
        return None
    accuracies = [s.label_accuracy for s in scored if s.label_accuracy is not None]
    if not accuracies:
        return None
    batch = len(scored[0].per_image)
    correct = max(round(a * batch) for a in accuracies)
    classes = spec.model.spec.num_classes
    return correct, 1.0 / classes, labels_beyond_chance(correct, batch, classes)


def attack_record(
    run: AttackRun, scored: Evaluation | None, attributed: int | None = None
) -> AttackRecord:
    """One attack of the run: its own pick's scores and its oracle best beside them."""
    ran = run.final is not None
    scores = None if scored is None else scored.attacker_selected
    oracle = None if scored is None else scored.oracle_best
    return AttackRecord(
        attack=run.planned.name,
        label=run.label,
        preset=run.planned.preset,
        adaptive=run.planned.adaptive,
        skipped=run.skipped,
        seconds=run.seconds,
        stop_reason=run.final.stop_reason if ran else None,
        steps=run.final.steps if ran else None,
        psnr_mean=None if scores is None else scores.psnr_mean,
        ssim_mean=None if scores is None else scores.ssim_mean,
        images_recovered=None
        if scores is None or scores.risk is None
        else scores.risk.images_recovered,
        level=None if scores is None or scores.risk is None else scores.risk.level,
        oracle_psnr_mean=None if oracle is None else oracle.psnr_mean,
        oracle_ssim_mean=None if oracle is None else oracle.ssim_mean,
        label_accuracy=None if scores is None else scores.label_accuracy,
        images_attributed=attributed,
        attack_loss=_loss(run.final.selected.loss) if ran else None,
        loss_by_restart={str(c.restart): _loss(c.loss) for c in run.final.candidates}
        if ran
        else None,
    )


def _loss(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
