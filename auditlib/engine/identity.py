"""A run's identity: the sha256 of its resolved configuration, and the runs stored for it.

``RunSpec.identity()`` hashes the spec as written: an attack's or defense's parameters are
the strings the user typed, so ``lr=1`` and ``lr=1.0``, the ``paper`` preset and its values
spelled out, or no parameters and the defaults spelled out, were different runs of one
configuration. :func:`run_identity` hashes what the run will do instead: the attack's
config dataclass after its preset and parameters are applied (each attack of "every
applicable attack"), less the fields that say how it computes rather than what
(``param(identity=False)``: IG's ``compiled``), whether its restarts race, whether an adaptive attacker runs beside it
(the threat model's switch, resolved; it matters only under a defense), and the defense's
settings; every number in canonical form (``1 == 1.0``). Building the configs costs no
model: it is the registries' parameter parsing only, which also refuses a bad parameter.

Runs recorded before the resolved identity existed are stored under the raw one (now the
*legacy* id). :func:`stored_runs` looks a spec up under both and keeps the run that stands
for it by the store's own rule (one with scores first, then the newest), so a finished run
is never recomputed because its id changed. A stored spec that no longer resolves (a
parameter since renamed) is found by its legacy id alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from auditlib.attacks import ALL_ATTACKS
from auditlib.attacks.restarts import race_of
from auditlib.config import identity_dict
from auditlib.defenses import build_defense_config
from auditlib.engine.attack_phase import adaptive_wanted, plan_attacks
from auditlib.errors import AuditInputError
from auditlib.spec import RunSpec

if TYPE_CHECKING:  # the store (SQLAlchemy, 0.3 s) only where runs are looked up, not at a
    # Ray worker's start, which needs run_identity alone
    from auditlib.store import BatchRecord, RunRecord, Store


@dataclass(frozen=True)
class Identities:
    """A spec's ids: ``resolved`` (None where the spec no longer resolves) and ``legacy``."""

    resolved: str | None
    legacy: str


def run_identity(spec: RunSpec) -> str:
    """The id a run of ``spec`` is stored under: the sha256 of its resolved configuration.

    A parameter the attack or defense refuses raises AuditInputError.
    """
    text = json.dumps(_canonical(resolved_payload(spec)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def identities(spec: RunSpec) -> Identities:
    """Both ids of ``spec``; the resolved one is None where the spec no longer resolves."""
    try:
        resolved = run_identity(spec)
    except AuditInputError:
        resolved = None
    return Identities(resolved, spec.identity())


def resolved_payload(spec: RunSpec) -> dict[str, Any]:
    """What the identity hashes: the spec's canonical payload (``RunSpec.payload``) with
    the attack and defense as the run resolves them."""
    payload = spec.payload()
    payload["attack"] = _resolved_attack(spec)
    _, defense_settings = build_defense_config(spec.defense.name, spec.defense.params_dict())
    payload["defense"] = {"name": spec.defense.name, "settings": defense_settings}
    # The adaptive twin runs only against a defense: an undefended run ignores the switch.
    payload["scenario"]["attacker_knows_defense"] = (
        adaptive_wanted(spec.scenario.attacker_knows_defense, spec.attack)
        if spec.defense.name != "none"
        else None
    )
    return payload


def _resolved_attack(spec: RunSpec) -> dict[str, Any]:
    resolved = [
        {
            "name": p.name,
            "settings": identity_dict(p.config),
            "race": None if (race := race_of(p.config, p.preset)) is None else asdict(race),
        }
        for p in plan_attacks(spec.attack, spec.budget.iterations, server=spec.scenario.server)
    ]
    if spec.attack.name == ALL_ATTACKS:
        return {"name": ALL_ATTACKS, "attacks": resolved}
    return resolved[0]


def _canonical(value: Any) -> Any:
    """``value`` with every whole float as an int (``1.0`` -> ``1``), so a number hashes
    alike however it was written; bools and strings stay as they are."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def stored_runs(
    store: Store, specs: Iterable[RunSpec], *, of: RunRecord | BatchRecord | None = None
) -> list[RunRecord | None]:
    """For each spec, the run that stands for it (None where none is stored), under its
    resolved id or its legacy one: one with scores first, then the newest. With ``of`` (a
    run or batch), only runs of its owner count: a batch's members and a run's control are
    its owner's runs, whoever looks at them; without, the store's own rule (a user's view
    looks among that user's runs)."""
    from auditlib.store import COMPLETED, TIMED_OUT

    rank = {COMPLETED: 0, TIMED_OUT: 1}  # Store.runs_for_specs' rule: a run with scores first
    ids = [identities(spec) for spec in specs]
    wanted = (i for pair in ids for i in (pair.resolved, pair.legacy) if i)
    found = (
        store.runs_for_specs(wanted) if of is None else store.runs_for_specs(wanted, owner=of.owner)
    )
    chosen = []
    for pair in ids:
        runs = [found[i] for i in dict.fromkeys((pair.resolved, pair.legacy)) if i in found]
        runs.sort(key=lambda r: (r.created_at, r.id), reverse=True)  # newest first
        chosen.append(min(runs, key=lambda r: rank.get(r.status, 2)) if runs else None)
    return chosen


def stored_run(
    store: Store, spec: RunSpec, *, of: RunRecord | BatchRecord | None = None
) -> RunRecord | None:
    """The run that stands for ``spec`` (:func:`stored_runs`), or None."""
    return stored_runs(store, [spec], of=of)[0]
