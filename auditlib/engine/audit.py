"""One audit run, end to end: victim -> defense -> attack -> metrics.

:func:`iter_audit` is a generator of the attack's progress events followed by one
:class:`AuditResult`; the CLI drains it with a progress bar and the dashboard's worker will
stream it. Everything a run does is determined by its :class:`RunSpec`.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

import auditlib
from auditlib.attacks import ProgressEvent, Reconstruction, RunControl
from auditlib.defenses import build_defense
from auditlib.engine.attack_phase import (
    AUDITOR_VIEW,
    BUDGET_SPENT,
    TWIN_SAME_AS_PLAIN,
    AttackRun,
    adaptive_wanted,
    plan_attacks,
    run_attacks,
    with_adaptive,
    worst_case,
)
from auditlib.engine.identity import run_identity
from auditlib.engine.releases import Rounds, client_of_image
from auditlib.engine.utility import UtilityProgress, iter_utility
from auditlib.engine.victim import prepare_victim
from auditlib.errors import AttackUnsupportedError, AuditInputError, RunCancelledError
from auditlib.metrics import LPIPS_NETS, evaluate, match, psnr, to_unit_range
from auditlib.metrics.catalogue import METRIC_DEFINITION
from auditlib.metrics.risk import labels_beyond_chance
from auditlib.metrics.scores import Evaluation, ImageScore, Scores
from auditlib.metrics.verdict import Finding, Scope, Twins, judge, threat_card
from auditlib.result import (
    AttackRecord,
    AuditSummary,
    DefenseReport,
    RecordedConfig,
    ThreatModel,
    Timing,
    UtilityRecord,
    UtilityUnavailable,
    VictimRecord,
)
from auditlib.result_json import summary_json
from auditlib.seeds import derive_seed
from auditlib.spec import ComponentSpec, RunSpec
from auditlib.threat import PrivateBatch


@dataclass(frozen=True, eq=False)
class AuditResult:
    summary: AuditSummary  # what result.json holds (summary.to_json())
    originals: np.ndarray  # B x H x W x C in [0, 1]
    reconstruction: np.ndarray  # attacker's selection, matched to the originals, same layout


@dataclass(frozen=True, eq=False)
class AuditStart:
    """Yielded once the victim is ready, before the attack's first event."""

    originals: np.ndarray  # B x H x W x C in [0, 1]
    names: tuple[str, ...]
    labels: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class LiveFrame:
    """The attack's current images, matched to the originals, with their PSNR so far.

    Computed by the evaluator side of the engine (which holds the private batch), never by
    the attack; yielded right after each progress event that carries images.
    """

    step: int
    images: np.ndarray  # B x H x W x C in [0, 1], in the originals' order
    psnr_mean: float


