"""The report's opening sections as flowables: the title page, 1 the executive summary
(with each run's verdict), 2 the threat model and FL scenario, 3 the attack and defense
settings. The words come from ``facts`` and ``verdict_facts``; here they are escaped and
laid out."""

from __future__ import annotations

from datetime import UTC, datetime

from reportlab.lib.units import cm
from reportlab.platypus import CondPageBreak, Flowable, PageBreak, Spacer

import auditlib
from auditlib.report import facts, facts_server, sections_sample
from auditlib.report import verdict_section as verdicts
from auditlib.report.layout import Builder, esc, lines
from auditlib.report.subject import ReportEntry, learns_nothing
from auditlib.report.text import NOT_AVAILABLE, when
from auditlib.report.verdict_facts import no_verdict_reason


def title_page(b: Builder) -> list[Flowable]:
    ref, entries = b.reference, b.entries
    pairs = [
        ("Subject", facts.subject_text(b.subject)),
        ("Identifier", b.subject.id),
        ("Recorded", when(b.subject.created_at)),
        ("Attack", ", ".join(facts.attack_names(entries)) or NOT_AVAILABLE),
        ("Target model", facts.model_text(ref)),
        ("Private data", f"{facts.images_count(ref)} from {facts.data_source(ref)}"),
        ("Runs", facts.runs_text(entries)),
        ("Report generated", f"{when(datetime.now(UTC))} by auditlib {auditlib.__version__}"),
        ("Runs audited with", facts.audited_versions(entries)),
    ]
    return [
        Spacer(1, 3 * cm),
        b.p("Gradient-leakage audit report", "title"),
        b.p(esc(b.subject.title), "subtitle"),
        b.plain_pairs(pairs),
        Spacer(1, 0.8 * cm),
        b.p(
            "This report states how much of a federated-learning client's private "
            "images an attacker at the server reconstructed from the client's model "
            "update, with and without defenses, and at what cost in model accuracy. "
            "Every number was measured by the runs listed in the appendix; the "
            "definitions are in section 7 and the limits of the measurement in section 8."
        ),
        PageBreak(),
    ]


def executive_summary(b: Builder) -> list[Flowable]:
    out: list[Flowable] = [b.p("1 Executive summary", "h1")]
    ref = b.reference
    attack = ", ".join(facts.attack_names(b.entries)) or "the attack"
    did, whose = facts_server.attacker_words(ref)
    out.append(
        b.p(
            f"The server {esc(did)} <b>{esc(attack)}</b> against {esc(whose)} "
            f"{esc(facts.images_count(ref, 'private image'))} ({esc(facts.data_source(ref))}) "
            f"on a {esc(facts.model_text(ref))}."
        )
    )
    if b.subject.kind == "run":
        out += run_summary(b, b.entries[0])
    else:
        if b.subject.kind == "sample":
            out += sections_sample.sample_block(b)
        out += verdicts.batch_summary(b, b.entries)
        out += b.bullets(
            verdicts.run_line(e, esc(facts.utility_words(r)))
            for e, r in zip(b.entries, b.rows, strict=True)
        )
    out.append(
        b.p(
            "A verdict is a bound, never a guarantee: <b>leaks</b> when the attack recovered "
            "images beyond the best guess that uses no update (levels: FedLeak's bands of "
            "the mean PSNR); <b>Labels</b> when only the private labels were recovered, "
            "beyond chance; <b>Low</b> only when a defended run stayed below the guess by "
            "the held margins against the attacker that knows the defense while the same "
            "attack at the same budget broke the undefended update; otherwise "
            "<b>Inconclusive</b>, with the reason. The sections below give "
            "each run's scope, guesses and control.",
            "small",
        )
    )
    for number, (entry, row) in enumerate(zip(b.entries, b.rows, strict=True), 1):
        out.append(CondPageBreak(6 * cm))
        title = f"1.{number} Verdict: {entry.label}"
        out += verdicts.verdict_block(b, entry, title, learns_nothing(row))
    return out


def run_summary(b: Builder, entry: ReportEntry) -> list[Flowable]:
    """The summary of a one-run report: its verdict's headline and sentence."""
    verdict = entry.verdict
    if verdict is None:
        return [b.p(f"<b>{esc(no_verdict_reason(entry).capitalize())}</b>.")]
    out = [b.p(f"<b>{esc(verdict.headline)}</b>"), b.p(esc(verdict.sentence))]
    utility = facts.utility_words(b.rows[0])
    if utility:
        out.append(b.p(esc(utility.strip())))
    return out


def threat_model(b: Builder) -> list[Flowable]:
    out: list[Flowable] = [b.p("2 Threat model and FL scenario", "h1")]
    out += verdicts.threat_card_flowables(b, b.entries) or server_knows(b)
    out.append(b.p("Scenario", "h2"))
    out.append(b.plain_pairs(facts.scenario_pairs(b.reference)))
    return out


def server_knows(b: Builder) -> list[Flowable]:
    """What the server knew, as runs recorded before verdicts (and their cards) list it."""
    known = facts.server_knows(b.entries)
    out = [
        b.p(
            f"The attacker is the server. It receives the client's <b>{esc(known.observation)}"
            "</b> for one round, as the defense left it, and knows:"
        )
    ]
    out += b.bullets(esc(k) for k in known.common) if known.common else [b.p("n/a (no summary)")]
    if known.extras:
        out.append(b.p("Under some defenses the server knows more:"))
        out += b.bullets(
            f"{esc(label)}: also {esc('; '.join(more))}" for label, more in known.extras
        )
    return out


def settings(b: Builder) -> list[Flowable]:
    out: list[Flowable] = [b.p("3 Attack and defense settings", "h1")]
    for attack in facts.attack_settings(b.entries):
        summary = f": {esc(attack.summary)}" if attack.summary else ""
        pairs = [
            ("Attack", f"<b>{esc(attack.name)}</b>{summary}"),
            ("Preset", esc(attack.preset)),
            ("Settings", lines(attack.settings)),
            ("Budget", esc(attack.budget)),
            ("Seed, device", esc(attack.seed_device)),
            ("LPIPS backbones", esc(attack.lpips_nets)),
        ]
        out.append(b.key_values(pairs))
        out.append(Spacer(1, 4))
    out.append(b.p("Defenses", "h2"))
    rows = [
        (
            esc(r.label),
            esc(r.defense),
            NOT_AVAILABLE if r.settings is None else lines(r.settings),
            esc(r.epsilon),
            esc(r.update_norm),
        )
        for r in facts.defense_rows(b.entries, b.rows)
    ]
    out.append(
        b.table(
            ("Run", "Defense", "Settings", "ε", "Update norm"),
            rows,
            (4.6 * cm, 2.4 * cm, 5.2 * cm, 2.2 * cm, 3.0 * cm),
        )
    )
    out.append(
        b.p(
            "Update norm: the L2 norm of the client's update before and after the defense.",
            "caption",
        )
    )
    utility = facts.utility_settings(b.entries)
    if utility:
        out += [b.p("Utility measurement", "h2"), b.plain_pairs(utility)]
    return out
