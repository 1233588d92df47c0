"""A run's attacks judged: their picks scored against the private batch (with several
attacks, per image the best of their own picks: the auditor's view; under the malicious
server, whose attacks each send a model of their own, the best single server's pick) and
the verdict on them, "held" asked of every attack's pick and every start; or, with no
private images to compare with (an observed update audited without the client's images),
each attack's pick as it made it, its own losses, and the verdict that says the run could
not be scored, never a figure in its place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from auditlib.attacks import Reconstruction
from auditlib.attacks.labels import idlg_exact
from auditlib.engine.attack_phase import AUDITOR_VIEW, AttackRun, PlannedAttack, worst_case
from auditlib.engine.releases import client_of_image
from auditlib.engine.victim import NO_PRIVATE_IMAGES, Victim
from auditlib.errors import AuditInputError
from auditlib.metrics import evaluate, score, to_unit_range
from auditlib.metrics.baseline import score_guesses
from auditlib.metrics.risk import LabelEvidence, label_matches, label_test
from auditlib.metrics.scores import Evaluation, ImageScore, Scores
from auditlib.metrics.verdict import Finding, Scope, Verdict, judge, unscored
from auditlib.result import AttackRecord
from auditlib.server.bins import PUBLIC_PRIORS, public_images
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
    planned_steps: int,
) -> Judged:
    """The attacks' picks scored against the private batch, and the verdict on them;
    ``planned_steps``: the steps of the planned attacks that run (the run's "of N", which
    leaves out those that do not apply)."""
    truth = PrivateBatch(batch.images.cpu(), batch.labels.cpu(), batch.names)
    means = public_means(spec, planned, tuple(batch.images.shape[1:]))
    # The guesses (and each image's flat bar) do not depend on any attack: scored once for
    # every evaluation of the run.
    guesses = score_guesses(to_unit_range(truth.images, victim.normalization), victim.prior, means)
    score_args = {
        "prior": victim.prior,
        "prior_unavailable_reason": victim.prior_unavailable_reason,
        "guess_scores": guesses,
    }
    per_attack: list[Evaluation] = []
    one_server = ""  # the best single server, under the malicious server with several attacks
    if len(planned) == 1:
        final = ran[0].final
        scores = evaluate(final, truth, victim.normalization, lpips_nets, **score_args)
        selected_scores = scores.attacker_selected
    else:
        for run in ran:
            per_attack.append(evaluate(run.final, truth, victim.normalization, (), **score_args))
    picks = [e.attacker_selected.per_image for e in per_attack]
    if len(ran) > 1 and spec.scenario.server == "malicious":
        # One server, one model: a server sends one model a round, so the finding is the
        # best single server's own pick, never a per-image union of several servers' models.
        best = _best_server(per_attack)
        one_server = ran[best].label
        final = ran[best].final
        scores = evaluate(final, truth, victim.normalization, lpips_nets, **score_args)
        selected_scores = replace(
            scores.attacker_selected,
            per_image=tuple(
                replace(image, attack=ran[best].label)
                for image in scores.attacker_selected.per_image
            ),
            view=one_server_view(ran[best].label, picks),
        )
    elif len(planned) > 1:  # per image, the best of the attacks' own picks: the auditor's view
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
    defended = spec.defense.name != "none"
    held = _held_everywhere(
        ran, picks or [selected_scores.per_image], truth, victim, defended, score_args
    )
    finding = Finding.from_scores(
        selected_scores.risk,
        stop_reason,
        scope.steps,
        planned_steps,
        labels=_labels_found(
            spec, [selected_scores, *(e.attacker_selected for e in per_attack)], ran
        ),
    )
    # Per image the best of several attacks' picks: whose picks the images recovered are.
    recovered_by = ()
    if len(ran) > 1 and not one_server:
        recovered = (i.attack for i in selected_scores.per_image if i.beyond_guess and i.attack)
        recovered_by = tuple(dict.fromkeys(recovered))
    finding = replace(finding, images_held=held, one_server=one_server, recovered_by=recovered_by)
    owners = client_of_image(batch, spec.scenario.clients)
    if spec.scenario.clients > 1:  # whose image each was, and whom the attacker named
        selected_scores = replace(
            selected_scores, per_image=_with_clients(selected_scores.per_image, owners, selected)
        )
    return Judged(
        metrics=selected_scores,
        oracle_best=scores.oracle_best,
        psnr_by_restart=dict(scores.psnr_by_restart),
        attacks=tuple(
            attack_record(r, s, _attributed(r, s or scores, owners))
            for r, s in zip(ran, per_attack or [None], strict=False)
        ),
        verdict=judge(finding, scope, defended=defended),
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


def _with_clients(per_image, owners: tuple[int, ...], selected) -> tuple:
    """Each image's score with the client that held it and, where the attack attributes
    (its pick names a client per image; -1: not read back), the client it named; 1-based,
    as the page and the report count clients."""
    named = selected.clients
    out = []
    for i, image in enumerate(per_image):
        attributed = None if named is None else named[image.reconstruction_index]
        out.append(
            replace(
                image,
                client=owners[i] + 1,
                attributed_client=None if attributed is None or attributed < 0 else attributed + 1,
            )
        )
    return tuple(out)


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


def public_means(
    spec: RunSpec, planned: list[PlannedAttack], shape: tuple[int, int, int]
) -> dict[str, np.ndarray]:
    """The mean image (H x W x C in [0, 1]) of each public set the run's server holds (a
    malicious server's bins prior or calibration set, ``prior`` or ``calibrate_on`` of its
    attacks), a guess without the update for any images, uploaded ones included; a set
    refused as the audited images' own is no public data and gives none."""
    audited = spec.data.location if spec.data.source == "samples" else None
    sources = dict.fromkeys(
        value
        for p in planned
        for value in (getattr(p.config, "prior", None), getattr(p.config, "calibrate_on", None))
        if isinstance(value, str) and value in PUBLIC_PRIORS
    )
    out = {}
    for source in sources:
        try:
            images = public_images(source, shape, audited)
        except AuditInputError:  # the audited set itself: the server does not hold it
            continue
        out[source] = images.mean(dim=0).permute(1, 2, 0).to(torch.float64).numpy()
    return out


