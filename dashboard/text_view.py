"""What the Text page shows of a text run: its progress with the best sequences so far, its
verdict, its scores beside the guess from public text, the private and recovered
sequences side by side, the attacks' notes, the PDF (masked or not), and several runs'
verdicts side by side (a comparison of defenses).

Private text reaches the browser only over the signed-in session's own connection: tables
and text elements, and the PDF through ``downloads.private_download``.
"""

from __future__ import annotations

import streamlit as st

from auditlib.report.text_pdf import mask_text, render_text_report
from auditlib.store.text_runs import TextRunRecord
from auditlib.text_result_read import AttackRow, StoredTextResult, read_text_result
from dashboard.auth import signed_in_only
from dashboard.downloads import private_download
from dashboard.text_engine import shared_text_manager, user_text_runs

REFRESH_S = 1.0
RUN_KEY = "text_run"  # session and URL: the open text run


def open_text_run(run_id: str) -> None:
    st.session_state[RUN_KEY] = run_id
    st.query_params[RUN_KEY] = run_id


@signed_in_only
def _cancel(run_id: str) -> None:
    if user_text_runs().get(run_id) is not None:  # refused for another user's
        shared_text_manager().cancel(run_id)


def live_text_view(run_id: str, live: bool) -> None:
    """Status and the best sequences so far; reruns the page once the run has ended."""
    record = user_text_runs().get(run_id)
    if record is None:
        return
    if live and record.finished:
        st.rerun(scope="app")
    if record.finished:
        return
    progress = record.live or {}
    where = f"{progress.get('stage', 'queued')} {progress.get('attack') or ''}".strip()
    st.info(f"Text audit {record.status}: {where}. {progress.get('note') or ''}".strip())
    texts = progress.get("texts") or []
    if texts:
        st.caption(f"The best sequences {progress.get('attack', '')} has so far:")
        st.table({"recovered so far": list(texts)})
    st.button(
        "Cancel text audit", key="text_cancel", on_click=_cancel, args=(run_id,),
        disabled=record.cancel_requested,
        help="Stops the audit between two steps: what the running attack has recovered is "
        "scored, nothing after it runs, and the verdict claims only what was measured.",
    )  # fmt: skip


def _verdict_box(result: StoredTextResult) -> None:
    v = result.verdict
    box = {"leaks": st.error, "defense_held": st.success}.get(v.outcome, st.warning)
    box(f"**{v.headline}**")
    st.markdown(v.sentence)
    adaptive = {"ran": "ran", "not offered": "not offered for this defense", "none": "did not run",
                "no defense": "no defense to know"}.get(v.adaptive, v.adaptive)  # fmt: skip
    eps = result.privacy.epsilon
    epsilon = (
        f"ε = {eps:.4g}" if eps is not None
        else ("none: no defense" if result.spec.defense == "none"
              else f"none ({result.privacy.reason or 'the defense gives none'})")
    )  # fmt: skip
    st.caption(
        f"Attacks: {', '.join(v.attacks)} · defense: {v.defense} · the attacker that knows "
        f"the defense: {adaptive} · privacy: {epsilon}"
    )


def _score_rows(result: StoredTextResult) -> list[dict[str, str]]:
    """Per attack (and control) its scores, then the guess from public text's: text cells,
    so a guess's "n/a" (no token positions, no exact sequence) stands beside numbers."""
    size = len(result.private_texts)

    def row(run: AttackRow) -> dict[str, str]:
        return {
            "attack": run.label,
            "ROUGE-1": f"{run.rouge1:.3f}",
            "ROUGE-2": f"{run.rouge2:.3f}",
            "ROUGE-L": f"{run.rougeL:.3f}",
            "exact": f"{run.exact} of {size}",
            "token accuracy": f"{run.token_accuracy:.3f}",
            "recovered": f"{run.recovered} of {size}",
            "level": run.level or "none",
            "seconds": f"{run.seconds:.1f}",
        }

    def mean(measure: str) -> str:
        value = result.bar_mean(measure)
        return "n/a" if value is None else f"{value:.3f}"

    rows = [row(r) for r in (*result.runs, *result.controls)]
    rows.append(
        {
            "attack": "guess from public text (no update)",
            "ROUGE-1": mean("rouge1"),
            "ROUGE-2": mean("rouge2"),
            "ROUGE-L": mean("rougeL"),
            "exact": "n/a",
            "token accuracy": "n/a",
            "recovered": "-",
            "level": "-",
            "seconds": "-",
        }
    )
    return rows


