"""The attack phase of a run: one attack, or every attack that applies, on one observation.

"Every applicable attack" (attack name ``all``) runs each registered attack at its audit
preset, one after another, sharing the run's time budget: each attack gets an equal share
of what is left when it starts among the attacks from it on that will run (so time an
attack does not use passes on, and one that will be skipped takes none). On CUDA the
honest server's attacks run at once instead, sharing the device for the budget
(:func:`run_attacks_at_once`, ``engine.at_once``). An attack that
does not apply to the scenario (its declared requirement, or the attack's own refusal when
it starts) is listed with its reason. The scores then take, per image, the best of the
attacks' own picks (:func:`worst_case`): the auditor's view, chosen with the private images
(under the malicious server, whose attacks each send a model of their own, the best single
server's pick instead: ``engine.judging``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from auditlib.attacks import (
    ALL_ATTACKS,
    ATTACKS,
    Candidate,
    ProgressEvent,
    Reconstruction,
    RunControl,
    build_attack_config,
)
from auditlib.attacks.restarts import AUDIT_PRESET, planned_steps, restart_schedule, run_attack
from auditlib.engine.at_once import Ended, groups_that_fit, run_at_once, why_not_at_once
from auditlib.errors import AttackUnsupportedError, AuditInputError
from auditlib.fl.scenario import Release
from auditlib.metrics.scores import ImageScore
from auditlib.seeds import derive_seed
from auditlib.spec import ComponentSpec
from auditlib.threat import AttackerKnowledge

# The reason a twin is skipped when knowing the defense changes nothing in its objective:
# the plain attack then already is the attacker that knows the defense.
TWIN_SAME_AS_PLAIN = "knowing the defense leaves its objective the plain attack's"
# The reason an attack is skipped when the run's clock ran out before it started: the run's
# stop reason is then "time budget" (``engine.audit``), never "completed".
BUDGET_SPENT = "the run's time budget was spent"
# What the combined scores of several attacks are (``Scores.view``, result.json's
# ``metrics.view``): not what any attacker would pick.
AUDITOR_VIEW = (
    "per image, the best of the attacks' own picks (each chosen by its attack's own loss), "
    "chosen with the private images: the auditor's view, not an attacker's pick; an image "
    "counts as recovered when any attack's own pick recovered it, and as showing nothing "
    "only when every attack's own pick showed nothing"
)


@dataclass(frozen=True, eq=False)
class PlannedAttack:
    name: str
    preset: str | None
    config: Any
    settings: dict[str, Any]
    planned_steps: int
    adaptive: bool = False  # the attacker knows the defense (``KnownDefense``)
    # An evading server tried in the place of this built server's, where the client checks
    # the model it receives (``twins.with_evading``): it knows the check by construction and is
    # one of the twins' pool (``adaptive`` is set), with its own name, build and read-back.
    twin_of: str | None = None

    @property
    def label(self) -> str:
        words = [f"{self.preset} preset"] if self.preset else []
        if self.twin_of is not None:
            words += [f"in {self.twin_of}'s place, built to pass the model check"]
        elif self.adaptive:
            words += ["knows the defense"]
        return self.name + (f" ({', '.join(words)})" if words else "")


@dataclass(frozen=True, eq=False)
class AttackRun:
    """One attack's outcome within the run."""

    planned: PlannedAttack
    final: Reconstruction | None
    skipped: str | None  # why the attack did not run, where it did not
    seconds: float
    # Ran at the same time as other attacks (``engine.at_once``): its seconds overlap theirs,
    # so the attacks' seconds add up to more than the run's.
    at_once: bool = False

    @property
    def label(self) -> str:
        return self.planned.label


def plan_attacks(
    attack: ComponentSpec, iterations: int, every: int = 10, server: str = "honest"
) -> list[PlannedAttack]:
    """The attacks a run will try, each with its resolved configuration.

    Every applicable attack is, under the honest-but-curious server, each attack that
    observes; under the malicious one, each attack that builds the model it sends (the
    honest server's attacks are that threat model's audit) but those built to pass a model
    check, which stand in for the others where the client checks (``twins.with_evading``)."""
    if attack.name == ALL_ATTACKS:
        if attack.params:
            raise AuditInputError(
                "every applicable attack runs each attack at its audit preset; it takes no "
                "attack parameters"
            )
        malicious = server == "malicious"
        # The servers built to pass a model check are left to it (``twins.with_evading``): without
        # one, each is a weaker copy of the server it stands in for.
        chosen = [
            (name, AUDIT_PRESET, {})
            for name, info in ATTACKS.items()
            if (info.builds is not None) == malicious and not info.stands_in_for
        ]
    else:
        info = ATTACKS.get(attack.name)
        if info is not None:
            refuse_without_its_server(info, server)
        chosen = [(attack.name, attack.preset, attack.params_dict())]
    planned = []
    for name, preset, params in chosen:
        config, settings = build_attack_config(name, params, preset)
        if ATTACKS[name].closed_form:
            settings["restart_schedule"] = "one pass (a closed form)"
            steps = 1
        else:
            settings["restart_schedule"] = restart_schedule(config, preset)
            steps = planned_steps(config, preset, iterations, every)
        planned.append(PlannedAttack(name, preset, config, settings, steps))
    return planned


