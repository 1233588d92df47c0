"""The attacker that knows the defense: its plan (each attack's twin, or under a client's
model check each server built to pass it) and whether it ran (the verdict's
``Scope.twins``), in a word and in words."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from auditlib.attacks import ATTACKS, build_attack_config
from auditlib.attacks.base import evading_servers
from auditlib.attacks.restarts import AUDIT_PRESET
from auditlib.config import config_dict
from auditlib.engine.attack_phase import TWIN_SAME_AS_PLAIN, AttackRun, PlannedAttack
from auditlib.engine.releases import Rounds
from auditlib.metrics.verdict import Twins, Verdict, judge
from auditlib.result import AttackRecord
from auditlib.spec import RunSpec


def with_adaptive(planned: list[PlannedAttack]) -> list[PlannedAttack]:
    """Each attack followed by its adaptive twin: same settings and seed, told the defense,
    but what the attack's twin sets otherwise (``AttackInfo.twin_params``)."""
    return [twin for p in planned for twin in (p, _twin(p))]


def _twin(attack: PlannedAttack) -> PlannedAttack:
    changes = ATTACKS[attack.name].twin_params
    if not changes:
        return replace(attack, adaptive=True)
    config = replace(attack.config, **changes)
    settings = {**attack.settings, **{k: config_dict(config)[k] for k in changes}}
    return replace(attack, adaptive=True, config=config, settings=settings)


def with_evading(planned: list[PlannedAttack]) -> list[PlannedAttack]:
    """The plan under a client's model check: each built server's attack followed by every
    evading server that stands in for it (``AttackInfo.stands_in_for``) at its audit preset,
    each once (a disguised server stands in for several) and none already planned as a plain
    attack (an evading server audited by name is its own plain run)."""
    planned_names = {p.name for p in planned}
    added: set[str] = set()
    out = []
    for attack in planned:
        out.append(attack)
        if attack.adaptive or ATTACKS[attack.name].builds is None:
            continue
        for name in evading_servers(attack.name):
            if name in planned_names or name in added:
                continue
            added.add(name)
            config, settings = build_attack_config(name, {}, AUDIT_PRESET)
            # A server's attack is a closed form (``imprint.server_attack``): one pass.
            settings["restart_schedule"] = "one pass (a closed form)"
            out.append(
                PlannedAttack(
                    name, AUDIT_PRESET, config, settings, 1, adaptive=True, twin_of=attack.name
                )
            )
    return out


def twins_ran(
    spec: RunSpec, release, adaptive: bool, runs: list[AttackRun], rounds: Rounds | None = None
) -> tuple[Twins, str]:
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
    evading = [r for r in runs if r.planned.twin_of is not None]
    if evading and rounds is not None:
        return _evading_twins(rounds, runs, evading)
    if release.known_defense is None:
        return "not offered", f"no attacker that knows {spec.defense.name} is offered"
    twins = {r.planned.name: r for r in runs if r.planned.adaptive}
    plain = [r for r in runs if not r.planned.adaptive and r.final is not None]
    covered, missing = [], []
    for run in plain:
        twin = twins.get(run.planned.name)
        if twin is not None and _measured(twin):
            covered.append(f"{run.planned.name}'s twin ran")
        elif twin is not None and (twin.skipped or "").startswith(TWIN_SAME_AS_PLAIN):
            covered.append(f"{run.planned.name}'s twin is the plain attack ({TWIN_SAME_AS_PLAIN})")
        else:
            why = "none was planned" if twin is None else _why_unmeasured(twin)
            missing.append(f"the twin of {run.planned.name} did not run: {why}")
    if not plain:  # no plain attack ran: the twins alone
        if any(_measured(t) for t in twins.values()):
            return "ran", "every twin ran"
        return "none", "; ".join(
            f"a twin of {t.planned.name}: {_why_unmeasured(t)}" for t in twins.values()
        ) or "no twin ran"
    if not missing:
        return "ran", "; ".join(covered)
    return ("partly" if covered else "none"), "; ".join(missing)


def _measured(run: AttackRun) -> bool:
    """Whether an attack ran to a measurement: not skipped, and not every start of it
    diverged (its optimisation left the finite numbers: its pick is where it broke down,
    as the verdict says of a run whose every attack diverged)."""
    return run.final is not None and run.final.stop_reason != "diverged"


def _why_unmeasured(run: AttackRun) -> str:
    if run.final is not None:  # every start diverged
        return _diverged(run.final.steps)
    return run.skipped or "it did not run"


def _diverged(steps: int) -> str:
    return (
        f"every start of it diverged: its optimisation broke down within {steps:,} steps, so "
        "it measured nothing"
    )


def rescoped(verdict: Verdict, attacks: Sequence[AttackRecord]) -> Verdict:
    """A verdict recorded before version 6 as it reads now: there, a twin whose every start
    diverged counted as run (``Scope.twins`` "ran"); the run's attack records say which
    did. The verdict is judged again from this scope, beside the control it was judged with
    (``engine.controls.verdict_of`` judges it again beside the control stored now)."""
    if verdict.version >= 6 or verdict.scope.twins != "ran":
        return verdict
    broke = [a for a in attacks if a.adaptive and a.stop_reason == "diverged"]
    if not broke:
        return verdict
    others = any(a.adaptive and a.stop_reason not in (None, "diverged") for a in attacks)
    words = "; ".join(
        f"the twin of {a.attack} did not run: {_diverged(a.steps or 0)}" for a in broke
    )
    scope = replace(verdict.scope, twins="partly" if others else "none", twins_words=words)
    if verdict.finding is None:  # unscored: no figure to judge again
        return replace(verdict, scope=scope)
    # Twins run only against a defense: the run was judged as defended.
    return judge(
        verdict.finding,
        scope,
        defended=True,
        control=verdict.control,
        control_note=verdict.control_note,
    )


def _evading_twins(
    rounds: Rounds, runs: list[AttackRun], evading: list[AttackRun]
) -> tuple[Twins, str]:
    """Under a model check: which servers it was tried against, built and evading, and what
    became of each (refused, passed, or why it was not tried). "ran" only where every
    evading server planned ran; the verdict reads the rest from the scores and
    ``Scope.refused``."""

    def fate(run: AttackRun) -> str:
        if run.final is None:
            return f"{run.planned.name} not tried ({run.skipped or 'it did not run'})"
        refused = rounds.for_attack(run.planned).refused
        return f"{run.planned.name} {'refused' if refused else 'passed the check'}"

    built = [r for r in runs if not r.planned.adaptive]
    tried = "; ".join(fate(r) for r in [*built, *evading])
    words = f"the model check was tried against {len(built) + len(evading)} servers: {tried}"
    ran = [r for r in evading if r.final is not None]
    if len(ran) == len(evading):
        return "ran", words
    return ("partly" if ran else "none"), words
