"""The optimisation attacks (TAG, LAMP), TIGER and, on LoRA, UTR on the GPT-2 and the LLaMA
architectures at the same tiny size, the same demo verses, one torch thread: what each
recovers on a rotary decoder beside GPT-2 (docs/TEXT.md, "The LLaMA family").

Each row: ``gpt2-tiny`` or ``llama-tiny`` (random weights, seed 0, the demo BPE), FedSGD,
``demo_batch(tok, B, n, seed=0)`` at 1 x 8, 2 x 12 and 4 x 16 (TAG and LAMP the first two);
TAG 100 steps and LAMP 40 steps with their defaults (the strongest presets), TIGER with its
defaults, UTR on rank-8 adapters at peft's
initialisation (its first round). Single seeded runs on tiny random models: what the attacks
do there, not their ceiling.

    nice -n 5 .venv/bin/python -m benchmarks.text_families

Writes benchmarks/results/text_families.json.
"""

from __future__ import annotations

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


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for preset in ("gpt2-tiny", "llama-tiny"):
        for attack in (*ATTACKS, "utr"):
            for size, length in CASES.get(attack, ALL_CASES):
                rows.append(_row(preset, attack, size, length, lora=attack == "utr"))
                print(json.dumps(rows[-1]), flush=True)
    OUT.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