def refuse_without_its_server(info, server: str) -> None:
    """A malicious server's attack (it builds the model it reads) runs only under that
    threat model."""
    if info.builds is not None and server != "malicious":
        raise AuditInputError(
            f"{info.name} is a malicious server's attack (it changes the model the server "
            "sends): choose the malicious-server threat model to run it"
        )


def adaptive_wanted(knows: bool | None, attack: ComponentSpec) -> bool:
    """The threat model's switch; by default on, except for a paper-preset reproduction."""
    return attack.preset != "paper" if knows is None else knows


def run_attacks(
    planned: list[PlannedAttack],
    release_for: Callable[[PlannedAttack], Release],
    control: RunControl,
    seed: int,
    outcomes: list[AttackRun],
    at_once: bool | None = False,
) -> Iterator[ProgressEvent]:
    """Run the planned attacks in turn (or at once); their events are renumbered to the
    run's steps.

    ``release_for`` gives each attack what the server received (the honest server's
    release, or the release of the model a malicious attack built); ``outcomes`` receives
    one :class:`AttackRun` per planned attack. ``at_once``: the honest server's attacks run
    at once, each pool (plain attacks, then twins) together (:func:`run_attacks_at_once`);
    None: where ``engine.at_once.why_not_at_once`` allows it (nowhere until the streams'
    check passes on a GPU: ``at_once.UNCONFIRMED_ON_CUDA``).
    """
    if runs_at_once(planned, release_for, at_once):
        yield from run_attacks_at_once(planned, release_for, control, seed, outcomes)
        return
    started = time.perf_counter()
    # The steps of the attacks that will run: the count the estimate and the page show.
    running = steps_that_run(planned, release_for)
    total = sum(p.planned_steps for p, runs in zip(planned, running, strict=True) if runs)
    offset = 0
    finals: dict[str, Reconstruction] = {}  # each plain attack's result, for its twin
    spent = {False: 0.0, True: 0.0}  # seconds used by the plain attacks and by the twins
    late: dict[bool, list[float]] = {False: [], True: []}  # seconds run past a share
    for index, attack in enumerate(planned):
        call = attack_call(index, planned, release_for, control, seed, finals, spent, late)
        if isinstance(call, AttackRun):  # skipped, or a twin that is its plain attack undone
            outcomes.append(call)
            continue
        began = time.perf_counter()
        final = None
        try:
            for event in call.events():
                if event.final is not None:
                    final = event.final
                # One final for the whole run: iter_audit scores the attacks' finals itself.
                # Steps and seconds count from the first attack's start, as the run's timing
                # does (each attack's own clock starts at zero).
                yield replace(
                    event,
                    step=offset + event.step,
                    total_steps=total,
                    elapsed_s=began - started + event.elapsed_s,
                    final=None,
                )
        except AttackUnsupportedError as exc:
            if len(planned) == 1:
                raise
            outcomes.append(AttackRun(attack, None, str(exc), time.perf_counter() - began))
            continue
        finally:
            spent[attack.adaptive] += time.perf_counter() - began
        final = settled(call, final, finals)
        offset += final.steps if final is not None else 0
        seconds = time.perf_counter() - began
        share = call.control.max_seconds
        if share is not None and final is not None and final.stop_reason == "time budget":
            late[attack.adaptive].append(max(seconds - share, 0.0))
        outcomes.append(AttackRun(attack, final, None, seconds))


def runs_at_once(
    planned: list[PlannedAttack],
    release_for: Callable[[PlannedAttack], Release],
    at_once: bool | None = None,
) -> bool:
    """Whether :func:`run_attacks` runs these attacks at once: several, none a malicious
    server's (its model is built at its turn, and its one closed-form pass gains nothing at
    once), and ``at_once`` asked for or, where None, allowed (``why_not_at_once``)."""
    if len(planned) < 2 or any(ATTACKS[p.name].builds is not None for p in planned):
        return False
    return at_once if at_once is not None else why_not_at_once(planned, release_for) is None


