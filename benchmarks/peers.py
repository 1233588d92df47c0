"""The product beside breaching (Geiping et al.'s library, the field's reference optimisation
attacks), in one run, on the same model weights, the same photograph and the same observed
gradient: seconds per run, iterations per second and PSNR of each.

breaching is never a dependency of the product: it is installed into its own folder,
``.peers/site`` (git-ignored), and imported only here::

    .venv/bin/python -m pip install --target .peers/site --no-deps \\
        breaching==0.1.2 hydra-core omegaconf antlr4-python3-runtime==4.9.3

(its own requirements besides these, torch, torchvision, scipy and lpips, are the product's).
Rows, interleaved (ours, breaching, ours, breaching) so that load on the machine falls on both:

- DLG on DLG's LeNet (sigmoid, U(-0.5, 0.5), 100 classes), 32x32, labels optimised jointly,
  L-BFGS lr 1 with 20 evaluations per step: breaching's ``deepleakage`` against our ``dlg``;
- IG on the same LeNet, labels known to both, Adam lr 0.1 with signed gradients, step
  decay at 3/8, 5/8, 7/8, boxed, cosine distance, TV 1e-4 (breaching's TV scale set to ours):
  breaching's ``invertinggradients`` against our ``ig`` (paper preset);
- IG on ResNet-18 (the GRNN thesis's sigmoid, uniform-initialised form), 32x32, the same.

One restart each, the same iteration count on both sides, after an untimed warm-up of each;
ten runs each with seeds 0 to 9, and for each seed both sides start from the same draw
(ours; breaching's initialiser returns it, its algorithm untouched), so PSNRs compare start
for start. Seconds are wall-clock per run on this machine's 2 threads, from the attack's
start to its last image (model already built, gradient already computed); evaluations are
the model's forward passes in that time (one per objective evaluation: an L-BFGS step makes
1 to 20, so a run's time is read beside them); PSNR against the photograph in [0, 1]
(docs/METRICS.md).

Writes benchmarks/results/peers.json and the table in docs/PERFORMANCE.md.
Usage: python -m benchmarks.peers [--render-only]
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time

import torch

from auditlib.attacks import RunControl, build_attack_config, get_attack
from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import client_update, trainable_parameters
from auditlib.engine.audit import prepare_victim
from auditlib.threat import AttackerKnowledge, Observation
from benchmarks.common import ROOT, machine, replace_section
from benchmarks.reproduce_attacks import LENET, RESNET18, photograph, spec_of

PEERS = ROOT / ".peers" / "site"
RESULTS = ROOT / "benchmarks" / "results" / "peers.json"
DOC = ROOT / "docs" / "PERFORMANCE.md"
# Seeds 0..9 on each side. From the same start the two sides part after a few steps (float
# differences between two implementations of one algorithm, which signed gradients and
# L-BFGS's line steps magnify), so a seed's PSNR difference is a draw: the table gives the
# paired mean difference with its standard error, which five seeds left too wide to read.
REPEATS = 10
# (name, our attack, our preset, breaching's attack, model, iterations, labels known)
ROWS = (
    ("DLG, LeNet 32x32", "dlg", None, "deepleakage", LENET, 100, False),
    ("IG, LeNet 32x32", "ig", "paper", "invertinggradients", LENET, 500, True),
    ("IG, ResNet-18 32x32", "ig", "paper", "invertinggradients", RESNET18, 100, True),
)


def _case(model_spec):
    """The victim's model, photograph and FedSGD gradient, as both sides get them."""
    spec = spec_of(model_spec, "ig", data=photograph(0), iterations=1)
    victim = prepare_victim(spec)
    model = victim.model
    parameters = trainable_parameters(model)
    gradient = client_update(
        model,
        parameters,
        victim.batch.images,
        victim.batch.labels,
        ClientProtocol(),
        differentiable=False,
    )
    return victim, tuple(parameters), tuple(g.detach() for g in gradient)


def _counting_forwards(model: torch.nn.Module) -> list[int]:
    """A counter of ``model``'s forward passes (one per objective evaluation on either side;
    it survives breaching's copies of the model, which copy its hooks): the work a run did,
    which its iteration count does not say (an L-BFGS step makes 1 to 20 evaluations)."""
    count = [0]

    def seen(module, inputs):
        count[0] += 1

    model.register_forward_pre_hook(seen)
    return count


def _psnr(images: torch.Tensor, victim) -> float:
    norm = victim.normalization
    mean = torch.tensor(norm.mean).view(1, -1, 1, 1)
    std = torch.tensor(norm.std).view(1, -1, 1, 1)
    unit = (images.cpu() * std + mean).clamp(0, 1)
    truth = victim.batch.images * std + mean
    mse = float((unit - truth).pow(2).mean())
    return 10 * torch.log10(torch.tensor(1 / max(mse, 1e-10))).item()


