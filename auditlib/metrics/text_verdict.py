"""The verdict of a text audit, on the rules of the image verdict (``metrics.verdict``):

- **leaks**: some attack recovered sequences beyond the guess from public text
  (``metrics.text_risk``); the level is the best attack's batch level.
- **defense held** ("Low"): under the defense every sequence showed nothing of itself to
  every attack that ran, the attacker that knows the defense ran where one is offered, and
  the same attacks at the same budget broke the undefended update (the control: at least
  half its sequences recovered). It says the defense stopped these attacks, nothing more.
- **inconclusive**: nothing was recovered and nothing follows: no defense (a failed attack
  on an undefended update is no evidence of safety), a control that did not leak, a
  recovery between the guess and the recovered line, no adaptive attacker where one is
  offered, or an audit cancelled before its attacks and controls finished (a leak found
  before the stop still stands: it was measured).
"""

from __future__ import annotations

from dataclasses import dataclass

from auditlib.metrics.text_risk import BATCH_SHARE, LEVEL_WORDS, TextRisk
from auditlib.metrics.verdict import INCONCLUSIVE, OUTCOME_TITLE, Outcome
from auditlib.words import count_of

TEXT_VERDICT_VERSION = 1


@dataclass(frozen=True)
class TextFinding:
    """One attack's result on one update, as the verdict reads it."""

    attack: str
    risk: TextRisk
    rouge1: float
    rouge2: float
    rougeL: float
    exact: int


@dataclass(frozen=True)
class TextVerdict:
    outcome: Outcome
    level: str
    headline: str
    sentence: str
    findings: tuple[TextFinding, ...]  # under the audited update (defended where a defense is)
    controls: tuple[TextFinding, ...]  # the same attacks on the undefended update
    attacks: tuple[str, ...]
    defense: str
    adaptive: str  # "ran", "not offered", "no defense"
    version: int = TEXT_VERDICT_VERSION

    @property
    def title(self) -> str:
        return OUTCOME_TITLE[self.outcome]


def _best(findings: tuple[TextFinding, ...]) -> TextFinding | None:
    return max(findings, key=lambda f: (f.risk.recovered_count, f.rouge2), default=None)


def judge_text(
    findings: tuple[TextFinding, ...],
    controls: tuple[TextFinding, ...],
    defense: str,
    adaptive: str,
    *,
    stopped: bool = False,
) -> TextVerdict:
    """``stopped``: the audit was cancelled, so an attack was cut short and what followed it
    (the rest, the controls) did not run."""
    attacks = tuple(f.attack for f in findings)
    best = _best(findings)
    size = best.risk.sequences if best else 0
    args = (findings, controls, attacks, defense, adaptive)
    if best is not None and best.risk.recovered_count:
        level = best.risk.level or "Medium"
        return TextVerdict(
            "leaks", level,
            f"{level}: {count_of(best.risk.recovered_count, 'sequence')} of {size} recovered",
            f"{best.attack} recovered {best.risk.recovered_count} of the client's {size} "
            f"sequences beyond the best guess from public text ({LEVEL_WORDS[level]}; mean "
            f"ROUGE-1 {best.rouge1:.2f}, ROUGE-2 {best.rouge2:.2f}, {best.exact} exact)"
            + (f" under {defense}" if defense != "none" else "") + ".",
            *args,
        )  # fmt: skip
    if stopped:
        return _inconclusive(
            "the audit was cancelled before its attacks and controls had finished; nothing "
            "follows from what they had not recovered by then",
            *args,
        )
    if defense == "none":
        return _inconclusive(
            "nothing was recovered from the undefended update; a failed attack is no "
            "evidence of safety",
            *args,
        )
    if not all(f.risk.held_count == f.risk.sequences for f in findings):
        return _inconclusive(
            "some sequences came back between the guess from public text and the recovered "
            "line: neither a leak nor nothing",
            *args,
        )
    leaked = [c for c in controls if c.risk.recovered_count >= BATCH_SHARE * c.risk.sequences]
    if not leaked:
        return _inconclusive(
            "the same attacks did not break the undefended update either, so the defense's "
            "part is not shown",
            *args,
        )
    if adaptive not in ("ran", "not offered"):
        return _inconclusive("the attacker that knows the defense did not run", *args)
    control = _best(tuple(leaked))
    return TextVerdict(
        "defense_held", "Low", f"Low: {defense} held against {', '.join(attacks)}",
        f"Under {defense} no sequence showed more of itself than the guess from public text, "
        f"while {control.attack} recovered {control.risk.recovered_count} of "
        f"{control.risk.sequences} from the undefended update at the same budget. It says "
        "the defense stopped these attacks, nothing more.",
        *args,
    )  # fmt: skip


def _inconclusive(why: str, findings, controls, attacks, defense, adaptive) -> TextVerdict:
    return TextVerdict(
        "inconclusive", INCONCLUSIVE, f"{INCONCLUSIVE}: {why.split(';')[0].split(',')[0]}",
        why[0].upper() + why[1:] + ".", findings, controls, attacks, defense, adaptive,
    )  # fmt: skip
