"""Robbing the Fed (Fowl et al., ICLR 2022): the product's imprint block and read-back
(``rtf``) beside breaching's (Geiping et al.'s library, whose authors include the paper's),
in one run, on the same batch, the same model weights and the same bins.

breaching is never a dependency of the product: it is installed into its own folder,
``.peers/site`` (git-ignored), and imported only by the benchmarks::

    .venv/bin/python -m pip install --target .peers/site --no-deps \\
        breaching==0.1.2 hydra-core omegaconf antlr4-python3-runtime==4.9.3

The case: ResNet-18 with torchvision's stem (7x7 stride-2 convolution and max pool) at
224x224, 1000 classes, the product's seeded initialisation (no pretrained weights are
fetched), ImageNet normalisation, FedSGD (one gradient of the mean loss, BatchNorm in
training mode), a batch of 64 crops of scikit-image's photographs
(``benchmarks.photo_crops``) with seeded labels. Two bin counts: the audit preset's
8 x 64 = 512 and the paper preset's 128, thresholds at quantiles of the Normal fitted on
the brightness of the public ``faces`` set (``auditlib.server.bins``).

- Ours: ``get_attack("rtf").builds`` puts the imprint block in front of the model; the
  client's update (``client_update``), then ``rtf`` reads the bins back.
- breaching's: a copy of the same ResNet-18 weights; its ``MaliciousModelServer`` places its
  ``ImprintBlock`` in front of the first layer (``_place_malicious_block``, called with a
  stand-in for the server's config: input shape and modality only), which also gives the
  block's parameter indices its attacker reads. The block's rows are then set to ours, from
  our block's own parameters: our row k, w_k . u + b_k on the pixels u = x std + mean, is
  (w_k std) . x + (b_k + w_k . mean) on the normalised input x that breaching's block sees
  (with the block as committed at the time of writing: weight GAIN std_c(j) / d, bias
  GAIN (mean of the channel means - t_k)); its ``linear2`` is set to our ``spread``. Both
  models then compute the same function (the largest difference of their rows' bias
  gradients is in the results). The client's update is the same ``client_update`` on
  both; breaching's ``ImprintAttacker`` (its ``imprint`` attack config, unchanged) reads
  the bins back from it.

Timed, the same way on both sides: ``total`` is the client's update plus the read-back,
``read-back`` the read-back alone (ours: ``rtf``'s run from the observation to its final
event; breaching's: ``reconstruct`` from the shared data, which rebuilds its model from the
server's payload as its API does). The model, the modification and breaching's attacker
object are built before the clock starts. One untimed warm-up of each side per bin count,
then 3 runs interleaved (ours, breaching, ours, breaching); the median is reported.

Scored with the product's metrics: both sides' 64 images in [0, 1] (``to_unit_range``),
matched to the originals (``match``, Hungarian on MSE), PSNR per image (``psnr``, capped at
100 dB); recovered = PSNR >= 30 dB. Beside it, the originals whose nearest reconstruction
(one-to-one or not) is >= 30 dB: the matching minimises the batch's total MSE, and can give
an exact read-back to another original when the images left over (a side's fillers for the
bins it could not read) are far from both.

Writes benchmarks/results/peer_imprint.json and its table in docs/PERFORMANCE.md.
Usage: python -m benchmarks.peer_imprint [--render-only]
"""

from __future__ import annotations

import copy
import gc
import json
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

from auditlib.attacks import RunControl, build_attack_config, get_attack
from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import client_update, trainable_parameters
from auditlib.data.normalization import Normalization
from auditlib.metrics import match, psnr, psnr_from_mse, to_unit_range
from auditlib.metrics.matching import pairwise_mse
from auditlib.models import ModelSpec
from auditlib.models.registry import build_model
from auditlib.server.modification import BuildContext
from auditlib.threat import AttackerKnowledge, Observation
from benchmarks.common import ROOT, machine, replace_section
from benchmarks.photo_crops import photo_crops

PEERS = ROOT / ".peers" / "site"
RESULTS = ROOT / "benchmarks" / "results" / "peer_imprint.json"
DOC = ROOT / "docs" / "PERFORMANCE.md"
MARKER = "peer-imprint"

