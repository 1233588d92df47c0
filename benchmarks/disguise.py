"""SEER's learned disguise (``seer-disguised``) on LeNet at 32 px, batches of 8 Fashion-MNIST
images: what its training costs, what its decoder reads back, and what the client's checks
see of it.

For each training length (the audit preset's 1500 steps, and a longer one), way of drawing
the training batches (``batches``: one-above, the audit preset's, or natural) and bound on
the D-SNR the training holds (``dsnr_bound``; 0: none, SEER's loss alone): the seconds the
training took; the mean PSNR of the decoded image against the batch's brightest on held-out
public batches (Fashion-MNIST train images the training did not draw) and on audited-style
batches (the Fashion-MNIST sample set, test split, as an audit decodes them, through the
client's own FedSGD update), beside the PSNR of the public mean brightest image (the guess
the decoder starts from); how often the decoded image, and the guess, is closer to the
brightest image than to any other of the batch; the model's top-1 accuracy on held-out public images before and
after; whether ``ModelCheck(ModelCheckConfig())`` refuses it on each audited batch; and
SEER's D-SNR (``defenses.model_behaviour.model_dsnr``, the model check's) of the disguised model beside the honest global
model's and Robbing the Fed's (audit preset) on the same batches.

Writes benchmarks/results/disguise.json. Usage:
    nice -n 15 python -m benchmarks.disguise [--runs 1500:one-above 6000:natural ...]
        [--batches 16] [--keep]
(each run STEPS:BATCHES[:DSNR_BOUND], the training's batches drawn ``one-above`` or
``natural``; the default runs all six of the results file, about 25 minutes on one core;
--keep keeps the runs of the results file that are not rerun)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from auditlib.attacks import ATTACKS, build_attack_config
from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import client_update, trainable_parameters
from auditlib.data.model_input import to_model_batch
from auditlib.data.normalization import Normalization
from auditlib.data.samples import load_sample_set
from auditlib.defenses import ClientContext
from auditlib.defenses.model_behaviour import model_dsnr as disaggregation_snr
from auditlib.defenses.model_check import ModelCheck, ModelCheckConfig
from auditlib.models import ModelSpec, build_model
from auditlib.server import BuildContext
from auditlib.server.disguise import HELD_OUT, public_set
from auditlib.server.disguise_training import mean_target, psnr, target_of
from benchmarks.common import ROOT, machine

SHAPE = (1, 32, 32)
BATCH = 8
NORM = Normalization.identity(1)
RESULTS = ROOT / "benchmarks" / "results" / "disguise.json"


def audited_batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` disjoint batches of the Fashion-MNIST sample set (test split), in [0, 1]."""
    out = []
    for k in range(count):
        read = load_sample_set("fashion-mnist", BATCH, seed=0, offset=k * BATCH)
        images = to_model_batch(list(read.images), SHAPE, NORM)
        out.append((images, torch.tensor(read.labels, dtype=torch.long)))
    return out


def fedsgd_update(model, images, labels) -> dict[str, torch.Tensor]:
    parameters = trainable_parameters(model)
    update = client_update(
        model, parameters, images, labels, ClientProtocol(), differentiable=False
    )
    return dict(zip(parameters, update, strict=True))


def model_check(model, images, labels) -> str | None:
    context = ClientContext(model, dict(model.named_parameters()), images, labels, ClientProtocol())
    return ModelCheck(ModelCheckConfig()).refuses(context)


def nearest(image: torch.Tensor, images: torch.Tensor) -> int:
    """The image of the batch ``image`` is closest to (highest PSNR)."""
    return max(range(len(images)), key=lambda i: psnr(image, images[i]))


