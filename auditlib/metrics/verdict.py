"""The verdict of an audit: what was shown, against what, within which scope.

A verdict is a bound, never one run read alone:

- **leaks**: the attack recovered images beyond the best guess that uses no update
  (``metrics.risk``). This holds whatever else happened: a run cut short by its budget
  that already recovered images has shown the leak.
- **labels leak** (level "Labels"): no image came back, but the private labels the attacker
  did not know did, beyond the attacker's best guess without the update
  (``metrics.risk.label_test``) or read by a rule exact by construction
  (``attacks.labels.idlg_exact``). The class of a private record is a disclosure; the
  verdict says beside it what is known of the images (``Verdict.images_words``).
- **defense held** (level "Low"): under the defense every image stayed below the best guess
  by the held margins (``metrics.risk.nothing_shown``), the attacker that knows the defense
  ran (or was the plain attack already), and the same attack at the same budget broke the
  undefended update (the control: at least ``CONTROL_LEAK_SHARE`` of its images recovered).
  It says the defense stopped *these* attacks at *this* budget, nothing more.
- **inconclusive**: nothing was recovered, and nothing follows from it: the run was cut
  short or every attack diverged, or it had no defense (a failed attack on an undefended
  update is no evidence of safety), or its control did not leak or is missing, or the
  reconstruction sits between the guess and the recovered line, or the defense held
  against the plain attack only (no twin that knows the defense ran). And, before any
  figure, a client that refused the model of every attack that ran (``Scope.refused``):
  the server received nothing, so nothing was recovered.
- **unavailable**: the reconstructions could not be scored at all: an observed update
  audited without the client's images has nothing to compare them with (``unscored``).
  No finding is made up in its place: the verdict has none.

Typed and versioned: result.json, the store, the pages and the PDF read ``Verdict``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from auditlib.metrics.risk import HELD_RULE, LABEL_RULE, LabelEvidence, level_sentence
from auditlib.metrics.scores import Risk
from auditlib.metrics.threat_card import (  # noqa: F401 (the card's names, read from here too)
    ASSUMED_SETTINGS,
    BATCH_ORDER,
    INDIVIDUAL_UPDATES,
    MALICIOUS_MODEL,
    MANIPULATION,
    NOTICEABLE,
    SOK_MODELS,
    Knowledge,
    ThreatCard,
    from_fields,
    threat_card,
)
from auditlib.words import count_of

# 2: held margins, the control's share, twins, diverged and budget-skipped runs, labels.
# 3: labels judged by the relabelling test or an exact rule (``Finding.label_basis``), not a
# binomial test against 1/C; a "Labels" verdict says what is known of the images; held on
# every attack's pick and start; one server's finding; a refused model said first.
# 4: a model check that refused every model "held" only against every server built to pass
# it (``Scope.evading``), the servers tried said.
# 5: a leak of several attacks is credited to those whose picks are the images recovered
# (``Finding.recovered_by``), and labels to those whose labels were counted
# (``Finding.labels_by``), not to every attack tried.
# 6: an attacker that knows the defense whose every start diverged did not run (its
# optimisation broke down): the defense is not said to hold against it.
VERDICT_VERSION = 6
Outcome = Literal["leaks", "labels_leak", "defense_held", "inconclusive", "unavailable"]
INCONCLUSIVE = "Inconclusive"
UNAVAILABLE = "Unavailable"
LABELS_LEVEL = "Labels"  # a level apart from FedLeak's image bands
OUTCOME_TITLE = {
    "leaks": "Leaks",
    "labels_leak": "Labels leak",
    "defense_held": "Defense held against these attacks",
    "inconclusive": "Inconclusive",
    "unavailable": "Unavailable",
}
# The control "leaked" (the attack broke the undefended update) only when at least this
# share of its images was recovered beyond the guess: one image of a batch of 16 does not.
CONTROL_LEAK_SHARE = 0.5
# Whether the attacker that knows the defense ran (``Scope.twins``): "ran" (every attack that
# ran had its twin run, or its twin's objective was the plain attack's already), "partly",
# "none" (offered, none ran; also results recorded before this was checked), "not offered"
# (no adaptive attacker for this defense), "off" (switched off, or the paper preset), or
# "no defense".
Twins = Literal["ran", "partly", "none", "not offered", "off", "no defense"]


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
    # Images below the guess by the held margins (``metrics.risk.nothing_shown``) on every
    # attack's own pick (each twin's included) and, where "held" decides, every start's
    # candidate (``engine.judging``); None: recorded before the margins (never "held").
    images_held: int | None = None
    # Labels the attacker did not know: correct ones (k of batch_size), the chance of one
    # (1/classes), and whether k is a finding; None where labels were known to the
    # attacker, none were recovered, or recorded before labels were findings.
    labels_recovered: int | None = None
    label_chance: float | None = None
    labels_beyond_chance: bool | None = None
    # How the labels were judged (``metrics.risk.LabelEvidence``): the relabelling test's
    # p-value (None where an exact rule needs none) and, in words, the test or the rule;
    # "": recorded before version 3, when k was tested against Binomial(B, 1/C).
    label_p_value: float | None = None
    label_basis: str = ""
    # Under the malicious server with several attacks: the attack (one server, one model)
    # whose own pick this finding is, the best single server; "": the run's attacks together.
    one_server: str = ""
    # With several attacks, per image the best of their picks: the attacks whose picks are
    # the images recovered, in the plan's order; (): one attack, none recovered, or
    # recorded before it (then the run's attacks are named together).
    recovered_by: tuple[str, ...] = ()
    # The attacks whose labels ``labels_recovered`` counts (``LabelEvidence.by``); (): none
    # recorded (the run's attacks are named).
    labels_by: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("recovered_by", "labels_by"):  # stored: lists
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def cut_short(self) -> bool:
        """Stopped by the clock or a person before the attack had its full step budget."""
        return self.stop_reason in ("time budget", "cancelled")

    @property
    def held(self) -> bool:
        """Every image below the best guess by the held margins."""
        return self.batch_size > 0 and self.images_held == self.batch_size

    @property
    def broke_update(self) -> bool:
        """As a control: the attack broke the undefended update, at least
        ``CONTROL_LEAK_SHARE`` of its images recovered beyond the guess."""
        return self.leaked and self.images_recovered >= CONTROL_LEAK_SHARE * self.batch_size

    def label_words(self) -> str:
        """'the private labels were recovered, k of B (how they were judged)', or ''."""
        if not self.labels_beyond_chance or self.label_chance is None:
            return ""
        what = "label was" if self.batch_size == 1 else "labels were"
        found = f"the private {what} recovered, {self.labels_recovered} of {self.batch_size}"
        if not self.label_basis:  # recorded before version 3
            return (
                f"{found} against a chance of {100 * self.label_chance:.3g}% (a binomial test "
                "against 1/C, as judged before the relabelling test)"
            )
        if self.label_p_value is None:  # an exact rule's: no chance to weigh it against
            return f"{found} ({self.label_basis})"
        return f"{found} ({self.label_basis}; a chance of {100 * self.label_chance:.3g}% each)"

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
    def from_scores(
        cls,
        risk: Risk,
        stop_reason: str,
        steps: int,
        planned: int,
        *,
        labels: LabelEvidence | None = None,
    ) -> Finding:
        """``labels``: what the labels show, where the attacker did not know them and
        recovered some."""
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
            images_held=risk.images_held,
            labels_recovered=None if labels is None else labels.correct,
            label_chance=None if labels is None else 1.0 / labels.classes,
            labels_beyond_chance=None if labels is None else labels.beyond_chance,
            label_p_value=None if labels is None else labels.p_value,
            label_basis="" if labels is None else labels.basis,
            labels_by=() if labels is None else labels.by,
        )


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
    # Whether the attacker that knows the defense ran (``Twins``), and in words why not
    # where it did not; recorded before: "none".
    twins: Twins = "none"
    twins_words: str = "not recorded (a verdict from before twins were checked)"
    # Why the client refused to train on the model it received (a model check that flagged
    # a malicious server's model), in words; empty: it trained on it.
    refused: str = ""
    # The servers built to pass the client's model check that were tried in the place of
    # the built ones (``engine.twins.with_evading``); empty: none was.
    evading: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scope:
        values = {k: v for k, v in data.items() if k != "threat"}
        values["attacks"] = tuple(values["attacks"])
        values["evading"] = tuple(values.get("evading", ()))
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
    finding: Finding | None  # None: the run could not be scored ("unavailable")
    control: Finding | None
    control_note: str
    scope: Scope
    version: int = VERDICT_VERSION
    # Beside a "Labels" verdict: what is known of the images (held, or why their failure
    # shows nothing), in words; "" for other outcomes and verdicts recorded before it.
    images_words: str = ""

    @property
    def is_finding(self) -> bool:
        """A level a reviewer may quote: a leak, or a defense that held against a leaking control."""
        return self.outcome not in ("inconclusive", "unavailable")

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
            finding=from_fields(Finding, data["finding"]) if data.get("finding") else None,
            control=from_fields(Finding, control) if control else None,
            control_note=data["control_note"],
            scope=Scope.from_dict(data["scope"]),
            version=int(data.get("version", VERDICT_VERSION)),
            images_words=data.get("images_words", ""),
        )


def _attacks(scope: Scope) -> str:
    return _names(scope.attacks)


def _picks_words(recovered: int, by: tuple[str, ...]) -> str:
    """'the recovered image is idlg's pick', 'the recovered images are the picks of dlg and
    idlg'."""
    if recovered == 1:
        return f"the recovered image is {by[0]}'s pick"
    if len(by) == 1:
        return f"the recovered images are {by[0]}'s picks"
    return f"the recovered images are the picks of {_names(by)}"


