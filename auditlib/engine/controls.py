"""Positive controls: every defended run is judged beside the same attack on the undefended
update at the same budget (``RunSpec.control``).

The control is an ordinary run, stored by its spec id (``engine.identity``), so it runs once and serves every
defended run that shares it (a comparison's "none" member is the control of the others;
a sweep's points share one). The verdict of a defended run is composed when it is read,
from its own finding and its control's, so a control that finishes later still counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from auditlib.engine.identity import stored_run
from auditlib.engine.twins import rescoped
from auditlib.metrics.verdict import Finding, Verdict, judge
from auditlib.spec import RunSpec, run_spec_from_dict
from auditlib.store import Store
from auditlib.store.records import COMPLETED, TIMED_OUT, UNFINISHED, RunRecord

WITH_RESULT = (COMPLETED, TIMED_OUT)  # statuses whose run carries scores


def stored_verdict(run: RunRecord) -> Verdict | None:
    """The verdict a run recorded for itself (without its control), its scope as the rules
    now read it (``twins.rescoped``); None for runs without a result or stored before
    verdicts existed."""
    if run.result is None or run.result.verdict is None:
        return None
    return rescoped(run.result.verdict, run.result.attacks)


def control_finding(
    store: Store, spec: RunSpec, *, of: RunRecord | None = None
) -> tuple[Finding | None, str, RunRecord | None]:
    """The control's finding (None where there is none yet), a note on where it stands,
    and its run; with ``of`` (the defended run), a control of that run's owner."""
    control = spec.control()
    assert control is not None
    run = stored_run(store, control, of=of)
    if run is None:
        return None, "no undefended control has been run at this budget", None
    verdict = stored_verdict(run) if run.status in WITH_RESULT else None
    if verdict is not None:
        return verdict.finding, f"control run {run.id[:8]} ({run.status.replace('_', ' ')})", run
    if run.status in UNFINISHED:
        return None, f"the control run {run.id[:8]} has not finished yet", run
    return (
        None,
        f"the control run {run.id[:8]} ended {run.status.replace('_', ' ')} without a result",
        run,
    )


def verdict_of(store: Store, run: RunRecord) -> Verdict | None:
    """The verdict of a stored run, with its control where it has a defense."""
    own = stored_verdict(run)
    if own is None:
        return None
    spec = run_spec_from_dict(run.spec)
    if spec.control() is None:
        return own
    finding, note, _ = control_finding(store, spec, of=run)
    return judge(own.finding, own.scope, defended=True, control=finding, control_note=note)


def needs_control(store: Store, spec: RunSpec) -> RunSpec | None:
    """The control spec to start for ``spec``: None when it needs none or one with a result
    or in progress exists."""
    control = spec.control()
    if control is None:
        return None
    run = stored_run(store, control)
    if run is not None and (run.status in WITH_RESULT or run.status in UNFINISHED):
        return None
    return control


def start_with_control(
    manager: Any, spec: RunSpec, assets: Mapping[str, bytes] | None = None, title: str = ""
) -> tuple[str, str | None]:
    """Start ``spec`` and, where it needs one, its control; returns both run ids."""
    control = needs_control(manager.store, spec)
    control_id = None
    if control is not None:
        control_id = manager.start(
            control, assets, title=f"{title or spec.attack.name} · control (no defense)"
        )
    return manager.start(spec, assets, title=title), control_id
