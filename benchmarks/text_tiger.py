"""TIGER's continuous span objective beside DAGER (exact and ranked), with and without noise.

Decoder case: DAGER's benchmark batch (GPT-2 small, random weights seed 0, demo BPE of 8192,
next-token training, FedSGD, ``demo_batch(tok, 16, 32, seed=0)``) undefended and under
``dp-gaussian`` (L2 clip 30, sigma 1e-6, 1e-4, 60), the noise drawn as the text audit draws
it (generator seeded 0), so the rows sit beside benchmarks/results/text_dager.json's.
Encoder case: TinyBERT-4 size (4 x 312), sequence classification, 4 sequences of 12 tokens,
undefended: where DAGER needs its bounded search over combinations.

Each row: ROUGE-1/2, exact sequences, token accuracy, sequences recovered by the product's
rule (``text_risk``: ROUGE-1 >= 0.5 and 0.2 above the best guess from public text), seconds.
One torch thread.

``verdict``: the product's audit (``run_text_audit``) of the decoder batch under sigma 1e-4
with DAGER and TIGER: DAGER, its ranked twin, TIGER, the undefended controls and the verdict
(``--model llama-small``: on the LLaMA architecture, text_tiger_verdict_llama-small.json).

    nice -n 15 .venv/bin/python -m benchmarks.text_tiger [--part decoder|encoder|verdict|all]

Writes benchmarks/results/text_tiger.json (``verdict``: text_tiger_verdict.json).
``--part decoder --model llama-small``: the decoder case on the LLaMA architecture at the same
size (rotary positions), written to text_tiger_llama-small.json. ``--tiger-layers N`` runs
TIGER with that many spans on any model (``_layersN`` in the file's name); ``--tiger-only``
leaves DAGER's rows out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from auditlib.attacks.text.base import TextTarget
from auditlib.attacks.text.dager import DagerConfig, run_dager
from auditlib.attacks.text.tiger import TigerConfig, run_tiger
from auditlib.client.text_update import text_update
from auditlib.data.demo_text import demo_text
from auditlib.data.text_samples import demo_batch
from auditlib.defenses import build_defense
from auditlib.engine.text_audit import TextAuditSpec, defended, run_text_audit
from auditlib.metrics.text import score_text
from auditlib.metrics.text_baseline import guess_bar, text_guesses
from auditlib.metrics.text_risk import text_risk
from auditlib.models.text import build_text_model
from benchmarks.common import machine

OUT = Path(__file__).resolve().parent / "results" / "text_tiger.json"
SIGMAS = (0.0, 1e-6, 1e-4, 60.0)


def _noised(update, sigma: float):
    """The update under dp-gaussian (clip 30), the noise drawn as the text audit draws it."""
    if sigma == 0:
        return update
    return defended(
        build_defense("dp-gaussian", {"sigma": str(sigma), "clip": "30"})[0], 0, update
    )[0]


def _row(name: str, recovered, batch, private, bar) -> dict:
    scores = score_text(batch.texts, private, recovered.texts, recovered.token_ids)
    risk = text_risk(scores, bar)
    return {
        "attack": name, "rouge1": round(scores.rouge1, 4), "rouge2": round(scores.rouge2, 4),
        "exact": scores.exact, "token_accuracy": round(scores.token_accuracy, 4),
        "recovered": risk.recovered_count, "seconds": round(recovered.seconds, 1),
        "notes": list(recovered.notes),
    }  # fmt: skip


def _case(
    preset: str, size: int, length: int, sigmas, dager_modes, tiger: TigerConfig
) -> list[dict]:
    model = build_text_model(preset, seed=0)
    batch = demo_batch(model.tokenizer, size, length, seed=0)
    tok = model.tokenizer
    private = [
        [t for t in r if t not in (tok.bos_id, tok.eos_id)] for r in batch.input_ids.tolist()
    ]
    bar = guess_bar(batch.texts, text_guesses(demo_text().public, tok, length, 0))
    clean = text_update(model, batch)
    rows = []
    for sigma in sigmas:
        target = TextTarget(model, _noised(clean, sigma), size, length)
        entry = {
            "model": preset, "batch": f"{size} x {length}", "sigma": sigma,
            "guess_rouge1": round(sum(bar.rouge1) / len(bar.rouge1), 4), "attacks": [],
        }  # fmt: skip
        for mode in dager_modes:
            entry["attacks"].append(
                _row(
                    f"dager ({mode})",
                    run_dager(target, DagerConfig(mode=mode)),
                    batch,
                    private,
                    bar,
                )
            )
        entry["attacks"].append(_row("tiger", run_tiger(target, tiger), batch, private, bar))
        print(json.dumps({k: v for k, v in entry.items() if k != "attacks"}), flush=True)
        for a in entry["attacks"]:
            print("  ", {k: v for k, v in a.items() if k != "notes"}, flush=True)
        rows.append(entry)
    return rows


def verdict(sigma: float = 1e-4, model: str = "gpt2") -> dict:
    spec = TextAuditSpec(
        model=model, batch_size=16, length=32, attacks=("dager", "tiger"),
        defense="dp-gaussian", defense_params={"sigma": str(sigma), "clip": "30"},
    )  # fmt: skip
    result = run_text_audit(spec)

    def row(run) -> dict:
        return {
            "attack": run.attack, "rouge1": round(run.scores.rouge1, 4),
            "rouge2": round(run.scores.rouge2, 4), "exact": run.scores.exact,
            "recovered": run.finding.risk.recovered_count, "level": run.finding.risk.level,
        }  # fmt: skip

    v = result.verdict
    return {
        "model": model, "sigma": sigma, "epsilon": result.privacy.get("epsilon"),
        "runs": [row(r) for r in result.runs], "controls": [row(r) for r in result.controls],
        "verdict": {"outcome": v.outcome, "level": v.level, "headline": v.headline,
                    "sentence": v.sentence, "adaptive": v.adaptive},
        "seconds": round(result.seconds, 1),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("decoder", "encoder", "verdict", "all"), default="all")
    parser.add_argument("--out", default=None, help="default: text_tiger[_<model>].json")
    parser.add_argument("--model", default="gpt2", help="the decoder case's text preset")
    parser.add_argument(
        "--tiger-layers",
        type=int,
        default=None,
        help="TIGER's `layers` and `rotary_layers` (default: its own)",
    )
    parser.add_argument(
        "--tiger-only", action="store_true", help="the decoder case without DAGER's rows"
    )
    args = parser.parse_args()
    tiger = TigerConfig()
    if args.tiger_layers is not None:
        tiger = TigerConfig(layers=args.tiger_layers, rotary_layers=args.tiger_layers)
    if args.out is None:
        stem = OUT.stem if args.model == "gpt2" else f"{OUT.stem}_{args.model}"
        if args.tiger_layers is not None:
            stem += f"_layers{args.tiger_layers}"
        args.out = str(OUT.with_name(f"{stem}.json"))
    torch.set_num_threads(1)
    if args.part in ("verdict", "all"):
        name = "text_tiger_verdict" + ("" if args.model == "gpt2" else f"_{args.model}")
        out = Path(args.out).with_name(f"{name}.json")
        found = verdict(model=args.model)
        out.write_text(json.dumps({"machine": machine(), **found}, indent=1), encoding="utf-8")
        print(json.dumps(found, indent=1), flush=True)
        if args.part == "verdict":
            return
    rows = []
    if args.part in ("encoder", "all"):
        rows += _case("tinybert", 4, 12, (0.0,), ("exact", "ranked"), tiger)
    if args.part in ("decoder", "all"):
        dager = () if args.tiger_only else ("ranked",)
        rows += _case(args.model, 16, 32, SIGMAS, dager, tiger)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"machine": machine(), "tiger": tiger.__dict__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
