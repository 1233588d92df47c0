"""Comparisons, sweeps and samples: sets of ordinary runs, recorded as a batch in the store.

A comparison runs one scenario and attack under several defenses; a sweep runs it over a
grid of one defense's strength knob (several defenses may share a chart, one curve each); a
sample runs it on every batch of the auditor's set, one client's update each
(``engine.sample``; its verdict is ``metrics.sample``).
Each member is a plain :class:`RunSpec` started through the :class:`RunManager`, so it
streams, persists and cancels like any run, and Ray runs as many at once as there are
workers. Members are matched to runs by spec id (``engine.identity``): restarting a batch (after a cancel or a
restart of the dashboard) only starts members without a completed or active run, and a
point that any earlier run computed with the same spec is not recomputed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from auditlib.config import require
from auditlib.defenses import DEFENSES, build_defense
from auditlib.engine.controls import WITH_RESULT, needs_control
from auditlib.engine.identity import run_identity, stored_runs
from auditlib.engine.together import why_sample_apart
from auditlib.errors import AuditInputError
from auditlib.spec import ComponentSpec, RunSpec, run_spec_from_dict
from auditlib.store import UNFINISHED, BatchRecord, RunRecord, Store

MAX_MEMBERS = 64  # runs in one batch: a sweep of 8 defenses x 8 points at most


@dataclass(frozen=True)
class BatchMember:
    """One run of a batch: which curve (or column) it belongs to and where on it."""

    label: str  # what the tables and charts call it, e.g. "dp-gaussian sigma=0.01"
    series: str  # the curve (sweep) or column (comparison): the defense's name
    knob: str | None  # the varied config field (sweeps)
    value: float | None  # the knob's value (sweeps)
    spec: RunSpec

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "series": self.series,
            "knob": self.knob,
            "value": self.value,
            "spec": self.spec.to_dict(),
            "spec_id": run_identity(self.spec),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchMember:
        value = data.get("value")
        return cls(
            str(data["label"]),
            str(data["series"]),
            data.get("knob"),
            None if value is None else float(value),
            run_spec_from_dict(data["spec"]),
        )


@dataclass(frozen=True)
class SweepCurve:
    """One curve of a sweep: ``defense`` with its ``knob`` set to each of ``values``; the
    other config fields from ``params``."""

    defense: str
    values: tuple[float, ...]
    knob: str | None = None  # None: the defense's registered strength knob
    params: tuple[tuple[str, str], ...] = ()

    def resolved_knob(self) -> str:
        info = DEFENSES.get(self.defense)
        if info is None:
            raise AuditInputError(
                f"unknown defense {self.defense!r}; available: {', '.join(sorted(DEFENSES))}"
            )
        knob = self.knob or info.strength
        if knob is None:
            raise AuditInputError(f"defense {self.defense!r} has no strength knob to sweep")
        fields = {f.name for f in dataclasses.fields(info.config_type)}
        if knob not in fields:
            raise AuditInputError(
                f"defense {self.defense!r} has no setting {knob!r}; expected one of "
                f"{', '.join(sorted(fields))}"
            )
        return knob


MAX_GRID = 16  # points on one curve


def parse_grid(text: str, what: str = "values") -> tuple[float, ...]:
    """ "0.001, 0.01, 0.1" -> (0.001, 0.01, 0.1): finite numbers, distinct, 1..MAX_GRID."""
    parts = [p.strip() for p in text.replace(";", ",").split(",") if p.strip()]
    values = []
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            raise AuditInputError(
                f"{what}: {part!r} is not a number; expected numbers separated by commas, "
                "e.g. 0.001, 0.01, 0.1"
            ) from None
        require(math.isfinite(value), f"{what}: {part!r} is not a finite number")
        values.append(value)
    require(len(values) >= 1, f"{what}: give at least one number, e.g. 0.001, 0.01, 0.1")
    require(len(values) <= MAX_GRID, f"{what}: at most {MAX_GRID} points, got {len(values)}")
    require(len(set(values)) == len(values), f"{what}: a value appears twice")
    return tuple(values)


def _format(value: float) -> str:
    return f"{value:g}"


def _checked(members: list[BatchMember]) -> list[BatchMember]:
    require(len(members) >= 1, "a batch needs at least one run")
    require(
        len(members) <= MAX_MEMBERS,
        f"a batch holds at most {MAX_MEMBERS} runs, this one has {len(members)}",
    )
    seen: set[str] = set()
    for member in members:
        # Refuse bad parameters before anything is recorded or started.
        build_defense(member.spec.defense.name, member.spec.defense.params_dict())
        spec_id = run_identity(member.spec)  # one configuration however its values are written
        if spec_id in seen:
            raise AuditInputError(f"{member.label} appears twice in the batch")
        seen.add(spec_id)
    return members


def comparison_members(base: RunSpec, defenses: Sequence[ComponentSpec]) -> list[BatchMember]:
    """``base`` under each defense, in the order given."""
    members = []
    for defense in defenses:
        settings = ", ".join(f"{k}={v}" for k, v in defense.params)
        label = defense.name + (f" ({settings})" if settings else "")
        members.append(
            BatchMember(label, defense.name, None, None, dataclasses.replace(base, defense=defense))
        )
    return _checked(members)


def sweep_members(base: RunSpec, curves: Sequence[SweepCurve]) -> list[BatchMember]:
    """``base`` at every point of every curve (curve by curve, values in the order given)."""
    members = []
    for curve in curves:
        knob = curve.resolved_knob()
        require(len(curve.values) >= 1, f"the {curve.defense} curve has no values")
        for value in curve.values:
            params = {**dict(curve.params), knob: _format(value)}
            defense = ComponentSpec.of(curve.defense, params)
            members.append(
                BatchMember(
                    f"{curve.defense} {knob}={_format(value)}",
                    curve.defense,
                    knob,
                    float(value),
                    dataclasses.replace(base, defense=defense),
                )
            )
    return _checked(members)


SAMPLE_SERIES = "sample"


def sample_members(
    base: RunSpec, updates: int | str, assets: Mapping[str, bytes] | None = None
) -> list[BatchMember]:
    """The sample's updates (``engine.sample.update_specs``), one member each, in order."""
    from auditlib.engine.sample import update_specs

    members = []
    for index, spec in enumerate(update_specs(base, updates, assets)):
        first = spec.data.offset + 1
        size = spec.data.batch_size or 1
        images = f"image {first}" if size == 1 else f"images {first} to {first + size - 1}"
        label = f"update {index + 1} ({images})"
        members.append(BatchMember(label, SAMPLE_SERIES, None, float(index), spec))
    return _checked(members)