def measure(steps: int, drawn: str, bound: float, batches, seed: int) -> dict:
    torch.set_num_threads(1)
    global_model = build_model(ModelSpec("lenet", 10, SHAPE))
    context = BuildContext(global_model, SHAPE, BATCH, 1, NORM, "fashion-mnist", seed)
    params = {"steps": steps, "batches": drawn, "dsnr_bound": bound}
    config, _ = build_attack_config("seer-disguised", params, "audit")
    began = time.perf_counter()
    server = ATTACKS["seer-disguised"].builds(config, context)
    build_seconds = time.perf_counter() - began
    rtf = ATTACKS["rtf"].builds(build_attack_config("rtf", {}, "audit")[0], context)
    # The guess the decoder starts from (its bias at step 0): the public mean brightest image.
    train, _ = public_set(config.public, context).split(HELD_OUT)
    guess = mean_target(train, server.property, BATCH, torch.Generator().manual_seed(seed))
    decoded, guessed, refusals = [], [], []
    closest = {"decoded": 0, "guess": 0}
    dsnr = {"seer": [], "honest": [], "rtf": []}
    for images, labels in batches:
        read = server.decoder.read(fedsgd_update(server.model, images, labels), BATCH)
        target = target_of(images, server.property)
        decoded.append(psnr(read, target))
        guessed.append(psnr(guess, target))
        for kind, image in (("decoded", read), ("guess", guess)):
            closest[kind] += nearest(image, images) == int(images.flatten(1).mean(1).argmax())
        refusals.append(model_check(server.model, images, labels))
        dsnr["seer"].append(disaggregation_snr(server.model, images, labels))
        dsnr["honest"].append(disaggregation_snr(global_model, images, labels))
        dsnr["rtf"].append(disaggregation_snr(rtf.model, images, labels))
    outcome = server.outcome
    return {
        "steps": steps,
        "batches": drawn,
        "dsnr_bound": bound,
        "training_seconds": round(outcome.seconds, 1),
        "build_seconds": round(build_seconds, 1),
        "held_out_public_psnr_db": round(outcome.held_out_psnr, 2),
        "held_out_public_guess_psnr_db": round(outcome.guess_psnr, 2),
        "audited_psnr_db": round(statistics.mean(decoded), 2),
        "audited_psnr_min_max_db": [round(min(decoded), 2), round(max(decoded), 2)],
        "audited_guess_psnr_db": round(statistics.mean(guessed), 2),
        "decoded_closest_to_the_brightest": f"{closest['decoded']} of {len(batches)}",
        "guess_closest_to_the_brightest": f"{closest['guess']} of {len(batches)}",
        "accuracy_before": round(outcome.accuracy_before, 3),
        "accuracy_after": round(outcome.accuracy_after, 3),
        "model_check_refused": f"{sum(r is not None for r in refusals)} of {len(batches)}",
        "model_check_reasons": sorted({r for r in refusals if r is not None}),
        "dsnr_median": {k: round(statistics.median(v), 4) for k, v in dsnr.items()},
        "dsnr_max": {k: round(max(v), 4) for k, v in dsnr.items()},
        "dsnr_above_1": {k: f"{sum(x > 1 for x in v)} of {len(v)}" for k, v in dsnr.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs",
        nargs="+",
        default=[
            "1500:one-above",
            "6000:one-above",
            "1500:natural",
            "6000:natural",
            "6000:one-above:10",
            "6000:one-above:0.5",
        ],
        help="training runs as STEPS:BATCHES[:DSNR_BOUND] (BATCHES: one-above or natural)",
    )
    parser.add_argument("--batches", type=int, default=16, help="audited batches")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--keep", action="store_true", help="keep the runs of the results file not rerun"
    )
    parser.add_argument("--out", default=str(RESULTS), help="where to write the results")
    args = parser.parse_args()
    out = Path(args.out)
    batches = audited_batches(args.batches)
    wanted = [_run(r) for r in args.runs]
    runs = []
    if args.keep and out.exists():
        runs = [
            r
            for r in json.loads(out.read_text())["runs"]
            if (r["steps"], r["batches"], r["dsnr_bound"]) not in wanted
        ]
    for steps, drawn, bound in wanted:
        runs.append(measure(steps, drawn, bound, batches, args.seed))
        print(json.dumps(runs[-1], indent=1), flush=True)
    out.write_text(
        json.dumps(
            {
                "model": "lenet 1x32x32 (sigmoid, default init)",
                "batch": BATCH,
                "public": "4096 Fashion-MNIST train images (256 held out)",
                "audited": f"{args.batches} batches of the fashion-mnist sample set",
                "seed": args.seed,
                "machine": machine(),
                "runs": runs,
            },
            indent=1,
        )
        + "\n"
    )


def _run(text: str) -> tuple[int, str, float]:
    """STEPS:BATCHES[:DSNR_BOUND] (no bound: 0, SEER's loss alone)."""
    parts = text.split(":")
    return int(parts[0]), parts[1], float(parts[2]) if len(parts) > 2 else 0.0


if __name__ == "__main__":
    main()
