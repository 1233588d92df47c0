"""DAGER (Petrov et al., NeurIPS 2024) on the demo text: the exact attack where its
assumptions hold, and what noise does to it and to the attacker that knows the noise.

Case: GPT-2 at its small size (12 layers, width 768, 12 heads; random weights, seed 0, the
demo BPE tokenizer of 8192 tokens), next-token training, FedSGD, a batch of 16 New Testament
verses of 32 tokens (``demo_batch(tok, 16, 32, seed=0)``), one torch thread per process.

- ``plain``: the undefended update; seconds for the client's update and for DAGER alone;
  ROUGE-1/2/L, exact sequences, token accuracy (``metrics.text``).
- ``dp``: Gaussian noise at three levels (``dp-gaussian`` with an L2 clip C = 30, the
  library's default, and sigma 1e-6, 1e-4 and 2C = 60, the last a noise multiplier of 1
  under replace-one neighbours): each through ``run_text_audit``, so the verdict, the plain
  DAGER, the ranked DAGER that knows the noise, the undefended control and epsilon (Opacus's
  accountant) come from the product's own path.

    .venv/bin/python -m benchmarks.text_dager [--part plain|dp|all] [--model gpt2]

``--model llama-small``: the LLaMA architecture at the same size (rotary positions, RMSNorm,
an untied output head; ``models.text.PRESETS``), the same batch and parts. ``--part vocab
--model llama-small [--layers 24]``: DAGER with a real vocabulary's size (``large_vocabulary``),
8 x 32; ``--layers 24`` is Qwen2.5-0.5B's whole shape.

Writes benchmarks/results/text_dager.json (another ``--model``: text_dager_<model>.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from auditlib.attacks.text.base import TextTarget
from auditlib.attacks.text.dager import run_dager
from auditlib.client.text_update import text_update
from auditlib.data.text_samples import demo_batch
from auditlib.engine.text_audit import TextAuditSpec, run_text_audit
from auditlib.metrics.text import score_text
from auditlib.models.text import build_text_model
from benchmarks.common import machine, peak_rss_gb, qwen25_half_b_config

OUT = Path(__file__).resolve().parent / "results" / "text_dager.json"
SIGMAS = (1e-6, 1e-4, 60.0)


def plain(preset: str = "gpt2", size: int = 16, length: int = 32) -> dict:
    model = build_text_model(preset, seed=0)
    batch = demo_batch(model.tokenizer, size, length, seed=0)
    started = time.perf_counter()
    update = text_update(model, batch)
    update_s = time.perf_counter() - started
    norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in update.gradients.values())))
    result = run_dager(TextTarget(model, update, size, length))
    private = [batch.input_ids[i].tolist() for i in range(size)]
    scores = score_text(batch.texts, private, result.texts, result.token_ids)
    return {
        "model": model.source,
        "batch": f"{size} x {length} tokens",
        "update_seconds": round(update_s, 2),
        "dager_seconds": round(result.seconds, 2),
        "update_l2_norm": round(norm, 3),
        "rouge1": scores.rouge1,
        "rouge2": scores.rouge2,
        "rougeL": scores.rougeL,
        "token_accuracy": scores.token_accuracy,
        "exact": scores.exact,
        "assumptions_hold": result.assumptions_hold,
        "notes": list(result.notes),
    }


def large_vocabulary(size: int = 8, length: int = 32, layers: int = 2) -> dict:
    """DAGER where the vocabulary is a real one's size: Qwen2.5-0.5B's shape (151,936 tokens,
    width 896, 14 query and 2 key-value heads, a tied head) with ``layers`` of its 24 layers
    (24: the whole model, 494M parameters), random weights; the demo verses use the first
    8192 ids. The token filter and the openings' check then cover 151,936 tokens; the peak
    memory is the process's."""
    from transformers import Qwen2ForCausalLM

    from auditlib.data.text_tokenizer import demo_tokenizer
    from auditlib.models.text import DECODER, TextModel

    tok = demo_tokenizer("bpe")
    config = qwen25_half_b_config(tok, layers, vocab_size=151_936)
    torch.manual_seed(0)
    model = TextModel(Qwen2ForCausalLM(config).eval(), tok, DECODER, "qwen2-vocab", "random")
    batch = demo_batch(tok, size, length, seed=0)
    started = time.perf_counter()
    update = text_update(model, batch)
    update_s = time.perf_counter() - started
    result = run_dager(TextTarget(model, update, size, length))
    private = [batch.input_ids[i].tolist() for i in range(size)]
    scores = score_text(batch.texts, private, result.texts, result.token_ids)
    return {
        "model": f"Qwen2.5-0.5B's shape, {layers} layers, random weights (seed 0)",
        "parameters": sum(p.numel() for p in model.module.parameters()),
        "batch": f"{size} x {length} tokens",
        "update_seconds": round(update_s, 2),
        "dager_seconds": round(result.seconds, 2),
        "rouge1": scores.rouge1,
        "rouge2": scores.rouge2,
        "exact": scores.exact,
        "peak_rss_gb": peak_rss_gb(),
        "notes": list(result.notes),
    }


def dp(preset: str = "gpt2", size: int = 16, length: int = 32) -> list[dict]:
    rows = []
    for sigma in SIGMAS:
        spec = TextAuditSpec(
            model=preset, batch_size=size, length=length,
            defense="dp-gaussian", defense_params={"sigma": str(sigma), "clip": "30"},
        )  # fmt: skip
        started = time.perf_counter()
        result = run_text_audit(spec)
        row = {
            "sigma": sigma,
            "epsilon": result.privacy.get("epsilon"),
            "delta": result.privacy.get("delta"),
            "verdict": result.verdict.headline,
            "outcome": result.verdict.outcome,
            "seconds": round(time.perf_counter() - started, 1),
        }
        for run in [*result.runs, *(r for r in result.controls)]:
            key = "control" if run in result.controls else run.attack
            row[key] = {
                "rouge1": round(run.scores.rouge1, 4),
                "rouge2": round(run.scores.rouge2, 4),
                "exact": run.scores.exact,
                "recovered": run.finding.risk.recovered_count,
                "seconds": round(run.recovered.seconds, 1),
            }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", default="all", choices=("plain", "dp", "vocab", "all"))
    parser.add_argument("--model", default="gpt2", help="a text preset (models.text.PRESETS)")
    parser.add_argument("--layers", type=int, default=2, help="--part vocab: layers, 2 to 24")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = OUT if args.model == "gpt2" else OUT.with_name(f"{OUT.stem}_{args.model}.json")
    results = json.loads(out.read_text()) if out.exists() else {}
    results["machine"] = machine()
    if args.part in ("plain", "all"):
        results["plain"] = plain(args.model)
        print(json.dumps(results["plain"]), flush=True)
    if args.part in ("dp", "all"):
        results["dp"] = dp(args.model)
    if args.part == "vocab":  # not a preset's: its own key, in the --model's file
        key = "large_vocabulary" if args.layers == 2 else f"large_vocabulary_{args.layers}_layers"
        results[key] = large_vocabulary(layers=args.layers)
        print(json.dumps(results[key]), flush=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