def run_attacks_at_once(
    planned: list[PlannedAttack],
    release_for: Callable[[PlannedAttack], Release],
    control: RunControl,
    seed: int,
    outcomes: list[AttackRun],
) -> Iterator[ProgressEvent]:
    """:func:`run_attacks` with the plain attacks at once (``engine.at_once``), then their
    adaptive twins at once (a twin may reuse its plain attack's result). On CUDA a pool is
    split into groups that fit the memory free, each attack's peak measured on one step
    (``at_once.groups_that_fit``), the groups run one after another. Each attack of a group
    may use the group's share of the pool's budget (all of it for one group), as the group
    shares the device for it; the events' steps are the sum of every attack's steps so far,
    their seconds the phase's."""
    started = time.perf_counter()
    running = steps_that_run(planned, release_for)
    total = sum(p.planned_steps for p, runs in zip(planned, running, strict=True) if runs)
    finals: dict[str, Reconstruction] = {}
    spent = {False: 0.0, True: 0.0}
    ended: dict[int, AttackRun] = {}
    done = [0]  # the steps of the attacks that have ended
    for pool in (False, True):
        calls: dict[int, AttackCall] = {}
        for index, attack in enumerate(planned):
            if attack.adaptive != pool:
                continue
            call = attack_call(
                index, planned, release_for, control, seed, finals, spent, at_once=True
            )
            if isinstance(call, AttackRun):
                ended[index] = call
            else:
                calls[index] = call
        groups = groups_that_fit(calls)
        for g, group in enumerate(groups):
            left = None if control.max_seconds is None else control.max_seconds - spent[pool]
            if left is not None and left <= 0:
                ended.update(
                    {i: AttackRun(calls[i].attack, None, BUDGET_SPENT, 0.0) for i in group}
                )
                continue
            share = None if left is None else left / (len(groups) - g)
            began = time.perf_counter()
            yield from _group_at_once(
                {i: _with_share(calls[i], share) for i in group},
                started,
                total,
                done,
                finals,
                ended,
            )
            spent[pool] += time.perf_counter() - began
    outcomes.extend(ended[index] for index in sorted(ended))


def _with_share(call: AttackCall, seconds: float | None) -> AttackCall:
    return replace(call, control=replace(call.control, max_seconds=seconds))


def _group_at_once(
    calls: dict[int, AttackCall],
    started: float,
    total: int,
    done: list[int],
    finals: dict[str, Reconstruction],
    ended: dict[int, AttackRun],
) -> Iterator[ProgressEvent]:
    """One group's attacks at once (``run_attacks_at_once``): their events renumbered to
    the run's steps, each attack's outcome into ``ended``, its steps into ``done``. Images
    stream from one attack at a time, the first of the plan still running, so that the live
    view follows one reconstruction, as in turn, not frames of several by turns."""
    steps = dict.fromkeys(calls, 0)
    results: dict[int, Ended] = {}
    with contextlib.closing(run_at_once(calls)) as pairs:  # closed: the others stop
        for index, item in pairs:
            if isinstance(item, Ended):
                failed = item.error is not None
                if failed and not isinstance(item.error, AttackUnsupportedError):
                    raise item.error
                results[index] = item
                continue
            steps[index] = item.step
            shown = index == min(i for i in calls if i not in results)
            yield replace(
                item,
                step=done[0] + sum(steps.values()),
                total_steps=total,
                elapsed_s=time.perf_counter() - started,
                final=None,
                images=item.images if shown else None,
                labels=item.labels if shown else None,
            )
    beside = len(calls) > 1
    for index, call in calls.items():  # in the plan's order
        result = results[index]
        if result.error is not None:  # the attack's refusal
            ended[index] = AttackRun(
                call.attack, None, str(result.error), result.seconds, at_once=beside
            )
            continue
        final = settled(call, result.final, finals)
        done[0] += final.steps if final is not None else 0
        ended[index] = AttackRun(call.attack, final, None, result.seconds, at_once=beside)


@dataclass(frozen=True, eq=False)
class AttackCall:
    """One planned attack ready to run on one update: what ``run_attack`` takes, with the
    budget's share it gets (:func:`attack_call`)."""

    attack: PlannedAttack
    info: Any  # AttackInfo
    observation: Any
    knowledge: AttackerKnowledge
    control: RunControl
    seed: int

    def events(self):
        """The attack's run on this update: ``run_attack``'s progress events."""
        return run_attack(
            self.info,
            self.observation,
            self.knowledge,
            self.attack.config,
            self.control,
            self.seed,
            self.attack.preset,
        )


