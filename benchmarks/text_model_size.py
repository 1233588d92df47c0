"""The largest text model the audit takes (``models.text.MAX_TEXT_PARAMETERS``), run the way an
auditor runs it: their own folder (config.json, model.safetensors, tokenizer.json) read by
``load_text_model``, and ``run_text_audit`` with DAGER under DP noise, so the plain DAGER, its
ranked twin that knows the noise and the undefended control all run on the one model, the
clean and the noised update both held. Peak memory (the process's resident set) and time are
what the limit stands on.

Case: Qwen2's architecture (width 896, 14 query and 2 key-value heads, feed-forward 4864 and
biased projections: Qwen2.5-0.5B's layer) with as many layers as keep it under the limit,
the demo BPE tokenizer (8192 tokens), random weights (seed 0); FedSGD, 8 verses of 32
tokens, ``dp-gaussian`` sigma 1e-6 with clip 30; one torch thread.

    .venv/bin/python -m benchmarks.text_model_size [--parameters N]

Writes benchmarks/results/text_model_size.json (``at_the_limit``; another ``--parameters N``:
``at_N``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Qwen2ForCausalLM

from auditlib.data.text_tokenizer import demo_tokenizer
from auditlib.engine.text_audit import TextAuditSpec, run_text_audit
from auditlib.models.text import MAX_TEXT_PARAMETERS
from benchmarks.common import machine, peak_rss_gb, qwen25_half_b_config

OUT = Path(__file__).parent / "results" / "text_model_size.json"


def _config(layers: int, tok):
    return qwen25_half_b_config(tok, layers, vocab_size=tok.vocab_size)


def _layers_under(limit: int, tok) -> int:
    """The most layers whose model has at most ``limit`` parameters."""
    with torch.device("meta"):
        one = sum(p.numel() for p in Qwen2ForCausalLM(_config(1, tok)).parameters())
        two = sum(p.numel() for p in Qwen2ForCausalLM(_config(2, tok)).parameters())
    return 1 + (limit - one) // (two - one)


def write_folder(folder: Path, layers: int, tok) -> int:
    """The auditor's folder; returns its parameter count."""
    config = _config(layers, tok)
    torch.manual_seed(0)
    module = Qwen2ForCausalLM(config)
    state = {k: v.contiguous() for k, v in module.state_dict().items() if k != "lm_head.weight"}
    count = sum(p.numel() for p in module.parameters())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config.to_json_string())
    save_file(state, str(folder / "model.safetensors"))
    tok.tokenizer.save(str(folder / "tokenizer.json"))
    del module, state
    return count


def _scores(run) -> dict:
    return {
        "exact": run.scores.exact,
        "rouge1": round(run.scores.rouge1, 4),
        "seconds": round(run.recovered.seconds, 1),
    }


def run(parameters: int, size: int = 8, length: int = 32) -> dict:
    tok = demo_tokenizer("bpe")
    layers = _layers_under(parameters, tok)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen2"
        count = write_folder(folder, layers, tok)
        spec = TextAuditSpec(
            model=str(folder), batch_size=size, length=length, attacks=("dager",),
            defense="dp-gaussian", defense_params={"sigma": "1e-6", "clip": "30"},
        )  # fmt: skip
        started = time.perf_counter()
        result = run_text_audit(spec)
        seconds = time.perf_counter() - started
    runs = {r.attack: r for r in result.runs}
    runs.update({f"{r.attack} (control)": r for r in result.controls})
    return {
        "model": f"Qwen2 architecture, {layers} layers of Qwen2.5-0.5B's, demo tokenizer",
        "parameters": count,
        "safetensors_gb": round(count * 4 / 1e9, 2),
        "batch": f"{size} x {length} tokens",
        "defense": "dp-gaussian sigma 1e-6, clip 30",
        "audit_seconds": round(seconds, 1),
        "peak_rss_gb": peak_rss_gb(),
        "verdict": result.verdict.headline,
        "runs": {name: _scores(r) for name, r in runs.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parameters", type=int, default=MAX_TEXT_PARAMETERS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    key = "at_the_limit" if args.parameters == MAX_TEXT_PARAMETERS else f"at_{args.parameters}"
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    results.update({"machine": machine(), key: run(args.parameters)})
    print(json.dumps(results[key]), flush=True)
    OUT.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
