"""One audit run, end to end: victim -> defense -> attack -> metrics. :func:`iter_audit`
yields the attack's progress events, then one :class:`AuditResult`; the CLI and the
dashboard's worker drain it. Everything a run does is determined by its :class:`RunSpec`."""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

import auditlib
from auditlib.attacks import ATTACKS, ProgressEvent, RunControl
from auditlib.attacks.base import optimisers_ready
from auditlib.defenses import build_defense
from auditlib.engine.attack_phase import (
    BUDGET_SPENT,
    TWIN_SAME_AS_PLAIN,
    AttackRun,
    adaptive_wanted,
    plan_attacks,
    run_attacks,
    steps_that_run,
)
from auditlib.engine.identity import run_identity
from auditlib.engine.judging import attack_record, scored, unscored_runs
from auditlib.engine.releases import Rounds
from auditlib.engine.twins import twins_ran, with_adaptive, with_evading
from auditlib.engine.utility import UtilityProgress, iter_utility
from auditlib.engine.victim import prepare_victim
from auditlib.errors import AttackUnsupportedError, AuditInputError, RunCancelledError
from auditlib.metrics import LPIPS_NETS, match, psnr, to_unit_range
from auditlib.metrics.catalogue import METRIC_DEFINITION
from auditlib.metrics.verdict import Scope, threat_card
from auditlib.result import (
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

# The threat card's line on the update, and on a shuffling client's batch order.
SIMULATED_UPDATE = "what the server receives from the client"
OBSERVED_UPDATE = "what a real client sent (an observed update), not a simulation"
SHUFFLED_ORDER = (
    "the client shuffled its mini-batches with a seed of its own; the attacker simulated "
    "them in order"
)


@dataclass(frozen=True, eq=False)
class AuditResult:
    summary: AuditSummary  # what result.json holds (summary.to_json())
    originals: np.ndarray  # B x H x W x C in [0, 1]; 0 x H x W x C: no private images
    reconstruction: np.ndarray  # attacker's selection, matched to the originals, same layout
    # Without private images (an unscored run): each attack's pick, in its own order, by its
    # label (``reconstruction`` is the first's); () where the run was scored.
    by_attack: tuple[tuple[str, np.ndarray], ...] = ()


@dataclass(frozen=True, eq=False)
class AuditStart:
    """Yielded once the victim is ready, before the attack's first event."""

    originals: np.ndarray  # B x H x W x C in [0, 1]
    names: tuple[str, ...]
    labels: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class LiveFrame:
    """The attack's current images, matched to the originals, with their PSNR so far:
    computed by the evaluator side of the engine (which holds the private batch), never by
    the attack; yielded right after each progress event that carries images."""

    step: int
    images: np.ndarray  # B x H x W x C in [0, 1], in the originals' order
    psnr_mean: float


@dataclass(frozen=True, eq=False)
class PreparedRun:
    """A run up to its attack phase: the victim ready, the server's release made, the
    attacks planned (:func:`prepare_run`); :func:`finish_run` judges it once its attacks
    ran, here (:func:`iter_audit`) or beside other updates' (``engine.together``)."""

    spec: RunSpec
    planned: list  # PlannedAttack, with the adaptive twins where they run
    defense_settings: dict
    control: RunControl
    victim: Any
    originals: np.ndarray
    rounds: Rounds
    release: Any  # the report's release (the first attack's)
    adaptive: bool
    began_unix: float

    @property
    def batch(self):
        return self.victim.batch  # None: an observed update without the client's images

    @property
    def attack_seed(self) -> int:
        return derive_seed(self.spec.seed, "attack")


def prepare_run(spec: RunSpec, **kwargs: Any) -> PreparedRun:
    """Everything of a run before its attacks: the plan, the victim, the release (the
    keywords are :func:`iter_audit`'s, less ``lpips_nets``)."""
    return prepare_run_started(spec, **kwargs)[1]


def prepare_run_started(spec: RunSpec, **kwargs: Any) -> tuple[AuditStart, PreparedRun]:
    """:func:`prepare_run` with the :class:`AuditStart` a streamed run sends first."""
    preparing = _prepare(spec, **kwargs)
    start = next(preparing)
    while True:
        try:
            next(preparing)
        except StopIteration as done:
            return start, done.value


def _prepare(
    spec: RunSpec,
    *,
    is_cancelled: Callable[[], bool] | None = None,
    emit_every: int = 10,
    image_every: int = 50,
    allow_trusted_archive: bool = False,
    assets: Mapping[str, bytes] | None = None,
) -> Generator[AuditStart, None, PreparedRun]:
    """:func:`prepare_run`, yielding the :class:`AuditStart` as soon as the victim is ready
    (before the release, which may refuse the scenario)."""
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
    batch = victim.batch  # None: an observed update without the client's images
    if batch is None:
        channels, height, width = spec.model.spec.input_shape
        originals = np.zeros((0, height, width, channels))
        yield AuditStart(originals, (), ())
    else:
        originals = to_unit_range(batch.images, victim.normalization)
        yield AuditStart(originals, batch.names, tuple(int(v) for v in batch.labels))
    # A process's one-off import (2-3 s): in no attack's seconds, and after the start message
    optimisers_ready()
    rounds = Rounds(spec, victim, defense)
    release = _first_release(rounds, planned)  # the report's: the first attack's that builds
    adaptive = adaptive_wanted(spec.scenario.attacker_knows_defense, spec.attack)
    if adaptive and release.known_defense is not None:
        planned = with_adaptive(planned)
    elif adaptive and checks_models(defense) and spec.scenario.server == "malicious":
        # The server that knows a model check builds a model that passes it: each evading
        # server stands beside the built one it replaces, in the twins' pool.
        planned = with_evading(planned)
    return PreparedRun(
        spec,
        planned,
        defense_settings,
        control,
        victim,
        originals,
        rounds,
        release,
        adaptive,
        began_unix,
    )


def iter_audit(
    spec: RunSpec,
    *,
    is_cancelled: Callable[[], bool] | None = None,
    emit_every: int = 10,
    image_every: int = 50,
    lpips_nets: tuple[str, ...] = LPIPS_NETS,
    allow_trusted_archive: bool = False,
    assets: Mapping[str, bytes] | None = None,
    attacks_at_once: bool | None = None,
) -> Iterator[AuditStart | ProgressEvent | LiveFrame | UtilityProgress | AuditResult]:
    """Run the audit described by ``spec``.

    Yields an :class:`AuditStart`, then the attack's progress events (each event with images
    followed by a :class:`LiveFrame`), then, where the spec measures utility, one
    :class:`UtilityProgress` per training round, then the :class:`AuditResult`.
    ``attacks_at_once``: several attacks at once (``engine.at_once``); None: as it allows.
    """
    prepared = yield from _prepare(
        spec,
        is_cancelled=is_cancelled,
        emit_every=emit_every,
        image_every=image_every,
        allow_trusted_archive=allow_trusted_archive,
        assets=assets,
    )
    started = time.perf_counter()
    first_event_s = None
    runs: list[AttackRun] = []
    release_for, seed = prepared.rounds.for_attack, prepared.attack_seed
    phase = run_attacks(
        prepared.planned, release_for, prepared.control, seed, runs, attacks_at_once
    )
    for event in phase:
        if first_event_s is None:
            first_event_s = time.perf_counter() - started
        yield event
        frame = live_frame(prepared, event)
        if frame is not None:
            yield frame
    seconds = time.perf_counter() - started
    result = yield from finish_run(
        prepared,
        runs,
        seconds,
        first_event_s,
        lpips_nets=lpips_nets,
        allow_trusted_archive=allow_trusted_archive,
        assets=assets,
    )
    yield result


def live_frame(prepared: PreparedRun, event: ProgressEvent) -> LiveFrame | None:
    """The event's images matched to the originals with their PSNR so far (None where the
    event carries no images or the run has no private images to compare with)."""
    if event.images is None or prepared.batch is None:
        return None
    originals = prepared.originals
    current = to_unit_range(event.images, prepared.victim.normalization)
    order = match(current, originals)
    psnr_mean = float(np.mean([psnr(current[j], originals[i]) for i, j in enumerate(order)]))
    return LiveFrame(event.step, current[order], psnr_mean)


def finish_run(
    prepared: PreparedRun,
    runs: list[AttackRun],
    seconds: float,
    first_event_s: float | None,
    *,
    lpips_nets: tuple[str, ...] = LPIPS_NETS,
    allow_trusted_archive: bool = False,
    assets: Mapping[str, bytes] | None = None,
) -> Generator[UtilityProgress, None, AuditResult]:
    """A run once its attacks ran (``runs``, in ``seconds`` of attack phase): the utility
    training where the spec asks for it (yielding its progress), the scores, the verdict;
    returns the :class:`AuditResult`."""
    spec, planned, control = prepared.spec, prepared.planned, prepared.control
    victim, batch, rounds = prepared.victim, prepared.batch, prepared.rounds
    release, adaptive = prepared.release, prepared.adaptive
    defense_settings, began_unix = prepared.defense_settings, prepared.began_unix
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

    steps = sum(r.final.steps for r in ran)
    running = steps_that_run(planned, rounds.for_attack)
    planned_steps = sum(p.planned_steps for p, runs in zip(planned, running, strict=True) if runs)
    twins, twins_words = twins_ran(spec, release, adaptive, runs, rounds)
    protocol = spec.scenario.protocol
    batch_size = release.knowledge.batch_size
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
            protocol=protocol.describe(),
            labels_known=spec.scenario.labels_known,
            batchnorm_statistics=any(_uses_batchnorm(r, victim.model) for r in ran),
            batch_size=batch_size,
            defense=_defense_knowledge(spec, release, adaptive, runs),
            modification=_modification_words(rounds),
            clients=spec.scenario.clients,
            update=OBSERVED_UPDATE if victim.observed is not None else SIMULATED_UPDATE,
            batch_order=SHUFFLED_ORDER
            if protocol.shuffle and protocol.algorithm == "fedavg"
            else None,
            assumed=_assumed(victim),
        ),
        twins=twins,
        twins_words=twins_words,
        refused=_refused(rounds, ran),
        evading=tuple(r.planned.name for r in runs if r.planned.twin_of is not None),
    )
    if batch is None:
        judged = unscored_runs(ran, scope, stop_reason, victim.normalization)
    else:
        judged = scored(
            spec, planned, ran, victim, batch, scope, stop_reason, lpips_nets, planned_steps
        )

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
                "client protocol: " + protocol.describe(),
                "input normalisation",
                f"batch size {batch_size}",
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
                # A model check looks at every server's model: its report after the last.
                **(
                    rounds.defense.privacy_report()  # type: ignore[attr-defined]
                    if checks_models(rounds.defense)
                    else release.privacy
                ),
                "update_norm_before": release.undefended_norm,
                "update_norm_after": release.defended_norm,
            }
        ),
        label_inference=judged.label_inference,
        metrics=judged.metrics,
        oracle_best=judged.oracle_best,
        psnr_by_restart=judged.psnr_by_restart,
        attacks=judged.attacks + tuple(attack_record(r, None) for r in runs if r.final is None),
        verdict=judged.verdict,
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
        unscored=judged.unscored,
    )
    return AuditResult(summary, prepared.originals, judged.reconstruction, judged.by_attack)


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


