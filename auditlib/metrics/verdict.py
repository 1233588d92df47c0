"""The verdict of an audit: what was shown, against what, within which scope.

A verdict is a bound, never one run read alone:

- **leaks**: the attack recovered images beyond the best guess that uses no update
  (``metrics.risk``). This holds whatever else happened: a run cut short by its budget
  that already recovered images has shown the leak.
- **defense held** (level "Low"): under the defense the attack recovered nothing beyond the
  guess, while the same attack at the same budget broke the undefended update (the
  control). It says the defense stopped *this* attack at *this* budget, nothing more.
- **inconclusive**: nothing was recovered, and nothing follows from it: the run was cut
  short, or it had no defense (a failed attack on an undefended update is no evidence of
  safety), or its control did not leak or is missing.

Typed and versioned: result.json, the store, the pages and the PDF read ``Verdict``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from auditlib.metrics.risk import LEVEL_MEANING
from auditlib.metrics.scores import Risk
from auditlib.words import count_of

VERDICT_VERSION = 1
Outcome = Literal["leaks", "defense_held", "inconclusive"]
INCONCLUSIVE = "Inconclusive"
OUTCOME_TITLE = {
    "leaks": "Leaks",
    "defense_held": "Defense held against this attack",
    "inconclusive": "Inconclusive",
}


def _from(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Finding:
    """What one run showed by itself (from its attacker-selected scores)."""

    leaked: bool
    level: str | None  # FedLeak's band when leaked
    images_recovered: int
    batch_size: int
    psnr_mean: float
    guess_psnr_mean: float
    ssim_mean: float | None
    guess_ssim_mean: float | None
    stop_reason: str  # "completed", "time budget", "cancelled", "diverged"
    steps: int
    planned_steps: int

    @property
    def cut_short(self) -> bool:
        """Stopped by the clock or a person before the attack had its full step budget."""
        return self.stop_reason in ("time budget", "cancelled")

    def figures(self) -> str:
        """'k of B images beyond the guess; mean PSNR x dB (best guess y dB)'."""
        ssim = ""
        if self.ssim_mean is not None and self.guess_ssim_mean is not None:
            ssim = f", SSIM {self.ssim_mean:.3f} (guess {self.guess_ssim_mean:.3f})"
        return (
            f"{self.images_recovered} of {self.batch_size} image"
            f"{'s' if self.batch_size != 1 else ''} recovered beyond the best guess; mean PSNR "
            f"{self.psnr_mean:.2f} dB (best guess without the update {self.guess_psnr_mean:.2f} dB)"
            f"{ssim}"
        )

    @classmethod
    def from_scores(cls, risk: Risk, stop_reason: str, steps: int, planned: int) -> Finding:
        return cls(
            leaked=risk.images_recovered > 0,
            level=risk.level,
            images_recovered=risk.images_recovered,
            batch_size=risk.batch_size,
            psnr_mean=risk.psnr_mean,
            guess_psnr_mean=risk.guess_psnr_mean,
            ssim_mean=risk.ssim_mean,
            guess_ssim_mean=risk.guess_ssim_mean,
            stop_reason=stop_reason,
            steps=steps,
            planned_steps=planned,
        )


@dataclass(frozen=True)
class Knowledge:
    """One line of the threat-model card: what the attacker was given."""

    item: str
    known: bool
    detail: str = ""


@dataclass(frozen=True)
class ThreatCard:
    """What the attacker knew, in the vocabulary of the SoK of gradient inversion (Carletti
    et al., USENIX Security 2025), whose threat models A-H auditors know."""

    sok_model: str  # "A".."H"
    sok_name: str
    knowledge: tuple[Knowledge, ...]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThreatCard:
        return cls(
            data["sok_model"],
            data["sok_name"],
            tuple(_from(Knowledge, k) for k in data["knowledge"]),
        )


SOK_MODELS = {
    "A": "Eavesdropper",
    "B": "Informed Eavesdropper",
    "C": "Parameter-Aware Eavesdropper",
    "D": "Data-Enhanced Eavesdropper",
    "E": "Statistical-Informed Eavesdropper",
}


def threat_card(
    *,
    protocol: str,
    labels_known: bool,
    batchnorm_statistics: bool,
    batch_size: int,
    defense: tuple[bool, str] = (False, "no defense"),
) -> ThreatCard:
    """The card of an honest-but-curious server of this tool: it sends the model, so it
    knows architecture and weights, and it asks for the local training (C); labels the
    client shares or BatchNorm statistics of the client's data inform it further (E).
    ``defense``: whether an adaptive attacker knew the defense, and what it did. No
    attack here uses surrogate data or manipulates the model or the client selection."""
    informed = labels_known or batchnorm_statistics
    model = "E" if informed else "C"
    knowledge = (
        Knowledge("the shared update", True, "what the server receives from the client"),
        Knowledge("model architecture and weights", True, "the server sent them"),
        Knowledge("local training settings", True, protocol),
        Knowledge("batch size", True, str(batch_size)),
        Knowledge(
            "labels",
            labels_known,
            "shared by the client" if labels_known else "inferred or optimised by the attack",
        ),
        Knowledge(
            "BatchNorm statistics of the client's data",
            batchnorm_statistics,
            "used as a prior" if batchnorm_statistics else "not used",
        ),
        Knowledge("the defense's mechanism and public parameters", *defense),
        Knowledge("surrogate data", False, "not used by any attack here"),
        Knowledge("active manipulation of the model or clients", False, "honest-but-curious"),
    )
    return ThreatCard(model, SOK_MODELS[model], knowledge)


@dataclass(frozen=True)
class Scope:
    """How far the verdict reaches: the attacks tried and what they were allowed."""

    attacks: tuple[str, ...]  # "dlg (audit preset)" ...
    defense: str  # "none" or the defense with its parameters
    restarts: str  # the restart schedule, in words
    iterations: int  # step budget per start
    time_budget_s: float | None
    steps: int  # steps spent over all starts (and attacks)
    seconds: float
    threat: ThreatCard

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scope:
        values = {k: v for k, v in data.items() if k != "threat"}
        values["attacks"] = tuple(values["attacks"])
        return cls(threat=ThreatCard.from_dict(data["threat"]), **values)

    def budget_words(self) -> str:
        clock = f", at most {self.time_budget_s:g} s" if self.time_budget_s else ""
        return (
            f"{count_of(self.iterations, 'step')} per start{clock}; "
            f"{count_of(self.steps, 'step')} in {self.seconds:.1f} s spent"
        )


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    level: str  # "Very High" | "High" | "Medium" | "Low" | "Inconclusive"
    headline: str
    sentence: str
    finding: Finding
    control: Finding | None
    control_note: str
    scope: Scope
    version: int = VERDICT_VERSION

    @property
    def is_finding(self) -> bool:
        """A level a reviewer may quote: a leak, or a defense that held against a leaking control."""
        return self.outcome != "inconclusive"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        control = data.get("control")
        return cls(
            outcome=data["outcome"],
            level=data["level"],
            headline=data["headline"],
            sentence=data["sentence"],
            finding=_from(Finding, data["finding"]),
            control=_from(Finding, control) if control else None,
            control_note=data["control_note"],
            scope=Scope.from_dict(data["scope"]),
            version=int(data.get("version", VERDICT_VERSION)),
        )


def _attacks(scope: Scope) -> str:
    return " and ".join(scope.attacks) if len(scope.attacks) <= 2 else ", ".join(scope.attacks)


def judge(
    finding: Finding,
    scope: Scope,
    *,
    defended: bool,
    control: Finding | None = None,
    control_note: str = "",
) -> Verdict:
    """The verdict of one run, given its undefended control where it has a defense."""
    attacks = _attacks(scope)
    if not defended:
        control_note = "no defense: this run is the undefended case itself"
    if finding.leaked:
        level = finding.level or "Medium"
        cut = (
            f" The run was stopped by its {finding.stop_reason} at step {finding.steps:,} of "
            f"{finding.planned_steps:,}; the leak it had shown by then stands, and a complete run "
            "may show more."
            if finding.cut_short
            else ""
        )
        if defended:
            headline = f"{level}: the defense did not stop {attacks}"
            versus = f" Without the defense: {control.figures()}." if control else ""
            sentence = (
                f"Under {scope.defense}, {attacks}: {finding.figures()}; {LEVEL_MEANING[level]}."
                f"{versus}{cut}"
            )
        else:
            headline = f"{level}: {attacks} rebuilt the client's images"
            sentence = f"{attacks}: {finding.figures()}; {LEVEL_MEANING[level]}.{cut}"
        return Verdict("leaks", level, headline, sentence, finding, control, control_note, scope)

    nothing = f"{attacks} recovered nothing beyond the best guess ({finding.figures()})"
    if finding.cut_short:
        reason = (
            f"the attack was stopped by its {finding.stop_reason} at step {finding.steps:,} of "
            f"{finding.planned_steps:,}, before it could finish"
        )
        advice = "raise the time budget or lower the steps and run it again"
    elif not defended:
        reason = "a failed attack on the undefended update is not evidence of safety"
        advice = "raise the budget or try another attack (or every applicable attack)"
    elif control is None:
        reason = (
            f"no undefended control at the same budget is available ({control_note or 'not run'})"
        )
        advice = "run the same attack without the defense at this budget"
    elif not control.leaked:
        reason = (
            "the attack did not break even the undefended update at this budget "
            f"(control: {control.figures()}), so nothing is known about the defense"
        )
        advice = "raise the budget or use another attack"
    else:
        headline = f"Low: the defense stopped {attacks} at this budget"
        sentence = (
            f"Under {scope.defense}, {nothing}, while the same attack at the same budget "
            f"broke the undefended update ({control.figures()}; level {control.level}). "
            "The defense stopped this attack at this budget; a stronger or adaptive attack "
            "may still succeed."
        )
        return Verdict(
            "defense_held", "Low", headline, sentence, finding, control, control_note, scope
        )
    headline = f"Inconclusive: {reason.split(' (')[0]}"
    sentence = f"{nothing}. Inconclusive: {reason}; {advice}."
    return Verdict(
        "inconclusive", INCONCLUSIVE, headline, sentence, finding, control, control_note, scope
    )
