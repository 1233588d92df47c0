"""How a run's attacks computed their steps, in words: one definition for the command line
and the page (``AttackRecord.step``, ``step_note``)."""

from __future__ import annotations

from collections.abc import Sequence

from auditlib.reconstruction import EAGER, RECORDED
from auditlib.result import AttackRecord

_SAID = {RECORDED: "recorded as a CUDA graph and replayed"}


def plainly_eager(attacks: Sequence[AttackRecord]) -> bool:
    """Whether every attack that told computed its step eagerly, as asked: nothing to say on
    the command line, where that is every run on a CPU."""
    return all(a.step in (None, EAGER) and a.step_note is None for a in attacks)


def steps_text(attacks: Sequence[AttackRecord]) -> str | None:
    """'Steps: eager, every attack.', or each attack's way with why ('Steps: ig recorded as
    a CUDA graph and replayed (...); dlg eager.'); None where no attack told it (no
    optimisation step, or a result recorded before it was kept)."""
    told = [a for a in attacks if a.step is not None]
    if not told:
        return None
    if all(a.step == told[0].step and a.step_note is None for a in told):
        every = ", every attack" if len(told) > 1 else ""
        return f"Steps: {_said(told[0].step)}{every}."
    return "Steps: " + "; ".join(_one(a) for a in told) + "."


def _one(attack: AttackRecord) -> str:
    note = f" ({attack.step_note})" if attack.step_note else ""
    return f"{attack.label or attack.attack} {_said(attack.step)}{note}"


def _said(step: str | None) -> str:
    return _SAID.get(step or "", step or "")
