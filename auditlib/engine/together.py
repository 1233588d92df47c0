"""Updates together: a sample audit's updates attacked as one batched computation.

A sample audit (``engine.sample``) audits many updates of one model, each a full run judged
on its own. Each run is prepared alone (``audit.prepare_run``: its victim, its release, its
plan) and judged alone (``audit.finish_run``); only the attack phase is shared: for each
planned attack in turn, the updates it runs on advance together as one batched computation
(``attacks.restarts.run_attack_updates``) where the attack has a batched form and the
updates differ only in what they match (``attacks.restarts.why_apart``); otherwise they run
one after another, exactly as alone, and the reason is kept (:class:`Together`).

Budgets, per update as alone: each update's attack gets its own share of its own time
budget (``attack_phase.attack_call``, the same rule as one run); updates together get one
clock of the sum of their shares, and since they advance in lockstep (every running start of
every update takes every step) a budget cut leaves every update at the same step. The
seconds an update is charged (its pools, ``timing.seconds``) are the joint time divided by
the updates that shared it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from auditlib.attacks import ATTACKS, ProgressEvent
from auditlib.attacks.restarts import run_attack_updates, why_apart
from auditlib.engine.attack_phase import (
    AttackCall,
    AttackRun,
    attack_call,
    plan_attacks,
    run_attacks,
    settled,
    steps_that_run,
)
from auditlib.engine.audit import (
    AuditResult,
    AuditStart,
    LiveFrame,
    PreparedRun,
    finish_run,
    live_frame,
    prepare_run_started,
)
from auditlib.engine.memory_plan import (
    GroupPlan,
    MemoryPlan,
    measure_rows,
    peak_bytes,
    plan_groups,
    plan_updates,
)
from auditlib.engine.utility import UtilityProgress
from auditlib.errors import AttackUnsupportedError
from auditlib.metrics import LPIPS_NETS
from auditlib.models import own_code
from auditlib.spec import RunSpec


@dataclass(frozen=True)
class Together:
    """How one planned attack ran over the updates: how many advanced together, and why
    the others (or all) ran one after another."""

    attack: str
    together: int  # updates that advanced as one batched computation
    apart: int  # updates run one after another
    why_apart: str | None = None
    memory: MemoryPlan | None = None  # how the updates together were chunked, and why

    @property
    def words(self) -> str:
        if self.apart == 0:
            advanced = f"{self.attack}: {self.together} updates advanced together"
            if self.memory is not None and self.memory.chunks > 1:
                advanced += f", {self.memory.chunks} chunks one after another"
            return advanced + (f" ({self.memory.words})" if self.memory is not None else "")
        updates = f"{self.apart} update{'s' if self.apart != 1 else ''}"
        return f"{self.attack}: {updates} one after another ({self.why_apart})"


def why_specs_apart(specs: Sequence[RunSpec]) -> str | None:
    """Why a sample's updates cannot share their attack phase at all (None: they may, attack
    by attack)."""
    if len(specs) < 2:
        return "one update"
    if any(s.model.trusted_archive for s in specs):
        return "a trusted model archive runs in a process of its own, one update at a time"
    if any(s.model.spec.info.source == own_code.SOURCE for s in specs):
        return "a model class of your own code runs in a process of its own, one update at a time"
    first = specs[0]
    for spec in specs[1:]:  # update_specs changes only which images; anything else is refused
        if replace(spec, data=first.data) != first:
            return "the updates' specs differ beyond their images"
    return None


def why_sample_apart(specs: Sequence[RunSpec]) -> str | None:
    """Why a sample's updates start as separate runs rather than as one task of updates
    together (None: one task): their attack phases cannot be shared (:func:`why_specs_apart`),
    or no attack they plan has a batched form across updates, or none that gains by it on a
    CPU (``AttackInfo.no_cpu_gain``), so one task would only run them one after another on
    one worker, where separate runs may run side by side."""
    why = why_specs_apart(specs)
    if why is not None:
        return why
    first = specs[0]
    planned = plan_attacks(first.attack, first.budget.iterations, server=first.scenario.server)
    infos = [ATTACKS[p.name] for p in planned]
    if not any(info.run_updates is not None for info in infos):
        names = ", ".join(p.name for p in planned)
        return f"{names} has no batched form across updates"
    batched = [info for info in infos if info.run_updates is not None]
    if first.device == "cpu" and all(info.no_cpu_gain for info in batched):
        return "; ".join(info.no_cpu_gain for info in batched)
    return None


def run_attacks_together(
    prepared: Sequence[PreparedRun],
    outcomes: Sequence[list[AttackRun]],
    seconds: list[float],
    notes: list[Together],
) -> Iterator[tuple[int, ProgressEvent]]:
    """The attack phase of every prepared run (``engine.attack_phase.run_attacks``'s, per
    update), attack by attack, updates together where they can be: (update, event) pairs.
    ``outcomes[u]`` receives update u's :class:`AttackRun` per planned attack, ``seconds[u]``
    its attack seconds; ``notes`` one :class:`Together` per attack that ran."""
    phase = _Phase(prepared, outcomes, seconds)
    plans = {tuple(p.label for p in run.planned) for run in prepared}
    if len(plans) > 1:  # each update its own plan (a release that offers no twin): as alone
        notes.append(Together("every attack", 0, len(prepared), "the updates' plans differ"))
        for u, run in enumerate(prepared):
            began = time.perf_counter()
            for event in run_attacks(
                run.planned, run.rounds.for_attack, run.control, run.attack_seed, outcomes[u]
            ):
                yield u, event
            seconds[u] += time.perf_counter() - began
        return
    for index, attack in enumerate(phase.planned):
        calls: dict[int, AttackCall] = {}
        for u, run in enumerate(prepared):
            call = attack_call(
                index,
                run.planned,
                run.rounds.for_attack,
                run.control,
                run.attack_seed,
                phase.finals[u],
                phase.spent[u],
            )
            if isinstance(call, AttackRun):
                outcomes[u].append(call)
            else:
                calls[u] = call
        if not calls:
            continue
        info = ATTACKS[attack.name]
        updates = sorted(calls)
        why = (
            why_apart(info, attack.config, [calls[u].knowledge for u in updates], attack.preset)
            if len(updates) > 1
            else "one update to run"
        )
        if why is None and info.no_cpu_gain and calls[updates[0]].knowledge.device.type == "cpu":
            why = info.no_cpu_gain  # together would be slower here: measured
        if why is None:
            plan = memory_plan(info, [calls[u] for u in updates])
            notes.append(Together(attack.label, len(updates), 0, memory=plan))
            for start in range(0, len(updates), plan.chunk):
                chunk = updates[start : start + plan.chunk]
                yield from phase.together(info, {u: calls[u] for u in chunk})
        else:
            notes.append(Together(attack.label, 0, len(updates), why))
            for u in updates:
                yield from phase.alone(u, calls[u])


def memory_plan(info, calls: Sequence[AttackCall]) -> MemoryPlan:
    """How many of these updates advance together at a time (``engine.memory_plan``): one
    step of the attack for one update and for two (copies of the first), measured at its
    peak on the updates' device, against the memory free now."""
    first = calls[0]
    device = first.observation.tensors[0].device
    probe = replace(first.control, max_steps=1, max_seconds=None, emit_every=1)

    def one_step(updates: int) -> None:
        for _ in run_attack_updates(
            info,
            [first.observation] * updates,
            [first.knowledge] * updates,
            first.attack.config,
            probe,
            [first.seed] * updates,
            first.attack.preset,
        ):
            pass

    return plan_updates(len(calls), 1, measure_rows(one_step, device), device)


