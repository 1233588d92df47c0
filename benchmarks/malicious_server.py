"""The malicious server, measured: what a server that changes the model recovers, on the
product's own path and against the defenses.

1. ``rtf`` through the engine (``run_audit``, as the CLI and the dashboard run it) on
   ResNet-18 at 224 px (torchvision's stem, 1000 classes, untrained), a batch of 64
   photographs (``benchmarks.photo_crops``, written to a folder and read back as an auditor's
   folder is), ImageNet normalisation, FedSGD: images recovered at >= 30 dB, seconds from
   the spec to the result, the verdict under the malicious-server threat model.
2. ``loki`` through the engine under secure aggregation of 8 clients of 8 images (the same
   photographs at 32 px, ResNet-18 with its CIFAR stem): images recovered and attributed to
   the client that held them.
3. The defenses against the malicious server, at the library's level (the product's batch
   cap is 64): the update each defense releases, read back by ``rtf`` (and by ``loki`` under
   secure aggregation); images recovered at >= 30 dB out of B and their mean PSNR, at
   B = 16, 64, 256 and 32 and 224 px. Beyond the 85 crops, a batch takes Fashion-MNIST test
   images, enlarged (``batch_of``). Under the model check each built server (rtf, cah; loki
   under secure aggregation) is read beside the evading server that stands in for it
   (``rtf-evading``, ``cah-evading``, ``loki-evading``), each row saying whether the check
   refused or passed its model.

Writes benchmarks/results/malicious_server.json (``--cuda``: malicious_server-cuda.json, the
same cases on the GPU) and the tables in docs/PERFORMANCE.md ("The malicious server").
Usage: python -m benchmarks.malicious_server [--render-only] [--quick] [--cuda] (quick: the
defense table at 32 px and B <= 64 only; the CPU's table here).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from auditlib.attacks import build_attack_config, get_attack
from auditlib.attacks.base import RunControl
from auditlib.client.protocol import ClientProtocol
from auditlib.data.decode import DEFAULT_LIMITS
from auditlib.data.normalization import Normalization
from auditlib.data.samples import load_sample_set
from auditlib.defenses import build_defense
from auditlib.engine.audit import run_audit
from auditlib.engine.releases import client_batches, client_of_image
from auditlib.fl.scenario import release_aggregate, release_update
from auditlib.metrics import match, psnr, to_unit_range
from auditlib.models import ModelSpec, build_model
from auditlib.server import BuildContext
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from auditlib.threat import PrivateBatch
from benchmarks.common import ROOT, machine, replace_section
from benchmarks.photo_crops import photo_crops

RESULTS = ROOT / "benchmarks" / "results" / "malicious_server.json"
DOC = ROOT / "docs" / "PERFORMANCE.md"
IMAGENET = "0.485,0.456,0.406/0.229,0.224,0.225"
NORMALIZATION = Normalization((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
RECOVERED_DB = 30.0
CROPS = 85  # 17 photographs x 5 positions
CLIENTS = 8
CHUNK = DEFAULT_LIMITS.max_images  # the sample-set loader hands out this many at a time
# (row name, defense, its parameters, clients summed by secure aggregation); a DP row is
# read by the plain server and by the server that knows the defense (``KNOWS``).
DEFENSES = (
    ("none", "none", {}, 1),
    ("DP noise (Gaussian, sigma 0.1, clip 30)", "dp-gaussian", {}, 1),
    ("DP noise (Gaussian, sigma 0.1, no clip)", "dp-gaussian", {"clip": None}, 1),
    ("clipping (L2 norm 4)", "clip", {}, 1),
    ("pruning (90 % per layer)", "prune", {}, 1),
    (f"secure aggregation ({CLIENTS} clients)", "none", {}, CLIENTS),
    ("model check", "model-check", {}, 1),
    (f"model check, secure aggregation ({CLIENTS} clients)", "model-check", {}, CLIENTS),
)
# Under the model check each built server is read beside the evading server that stands in
# for it (``attacks.evading``: built to pass the check as it stands).
CHECKED = {1: ("rtf", "rtf-evading", "cah", "cah-evading"), CLIENTS: ("loki", "loki-evading")}


def model_of(size: int) -> ModelSpec:
    stem = "imagenet" if size >= 64 else "cifar"
    return ModelSpec("resnet18", 1000, (3, size, size), stem=stem, seed=0)


def batch_of(count: int, size: int) -> tuple[torch.Tensor, tuple[str, ...]]:
    """``count`` distinct images: the 85 photograph crops, then Fashion-MNIST test images
    (seed 0's order) enlarged to ``size`` and repeated over the colour channels. Mirrored or
    turned crops would not do: they keep their crop's brightness, so they share its bin."""
    pixels, names = photo_crops(min(count, CROPS), size)
    parts, labels = [pixels], list(names)
    for offset in range(0, max(count - CROPS, 0), CHUNK):
        more = load_sample_set("fashion-mnist", min(CHUNK, count - CROPS - offset), offset=offset)
        for image, name in zip(more.images, more.names, strict=True):
            grey = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
            grey = F.interpolate(
                grey[None], size=(size, size), mode="bilinear", align_corners=False
            )
            parts.append(grey.clamp(0, 1).expand(1, 3, size, size))
            labels.append(name)
    return torch.cat(parts)[:count], tuple(labels[:count])


def write_folder(pixels: torch.Tensor, names: tuple[str, ...], folder: Path) -> None:
    for image, name in zip(pixels, names, strict=True):
        array = (image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        Image.fromarray(array).save(folder / f"{name}.png")


def engine_case(
    attack: str, size: int, batch: int, clients: int | None, device: str = "cpu"
) -> dict:
    """One audit through ``run_audit`` from an auditor's folder of photographs."""
    pixels, names = photo_crops(batch, size)
    with tempfile.TemporaryDirectory() as folder:
        write_folder(pixels, tuple(f"{i:03d}-{n}" for i, n in enumerate(names)), Path(folder))
        spec = RunSpec(
            model=ModelRef(model_of(size)),
            data=DataSpec("folder", folder, batch_size=batch, normalization=IMAGENET),
            scenario=ScenarioSpec(server="malicious", secure_aggregation=clients),
            attack=ComponentSpec.of(attack, preset="audit"),
            defense=ComponentSpec.of("none"),
            budget=Budget(1),
            device=device,
        )
        began = time.perf_counter()
        result = run_audit(spec, lpips_nets=())
        seconds = time.perf_counter() - began
    summary = result.summary
    scores = [p.psnr for p in summary.metrics.per_image]
    recovered = [p for p in scores if p >= RECOVERED_DB]
    return {
        "attack": attack,
        "size": size,
        "batch": batch,
        "clients": clients,
        "seconds": seconds,
        "attack_seconds": summary.attacks[0].seconds,
        "recovered": len(recovered),
        "recovered_psnr_mean": statistics.fmean(recovered) if recovered else None,
        "attributed": summary.attacks[0].images_attributed,
        "outcome": summary.verdict.outcome,
        "headline": summary.verdict.headline,
        "sok_model": summary.verdict.scope.threat.sok_model,
    }


# The defenses whose rows the server that knows the defense reads too (its twin).
KNOWS = ("dp-gaussian",)
TWIN = " (knows the defense)"


def defense_case(
    attack: str,
    defense: str,
    params: dict,
    clients: int,
    size: int,
    batch: int,
    device: str = "cpu",
    knows: bool = False,
):
    """The release of the model ``attack`` builds, under ``defense``, read back; scored.
    ``knows``: the server knows the defense (the twin, as the engine runs it: its model
    built for the known noise and clip, its read-back told the noise)."""
    pixels, names = batch_of(batch, size)
    images = NORMALIZATION.normalize(pixels).to(device)
    labels = torch.randint(0, 1000, (batch,), generator=torch.Generator().manual_seed(0))
    labels = labels.to(device)
    private = PrivateBatch(images, labels, names)
    model = build_model(model_of(size)).to(device)
    info = get_attack(attack)
    config, _ = build_attack_config(attack, None, "audit")
    per_client = -(-batch // clients)
    context = BuildContext(model, (3, size, size), per_client, clients, NORMALIZATION, None, 0)
    guard, _ = build_defense(defense, params)
    known = guard.known_to_attacker(None, {}) if knows else None  # DP's needs no observation
    if known is not None:
        context = replace(context, noise_std=known.entry_noise_std, clip_norm=known.clip_norm)
    began = time.perf_counter()
    try:
        modification = info.builds(config, context)
    except Exception as exc:  # a refusal (too large a block): the table says so
        return {"refused": str(exc)}
    arguments = {
        "normalization": NORMALIZATION,
        "num_classes": 1000,
        "labels_known": False,
        "seed": 0,
    }
    if clients == 1:
        release = release_update(
            modification.model_for(0), private, ClientProtocol(), guard, **arguments
        )
    else:
        release = release_aggregate(
            modification.model_for,
            client_batches(private, clients),
            ClientProtocol(),
            guard,
            **arguments,
        )
    knowledge = replace(release.knowledge, server=modification, defense=known)
    final = None
    for event in info.run(release.observation, knowledge, config, RunControl(1), 0):
        final = event.final
    candidate = final.selected  # on the CPU: the read-back has finished
    seconds = time.perf_counter() - began
    rebuilt = to_unit_range(candidate.images, NORMALIZATION)
    originals = to_unit_range(images.cpu(), NORMALIZATION)
    order = match(rebuilt, originals)
    scores = [psnr(rebuilt[j], originals[i]) for i, j in enumerate(order)]
    recovered = [s for s in scores if s >= RECOVERED_DB]
    owners = client_of_image(private, clients)
    attributed = None
    if candidate.clients is not None:
        attributed = sum(
            1
            for i, j in enumerate(order)
            if scores[i] >= RECOVERED_DB and candidate.clients[j] == owners[i]
        )
    checked = str(release.privacy.get("model_check", ""))
    return {
        "recovered": len(recovered),
        "recovered_psnr_mean": statistics.fmean(recovered) if recovered else None,
        "attributed": attributed,
        "seconds": seconds,
        "privacy": {k: str(v) for k, v in release.privacy.items()},
        # The model check's word on the model: "refused" or "passed" (None: no check).
        "check": None if not checked else "refused" if checked.startswith("flagged") else "passed",
    }


def measure(quick: bool, device: str) -> dict:
    torch.manual_seed(0)
    results = {"machine": machine(), "device": device, "quick": quick, "engine": [], "defenses": []}
    results["engine"].append(engine_case("rtf", 224, 64, None, device))
    print(results["engine"][-1], flush=True)
    results["engine"].append(engine_case("loki", 32, 64, CLIENTS, device))
    print(results["engine"][-1], flush=True)
    sizes = (32,) if quick else (32, 224)
    batches = (16, 64) if quick else (16, 64, 256)
    for size in sizes:
        for batch in batches:
            for name, defense, params, clients in DEFENSES:
                attacks = ("rtf", "loki") if clients > 1 else ("rtf",)
                if defense == "model-check":
                    attacks = CHECKED[clients]
                for attack in attacks:
                    for knows in (False, True) if defense in KNOWS else (False,):
                        label = attack + (TWIN if knows else "")
                        row = {"defense": name, "attack": label, "size": size, "batch": batch}
                        row |= defense_case(
                            attack, defense, params, clients, size, batch, device, knows
                        )
                        print(row, flush=True)
                        results["defenses"].append(row)
    return results


def render(results: dict) -> str:
    lines = [f"Measured on {results['machine']} (`python -m benchmarks.malicious_server`).", ""]
    lines += [
        "| attack | model, images | seconds (spec to result) | recovered >= 30 dB | attributed | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["engine"]:
        clients = f", secure aggregation of {row['clients']}" if row["clients"] else ""
        psnr_text = f" ({row['recovered_psnr_mean']:.1f} dB)" if row["recovered_psnr_mean"] else ""
        attributed = "-" if row["attributed"] is None else f"{row['attributed']} of {row['batch']}"
        lines.append(
            f"| {row['attack']} | ResNet-18 {row['size']} px, {row['batch']} photographs{clients} "
            f"| {row['seconds']:.1f} | {row['recovered']} of {row['batch']}{psnr_text} | {attributed} "
            f"| {row['outcome']} (SoK {row['sok_model']}) |"
        )
    lines += [
        "",
        "| defense | attack | px | B | recovered >= 30 dB (mean PSNR) | attributed | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["defenses"]:
        if "refused" in row:
            lines.append(
                f"| {row['defense']} | {row['attack']} | {row['size']} | {row['batch']} | refused: {row['refused']} | - | - |"
            )
            continue
        mean = (
            "" if row["recovered_psnr_mean"] is None else f" ({row['recovered_psnr_mean']:.1f} dB)"
        )
        attributed = "-" if row["attributed"] is None else str(row["attributed"])
        attack = row["attack"] + (f" ({row['check']} by the check)" if row.get("check") else "")
        lines.append(
            f"| {row['defense']} | {attack} | {row['size']} | {row['batch']} | "
            f"{row['recovered']} of {row['batch']}{mean} | {attributed} | {row['seconds']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    device = "cuda" if "--cuda" in sys.argv else "cpu"
    path = RESULTS if device == "cpu" else RESULTS.with_name("malicious_server-cuda.json")
    if "--render-only" in sys.argv:
        results = json.loads(path.read_text())
    else:
        results = measure("--quick" in sys.argv, device)
        path.write_text(json.dumps(results, indent=2) + "\n")
    if device == "cpu":
        replace_section(DOC, "malicious-server", render(results))
    else:
        replace_section(DOC, "malicious-server-cuda", render(results))
    print(render(results))


if __name__ == "__main__":
    main()
