"""How a run's attacks computed their steps, as the result keeps it (``AttackRecord.step``
and ``step_note``) and as the command line and the page say it
(``auditlib.report.step_words``)."""

from __future__ import annotations

from auditlib.reconstruction import COMPILED, EAGER, RECORDED
from auditlib.report.step_words import plainly_eager, steps_text
from auditlib.result import AttackRecord


def _record(attack: str, step: str | None, note: str | None = None) -> AttackRecord:
    return AttackRecord(attack=attack, label=attack, step=step, step_note=note)


def test_a_record_keeps_its_step_through_json_and_one_before_it_was_kept_has_none():
    record = _record("ig", RECORDED, "the run's choice on CUDA")
    data = record.to_json()
    assert (data["step"], data["step_note"]) == (RECORDED, "the run's choice on CUDA")
    assert AttackRecord.from_json(data) == record
    older = _record("dlg", None).to_json()
    assert "step" not in older and "step_note" not in older  # the shape it had before
    assert AttackRecord.from_json(older).step is None


def test_the_steps_are_said_once_where_every_attack_stepped_alike():
    assert steps_text([_record("dlg", EAGER)]) == "Steps: eager."
    two = [_record("dlg", EAGER), _record("ig", EAGER), _record("rtf", None)]
    assert steps_text(two) == "Steps: eager, every attack."
    assert plainly_eager(two)
    assert steps_text([_record("rtf", None)]) is None  # no optimisation step: nothing told


def test_each_attack_s_way_is_said_with_why_where_they_differ_or_one_has_a_note():
    records = [
        _record("ig", RECORDED, "the run's choice on CUDA; captured=false keeps it eager"),
        _record("dlg", EAGER, "its recording as a CUDA graph failed (RuntimeError: x)"),
        _record("grnn", COMPILED),
    ]
    assert steps_text(records) == (
        "Steps: ig recorded as a CUDA graph and replayed (the run's choice on CUDA; "
        "captured=false keeps it eager); dlg eager (its recording as a CUDA graph failed "
        "(RuntimeError: x)); grnn compiled."
    )
    assert not plainly_eager(records[2:])  # compiled: the command line says it
    assert not plainly_eager([_record("dlg", EAGER, "its recording failed")])