# How the scores shown were chosen under the malicious server with several attacks
# (``Scores.view``): one server's model, never several servers' per image.
ONE_SERVER = "one server's model"


def _best_server(evaluations: list[Evaluation]) -> int:
    """The server (attack) whose own pick recovered the most images (tie: the higher mean
    PSNR): what one server, which sends one model a round, achieves at best."""

    def key(k: int) -> tuple[int, float]:
        own = evaluations[k].attacker_selected
        recovered = own.risk.images_recovered if own.risk is not None else 0
        return recovered, own.psnr_mean

    return max(range(len(evaluations)), key=key)


def one_server_view(label: str, picks: list[tuple[ImageScore, ...]]) -> str:
    """``Scores.view`` of the best single server's pick, with the per-image union of every
    server's pick beside it, labelled as what it is: several servers' models."""
    batch = len(picks[0])
    union = sum(1 for i in range(batch) if any(p[i].beyond_guess for p in picks))
    return (
        f"{ONE_SERVER}: the own pick of {label}, the server of the {len(picks)} that "
        "recovered the most images (tie: the higher mean PSNR); a server sends one model a "
        f"round, so no image is taken from another server's model (per image over the "
        f"{len(picks)} servers' models, {union} of {batch} would count: several servers' "
        "models, which no single server achieves)"
    )


def _held_everywhere(
    ran: list[AttackRun],
    picks: list[tuple[ImageScore, ...]],
    truth: PrivateBatch,
    victim: Victim,
    defended: bool,
    score_args: dict[str, Any],
) -> int:
    """Images below the guess by the held margins (``nothing_shown``) on every attack's own
    pick, each twin's included, and, where that is every image of a defended run (where
    "held" can decide the verdict), on every start's candidate of every attack as well: the
    auditor sees them all (the oracle best among them), and one start between the guess
    and the recovered line is not "nothing shown". Scored without LPIPS; matched per
    candidate as its attack's pick is."""
    held = [all(bool(p[i].nothing_shown) for p in picks) for i in range(len(picks[0]))]
    if not defended or not all(held):
        return sum(held)
    for run in ran:
        chosen = run.final.selected
        for candidate in run.final.candidates:
            if candidate is chosen:
                continue
            other = score(
                candidate.images,
                None,
                truth,
                victim.normalization,
                (),
                prior=victim.prior,
                guess_scores=score_args["guess_scores"],
            )
            held = [h and bool(p.nothing_shown) for h, p in zip(held, other.per_image, strict=True)]
    return sum(held)