class _Phase:
    """The bookkeeping :func:`run_attacks` keeps for one run, kept per update: each plain
    attack's result (for its twin), the seconds each pool spent, the steps so far."""

    def __init__(self, prepared, outcomes, seconds) -> None:
        self.planned = prepared[0].planned
        self.several = len(self.planned) > 1
        # The steps of the attacks that will run, as run_attacks counts them (issue 52).
        running = steps_that_run(self.planned, prepared[0].rounds.for_attack)
        self.total = sum(
            p.planned_steps for p, runs in zip(self.planned, running, strict=True) if runs
        )
        self.finals: list[dict] = [{} for _ in prepared]
        self.spent = [{False: 0.0, True: 0.0} for _ in prepared]
        self.offsets = [0] * len(prepared)
        self.outcomes = outcomes
        self.seconds = seconds
        self.started = time.perf_counter()

    def _renumbered(self, u: int, event: ProgressEvent, began: float) -> ProgressEvent:
        # As run_attacks: steps and seconds from the phase's start, the final kept aside.
        return replace(
            event,
            step=self.offsets[u] + event.step,
            total_steps=self.total,
            elapsed_s=began - self.started + event.elapsed_s,
            final=None,
        )

    def _settle(self, u: int, call: AttackCall, final, skipped: str | None, seconds: float):
        self.spent[u][call.attack.adaptive] += seconds
        self.seconds[u] += seconds
        final = settled(call, final, self.finals[u])
        self.offsets[u] += final.steps if final is not None else 0
        self.outcomes[u].append(AttackRun(call.attack, final, skipped, seconds))

    def alone(self, u: int, call: AttackCall) -> Iterator[tuple[int, ProgressEvent]]:
        """Update u's attack on its own, as ``run_attacks`` runs it."""
        began = time.perf_counter()
        final, skipped = None, None
        try:
            for event in call.events():
                final = event.final if event.final is not None else final
                yield u, self._renumbered(u, event, began)
        except AttackUnsupportedError as exc:
            if not self.several:
                raise
            final, skipped = None, str(exc)
        self._settle(u, call, final, skipped, time.perf_counter() - began)

    def together(self, info, calls: dict[int, AttackCall]) -> Iterator[tuple[int, ProgressEvent]]:
        """The updates' attack as one batched computation (``run_attack_updates``)."""
        updates = list(calls)
        first = calls[updates[0]]
        shares = [c.control.max_seconds for c in calls.values()]
        # One clock for all: the sum of each update's share of its own budget (in lockstep
        # every update takes the same steps, whatever cuts them).
        budget = None if any(s is None for s in shares) else sum(shares)
        control = replace(first.control, max_seconds=budget)
        began = time.perf_counter()
        finals: dict[int, Any] = {}
        skipped = None
        try:
            for k, event in run_attack_updates(
                info,
                [c.observation for c in calls.values()],
                [c.knowledge for c in calls.values()],
                first.attack.config,
                control,
                [c.seed for c in calls.values()],
                first.attack.preset,
            ):
                u = updates[k]
                if event.final is not None:
                    finals[u] = event.final
                yield u, self._renumbered(u, event, began)
        except AttackUnsupportedError as exc:
            if not self.several:
                raise
            skipped = str(exc)
        share = (time.perf_counter() - began) / len(updates)  # each update's part of it
        for u in updates:
            self._settle(u, calls[u], finals.get(u), skipped, share)


