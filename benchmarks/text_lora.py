"""UTR and DAGER on a LoRA update of GPT-2 (the backbone frozen), FedSGD, the demo text.

Two rounds: the first (peft's initialisation, lora_B = 0, so lora_A's gradient is zero)
and a later one (the adapters after a few SGD steps on public text). Each: DAGER's and UTR's
recovery, scored with ROUGE-1/2/L, exact sequences and seconds, beside a random guess.

    nice -n 15 .venv/bin/python -m benchmarks.text_lora            # GPT-2 small, 16 x 32
    nice -n 15 .venv/bin/python -m benchmarks.text_lora --batch 4 --length 16
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from auditlib.attacks.text.base import TextTarget
from auditlib.attacks.text.dager import run_dager
from auditlib.attacks.text.utr import UtrConfig, run_utr
from auditlib.client.text_update import text_loss, text_update, trainable
from auditlib.data.demo_text import demo_text
from auditlib.data.text_samples import TextRows, demo_batch, make_batch
from auditlib.metrics.text import score_text
from auditlib.models.text import TextModel, build_text_model, with_lora
from benchmarks.common import ROOT, machine

PAPER = (
    "UTR (arXiv 2601.17533): ROUGE-1/2 above 0.99 on GPT2-Large, BERT and Qwen2.5-7B with "
    "bottleneck adapters of reduction factor 2 (its public code), scored on the sequences it "
    "verified; not a LoRA setting"
)


def later_round(model: TextModel, steps: int, rate: float, size: int, length: int) -> float:
    """Train the adapters ``steps`` SGD steps on public text (in place); lora_B's norm."""
    rows = TextRows(demo_text().public, None)
    batch = make_batch(model.tokenizer, rows, size, length, seed=1, full_only=True)
    params = trainable(model)
    for _ in range(steps):
        grads = torch.autograd.grad(text_loss(model, batch), list(params.values()))
        with torch.no_grad():
            for p, g in zip(params.values(), grads, strict=True):
                p -= rate * g
    return float(sum(p.detach().norm() ** 2 for n, p in params.items() if "lora_B" in n) ** 0.5)


def scored(batch, recovered) -> dict:
    s = score_text(batch.texts, batch.input_ids.tolist(), recovered.texts, recovered.token_ids)
    return {
        "rouge1": round(s.rouge1, 4), "rouge2": round(s.rouge2, 4), "rougeL": round(s.rougeL, 4),
        "token_accuracy": round(s.token_accuracy, 4), "exact": s.exact,
        "seconds": round(recovered.seconds, 1), "notes": list(recovered.notes),
        "first_texts": list(recovered.texts[:3]),
    }  # fmt: skip


def random_guess(model: TextModel, batch, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.tokenizer.vocab_size, tuple(batch.input_ids.shape), generator=g)
    texts = [model.tokenizer.decode(r) for r in ids.tolist()]
    s = score_text(batch.texts, batch.input_ids.tolist(), texts, ids.tolist())
    return {
        "rouge1": round(s.rouge1, 4),
        "rouge2": round(s.rouge2, 4),
        "rougeL": round(s.rougeL, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="gpt2")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rounds", default="first,later")
    parser.add_argument("--refine-iterations", type=int, default=5)
    parser.add_argument("--refine-seconds", type=float, default=600.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/text_lora.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = UtrConfig(refine_iterations=args.refine_iterations, refine_seconds=args.refine_seconds)
    results = {
        "machine": machine(), "preset": args.preset, "rank": args.rank, "batch": args.batch,
        "length": args.length, "algorithm": "fedsgd", "utr_config": config.__dict__,
        "paper": PAPER, "rounds": {},
    }  # fmt: skip
    for which in args.rounds.split(","):
        model = with_lora(build_text_model(args.preset, seed=0), rank=args.rank)
        b_norm = 0.0
        if which == "later":
            b_norm = later_round(model, steps=5, rate=0.5, size=16, length=args.length)
        batch = demo_batch(model.tokenizer, args.batch, args.length, seed=0)
        started = time.perf_counter()
        update = text_update(model, batch)
        update_seconds = time.perf_counter() - started
        target = TextTarget(model, update, args.batch, args.length)
        entry = {
            "lora_B_norm": round(b_norm, 4), "update_seconds": round(update_seconds, 1),
            "random_guess": random_guess(model, batch, seed=0),
        }  # fmt: skip
        entry["dager"] = scored(batch, run_dager(target))
        print(which, "dager", entry["dager"]["rouge1"], flush=True)
        entry["utr"] = scored(batch, run_utr(target, config))
        print(
            which, "utr", {k: entry["utr"][k] for k in ("rouge1", "rouge2", "seconds")}, flush=True
        )
        results["rounds"][which] = entry
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
