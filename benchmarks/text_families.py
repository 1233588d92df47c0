"""The optimisation attacks (TAG, LAMP), TIGER and, on LoRA, UTR on the GPT-2 and the LLaMA
architectures at the same tiny size, the same demo verses, one torch thread: what each
recovers on a rotary decoder beside GPT-2 (docs/TEXT.md, "The LLaMA family").

Each row: ``gpt2-tiny`` or ``llama-tiny`` (random weights, seed 0, the demo BPE), FedSGD,
``demo_batch(tok, B, n, seed=0)`` at 1 x 8, 2 x 12 and 4 x 16 (TAG and LAMP the first two);
TAG 100 steps and LAMP 40 steps with their defaults (the strongest presets), TIGER with its
defaults, UTR on rank-8 adapters at peft's
initialisation (its first round). Single seeded runs on tiny random models: what the attacks
do there, not their ceiling.

    nice -n 5 .venv/bin/python -m benchmarks.text_families [--part rows|tiger-seeds|all]

``tiger-seeds``: TIGER's mean ROUGE-1 over the demo batches of seeds 0 to 3 at each size
(``tiger_over_seeds``), the figure its rotary settings were chosen on (docs/ALGORITHMS.md).

Writes benchmarks/results/text_families.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from auditlib.attacks.text.base import TextTarget
from auditlib.attacks.text.lamp import lamp_config, run_lamp
from auditlib.attacks.text.tag import run_tag, tag_config
from auditlib.attacks.text.tiger import run_tiger
from auditlib.attacks.text.utr import run_utr
from auditlib.client.text_update import text_update
from auditlib.data.text_samples import demo_batch
from auditlib.metrics.text import score_text
from auditlib.models.text import build_text_model, with_lora
from benchmarks.common import machine

OUT = Path(__file__).resolve().parent / "results" / "text_families.json"
# (sequences, tokens) each attack runs on: the optimisation attacks' steps cost seconds each
CASES = {"tag": ((1, 8), (2, 12)), "lamp": ((1, 8), (2, 12))}
ALL_CASES = ((1, 8), (2, 12), (4, 16))
ATTACKS = {
    "tag": lambda target: run_tag(target, tag_config(steps=100, seed=0)),
    "lamp": lambda target: run_lamp(target, lamp_config(steps=40, seed=0)),
    "tiger": lambda target: run_tiger(target),
}


def _row(preset: str, attack: str, size: int, length: int, lora: bool) -> dict:
    model = build_text_model(preset, seed=0)
    if lora:
        model = with_lora(model, rank=8)
    batch = demo_batch(model.tokenizer, size, length, seed=0)
    target = TextTarget(model, text_update(model, batch), size, length)
    result = run_utr(target) if attack == "utr" else ATTACKS[attack](target)
    private = [row.tolist() for row in batch.input_ids]
    scores = score_text(batch.texts, private, result.texts, result.token_ids)
    return {
        "model": preset + (", LoRA rank 8" if lora else ""),
        "attack": attack,
        "batch": f"{size} x {length}",
        "rouge1": round(scores.rouge1, 3),
        "rouge2": round(scores.rouge2, 3),
        "exact": scores.exact,
        "seconds": round(result.seconds, 1),
    }


def tiger_over_seeds(seeds: int = 4) -> dict[str, list[float]]:
    """TIGER's mean ROUGE-1 at 1 x 8, 2 x 12 and 4 x 16 over the demo batches of seeds 0 to
    ``seeds`` - 1 (one model per preset, seed 0): less of one batch's luck than a row."""
    means = {}
    for preset in ("gpt2-tiny", "llama-tiny"):
        model = build_text_model(preset, seed=0)
        per_size = []
        for size, length in ALL_CASES:
            total = 0.0
            for seed in range(seeds):
                batch = demo_batch(model.tokenizer, size, length, seed=seed)
                result = run_tiger(TextTarget(model, text_update(model, batch), size, length))
                private = [row.tolist() for row in batch.input_ids]
                total += score_text(batch.texts, private, result.texts, result.token_ids).rouge1
            per_size.append(round(total / seeds, 3))
        means[preset] = per_size
        print(json.dumps({preset: per_size}), flush=True)
    return means


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("rows", "tiger-seeds", "all"), default="all")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    results["machine"] = machine()
    if args.part in ("rows", "all"):
        rows = []
        for preset in ("gpt2-tiny", "llama-tiny"):
            for attack in (*ATTACKS, "utr"):
                for size, length in CASES.get(attack, ALL_CASES):
                    rows.append(_row(preset, attack, size, length, lora=attack == "utr"))
                    print(json.dumps(rows[-1]), flush=True)
        results["rows"] = rows
    if args.part in ("tiger-seeds", "all"):
        results["tiger_over_seeds"] = tiger_over_seeds()
    OUT.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