BATCH = 64
SIZE = 224
SHAPE = (3, SIZE, SIZE)
CLASSES = 1000
MODEL = ModelSpec("resnet18", num_classes=CLASSES, input_shape=SHAPE, stem="imagenet", seed=0)
IMAGENET = Normalization((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
PRESETS = ("audit", "paper")  # rtf's presets: 8 bins per image (512 here), and 128 bins
REPEATS = 3
RECOVERED_DB = 30.0
LABEL_SEED = 0


def _case() -> dict:
    """The batch (pixels in [0, 1] and model-space images), labels and the global model."""
    pixels, names = photo_crops(BATCH, SIZE)
    labels = torch.randint(
        0, CLASSES, (BATCH,), generator=torch.Generator().manual_seed(LABEL_SEED)
    )
    return {
        "pixels": pixels,
        "images": IMAGENET.normalize(pixels),
        "names": names,
        "labels": labels,
        "model": build_model(MODEL),
    }


def _score(images: torch.Tensor, pixels: torch.Tensor) -> tuple[list[float], list[float]]:
    """PSNR of each original against the reconstruction matched to it (the product's
    metric), and against its nearest reconstruction, one-to-one or not (which counts every
    exact read-back: the matching minimises the batch's total MSE, and may hand an exact
    read-back to another original where the images left over are far from both)."""
    reconstructions = to_unit_range(images, IMAGENET)
    originals = pixels.permute(0, 2, 3, 1).to(torch.float64).numpy()
    order = match(reconstructions, originals)
    matched = [psnr(reconstructions[order[i]], originals[i]) for i in range(len(originals))]
    nearest = pairwise_mse(reconstructions, originals).min(axis=1)
    return matched, [psnr_from_mse(float(v)) for v in nearest]


# -- ours ----------------------------------------------------------------------------------


def build_ours(case: dict, preset: str):
    info = get_attack("rtf")
    config, _ = build_attack_config("rtf", {}, preset)
    context = BuildContext(case["model"], SHAPE, BATCH, 1, IMAGENET, None, 0)
    return config, info.builds(config, context)


def run_ours(case: dict, config, modification) -> dict:
    info = get_attack("rtf")
    model = modification.model
    parameters = trainable_parameters(model)
    protocol = ClientProtocol()
    start = time.perf_counter()
    update = client_update(
        model, parameters, case["images"], case["labels"], protocol, differentiable=False
    )
    read_start = time.perf_counter()
    observation = Observation("gradient", tuple(u.detach() for u in update), tuple(parameters))
    knowledge = AttackerKnowledge(
        model=model,
        protocol=protocol,
        batch_size=BATCH,
        input_shape=SHAPE,
        num_classes=CLASSES,
        normalization=IMAGENET,
        server=modification,
    )
    final = None
    for event in info.run(observation, knowledge, config, RunControl(1), 0):
        final = event.final or final
    end = time.perf_counter()
    bias = update[list(parameters).index(modification.parameter_names[1])].detach().clone()
    return {
        "images": final.selected.images,
        "total": end - start,
        "read_back": end - read_start,
        "returned": int(final.label_inference["images_read_back"]),
        "bias_gradient": bias,
    }


# -- breaching's -----------------------------------------------------------------------------


def _breaching():
    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    import breaching  # the peer is optional and lives outside the product

    return breaching


@torch.no_grad()
def _set_rows(block, ours) -> None:
    """breaching's ``linear0`` computing our rows on the normalised input, and its
    ``linear2`` our ``spread``: the same function as our block in front of the same model.

    Our row k is w_k . u + b_k on pixels u = x std + mean (``ToPixels``), that is
    (w_k std) . x + (b_k + w_k . mean) on the normalised input x; copied from our block's
    own parameters, so whatever scale it gives its rows, breaching's computes the same."""
    per_channel = int(np.prod(SHAPE[1:]))
    std = torch.tensor(IMAGENET.std).repeat_interleave(per_channel)
    mean = torch.tensor(IMAGENET.mean, dtype=torch.float64).repeat_interleave(per_channel)
    weight = ours.bins.weight.detach()
    block.linear0.weight.copy_(weight * std)
    block.linear0.bias.copy_(ours.bins.bias.detach().double() + weight.double() @ mean)
    block.linear2.weight.copy_(ours.spread.weight.detach())
    block.linear2.bias.copy_(ours.spread.bias.detach())


def build_theirs(case: dict, modification) -> dict:
    breaching = _breaching()
    from breaching.cases.malicious_modifications.imprint import ImprintBlock
    from breaching.cases.servers import MaliciousModelServer

    # What _place_malicious_block reads of its server: the first-layer types and the data's
    # shape and modality (the rest of MaliciousModelServer needs a dataset and a user).
    server = SimpleNamespace(
        CANDIDATE_FIRST_LAYERS=MaliciousModelServer.CANDIDATE_FIRST_LAYERS,
        cfg_data=SimpleNamespace(shape=SHAPE, modality="vision"),
    )
    model, secrets = MaliciousModelServer._place_malicious_block(
        server,
        copy.deepcopy(case["model"]),
        ImprintBlock,
        type="ImprintBlock",
        num_bins=modification.rows,
        connection="linear",
        linfunc="avg",
    )
    block = next(m for m in model.modules() if isinstance(m, ImprintBlock))
    _set_rows(block, modification.model.server_block)
    cfg = breaching.get_attack_config("imprint")
    setup = {"dtype": torch.float, "device": torch.device("cpu")}
    attacker = breaching.attacks.prepare_attack(model, torch.nn.CrossEntropyLoss(), cfg, setup)
    hits = []
    invert = attacker.invert_fc_layer

    def counted(weight_grad, bias_grad, positions):  # instrumentation only: the hits it found
        found = invert(weight_grad, bias_grad, positions)
        hits.append(int(found.shape[0]))
        return found

    attacker.invert_fc_layer = counted
    metadata = SimpleNamespace(
        shape=SHAPE, mean=list(IMAGENET.mean), std=list(IMAGENET.std), modality="vision"
    )
    payload = [  # the server's parameters and public buffers (its rtf case sends both)
        {
            "parameters": [p.detach() for p in model.parameters()],
            "buffers": [b.detach() for b in model.buffers()],
            "metadata": metadata,
        }
    ]
    return {
        "model": model,
        "attacker": attacker,
        "payload": payload,
        "secrets": {"ImprintBlock": secrets},
        "hits": hits,
        "bias_index": secrets["bias_idx"],
    }


def run_theirs(case: dict, theirs: dict) -> dict:
    model = theirs["model"]
    parameters = trainable_parameters(model)
    start = time.perf_counter()
    update = client_update(
        model, parameters, case["images"], case["labels"], ClientProtocol(), differentiable=False
    )
    read_start = time.perf_counter()
    shared = [
        {
            "gradients": [u.detach() for u in update],
            "buffers": None,
            "metadata": {
                "num_data_points": BATCH,
                "labels": case["labels"].clone(),
                "local_hyperparams": None,
            },
        }
    ]
    output, _ = theirs["attacker"].reconstruct(
        theirs["payload"], shared, theirs["secrets"], dryrun=False
    )
    end = time.perf_counter()
    return {
        "images": output["data"].detach(),
        "total": end - start,
        "read_back": end - read_start,
        "returned": theirs["hits"][-1],
        "bias_gradient": update[theirs["bias_index"]].detach().clone(),
    }


# -- the run ---------------------------------------------------------------------------------


def _summary(runs: list[dict], pixels: torch.Tensor) -> dict:
    scores = [_score(r["images"], pixels) for r in runs]
    recovered = [sum(v >= RECOVERED_DB for v in s) for s, _ in scores]
    first, nearest = scores[0]
    good = [v for v in first if v >= RECOVERED_DB]
    return {
        "recovered": recovered[0],
        "recovered_each_run": recovered,
        "psnr_recovered_mean": statistics.fmean(good) if good else None,
        "psnr_recovered_min": min(good) if good else None,
        "psnr_all_mean": statistics.fmean(first),
        "psnr": [round(v, 3) for v in first],
        "nearest_at_threshold": sum(v >= RECOVERED_DB for v in nearest),
        "psnr_nearest": [round(v, 3) for v in nearest],
        "returned": runs[0]["returned"],
        "total_seconds": [r["total"] for r in runs],
        "read_back_seconds": [r["read_back"] for r in runs],
        "total_median": statistics.median(r["total"] for r in runs),
        "read_back_median": statistics.median(r["read_back"] for r in runs),
    }


def measure(case: dict, preset: str) -> dict:
    config, modification = build_ours(case, preset)
    thresholds = modification.thresholds
    theirs = build_theirs(case, modification)
    run_ours(case, config, modification)  # warm-up, not timed
    run_theirs(case, theirs)
    runs = {"ours": [], "breaching": []}
    for _ in range(REPEATS):
        runs["ours"].append(run_ours(case, config, modification))
        runs["breaching"].append(run_theirs(case, theirs))
    ours_bias = runs["ours"][0]["bias_gradient"].double()
    their_bias = runs["breaching"][0]["bias_gradient"].double()
    row = {
        "preset": preset,
        "bins": len(thresholds),
        "prior": modification.prior.source,
        # The two models compute the same function: their rows' bias gradients agree.
        "bias_gradient_relative_difference": float(
            (ours_bias - their_bias).abs().max() / ours_bias.abs().max()
        ),
        "ours": _summary(runs["ours"], case["pixels"]),
        "breaching": _summary(runs["breaching"], case["pixels"]),
    }
    del runs, theirs, modification
    gc.collect()
    return row


def _psnr_cell(side: dict) -> str:
    if side["psnr_recovered_mean"] is None:
        return "-"
    return f"{side['psnr_recovered_mean']:.1f} (min {side['psnr_recovered_min']:.1f})"


def render(result: dict) -> str:
    lines = [
        "| bins | side | recovered (>= 30 dB, of 64) | mean PSNR of those, dB | nearest "
        "reconstruction >= 30 dB | bins read back | mean PSNR of all 64, dB | total s "
        "(update + read-back), median | read-back s, median |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        for side in ("ours", "breaching"):
            s = row[side]
            lines.append(
                f"| {row['bins']} ({row['preset']} preset) | {side} | {s['recovered']} | "
                f"{_psnr_cell(s)} | {s['nearest_at_threshold']} | {s['returned']} | "
                f"{s['psnr_all_mean']:.1f} | "
                f"{s['total_median']:.2f} | {s['read_back_median']:.2f} |"
            )
    runs = "; ".join(
        f"{row['bins']} bins, {side}: total "
        + ", ".join(f"{v:.2f}" for v in row[side]["total_seconds"])
        + " s, read-back "
        + ", ".join(f"{v:.2f}" for v in row[side]["read_back_seconds"])
        + " s"
        for row in result["rows"]
        for side in ("ours", "breaching")
    )
    agreement = ", ".join(
        f"{row['bins']} bins: {row['bias_gradient_relative_difference']:.1e}"
        for row in result["rows"]
    )
    return (
        "\n".join(lines)
        + f"\n\nEach run: {runs}. Largest difference of the two models' row-bias gradients, "
        f"relative to the largest: {agreement}. Thresholds from {result['rows'][0]['prior']}. "
        f"Product at {result['revision']}. Measured on: {result['machine']}, while the machine may have been shared with other "
        "work."
    )


def _revision() -> str:
    """The product's commit measured, and whether auditlib had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "auditlib"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" with uncommitted changes to auditlib" if dirty else "")


def main() -> None:
    if sys.argv[1:] == ["--render-only"]:  # the table again from the last results
        replace_section(DOC, MARKER, render(json.loads(RESULTS.read_text())))
        return
    if not (PEERS / "breaching").is_dir():
        raise SystemExit(f"breaching is not installed in {PEERS}; see this module's docstring")
    case = _case()
    rows = []
    for preset in PRESETS:
        row = measure(case, preset)
        print(json.dumps({k: v for k, v in row.items() if k not in ("ours", "breaching")}))
        rows.append(row)
    result = {
        "machine": machine(),
        "revision": _revision(),
        "case": {
            "model": "resnet18, torchvision stem, 1000 classes, seed 0 (no pretrained weights)",
            "input": list(SHAPE),
            "normalization": IMAGENET.as_dict(),
            "batch": BATCH,
            "images": list(case["names"]),
            "protocol": "FedSGD, BatchNorm in training mode",
            "repeats": REPEATS,
        },
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    text = render(result)
    replace_section(DOC, MARKER, text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
