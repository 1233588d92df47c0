"""TAG and LAMP (ours) beside breaching's TAG, on the same model, tokenizer, sequences,
observed gradient and step count: seconds and ROUGE-1/2/L (``score_text``).

breaching is never a product dependency: it is installed into ``.peers/site`` (see
``benchmarks/peers.py``) and imported only here. Its TAG attacker (``attack=tag``: joint
optimisation of embeddings and labels, L2 + 0.1 x linearly weighted L1, AdamW 0.05 with
warm-up and linear decay, gradient clipping at 1) is driven on our model object (wrapped as
its HuggingFaceContainer does) and our observed gradient; its one change here is the step
count. Attention runs through the math kernel on both sides (no double backward otherwise).

The machine has 2 shared cores: step counts are cut far below the papers' (TAG 2500, LAMP
2000) and LAMP's start and discrete-step candidates below 500 and 200; the figures are what
that budget buys, not the papers' settings. The papers' own figures are on pretrained
models; ours are randomly initialised (nothing is downloaded).

``--paper-budget`` runs every side at the papers' budgets instead: TAG 2500 steps (ours in
both settings and breaching's), LAMP 2000 steps with its 500 starts and reorderings and 200
discrete-step candidates every 75 steps. It writes text_tag_lamp_paper_budget.json.

Writes benchmarks/results/text_tag_lamp.json (another ``--model``: text_tag_lamp_<model>.json).
Usage: nice -n 15 python -m benchmarks.text_tag_lamp [--steps N] [--length N] [--model tinybert]
       [--paper-budget] [--rows tag,tag-paper,lamp,lamp-cos,breaching] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from auditlib.attacks.text.base import TextTarget
from auditlib.attacks.text.lamp import lamp_config, run_lamp
from auditlib.attacks.text.opt_embeddings import matching_problem, nearest_tokens
from auditlib.attacks.text.tag import run_tag, tag_config
from auditlib.client.text_update import text_update
from auditlib.data.text_samples import demo_batch
from auditlib.metrics.text import score_text
from auditlib.models.text import DECODER, build_text_model
from benchmarks.common import ROOT, machine

PEERS = ROOT / ".peers" / "site"
RESULTS = ROOT / "benchmarks" / "results" / "text_tag_lamp.json"
PAPER_BUDGET_RESULTS = ROOT / "benchmarks" / "results" / "text_tag_lamp_paper_budget.json"
TAG_PAPER_STEPS, LAMP_PAPER_STEPS = 2500, 2000  # eth-sri/lamp tag.sh and lamp_*.sh
ROWS = ("tag", "tag-paper", "lamp", "lamp-cos", "breaching")


def _scores(batch, tok, texts, ids) -> dict:
    truth = [
        [t for t in row if t not in (tok.bos_id, tok.eos_id)] for row in batch.input_ids.tolist()
    ]
    s = score_text(batch.texts, truth, texts, [list(x) for x in ids])
    return {
        "rouge1": round(s.rouge1, 4),
        "rouge2": round(s.rouge2, 4),
        "rougeL": round(s.rougeL, 4),
        "token_accuracy": round(s.token_accuracy, 4),
    }


def breaching_tag(model, batch, update, steps: int, seed: int) -> tuple[float, tuple, tuple]:
    """breaching 0.1.2's TAG on our model and gradient: (seconds, its own token recovery,
    its optimised embeddings projected as ours are: cosine over the non-special tokens).
    Its own recovery divides by squared norms, so a near-zero token row (BERT's [PAD] row
    starts at zero) wins every position on a randomly initialised model."""
    sys.path.insert(0, str(PEERS))
    import breaching  # the peer is optional and lives outside the product
    from breaching.cases.models.losses import CausalLoss
    from breaching.cases.models.model_preparation import HuggingFaceContainer
    from omegaconf import OmegaConf

    decoder = model.family == DECODER
    case = "10_causal_lang_training" if decoder else "9_bert_training"
    cfg = breaching.get_config(overrides=[f"case={case}", "attack=tag"])
    cfg.attack.optim.max_iterations = steps
    cfg.attack.optim.callback = steps
    cfg.attack.restarts.num_trials = 1
    tok = model.tokenizer
    metadata = OmegaConf.create(
        {
            "modality": "text",
            "task": "causal-lm" if decoder else "classification",
            "shape": [batch.length],
            "classes": 2,
            "vocab_size": tok.vocab_size,
        }
    )
    container = HuggingFaceContainer(copy.deepcopy(model.module))
    loss = CausalLoss() if decoder else torch.nn.CrossEntropyLoss()
    setup = {"dtype": torch.float, "device": torch.device("cpu")}
    attacker = breaching.attacks.prepare_attack(container, loss, cfg.attack, setup)
    payload = [
        {
            "parameters": [p.detach().clone() for p in container.parameters()],
            "buffers": None,
            "metadata": metadata,
        }
    ]
    # Our update's weights are the module's named parameters in order: the container's too.
    shared = [
        {
            "gradients": [g.clone() for g in update.gradients.values()],
            "buffers": None,
            "metadata": {"num_data_points": batch.size, "labels": None, "local_hyperparams": None},
        }
    ]
    torch.manual_seed(seed)
    start = time.perf_counter()
    with sdpa_kernel(SDPBackend.MATH):
        output, _ = attacker.reconstruct(payload, shared, {}, dryrun=False)
    seconds = time.perf_counter() - start
    own = output["data"].tolist()
    problem = matching_problem(TextTarget(model, update, batch.size, batch.length))
    projected = nearest_tokens(problem, output["raw_embeddings"], None, "tied").tolist()
    if not decoder:  # its [CLS]/[SEP] positions are optimised too; score the middle ones
        own, projected = [r[1:-1] for r in own], [r[1:-1] for r in projected]
    return seconds, own, projected


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tinybert")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--length", type=int, default=12)
    parser.add_argument("--batches", default="1,4")
    parser.add_argument(
        "--paper-budget", action="store_true", help="TAG 2500 steps, LAMP 2000 with its defaults"
    )
    parser.add_argument("--rows", default=",".join(ROWS), help="which rows to run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", help="results file (default: by model and budget)")
    args = parser.parse_args()
    wanted = [r for r in args.rows.split(",") if r]
    unknown = [r for r in wanted if r not in ROWS]
    if unknown:
        parser.error(f"--rows {unknown[0]!r}; expected some of {', '.join(ROWS)}")
    tag_steps = TAG_PAPER_STEPS if args.paper_budget else args.steps
    lamp_steps = LAMP_PAPER_STEPS if args.paper_budget else args.steps
    # LAMP's own starts and discrete steps at the paper's budget; cut with the steps otherwise.
    lamp_cut = (
        {}
        if args.paper_budget
        else {
            "init_candidates": 20,
            "swap_candidates": 20,
            "swap_every": max(2, args.steps // 4),
        }
    )
    torch.set_num_threads(args.threads)
    model = build_text_model(args.model, seed=0)
    tok = model.tokenizer
    rows = []
    sizes = [int(b) for b in args.batches.split(",")]
    for size in sizes:
        batch = demo_batch(tok, size, args.length, seed=0)
        update = text_update(model, batch)
        target = TextTarget(model, update, size, args.length)
        runs = {
            ("tag", "ours: tag (strongest, 1 restart)"): lambda t=target: run_tag(
                t, tag_config(steps=tag_steps, restarts=1, progress_every=tag_steps)
            ),
            ("tag-paper", "ours: tag (paper preset)"): lambda t=target: run_tag(
                t, tag_config("paper", steps=tag_steps, progress_every=tag_steps)
            ),
            # The strongest preset: LAMP_L1+L2's weights in token units (since 2026-11-29;
            # the rows measured before it, named "strongest, cosine", are the "cosine" row's).
            ("lamp", "ours: lamp (strongest: l1+l2, token units)"): lambda t=target: run_lamp(
                t, lamp_config(steps=lamp_steps, progress_every=lamp_steps, **lamp_cut)
            ),
            ("lamp-cos", "ours: lamp (cosine, token units)"): lambda t=target: run_lamp(
                t,
                lamp_config("cosine", steps=lamp_steps, progress_every=lamp_steps, **lamp_cut),
            ),
        }
        for (key, name), run in runs.items():
            if key not in wanted:
                continue
            result = run()
            rows.append(
                {
                    "batch": size, "attack": name, "seconds": round(result.seconds, 1),
                    **_scores(batch, tok, result.texts, result.token_ids),
                    "texts": list(result.texts), "notes": list(result.notes),
                }
            )  # fmt: skip
            print(json.dumps(rows[-1])[:300], flush=True)
        if "breaching" not in wanted:
            continue
        try:
            seconds, own, projected = breaching_tag(model, batch, update, tag_steps, seed=0)
            own_texts = [tok.decode(r) for r in own]
            projected_texts = [tok.decode(r) for r in projected]
            row = {
                "seconds": round(seconds, 1),
                "own_recovery": {**_scores(batch, tok, own_texts, own), "texts": own_texts},
                "cosine_projection": {
                    **_scores(batch, tok, projected_texts, projected),
                    "texts": projected_texts,
                },
            }
        except Exception as exc:  # report why breaching could not be driven, in the results
            row = {"unavailable": f"{type(exc).__name__}: {exc}"}
        rows.append({"batch": size, "attack": "breaching 0.1.2: tag", **row})
        print(json.dumps(rows[-1])[:300], flush=True)
    out = {
        "machine": machine(),
        "torch_threads": args.threads,
        "model": args.model,
        "length": args.length,
        "steps": {"tag": tag_steps, "lamp": lamp_steps},
        "lamp_settings": lamp_cut or "LAMP's defaults (500 starts, 200 candidates every 75 steps)",
        "private_texts": {  # each batch's private sequences, as scored above
            str(size): list(demo_batch(tok, size, args.length, 0).texts) for size in sizes
        },
        "rows": rows,
    }
    path = PAPER_BUDGET_RESULTS if args.paper_budget else RESULTS
    if args.model != "tinybert":
        path = path.with_name(f"{path.stem}_{args.model}.json")
    path = Path(args.out) if args.out else path
    path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
