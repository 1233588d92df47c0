"""What the pages read of a stored run: its typed result (``RunRecord.result``), its typed
spec, its settings in words and its verdict beside its undefended control. Never the raw
summary or spec dictionaries."""

from __future__ import annotations

from auditlib.engine.controls import stored_verdict, verdict_of
from auditlib.errors import AuditInputError
from auditlib.metrics.verdict import Verdict
from auditlib.result import AuditSummary
from auditlib.spec import RunSpec, run_spec_from_dict
from auditlib.store import RunRecord
from dashboard.resources import get_store
from dashboard.spec_words import RunSettings, older_spec_settings, settings_text

# A spec or result this version cannot read raises one of these (a spec of an older version).
UNREADABLE = (AuditInputError, KeyError, TypeError, ValueError)


def run_result(record: RunRecord | None) -> AuditSummary | None:
    """The run's typed result; None while it has none, or where this version cannot read it
    (``result_problem`` says why)."""
    if record is None:
        return None
    try:
        return record.result
    except AuditInputError:
        return None


def result_problem(record: RunRecord) -> str | None:
    """Why the run's stored result cannot be read (a newer schema); None when it can."""
    try:
        record.result  # noqa: B018 (read for its error)
    except AuditInputError as exc:
        return str(exc)
    return None


def stored_spec(record: RunRecord) -> RunSpec | None:
    """The run's spec, typed; None for a spec of an older version this one cannot read."""
    try:
        return run_spec_from_dict(record.spec)
    except UNREADABLE:
        return None


def defended_spec(record: RunRecord) -> RunSpec | None:
    """The stored run's spec when it has a defense (and so a control); None otherwise, or
    for a spec of an older version."""
    spec = stored_spec(record)
    return spec if spec is not None and spec.control() is not None else None


def run_settings(record: RunRecord) -> RunSettings:
    """The run's settings in words (see ``spec_words``)."""
    spec = stored_spec(record)
    if spec is not None:
        return settings_text(spec)
    result = run_result(record)
    if result is None:
        return older_spec_settings()
    return older_spec_settings(result.attack, result.defense)


def run_verdict(record: RunRecord) -> Verdict | None:
    """The verdict of a stored run with its undefended control (None for runs stored before
    verdicts, or without a result)."""
    result = run_result(record)
    if result is None:
        return None
    try:
        return verdict_of(get_store(), record)
    except UNREADABLE:  # a spec of an older version: the verdict the run recorded itself
        return stored_verdict(record)