def iter_audit(
    spec: RunSpec,
    *,
    is_cancelled: Callable[[], bool] | None = None,
    emit_every: int = 10,
    image_every: int = 50,
    lpips_nets: tuple[str, ...] = LPIPS_NETS,
    allow_trusted_archive: bool = False,
    assets: Mapping[str, bytes] | None = None,
) -> Iterator[AuditStart | ProgressEvent | LiveFrame | UtilityProgress | AuditResult]:
    """Run the audit described by ``spec``.

    Yields an :class:`AuditStart`, then the attack's progress events (each event with images
    followed by a :class:`LiveFrame`), then, where the spec measures utility, one
    :class:`UtilityProgress` per training round, then the :class:`AuditResult`.
    """
    began_unix = time.time()  # wall clock, for when runs overlapped (timing.*_unix)
    planned = plan_attacks(spec.attack, spec.budget.iterations, emit_every, spec.scenario.server)
    defense, defense_settings = build_defense(spec.defense.name, spec.defense.params_dict())
    control = RunControl(
        max_steps=spec.budget.iterations,
        max_seconds=spec.budget.max_seconds,
        emit_every=emit_every,
        image_every=image_every,
        is_cancelled=is_cancelled or (lambda: False),
    )
    victim = prepare_victim(spec, allow_trusted_archive=allow_trusted_archive, assets=assets)
    originals = to_unit_range(victim.batch.images, victim.normalization)
    yield AuditStart(originals, victim.batch.names, tuple(int(v) for v in victim.batch.labels))
    rounds = Rounds(spec, victim, defense)
    release = _first_release(rounds, planned)  # the report's: the first attack's that builds
    adaptive = adaptive_wanted(spec.scenario.attacker_knows_defense, spec.attack)
    if adaptive and release.known_defense is not None:
        planned = with_adaptive(planned)

    started = time.perf_counter()
    first_event_s = None
    runs: list[AttackRun] = []
    attack_seed = derive_seed(spec.seed, "attack")
    for event in run_attacks(planned, rounds.for_attack, control, attack_seed, runs):
        if first_event_s is None:
            first_event_s = time.perf_counter() - started
        yield event
        if event.images is not None:
            current = to_unit_range(event.images, victim.normalization)
            order = match(current, originals)
            psnr_mean = float(
                np.mean([psnr(current[j], originals[i]) for i, j in enumerate(order)])
            )
            yield LiveFrame(event.step, current[order], psnr_mean)
    seconds = time.perf_counter() - started
    ran = [r for r in runs if r.final is not None]
    if not ran and control.is_cancelled():
        raise RunCancelledError("cancelled before its attack started; nothing was measured")
    if not ran:
        reasons = "; ".join(f"{r.planned.name}: {r.skipped}" for r in runs)
        raise AttackUnsupportedError(f"no attack could run on this scenario ({reasons})")

    cancelled = control.is_cancelled
    stop_reason = _stop_reason(runs, cancelled())
    utility: UtilityRecord | UtilityUnavailable | None
    if spec.utility is None:
        utility = None
    elif stop_reason == "cancelled":
        utility = UtilityUnavailable("the run was cancelled before the utility training")
    else:
        utility = yield from iter_utility(
            spec,
            allow_trusted_archive=allow_trusted_archive,
            assets=assets,
            is_cancelled=cancelled,
        )

    truth = PrivateBatch(victim.batch.images.cpu(), victim.batch.labels.cpu(), victim.batch.names)
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

    steps = sum(r.final.steps for r in ran)
    planned_steps = sum(p.planned_steps for p in planned)
    assert selected_scores.risk is not None  # scored now: the risk is always there
    finding = Finding.from_scores(
        selected_scores.risk,
        stop_reason,
        steps,
        planned_steps,
        labels=_labels_found(spec, [selected_scores, *(e.attacker_selected for e in per_attack)]),
    )
    twins, twins_words = _twins(spec, release, adaptive, runs)
    owners = client_of_image(victim.batch, spec.scenario.clients)
    scope = Scope(
        attacks=tuple(r.label for r in ran),
        defense=_component_words(spec.defense),
        restarts="; ".join(
            dict.fromkeys(
                f"{r.planned.name}: {r.planned.settings['restart_schedule']}" for r in ran
            )
        ),
        iterations=spec.budget.iterations,
        time_budget_s=spec.budget.max_seconds,
        steps=steps,
        seconds=seconds,
        threat=threat_card(
            protocol=spec.scenario.protocol.describe(),
            labels_known=spec.scenario.labels_known,
            batchnorm_statistics=any(_uses_batchnorm(r, victim.model) for r in ran),
            batch_size=int(victim.batch.images.shape[0]),
            defense=_defense_knowledge(spec, release, adaptive, runs),
            modification=_modification_words(rounds),
            clients=spec.scenario.clients,
        ),
        twins=twins,
        twins_words=twins_words,
        refused=release.refused,
    )
    verdict = judge(finding, scope, defended=spec.defense.name != "none")

    # An adaptive twin runs with its attack's settings, so one attack keeps the flat form.
    settings_by_name = {r.planned.name: r.planned.settings for r in ran}
    attack_settings = ran[0].planned.settings if len(settings_by_name) == 1 else settings_by_name
    summary = AuditSummary(
        spec_id=run_identity(spec),
        attack=spec.attack.name,
        defense=spec.defense.name,
        config=RecordedConfig.from_json(  # as JSON holds it: lists, no NaN
            json.loads(
                summary_json(
                    {
                        **spec.to_dict(),
                        "attack_settings": attack_settings,
                        "defense_settings": defense_settings,
                        "lpips_nets": list(lpips_nets),
                        "metric_definition": METRIC_DEFINITION,
                    }
                )
            )
        ),
        threat_model=ThreatModel(
            observation=release.observation.kind,
            server_knows=(
                "model architecture and parameters",
                "client protocol: " + spec.scenario.protocol.describe(),
                "input normalisation",
                f"batch size {victim.batch.images.shape[0]}",
                *(["labels"] if spec.scenario.labels_known else []),
                *release.knowledge.notes,
                *(
                    f"the model it sent ({name}): {m.what_changed}"
                    for name, m in rounds.modifications.items()
                ),
            ),
        ),
        victim=VictimRecord.from_json(victim.records),
        defense_report=DefenseReport.from_json(
            {
                **release.privacy,
                "update_norm_before": release.undefended_norm,
                "update_norm_after": release.defended_norm,
            }
        ),
        label_inference=dict(final.label_inference or {}),
        metrics=selected_scores,
        oracle_best=scores.oracle_best,
        psnr_by_restart=scores.psnr_by_restart,
        attacks=tuple(
            _attack_record(r, s, _attributed(r, s or scores, owners))
            for r, s in zip(ran, per_attack or [None], strict=False)
        )
        + tuple(_attack_record(r, None) for r in runs if r.final is None),
        verdict=verdict,
        stop_reason=stop_reason,
        utility=utility,
        timing=Timing(
            seconds=seconds,
            iterations=steps,
            planned_iterations=planned_steps,
            iterations_per_second=steps / seconds if seconds > 0 else None,
            time_to_first_event_s=first_event_s,
            began_unix=began_unix,
            ended_unix=time.time(),
        ),
        versions={
            "auditlib": auditlib.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    )
    yield AuditResult(summary, originals, reconstruction)


def _first_release(rounds: Rounds, planned: list[AttackRun]):
    """The release the report describes: the first planned attack's that the server could
    make (where the only attack's model cannot be built, its refusal is the run's)."""
    refusals = []
    for attack in planned:
        try:
            return rounds.for_attack(attack)
        except AuditInputError as exc:
            if len(planned) == 1:
                raise
            refusals.append(f"{attack.name}: {exc}")
    raise AuditInputError("no attack's model could be built: " + "; ".join(refusals))


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


def _stop_reason(runs: list[AttackRun], cancelled: bool) -> str:
    """The run's stop reason: cancelled, or cut by the clock if any attack was or an attack
    (a twin) was skipped because the clock had run out, else the attacks' own ("diverged"
    only if every attack that ran diverged)."""
    reasons = [r.final.stop_reason for r in runs if r.final is not None]
    if cancelled or "cancelled" in reasons:
        return "cancelled"
    if "time budget" in reasons or any(r.skipped == BUDGET_SPENT for r in runs):
        return "time budget"
    return "diverged" if all(r == "diverged" for r in reasons) else "completed"


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


def _twins(spec: RunSpec, release, adaptive: bool, runs: list[AttackRun]) -> tuple[Twins, str]:
    """Whether the attacker that knows the defense ran, in a word and in words: "ran" when
    every attack that ran had its twin run, or its twin was skipped because its objective is
    the plain attack's (``TWIN_SAME_AS_PLAIN``)."""
    if spec.defense.name == "none":
        return "no defense", "no defense"
    if not adaptive:
        why = (
            "the paper preset runs the plain attack alone"
            if spec.attack.preset == "paper"
            else "the attacker that knows the defense was switched off"
        )
        return "off", f"no twin ran: {why}"
    if release.known_defense is None:
        return "not offered", f"no attacker that knows {spec.defense.name} is offered"
    twins = {r.planned.name: r for r in runs if r.planned.adaptive}
    plain = [r for r in runs if not r.planned.adaptive and r.final is not None]
    covered, missing = [], []
    for run in plain:
        twin = twins.get(run.planned.name)
        if twin is not None and twin.final is not None:
            covered.append(f"{run.planned.name}'s twin ran")
        elif twin is not None and (twin.skipped or "").startswith(TWIN_SAME_AS_PLAIN):
            covered.append(f"{run.planned.name}'s twin is the plain attack ({TWIN_SAME_AS_PLAIN})")
        else:
            why = "none was planned" if twin is None else twin.skipped or "it did not run"
            missing.append(f"the twin of {run.planned.name} did not run: {why}")
    if not plain and any(t.final is not None for t in twins.values()):
        return "ran", "every twin ran"
    if not missing:
        return "ran", "; ".join(covered)
    return ("partly" if covered else "none"), "; ".join(missing)


def _component_words(component: ComponentSpec) -> str:
    params = ", ".join(f"{k}={v}" for k, v in component.params)
    return component.name + (f" ({params})" if params else "")


def _uses_batchnorm(run: AttackRun, model: nn.Module) -> bool:
    """Whether the attack used BatchNorm statistics as a prior (GradInversion's bn term)."""
    weight = getattr(run.planned.config, "bn", 0) or 0
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    return bool(weight > 0 and has_bn)


def _defense_knowledge(
    spec: RunSpec, release, adaptive: bool, runs: list[AttackRun]
) -> tuple[bool, str]:
    """The threat card's line on the defense: (known to an attacker here, in words)."""
    if spec.defense.name == "none":
        return False, "no defense"
    if not adaptive:
        return False, "not used: the plain attack only (the paper preset, or switched off)"
    known = release.known_defense
    if known is None:
        return False, f"no adaptive attacker is offered for {spec.defense.name}"
    twins = [r for r in runs if r.planned.adaptive]
    if twins and all(r.skipped == TWIN_SAME_AS_PLAIN for r in twins):
        # Knowing it changes no attack's objective: the plain attacks are those that know it.
        return True, (
            f"{known.summary}; knowing it leaves each attack's objective the plain one, so "
            "the plain attacks are the attacker that knows it (no twin rerun)"
        )
    if not any(r.final is not None for r in twins):
        reasons = "; ".join(dict.fromkeys(r.skipped for r in twins if r.skipped))
        return False, f"offered, but no twin ran: {reasons or 'none was planned'}"
    skipped = [r.planned.name for r in twins if r.final is None]
    besides = f" (none for {', '.join(skipped)}: see the attacks run)" if skipped else ""
    return True, f"an adaptive twin of each attack {known.summary}{besides}"


def _modification_words(rounds: Rounds) -> tuple[str, str] | None:
    """What the malicious server changed and whether a client could have noticed, in words
    (every model it built, where several attacks built one); None: it changed nothing."""
    built = rounds.modifications
    if not built:
        return None
    if len(built) == 1:
        (m,) = built.values()
        return m.what_changed, m.noticeable
    return (
        "; ".join(f"{name}: {m.what_changed}" for name, m in built.items()),
        "; ".join(f"{name}: {m.noticeable}" for name, m in built.items()),
    )


def _attack_record(
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
    )


def run_audit(
    spec: RunSpec, on_event: Callable[[ProgressEvent], None] | None = None, **kwargs: Any
) -> AuditResult:
    """Drain :func:`iter_audit`; ``on_event`` sees every progress event."""
    result = None
    for item in iter_audit(spec, **kwargs):
        if isinstance(item, AuditResult):
            result = item
        elif isinstance(item, ProgressEvent) and on_event is not None:
            on_event(item)
    assert result is not None
    return result