def _names(attacks: tuple[str, ...]) -> str:
    """'dlg', 'dlg and ig', 'dlg, idlg, ig'."""
    return " and ".join(attacks) if len(attacks) <= 2 else ", ".join(attacks)


def _why_inconclusive(
    finding: Finding, scope: Scope, defended: bool, control: Finding | None, control_note: str
) -> tuple[str, str, str] | None:
    """(headline's reason, sentence's reason, advice) of a run that recovered nothing and
    shows nothing either; None when the defense held."""
    if finding.cut_short:
        reason = (
            f"the attack was stopped by its {finding.stop_reason} at step {finding.steps:,} of "
            f"{finding.planned_steps:,}, before it could finish"
        )
        headline = reason
        if scope.twins in ("partly", "none") and "budget" in scope.twins_words:
            reason += f" ({scope.twins_words})"
        return headline, reason, "raise the time budget or lower the steps and run it again"
    if finding.stop_reason == "diverged":
        reason = "every attack diverged: its optimisation broke down, so it measured nothing"
        return reason, reason, "lower the learning rate or the steps, or try another attack"
    if not defended:
        reason = "a failed attack on the undefended update is not evidence of safety"
        return reason, reason, "raise the budget or try another attack (or every applicable attack)"
    if control is None:
        reason = (
            f"no undefended control at the same budget is available ({control_note or 'not run'})"
        )
        return (
            reason.split(" (")[0],
            reason,
            "run the same attack without the defense at this budget",
        )
    if not control.broke_update:
        reason = (
            "the attack did not break even the undefended update at this budget "
            f"(control: {control.figures()}; it counts as broken with at least "
            f"{CONTROL_LEAK_SHARE:.0%} of its images recovered), so nothing is known about the "
            "defense"
        )
        return reason.split(" (")[0], reason, "raise the budget or use another attack"
    if finding.images_held is None:
        reason = (
            "the run was recorded before the held margins and the attacker that knows the "
            "defense were checked"
        )
        return reason, reason, "run it again for a verdict under the present rules"
    if not finding.held:
        headline = "the reconstruction sits between the guess and the recovered line"
        reason = (
            f"{headline}: not recovered, yet not clearly below the best guess "
            f"({finding.images_held} of {finding.batch_size} below it by the margins on every "
            "attack's own pick and every start the auditor sees; "
            f"{HELD_RULE}), so the defense is not shown to hold"
        )
        return headline, reason, "raise the budget or use a stronger attack"
    if scope.twins != "ran":
        headline = f"the defense held against the plain attack only ({scope.twins_words})"
        reason = (
            f"{headline}; the defense is not shown to hold against an attacker that knows it, "
            "which several defenses of this tool's tables fall to"
        )
        return headline, reason, "run it with the attacker that knows the defense"
    return None


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
    labels = finding.label_words()
    cut = (
        f" The run was stopped by its {finding.stop_reason} at step {finding.steps:,} of "
        f"{finding.planned_steps:,}; the leak it had shown by then stands, and a complete run "
        "may show more."
        if finding.cut_short
        else ""
    )
    versus = f" Without the defense: {control.figures()}." if defended and control else ""
    if scope.refused:  # before any figure: what came of an update of zeros is no one's image
        return _refused(finding, scope, control, control_note, attacks, versus)
    if finding.leaked:
        level = finding.level or "Medium"
        meaning = level_sentence(level, finding.images_recovered, finding.batch_size)
        also = f" Besides, {labels}." if labels else ""
        # Who rebuilt them: the attacks whose picks are the images recovered, not every
        # attack tried (one that fell below the guess rebuilt nothing).
        by, figures = attacks, finding.figures()
        if finding.recovered_by and not finding.one_server:
            by = _names(finding.recovered_by)
            figures += "; " + _picks_words(finding.images_recovered, finding.recovered_by)
        if finding.one_server:  # a server sends one model a round: the best one's finding
            also += (
                f" It is the best single server of {attacks} (each sends a model of its own, "
                "one a round): images taken per image from several servers' models are no "
                "server's finding."
            )
            attacks = by = f"{finding.one_server}'s server"
        if defended:
            headline = f"{level}: the defense did not stop {by}"
            sentence = f"Under {scope.defense}, {attacks}: {figures}; {meaning}.{also}{versus}{cut}"
        else:
            headline = f"{level}: {by} rebuilt the client's images"
            sentence = f"{attacks}: {figures}; {meaning}.{also}{cut}"
        return Verdict("leaks", level, headline, sentence, finding, control, control_note, scope)

    if labels and not finding.label_basis:
        # Version 2's binomial test against 1/C, which B distinct guesses of B distinct
        # labels pass by construction: re-judged, neither a label leak nor evidence of safety.
        headline = "Inconclusive: its labels were judged by a test since found unsound"
        sentence = (
            f"{attacks} recovered no image beyond the best guess ({finding.figures()}); "
            f"{labels}, a test that distinct label rules pass whatever the update says, so "
            "whether the labels leaked is not known; run it again for a verdict under the "
            f"present rules ({LABEL_RULE}).{versus}{cut}"
        )
        return Verdict(
            "inconclusive", INCONCLUSIVE, headline, sentence, finding, control, control_note, scope
        )
    if labels:
        where = f"Under {scope.defense}, " if defended else ""
        what = "label" if finding.batch_size == 1 else "labels"
        # Beside the labels, what is known of the images: what the verdict would say of
        # them without the labels (held, or why nothing follows from their failure).
        why = _why_inconclusive(finding, scope, defended, control, control_note)
        if why is None:
            assert control is not None
            short = "held against these attacks"
            images = (
                "every image stayed below its guess by the held margins, the attacker that "
                f"knows the defense ran ({scope.twins_words}), and the same attack broke the "
                f"undefended update ({control.figures()}): the defense held for the images at "
                "this budget, not for the labels"
            )
        else:
            short = f"not shown safe ({why[0]})"
            images = (
                f"none was recovered, and that is no evidence they are safe: {why[1]}; {why[2]}"
            )
        by = _names(finding.labels_by) if finding.labels_by else attacks
        headline = (
            f"{LABELS_LEVEL}: {by} recovered the private {what} "
            f"({finding.labels_recovered} of {finding.batch_size}); the images {short}"
        )
        sentence = (
            f"{where}{attacks} recovered no image beyond the best guess ({finding.figures()}), "
            f"but {labels}: the class of a private record is a disclosure. "
            f"The images: {images}.{versus}{cut}"
        )
        return Verdict(
            "labels_leak",
            LABELS_LEVEL,
            headline,
            sentence,
            finding,
            control,
            control_note,
            scope,
            images_words=f"not shown safe: {why[1]}" if why else f"{short}: {images}",
        )

    nothing = f"{attacks} recovered nothing beyond the best guess ({finding.figures()})"
    why = _why_inconclusive(finding, scope, defended, control, control_note)
    if why is None:
        assert control is not None
        headline = f"Low: the defense stopped {attacks} at this budget"
        sentence = (
            f"Under {scope.defense}, {nothing}; every image stayed below its guess by the "
            f"held margins on every attack's own pick and every start, and the attacker that "
            f"knows the defense ran "
            f"({scope.twins_words}), while the same attack at the same budget broke the "
            f"undefended update ({control.figures()}; level {control.level}). "
            "The defense stopped these attacks at this budget; a stronger attack may still "
            "succeed."
        )
        return Verdict(
            "defense_held", "Low", headline, sentence, finding, control, control_note, scope
        )
    short, reason, advice = why
    headline = f"Inconclusive: {short}"
    sentence = f"{nothing}. Inconclusive: {reason}; {advice}."
    return Verdict(
        "inconclusive", INCONCLUSIVE, headline, sentence, finding, control, control_note, scope
    )