def attack_call(
    index: int,
    planned: list[PlannedAttack],
    release_for: Callable[[PlannedAttack], Release],
    control: RunControl,
    seed: int,
    finals: dict[str, Reconstruction],
    spent: dict[bool, float],
    late: dict[bool, list[float]] | None = None,
    at_once: bool = False,
) -> AttackCall | AttackRun:
    """What :func:`run_attacks` runs for ``planned[index]``: the call, or the attack's
    outcome without a run (it does not apply, the budget was spent, or a twin that is its
    plain attack's result undone). ``finals``: the plain attacks' results so far; ``spent``:
    the seconds the plain attacks and the twins have used; ``late``: the seconds each
    attack of either pool cut by its share ran past it; ``at_once``: the pool's attacks run
    at once, so each may use all that is left of the pool's budget."""
    attack = planned[index]
    try:
        observation, knowledge, info, reason, reuses_plain = _readied(
            attack, len(planned) > 1, release_for
        )
    except AuditInputError as exc:  # the server could not build its model for this batch
        if len(planned) == 1:
            raise
        return AttackRun(attack, None, str(exc), 0.0)
    if reason is not None or control.is_cancelled():
        return AttackRun(attack, None, reason or "the run was cancelled first", 0.0)
    plain = finals.get(attack.name)
    if reuses_plain:
        # Knowing the defense changes only what is done with the images afterwards
        # (Shadow's): the twin is the plain attack's own result, undone, not a rerun.
        if plain is None:
            return AttackRun(attack, None, "its plain attack has no result", 0.0)
        undone = replace(_undone(plain, knowledge), steps=0)  # no step of its own
        return AttackRun(attack, undone, None, 0.0)
    share = control.max_seconds
    if share is not None:
        # The plain attacks share the budget as they do in the undefended control run
        # (the same attack at the same budget, which the verdict compares with); the
        # adaptive twins share a budget of their own, so a twin never takes its plain
        # attack's time. A defended run may take up to twice the budget. What is left is
        # divided among the attacks of the pool that will run (this one and those after
        # it that apply): time an attack leaves unused passes to those after it, and an
        # attack that will be skipped takes no share.
        pool = spent[attack.adaptive]
        left = control.max_seconds - pool
        if left <= 0:
            return AttackRun(attack, None, BUDGET_SPENT, 0.0)
        runs = 1 if at_once else runs_ahead(index, planned, release_for)
        share = left / runs
        overran = [] if late is None else late[attack.adaptive]
        if runs == 1 and overran:
            # The clock stops an attack between evaluations and its starts are scored
            # after: it runs past its share. Past the last attack's the run would overrun
            # its budget, so the last holds back what those before it ran past theirs on
            # average (at most half of what is left).
            share = left - min(sum(overran) / len(overran), left / 2)
    # One seed per attack name, so an attack and its adaptive twin start alike.
    single = len({p.name for p in planned}) == 1
    seed_of_attack = seed if single else derive_seed(seed, attack.name)
    sub = replace(control, max_seconds=share)
    return AttackCall(attack, info, observation, knowledge, sub, seed_of_attack)


def _readied(
    attack: PlannedAttack, several: bool, release_for: Callable[[PlannedAttack], Release]
) -> tuple[Any, AttackerKnowledge, Any, str | None, bool]:
    """What ``attack`` runs on (observation, knowledge, its ``AttackInfo``), why it will
    not run (None: it will), and whether it is a twin that reuses its plain attack's result
    (no run of its own). Cheap once the release is made (``release_for`` makes each once);
    raises ``AuditInputError`` where the server could not build its model."""
    release = release_for(attack)
    observation = release.observation
    knowledge = release.knowledge
    twin = attack.adaptive and attack.twin_of is None  # an evading server is no such twin
    if twin:
        knowledge = replace(knowledge, defense=release.known_defense)
    info = ATTACKS[attack.name]
    reason = info.why_not_applicable(observation, knowledge) if several else None
    if reason is None and twin:
        reason = info.why_not_adaptive(knowledge.defense)
        if reason is None and info.twin_adds_nothing(knowledge.defense, attack.config):
            reason = TWIN_SAME_AS_PLAIN
    reuses_plain = (
        reason is None and twin and knowledge.defense.needs() & info.adapts == {"postprocess"}
    )
    return observation, knowledge, info, reason, reuses_plain