def record_batch(store: Store, kind: str, title: str, members: Sequence[BatchMember]) -> str:
    """Store the batch's definition; returns its id."""
    return store.create_batch(kind, title, {"members": [m.as_dict() for m in members]})


def members_of(batch: BatchRecord) -> list[BatchMember]:
    return [BatchMember.from_dict(m) for m in batch.definition.get("members", [])]


@dataclass(frozen=True)
class MemberState:
    member: BatchMember
    run: RunRecord | None  # the run standing for it (newest completed, else newest)


def batch_state(store: Store, batch: BatchRecord) -> list[MemberState]:
    members = members_of(batch)
    runs = stored_runs(store, [m.spec for m in members], of=batch)
    return [MemberState(m, run) for m, run in zip(members, runs, strict=True)]


def needs_run(state: MemberState) -> bool:
    """No run with a result (completed, or stopped by its time budget) and none in progress."""
    return state.run is None or state.run.status not in (*WITH_RESULT, *UNFINISHED)


def launch(
    manager: Any,
    batch: BatchRecord,
    assets: Mapping[str, bytes] | None = None,
) -> list[str]:
    """Start the members that need a run (see :func:`needs_run`); returns the new run ids.

    ``manager`` is the dashboard's :class:`~auditlib.engine.runs.RunManager`; Ray queues the
    runs and executes as many at once as it has CPUs for (``AUDIT_RAY_NUM_CPUS``). A
    sample's updates start as one task, together (``RunManager.start_together``), where
    they can advance together (``engine.together.why_sample_apart``).
    """
    started = []
    states = batch_state(manager.store, batch)
    pending = [s for s in states if needs_run(s)]

    def title_of(state: MemberState) -> str:
        return f"{batch.title} · {state.member.label}" if batch.title else state.member.label

    specs = [s.member.spec for s in pending]
    if batch.kind == "sample" and len(pending) > 1 and why_sample_apart(specs) is None:
        # A sample's updates advance as one batched computation on one worker
        # (engine.together), each still its own run.
        started += manager.start_together(specs, assets, [title_of(s) for s in pending])
        pending = []
    for state in pending:
        started.append(manager.start(state.member.spec, assets, title=title_of(state)))
    # Every defended member is judged beside its undefended control; start the controls
    # that no member stands for (a comparison's "none" member usually does).
    controls: dict[str, RunSpec] = {}
    for state in states:
        control = needs_control(manager.store, state.member.spec)
        if control is not None:
            controls.setdefault(run_identity(control), control)
    for control in controls.values():
        title = f"{batch.title} · control (no defense)" if batch.title else "control (no defense)"
        started.append(manager.start(control, assets, title=title))
    return started


def cancel(manager: Any, batch: BatchRecord) -> list[str]:
    """Ask every unfinished member run to stop; returns their ids."""
    stopping = []
    for state in batch_state(manager.store, batch):
        if state.run is not None and state.run.status in UNFINISHED:
            manager.cancel(state.run.id)
            stopping.append(state.run.id)
    return stopping


def delete(store: Store, batch: BatchRecord) -> tuple[int, list]:
    """Delete the batch with its runs (the runs that stand for its members, and their
    undefended controls) and the uploads no other run uses; runs another of the owner's
    batches stands on stay. Refused while one of its runs is unfinished. Returns how many
    runs went and the uploads deleted."""
    states = batch_state(store, batch)
    if any(s.run is not None and s.run.status in UNFINISHED for s in states):
        raise AuditInputError(f"the {batch.kind} still has runs in progress; cancel them first")
    kept: set[str] = set()
    for other in store.list_batches(limit=10_000):
        if other.id != batch.id and other.owner == batch.owner:
            kept |= _runs_of(store, other)
    freed = []
    gone = sorted(_runs_of(store, batch) - kept)
    for run_id in gone:
        freed += store.delete_run(run_id)
    store.delete_batch(batch.id)
    return len(gone), freed


def _runs_of(store: Store, batch: BatchRecord) -> set[str]:
    """The runs a batch stands on: its members' and their undefended controls'."""
    specs = [m.spec for m in members_of(batch)]
    specs += [c for spec in specs if (c := spec.control()) is not None]
    return {run.id for run in stored_runs(store, specs, of=batch) if run is not None}