def _check_carried_over(
    combined: Scores, picks: list[tuple[ImageScore, ...]], labels: list[str]
) -> None:
    """Each image of the combination scores as it did in the pick of the attack it came
    from: the count of images recovered can only be the union's."""
    for i, image in enumerate(combined.per_image):
        own = picks[labels.index(image.attack or "")][i]
        if (
            image.beyond_guess != own.beyond_guess
            or image.nothing_shown != own.nothing_shown
            or abs(image.psnr - own.psnr) > 1e-6
        ):
            raise AssertionError(
                f"the combined scores of {image.name} differ from {image.attack}'s own pick"
            )


def _labels_found(
    spec: RunSpec, scored: list[Scores], ran: list[AttackRun]
) -> LabelEvidence | None:
    """What the labels the attacker did not know show; None where labels were known or
    none came back. A label read by iDLG's rule where it is exact by construction
    (``attacks.labels.idlg_exact``) and right is a finding without a test; otherwise every
    attack's own pick and the combination are tested together against the labels relabelled
    at random (``metrics.risk.label_test``: the best of them against the best of them)."""
    if spec.scenario.labels_known:
        return None
    guesses = [s for s in scored if s.recovered_labels is not None]
    if not guesses:
        return None
    truth = [p.true_label for p in scored[0].per_image]
    classes = spec.model.spec.num_classes
    not_exact = ""
    for run in ran:
        record = run.final.label_inference if run.final is not None else None
        if not record or "unambiguous" not in record:
            continue
        protocol = spec.scenario.protocol
        exact, words = idlg_exact(
            record,
            classes=classes,
            steps=protocol.steps_for(len(truth)),
            optimizer=protocol.optimizer,
            weight_decay=protocol.weight_decay,
            defense=spec.defense.name,
            defense_params=dict(spec.defense.params),
            honest_server=spec.scenario.server == "honest",
            observed=spec.scenario.observed is not None,
        )
        if exact and len(truth) == 1 and record.get("label") == truth[0]:
            return LabelEvidence(1, classes, True, None, f"{run.label}: {words}", (run.label,))
        not_exact = not_exact or f"; {words}"
    test = label_test([[[int(v) for v in s.recovered_labels]] for s in guesses], [truth], classes)
    return LabelEvidence(
        test.correct,
        classes,
        test.beyond_chance,
        test.p_value,
        test.words() + not_exact,
        _labels_by(scored, ran, truth, test.correct),
    )


def _labels_by(
    scored: list[Scores], ran: list[AttackRun], truth: list[int], correct: int
) -> tuple[str, ...]:
    """The attacks whose own labels reach the ``correct`` the test judged (ties all); where
    only the auditor's per-image combination reaches it, those with any right label. One
    attack: it."""
    if len(ran) == 1:
        return (ran[0].label,)
    right = {
        run.label: label_matches(own.recovered_labels, truth)
        for run, own in zip(ran, scored[1:], strict=True)
        if own.recovered_labels is not None
    }
    return tuple(a for a, k in right.items() if k == correct) or tuple(
        a for a, k in right.items() if k > 0
    )


def attack_record(
    run: AttackRun, scored: Evaluation | None, attributed: int | None = None
) -> AttackRecord:
    """One attack of the run: its own pick's scores and its oracle best beside them."""
    ran = run.final is not None
    stepped = run.final.stepped if ran else None
    scores = None if scored is None else scored.attacker_selected
    oracle = None if scored is None else scored.oracle_best
    return AttackRecord(
        attack=run.planned.name,
        label=run.label,
        preset=run.planned.preset,
        adaptive=run.planned.adaptive,
        skipped=run.skipped,
        seconds=run.seconds,
        at_once=run.at_once,
        step=None if stepped is None else stepped.how,
        step_note=None if stepped is None else stepped.note,
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