def steps_that_run(
    planned: list[PlannedAttack], release_for: Callable[[PlannedAttack], Release]
) -> list[bool]:
    """Per planned attack, whether it will run on its own (and so its planned steps count
    toward the run's): not where it does not apply, nor a twin that is its plain attack's
    result undone or whose objective is the plain attack's. A malicious server's attack
    counts without building its model ahead of its turn; a plain attack whose release
    cannot be made counts where it is the only one (the run then says why it failed)."""
    several = len(planned) > 1
    running = []
    for attack in planned:
        if ATTACKS[attack.name].builds is not None:
            running.append(True)
            continue
        try:
            reason, reuses_plain = _readied(attack, several, release_for)[3:]
        except AuditInputError:
            running.append(not several)
            continue
        running.append(reason is None and not reuses_plain)
    return running


def runs_ahead(
    index: int, planned: list[PlannedAttack], release_for: Callable[[PlannedAttack], Release]
) -> int:
    """How many attacks of ``planned[index]``'s pool (plain attacks, or twins) will run from
    it on: it, and each later one that applies and runs on its own (a twin that reuses its
    plain attack's result takes no time). A malicious server's attack is counted without
    building its model ahead of its turn (a model never sent is never built); it is one
    closed-form pass."""
    attack = planned[index]
    count = 1
    for later in planned[index + 1 :]:
        if later.adaptive != attack.adaptive:
            continue
        if ATTACKS[later.name].builds is not None:
            count += 1
            continue
        try:
            reason, reuses_plain = _readied(later, True, release_for)[3:]
        except AuditInputError:
            continue
        count += reason is None and not reuses_plain
    return count


def settled(
    call: AttackCall, final: Reconstruction | None, finals: dict[str, Reconstruction]
) -> Reconstruction | None:
    """An attack's result as the run keeps it: a twin's with the defense's action on the
    images undone; a plain attack's remembered for its twin."""
    if final is not None and call.attack.adaptive:
        return _undone(final, call.knowledge)
    if final is not None:
        finals[call.attack.name] = final
    return final


def _undone(final: Reconstruction, knowledge: AttackerKnowledge) -> Reconstruction:
    """An adaptive attacker's candidates with the defense's action on the images undone
    (``KnownDefense.postprocess``, Shadow's); the attacker's pick by loss is unchanged."""
    known = knowledge.defense
    if known is None or known.postprocess is None:
        return final
    undo = known.postprocess
    return replace(
        final,
        candidates=tuple(
            replace(c, images=undo(c.images, c.labels, knowledge)) for c in final.candidates
        ),
    )


def worst_case(
    runs: list[AttackRun], per_image: list[tuple[ImageScore, ...]]
) -> tuple[Candidate, list[str]]:
    """Per image, the best of the attacks' own picks, as one candidate in the originals'
    order (to be scored with the identity matching: ``metrics.evaluate``'s
    ``matched_already``), with the attack each of its images came from.

    ``per_image[k]`` is run k's matched per-image scores of its own pick. Per image, the
    most telling pick: among the attacks whose pick is recovered beyond the guess
    (``beyond_guess``), the one with the highest PSNR; where none is, among those whose pick
    sits between the guess and the recovered line (not ``nothing_shown``), the highest PSNR;
    where every pick shows nothing, the highest PSNR. So an image any attack recovered, in
    pixels or in structure, stays recovered (the combination counts at least as many images
    as the best single attack), and an image is held only where every attack's pick, each
    twin's included, is: a twin between the lines is never hidden behind a plain pick with a
    higher PSNR that shows nothing. The choice uses the private images: the auditor's view
    (``AUDITOR_VIEW``), not an attacker's pick.
    """
    images, labels, sources = [], [], []
    for i in range(len(per_image[0])):
        runs_at = range(len(runs))
        recovered = [k for k in runs_at if per_image[k][i].beyond_guess]
        between = [k for k in runs_at if not per_image[k][i].nothing_shown]
        k = max(recovered or between or runs_at, key=lambda k: per_image[k][i].psnr)
        selected = runs[k].final.selected
        j = per_image[k][i].reconstruction_index
        images.append(selected.images[j])
        labels.append(None if selected.labels is None else selected.labels[j])
        sources.append(runs[k].label)
    stacked_labels = None if any(v is None for v in labels) else torch.stack(labels)
    steps = sum(r.final.steps for r in runs)
    return Candidate(torch.stack(images), stacked_labels, math.nan, 0, steps, "completed"), sources