def _refused(rounds: Rounds, ran: list[AttackRun]) -> str:
    """Why the client refused the model of every attack that ran (its model check), in
    words; "" where it trained on the model of any: then what that model's update gave is
    what the verdict reads. Each attack's release was made before it ran (cached)."""
    reasons = {r.planned.name: rounds.for_attack(r.planned).refused for r in ran}
    if not reasons or not all(reasons.values()):
        return ""
    if len(set(reasons.values())) == 1:
        return next(iter(reasons.values()))
    return "; ".join(f"{name}: {reason}" for name, reason in reasons.items())


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


def checks_models(defense: object) -> bool:
    """Whether ``defense`` is a client's check of the model it receives (it may refuse it)."""
    return callable(getattr(defense, "refuses", None))


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
    evading = [r.planned for r in runs if r.planned.twin_of is not None]
    if known is None and evading:
        names = ", ".join(f"{p.name} (in {p.twin_of}'s place)" for p in evading)
        return True, (
            f"the server knows the client checks the model it receives: the servers built to "
            f"pass the check were tried, {names}"
        )
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
    steps = [
        f"; {r.planned.name}'s twin {ATTACKS[r.planned.name].twin_why}"
        for r in twins
        if r.final is not None and ATTACKS[r.planned.name].twin_why
    ]
    return True, f"an adaptive twin of each attack {known.summary}{besides}{''.join(steps)}"


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


def _assumed(victim) -> str | None:
    """The threat card's words for an observed update's settings its client did not report
    (None where there are none)."""
    words = () if victim.observed is None else victim.observed.training.assumed_words
    return "assumed: " + "; ".join(words) if words else None