REFUSED = "the client refused the server's model: the server received nothing"


def _refused(
    finding: Finding,
    scope: Scope,
    control: Finding | None,
    control_note: str,
    attacks: str,
    versus: str,
) -> Verdict:
    """The verdict of a run whose client refused the model of every attack that ran (its
    model check, ``Scope.refused``): it sent zeros, so nothing was recovered whatever the
    reconstructions score. "Low" (the check held) only where every server built to pass the
    check that the product has was among them (``Scope.evading``, the twins all ran) and the
    same servers' plain attack broke the undefended update; otherwise no level is given and
    the sentence says which servers the check was shown to stop."""
    sent = (
        f"Under {scope.defense}, {REFUSED} ({scope.refused}): the client did not train on it "
        f"and sent an update of zeros, so nothing was recovered: the reconstructions of "
        f"{attacks} are read from zeros, not from the client's images."
    )
    cost = " Weigh the check's cost: a refused round is a client's lost update."
    tried = scope.twins_words
    if scope.evading and scope.twins == "ran" and control is not None and control.broke_update:
        headline = (
            f"Low: the model check refused every server tried, {len(scope.evading)} built "
            "to pass it among them"
        )
        sentence = (
            f"{sent} It held against the servers built to pass it ({tried}), while the same "
            f"attack broke the undefended update ({control.figures()}; level {control.level})."
            " It is shown to stop these servers only: a server this product does not build may "
            f"still pass it.{cost}"
        )
        return Verdict(
            "defense_held", "Low", headline, sentence, finding, control, control_note, scope
        )
    if not scope.evading:
        why = (
            "no server built to pass the check was tried here, so the check is shown to stop "
            "this server only"
        )
    elif scope.twins != "ran":
        why = f"not every server built to pass the check was tried ({tried})"
    else:
        why = (
            f"the servers built to pass it were refused too ({tried}), but the same attack did "
            f"not break the undefended update ({control_note or 'no control'}), so nothing "
            "shows the check was needed"
        )
    headline = f"{INCONCLUSIVE}: {REFUSED}"
    sentence = f"{sent} Inconclusive: {why}.{versus}{cost}"
    return Verdict(
        "inconclusive", INCONCLUSIVE, headline, sentence, finding, control, control_note, scope
    )


def unscored(scope: Scope, reason: str, stop_reason: str) -> Verdict:
    """The verdict of a run whose reconstructions could not be scored (``reason``: an
    observed update audited without the client's images): it says so, and gives no level,
    figure or finding in their place."""
    attacks = _attacks(scope)
    stopped = "" if stop_reason == "completed" else f", stopped by its {stop_reason}"
    headline = f"{UNAVAILABLE}: {reason}"
    sentence = (
        f"{attacks} ran on the update ({scope.budget_words()}{stopped}); their "
        f"reconstructions and the attacker's own losses are shown, but with {reason} they "
        "cannot be scored: no leak level, PSNR or count of images recovered is given. Give "
        "the client's images (--images or --samples) to score them."
    )
    return Verdict("unavailable", UNAVAILABLE, headline, sentence, None, None, "", scope)