def our_knowledge(victim, classes, model, labels_known) -> AttackerKnowledge:
    """What our attacker knows of the victim's one photograph: ``model`` (the server's,
    on the device it runs on), FedSGD, the labels where they are known."""
    return AttackerKnowledge(
        model=model,
        protocol=ClientProtocol(),
        batch_size=1,
        input_shape=tuple(victim.batch.images.shape[1:]),
        num_classes=classes,
        normalization=victim.normalization,
        labels=victim.batch.labels.clone() if labels_known else None,
    )


def ours(victim, classes, names, gradient, attack, preset, iterations, labels_known, seed=0):
    model = copy.deepcopy(victim.model)
    forwards = _counting_forwards(model)
    knowledge = our_knowledge(victim, classes, model, labels_known)
    observation = Observation("gradient", gradient, names)
    config, _ = build_attack_config(attack, {"restarts": 1}, preset)
    control = RunControl(iterations, emit_every=iterations, image_every=iterations)
    start = time.perf_counter()
    final = None
    for event in get_attack(attack).run(observation, knowledge, config, control, seed):
        final = event.final or final
    seconds = time.perf_counter() - start
    return seconds, final.steps, _psnr(final.selected.images, victim), forwards[0]


def our_start(victim, classes, labels_known, seed):
    """The start our attack draws for ``seed``: images, then (labels unknown) label logits,
    from one generator (``attacks.loop``, ``objectives.random_images``)."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(victim.batch.images.shape, generator=generator)
    logits = None if labels_known else torch.randn((1, classes), generator=generator)
    return images, logits


def _start_from_ours(attacker, victim, classes, labels_known, seed) -> None:
    """breaching draws its start from the global generator through ``_initialize_data``
    (the candidate images, and for DLG the label logits after a label template); here
    that method returns our draw for the same seed instead, so both sides start from the
    same point and their PSNRs compare start for start. The algorithm is untouched."""
    images, logits = our_start(victim, classes, labels_known, seed)
    original = attacker._initialize_data
    calls = {"labels": 0}

    def same_start(shape):
        candidate = original(shape)  # breaching's own set-up (grad, memory format)
        if tuple(shape) == tuple(images.shape):
            candidate.data.copy_(images)
        elif logits is not None and tuple(shape) == tuple(logits.shape):
            calls["labels"] += 1
            if calls["labels"] == 2:  # the first is prepare_attack's label template
                candidate.data.copy_(logits)
        return candidate

    attacker._initialize_data = same_start


def theirs(victim, classes, gradient, attack, iterations, labels_known, seed=0, device="cpu"):
    sys.path.insert(0, str(PEERS))
    import breaching  # the peer is optional and lives outside the product

    cfg = breaching.get_config(overrides=["case=1_single_image_small", f"attack={attack}"])
    cfg.attack.optim.max_iterations = iterations
    cfg.attack.optim.callback = iterations
    cfg.attack.restarts.num_trials = 1
    if attack == "invertinggradients":
        cfg.attack.regularization.total_variation.scale = 1e-4  # ours
    norm = victim.normalization
    data = cfg.case.data
    data.mean, data.std = list(norm.mean), list(norm.std)
    data.shape = list(victim.batch.images.shape[1:])
    data.classes = classes
    setup = {"dtype": torch.float, "device": torch.device(device)}
    model = copy.deepcopy(victim.model).to(device)
    forwards = _counting_forwards(model)
    loss = torch.nn.CrossEntropyLoss()
    attacker = breaching.attacks.prepare_attack(model, loss, cfg.attack, setup)
    payload = [
        {
            "parameters": [p.detach().clone() for p in model.parameters()],  # on ``device``
            "buffers": None,
            "metadata": data,
        }
    ]
    shared = [
        {
            "gradients": [g.to(device, copy=True) for g in gradient],
            "buffers": None,
            "metadata": {
                "num_data_points": 1,
                "labels": victim.batch.labels.to(device, copy=True) if labels_known else None,
                "local_hyperparams": None,
            },
        }
    ]
    _start_from_ours(attacker, victim, classes, labels_known, seed)
    start = time.perf_counter()
    output, _ = attacker.reconstruct(payload, shared, {}, dryrun=False)
    if setup["device"].type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return seconds, iterations, _psnr(output["data"].detach(), victim), forwards[0]


def _paired(ours: list[float], theirs: list[float]) -> tuple[float, float]:
    """Mean of the per-seed PSNR differences (ours - breaching) and its standard error."""
    differences = [o - b for o, b in zip(ours, theirs, strict=True)]
    mean = statistics.mean(differences)
    error = statistics.stdev(differences) / len(differences) ** 0.5 if len(differences) > 1 else 0
    return mean, error


def render(rows: list[dict]) -> str:
    """The summary table (seconds and evaluations summed over the seeds, median PSNR, the
    paired PSNR difference), then every seed."""
    lines = [
        "| row | iterations | ours: s / it/s / evaluations / ms per evaluation / median PSNR | "
        "breaching: the same | time ours / breaching | per evaluation | PSNR ours - "
        "breaching: mean ± s.e. over the seeds | seeds where our PSNR is lower |",
        "|---|---|---|---|---|---|---|---|",
    ]
    details = []
    for r in rows:
        cells, per_evaluation = [], []
        for side in ("ours", "breaching"):
            s = r[side]
            seconds, evaluations = sum(s["seconds"]), sum(s["evaluations"])
            steps = s["steps"] * len(s["seconds"])  # optimiser steps, as each loop counts them
            per_evaluation.append(seconds / evaluations)
            cells.append(
                f"{seconds:.1f} / {steps / seconds:.1f} / {evaluations} / "
                f"{1000 * seconds / evaluations:.2f} / {statistics.median(s['psnr']):.2f}"
            )
        ratio = sum(r["ours"]["seconds"]) / sum(r["breaching"]["seconds"])
        mean, error = _paired(r["ours"]["psnr"], r["breaching"]["psnr"])
        lower = sum(
            o < b - 0.01 for o, b in zip(r["ours"]["psnr"], r["breaching"]["psnr"], strict=True)
        )
        lines.append(
            f"| {r['row']} | {r['iterations']} | {cells[0]} | {cells[1]} | {ratio:.2f} | "
            f"{per_evaluation[0] / per_evaluation[1]:.2f} | {mean:+.2f} ± {error:.2f} dB | "
            f"{lower} of {len(r['ours']['psnr'])} |"
        )
        per_seed = ", ".join(
            f"{seed}: {o:.2f}/{b:.2f} dB, {os_:.1f}/{bs:.1f} s, {oe}/{be} ev."
            for seed, (o, b, os_, bs, oe, be) in enumerate(
                zip(
                    r["ours"]["psnr"],
                    r["breaching"]["psnr"],
                    r["ours"]["seconds"],
                    r["breaching"]["seconds"],
                    r["ours"]["evaluations"],
                    r["breaching"]["evaluations"],
                    strict=True,
                )
            )
        )
        details.append(f"- {r['row']}, seed: ours/breaching: {per_seed}")
    seeds = len(rows[0]["ours"]["psnr"]) if rows else 0
    return (
        "\n".join(lines)
        + "\n\n"
        + "\n".join(details)
        + f"\n\n{seeds} interleaved runs each, seeds 0 to {seeds - 1}, each seed's start the "
        f"same on both sides; an evaluation is one forward pass of the model (one objective "
        f"evaluation). Measured on: {machine()}."
    )


def main() -> None:
    if sys.argv[1:] == ["--render-only"]:  # the table again from the last results
        replace_section(DOC, "peers", render(json.loads(RESULTS.read_text())["rows"]))
        return
    if not (PEERS / "breaching").is_dir():
        raise SystemExit(f"breaching is not installed in {PEERS}; see this module's docstring")
    torch.set_num_threads(2)
    rows = []
    for label, attack, preset, peer, model_spec, iterations, labels_known in ROWS:
        victim, names, gradient = _case(model_spec)
        classes = model_spec.num_classes
        runs = {"ours": [], "breaching": []}
        # Warm-up of both sides (lazy imports, first optimiser, allocator), not timed.
        ours(victim, classes, names, gradient, attack, preset, 2, labels_known)
        theirs(victim, classes, gradient, peer, 2, labels_known)
        for seed in range(REPEATS):
            runs["ours"].append(
                ours(
                    victim, classes, names, gradient, attack, preset, iterations, labels_known, seed
                )
            )
            runs["breaching"].append(
                theirs(victim, classes, gradient, peer, iterations, labels_known, seed)
            )
        row = {"row": label, "iterations": iterations}
        for side, results in runs.items():
            row[side] = {
                "seconds": [r[0] for r in results],
                "steps": results[0][1],
                "psnr": [r[2] for r in results],
                "evaluations": [r[3] for r in results],
            }
        print(json.dumps(row), flush=True)
        rows.append(row)
    RESULTS.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2) + "\n")
    text = render(rows)
    replace_section(DOC, "peers", text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