Item = AuditStart | ProgressEvent | LiveFrame | UtilityProgress | AuditResult


def iter_together(
    specs: Sequence[RunSpec],
    *,
    assets: Mapping[str, bytes] | None = None,
    is_cancelled: Callable[[], bool] | None = None,
    lpips_nets: tuple[str, ...] = LPIPS_NETS,
    emit_every: int = 10,
    image_every: int = 50,
) -> Iterator[tuple[int, Item] | tuple[None, Together | GroupPlan]]:
    """The runs of ``specs`` (a sample's updates, ``engine.sample.update_specs``), their
    attack phases shared (:func:`run_attacks_together`), each judged on its own, streamed:
    (update, item) with update u's items as ``engine.audit.iter_audit`` yields them for its
    run alone (its start, its events and live frames, its utility rounds, its result), and
    (None, note) for how the updates were grouped and how each attack ran.

    A prepared update holds its own model, release and attacker's copies until it is judged
    (for 64 updates of a 224-pixel ResNet-18, gigabytes), so the updates are prepared,
    attacked and judged a group at a time: as many as fit a share of the free memory, from
    the first one's measured peak (``engine.memory_plan.plan_groups``). ``is_cancelled``
    stops every update: they advance as one computation."""
    device = torch.device(specs[0].device)
    settings = {
        "is_cancelled": is_cancelled,
        "emit_every": emit_every,
        "image_every": image_every,
        "assets": assets,
    }
    held: list[tuple[AuditStart, PreparedRun]] = []

    def prepare_first() -> None:
        held.append(prepare_run_started(specs[0], **settings))

    plan = plan_groups(len(specs), peak_bytes(prepare_first, device), device)
    if plan.groups > 1:
        yield None, plan
    started = time.perf_counter()
    for offset in range(0, len(specs), plan.size):
        group = specs[offset : offset + plan.size]
        prepared: list[PreparedRun] = []
        for k, spec in enumerate(group):
            start, run = held.pop() if held else prepare_run_started(spec, **settings)
            yield offset + k, start
            prepared.append(run)
        outcomes: list[list[AttackRun]] = [[] for _ in group]
        seconds = [0.0] * len(group)
        first_event: list[float | None] = [None] * len(group)
        notes: list[Together] = []
        for u, event in run_attacks_together(prepared, outcomes, seconds, notes):
            if first_event[u] is None:
                first_event[u] = time.perf_counter() - started
            yield offset + u, event
            frame = live_frame(prepared[u], event)
            if frame is not None:
                yield offset + u, frame
        for note in notes:
            yield None, note
        for u, run in enumerate(prepared):
            finishing = finish_run(
                run, outcomes[u], seconds[u], first_event[u], lpips_nets=lpips_nets, assets=assets
            )
            while True:  # the utility training's progress, where the spec asks for it
                try:
                    yield offset + u, next(finishing)
                except StopIteration as done:
                    yield offset + u, done.value
                    break
        del prepared  # this group's models and releases go before the next is prepared


def audit_together(
    specs: Sequence[RunSpec],
    *,
    on_event: Callable[[int, ProgressEvent], None] | None = None,
    lpips_nets: tuple[str, ...] = LPIPS_NETS,
    emit_every: int = 10,
    image_every: int = 50,
) -> tuple[list[AuditResult], list[Together | GroupPlan]]:
    """:func:`iter_together` run to its end: the same :class:`AuditResult` each update would
    have alone, in the updates' order, and how each attack ran."""
    results: list[AuditResult] = []
    notes: list[Together | GroupPlan] = []
    for u, item in iter_together(
        specs, lpips_nets=lpips_nets, emit_every=emit_every, image_every=image_every
    ):
        if u is None:
            notes.append(item)
        elif isinstance(item, AuditResult):
            results.append(item)
        elif isinstance(item, ProgressEvent) and on_event is not None:
            on_event(u, item)
    return results, notes
