"""A text audit's result as JSON (result.json of ``audit --text-model``): what ran, what was
recovered beside what was private, the scores, the guess from public text and the verdict."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from auditlib.engine.text_audit import TextAttackRun, TextAuditResult

TEXT_RESULT_VERSION = 1


def _run(run: TextAttackRun, private: tuple[str, ...]) -> dict[str, Any]:
    per = run.scores.per_sequence
    return {
        "attack": run.attack,
        "seconds": round(run.recovered.seconds, 3),
        "assumptions_hold": run.recovered.assumptions_hold,
        "stopped": run.recovered.stopped,
        "notes": list(run.recovered.notes),
        "rouge1": run.scores.rouge1,
        "rouge2": run.scores.rouge2,
        "rougeL": run.scores.rougeL,
        "token_accuracy": run.scores.token_accuracy,
        "exact": run.scores.exact,
        "recovered": run.finding.risk.recovered_count,
        "nothing_shown": run.finding.risk.held_count,
        "level": run.finding.risk.level,
        "sequences": [
            {
                "private": private[i],
                "recovered": run.recovered.texts[s.matched] if s.matched is not None else None,
                **{k: v for k, v in asdict(s).items() if k != "matched"},
                "is_recovered": run.finding.risk.recovered[i],
                "level": run.finding.risk.levels[i],
            }
            for i, s in enumerate(per)
        ],
    }


def text_result_dict(result: TextAuditResult) -> dict[str, Any]:
    spec = asdict(result.spec)
    verdict = result.verdict
    return {
        "version": TEXT_RESULT_VERSION,
        "modality": "text",
        "spec": spec,
        "model": result.model_source,
        "data": result.batch_source,
        "privacy": result.privacy,
        "seconds": round(result.seconds, 3),
        "stopped": result.stopped,
        "inputs": dict(result.inputs),
        "guesses": [asdict(g) for g in result.guesses],
        "guess_bar": asdict(result.bar),
        "runs": [_run(r, result.private_texts) for r in result.runs],
        "controls": [_run(r, result.private_texts) for r in result.controls],
        "verdict": {
            "outcome": verdict.outcome,
            "level": verdict.level,
            "headline": verdict.headline,
            "sentence": verdict.sentence,
            "attacks": list(verdict.attacks),
            "defense": verdict.defense,
            "adaptive": verdict.adaptive,
            "version": verdict.version,
        },
    }
