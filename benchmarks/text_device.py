"""The text attacks on one device: a preset's update of one demo batch (GPT-2 small at
DAGER's 16 sequences of 32 tokens by default), then DAGER's whole run and the seconds a
step of TAG, LAMP and TIGER take on it, on ``--device`` (the CPU here; CUDA on a lent GPU:
``benchmarks/device/issue55.sh text``).

A step's time is the difference of two runs of S1 and S2 steps (the same start), divided by
S2 - S1, so neither the run's set-up nor its first step's is counted; progress events come
every S2 steps, once. LAMP runs its continuous steps only (its discrete step comes every
``swap_every`` steps after a burn-in, set to the whole run), from 4 starts rather than 500; TAG one restart;
TIGER one round. A run of one step goes first, untimed (LAMP's prior is trained there where
it is not cached yet). On CUDA the clock is read after ``torch.cuda.synchronize()``, and TF32
stays off as in an audit (``engine.device.full_float32``).

Writes benchmarks/results/text_device-<device>-<model>.json.
Usage: python -m benchmarks.text_device [--device cuda] [--model gpt2] [--batch 16]
       [--tokens 32] [--steps 2,6] [--attacks dager,tag,lamp,tiger] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from auditlib.attacks.text import run_text_attack
from auditlib.attacks.text.base import TextTarget
from auditlib.attacks.text.dager import DagerConfig
from auditlib.attacks.text.lamp import lamp_config
from auditlib.attacks.text.tag import tag_config
from auditlib.attacks.text.tiger import TigerConfig
from auditlib.client.text_update import text_update
from auditlib.data.text_samples import demo_batch
from auditlib.engine.device import resolve_device
from auditlib.models.text import build_text_model
from benchmarks.common import ROOT, machine

RESULTS = ROOT / "benchmarks" / "results"
STEPPED = {  # attack -> its config at S steps (progress once, at the end)
    "tag": lambda s: tag_config(steps=s, restarts=1, progress_every=s),
    "lamp": lambda s: lamp_config(steps=s, init_candidates=4, swap_burnin=1.0, progress_every=s),
    "tiger": lambda s: TigerConfig(steps=s, rounds=1),
}


def _timed(device: torch.device, run: Callable[[], object]) -> tuple[float, object]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    out = run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--steps", default="2,6", help="S1,S2: the two runs' steps")
    parser.add_argument("--attacks", default="dager,tag,lamp,tiger")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)  # TF32 off on CUDA, as in an audit
    first, second = (int(s) for s in args.steps.split(","))
    torch.manual_seed(0)
    model = build_text_model(args.model, 0)
    model.module.to(device)
    batch = demo_batch(model.tokenizer, args.batch, args.tokens, 0).to(device)
    update_s, update = _timed(device, lambda: text_update(model, batch))
    target = TextTarget(model, update, args.batch, args.tokens, batch.labels)
    rows = []
    for name in args.attacks.split(","):
        if name == "dager":
            seconds, out = _timed(device, lambda: run_text_attack("dager", target, DagerConfig()))
            exact = sum(s in out.token_ids for s in _private(batch, model))
            rows.append({"attack": name, "seconds": round(seconds, 3), "exact": exact})
        else:
            run_text_attack(name, target, STEPPED[name](1))  # first calls: caches, the prior
            short, _ = _timed(device, lambda n=name: run_text_attack(n, target, STEPPED[n](first)))
            long, _ = _timed(device, lambda n=name: run_text_attack(n, target, STEPPED[n](second)))
            per_step = (long - short) / (second - first)
            rows.append({
                "attack": name, "steps": [first, second], "seconds": [round(short, 3), round(long, 3)],
                "seconds_per_step": round(per_step, 4), "steps_per_s": round(1 / per_step, 3),
            })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else machine()
    result = {
        "device": str(device), "where": where, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "model": args.model, "batch": args.batch,
        "tokens": args.tokens, "update_seconds": round(update_s, 3), "rows": rows,
    }  # fmt: skip
    path = RESULTS / f"text_device-{device.type}-{args.model}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


def _private(batch, model) -> list[tuple[int, ...]]:
    """Each private sequence's real tokens, as DAGER returns them (an encoder's without its
    [CLS] and [SEP])."""
    tok, mask = model.tokenizer, batch.attention_mask.sum(1).tolist()
    rows = [batch.input_ids[i, : mask[i]].tolist() for i in range(batch.size)]
    return [tuple(t for t in row if t not in (tok.bos_id, tok.eos_id)) for row in rows]


if __name__ == "__main__":
    main()