def _side_by_side(run: AttackRow, masked: bool) -> None:
    """A table the page's text (not a canvas) holds: private and recovered sequences read
    side by side, and a browser's find or a screen reader reach them."""
    show = mask_text if masked else (lambda t: t)
    st.table(
        [
            {
                "private": show(s.private),
                "recovered": show(s.recovered) if s.recovered is not None else "(none matched)",
                "ROUGE-1": f"{s.rouge1:.2f}",
                "ROUGE-2": f"{s.rouge2:.2f}",
                "exact": "yes" if s.exact else "no",
                "beyond the guess": s.level if s.is_recovered else "no",
            }
            for s in run.sequences
        ]
    )


def result_view(record: TextRunRecord) -> None:
    if record.result is None:
        st.error(f"Text audit {record.status}: {record.error or 'no result'}")
        return
    result = read_text_result(record.result)
    if result.stopped:
        st.warning(
            "Cancelled: the attack running then was cut short and what followed it did not "
            "run. Its scores are what it had recovered by then; the verdict claims only that."
        )
    st.subheader("Verdict")
    _verdict_box(result)
    if result.inputs:  # what exactly was audited: the auditor's files by their bytes' hash
        st.caption(
            "Audited files (sha256): "
            + "; ".join(f"{name} `{digest[:16]}…`" for name, digest in result.inputs)
        )
    st.subheader("Scores beside the guess from public text")
    st.table(_score_rows(result))
    st.subheader("Private and recovered sequences")
    masked = st.checkbox("Mask the private text (word lengths only)", key="text_mask")
    runs = (*result.runs, *result.controls)
    if not runs:  # a result always holds a run; an empty one shows its verdict alone
        return
    labels = [r.label for r in runs]
    chosen = st.selectbox("Attack", labels, key="text_seq_attack") if len(runs) > 1 else labels[0]
    _side_by_side(runs[labels.index(chosen)], masked)
    with st.expander("What the attacks noted (their assumptions)"):
        for run in runs:
            held = {True: "held", False: "did not hold", None: "none (it claims no exactness)"}[
                run.assumptions_hold
            ]
            st.markdown(f"**{run.label}**: assumptions {held}")
            for note in run.notes:
                st.markdown(f"- {note}")
    pdf = render_text_report(result, mask_private=masked)
    private_download(
        st, "Download the PDF" + (" (masked)" if masked else ""), pdf,
        file_name=f"text-audit-{record.id[:8]}{'-masked' if masked else ''}.pdf",
        mime="application/pdf", key="text_pdf",
    )  # fmt: skip


def comparison_rows(records: list[TextRunRecord]) -> list[dict[str, object]]:
    """One row per finished run: its defense, verdict, the best attack's ROUGE, epsilon."""
    rows = []
    for record in records:
        if record.result is None:
            continue
        r = read_text_result(record.result)
        best = max(r.runs, key=lambda a: (a.recovered, a.rouge2), default=None)
        rows.append(
            {"defense": r.verdict.defense, "verdict": r.verdict.headline,
             "best attack": best.attack if best else "-",
             "ROUGE-1": round(best.rouge1, 3) if best else None,
             "ROUGE-2": round(best.rouge2, 3) if best else None,
             "ROUGE-L": round(best.rougeL, 3) if best else None,
             "epsilon": r.privacy.epsilon, "model": r.model,
             "sequences": f"{r.spec.batch_size} x {r.spec.length} tokens", "run": record.id[:8]}
        )  # fmt: skip
    return rows
