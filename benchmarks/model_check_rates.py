"""The client's model check, as error rates (issue 54): how many honest models it refuses and
how many malicious ones it lets through, per server family, with what a server that passes
still recovers; and what the check costs the client.

Honest models: every built-in architecture (``ARCHITECTURES``, the MLP also with ReLU) at
32 px, inits default and uniform untrained, and from its trainable init after 3 FedAvg
rounds (``fl.training.federated_averaging``) and after real training (an epoch of SGD on
512 Fashion-MNIST training images); torchvision's ResNet-18, MobileNet V3 small and
SqueezeNet 1.1 at 32 px (``models.zoo``) in the same three states; each over several seeds,
each checked on a client batch (4, 8 or 16 images of Fashion-MNIST, photographs or digits,
drawn by seed).

Malicious models: every registered attack that builds a model (``AttackInfo.builds``), its
audit preset and each choice of its config's ``disguise``, ``activation`` and ``property``
fields (so an evading or disguised server appears here once registered), in front of LeNet,
ResNet-20 or ResNet-18 at 32 px, for a batch of 4, 8 or 16, each drawn by seed; one client
(LOKI's kernels for client 0 of 1). A learned disguise (``seer-disguised``) trains for
minutes, so it is built once per base model and checked on several batches.

For each check: the check's verdict at its default settings, each behaviour statistic
(``defenses.model_behaviour``: the most suspicious layer's ownership, chain and D-SNR),
and, for a malicious model, what its read-back recovers from the update the client sends
(>= 30 dB, matched). The operating point at FPR <= 1 %: the budget of false alarms (1 % of
the honest checks, less those the weight signatures already raise) split evenly over the
three behaviour statistics, each threshold set just above that many honest values.

Writes benchmarks/results/model_check_rates.json and .md (the tables).
Usage: python -m benchmarks.model_check_rates [--quick] [--render-only] [--samples N]
       [--part malicious|honest|cost, then --merge: the parts on two CPUs at once]
(--quick: 1 seed, no torchvision or trained models, a few minutes)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import typing
import zlib
from dataclasses import fields, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from auditlib.attacks import ATTACKS
from auditlib.attacks.base import RunControl
from auditlib.client.protocol import ClientProtocol
from auditlib.config import build_config
from auditlib.data.model_input import to_model_batch
from auditlib.data.normalization import Normalization
from auditlib.data.samples import load_sample_set
from auditlib.data.training_sets import bundled_sets
from auditlib.defenses import ClientContext, build_defense
from auditlib.defenses import model_behaviour as mb
from auditlib.defenses import model_signatures as sig
from auditlib.errors import AuditInputError
from auditlib.fl.scenario import release_update
from auditlib.fl.training import FederatedTraining, federated_averaging, pretraining_pool
from auditlib.metrics import match, psnr, to_unit_range
from auditlib.models import ModelSpec, build_model
from auditlib.models.registry import ARCHITECTURES, trainable_init
from auditlib.server import BuildContext
from auditlib.threat import PrivateBatch
from benchmarks.common import ROOT, machine

NORM = Normalization((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
SHAPE = (3, 32, 32)
SOURCES = ("fashion-mnist", "photographs", "digits")
BATCHES = (4, 8, 16)
BASES = ("lenet", "resnet20", "resnet18")
TORCHVISION = (
    "torchvision:resnet18",
    "torchvision:mobilenet_v3_small",
    "torchvision:squeezenet1_1",
)
VARIANT_FIELDS = ("disguise", "activation", "property")
SLOW = {"seer-disguised"}  # trained servers: built once per base model
QUICK_STEPS = 200  # --quick trains a learned disguise this many steps (said in its rows)
FPR = 0.01
RECOVERED_DB = 30.0
RESULTS = ROOT / "benchmarks" / "results" / "model_check_rates.json"


def client_batch(rng: np.random.Generator, shape=SHAPE) -> tuple[torch.Tensor, str]:
    source = SOURCES[int(rng.integers(len(SOURCES)))]
    count = BATCHES[int(rng.integers(len(BATCHES)))]
    room = 17 - count if source == "photographs" else 40  # 17 photographs
    offset = int(rng.integers(0, room + 1))
    loaded = load_sample_set(source, count, offset=offset)
    return to_model_batch(list(loaded.images), shape, NORM), f"{source} {count} @{offset}"


def check(model: nn.Module, batch: torch.Tensor, labels: torch.Tensor) -> dict:
    """The check's verdict at its defaults and the statistics behind it."""
    defense, _ = build_defense("model-check")
    parameters = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    context = ClientContext(model, parameters, batch, labels, ClientProtocol())
    began = time.perf_counter()
    reason = defense.refuses(context)
    seconds = time.perf_counter() - began
    weights, _ = sig.weight_findings(model)
    dominance, _ = sig.batch_findings(model, batch)
    seen = defense.behaviour
    layers = seen.layers if seen is not None else ()
    chains = [layer.chain for layer in layers if layer.chain_sizes >= mb.CHAIN_SIZES]
    return {
        "refused": reason is not None,
        "reason": reason,
        "weight_signatures": sorted({f.signature for f in weights}),
        "dominance": bool(dominance),
        "ownership": max((layer.ownership for layer in layers), default=0.0),
        "chain": max(chains, default=0.0),
        "dsnr": max((layer.dsnr for layer in layers), default=0.0),
        "behaviour_unavailable": seen.why_unavailable if seen is not None else "off",
        "seconds": seconds,
    }


# --- honest models -----------------------------------------------------------------------


def train_centrally(model: nn.Module, seed: int) -> float:
    """An epoch of SGD (lr 0.01, momentum 0.9, batches of 32) on 512 Fashion-MNIST training
    images; its mean loss."""
    sets = bundled_sets("fashion-mnist", 512, 1, seed)
    images = to_model_batch(list(sets.train_images), SHAPE, NORM)
    labels = torch.as_tensor(sets.train_labels % 10)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for _ in range(1):
        losses = []
        for chunk in torch.randperm(len(images), generator=generator).split(32):
            optimiser.zero_grad()
            loss = F.cross_entropy(model(images[chunk]), labels[chunk])
            loss.backward()
            optimiser.step()
            losses.append(float(loss))
    optimiser.zero_grad(set_to_none=True)
    model.eval()
    return statistics.fmean(losses)


def honest_specs(seed: int, quick: bool):
    """(name, spec, state) for one seed."""
    for arch in ARCHITECTURES:
        for activation in (None, "relu") if arch == "mlp" else (None,):
            label = arch + (f"-{activation}" if activation else "")
            base = ModelSpec(arch, 10, SHAPE, seed=seed, activation=activation)
            for init in ("default", "uniform"):
                yield label, replace(base, init=init), "untrained"
            trainable = replace(base, init=trainable_init(base))
            yield label, trainable, "fedavg"
            if not quick:
                yield label, trainable, "trained"
    if not quick:
        for name in TORCHVISION:
            for state in ("untrained", "fedavg", "trained"):
                yield name, ModelSpec(name, 10, SHAPE, seed=seed), state


def honest_rows(seeds: int | range, quick: bool) -> list[dict]:
    rows = []
    for seed in range(seeds) if isinstance(seeds, int) else seeds:
        rng = np.random.default_rng(1000 + seed)
        pool = pretraining_pool("fashion-mnist", 512, SHAPE, 10, NORM, seed=seed)
        for label, spec, state in honest_specs(seed, quick):
            try:
                model = build_model(spec)
            except AuditInputError as refusal:
                print(f"skipped {label}: {refusal}", flush=True)
                continue
            loss = None
            if state == "fedavg":
                loss = federated_averaging(model, *pool, FederatedTraining(rounds=3), seed=seed)[-1]
            elif state == "trained":
                loss = train_centrally(model, seed)
            if loss is not None and not math.isfinite(loss):
                print(f"skipped {label} {state} seed {seed}: the training diverged", flush=True)
                continue
            for _ in range(1):  # one client batch a model: 205 models in the time here
                batch, what = client_batch(rng)
                labels = torch.as_tensor(rng.integers(0, 10, len(batch)))
                row = {
                    "kind": "honest",
                    "family": "honest",
                    "model": f"{label}, init {spec.init}, {state}",
                    "seed": seed,
                    "batch": what,
                    "training_loss": loss,
                    **check(model, batch, labels),
                }
                rows.append(row)
                print_row(row)
    return rows


# --- malicious models -------------------------------------------------------------------


def variants(info) -> list[tuple[str, dict]]:
    """The audit preset, then each other choice of each variant field, one at a time."""
    out = [("audit", {})]
    defaults = dict(info.audit.values) if info.audit is not None else {}
    for field in fields(info.config_type):
        if field.name not in VARIANT_FIELDS:
            continue
        hints = typing.get_type_hints(info.config_type)
        choices = typing.get_args(hints[field.name])
        chosen = defaults.get(field.name, field.default)
        out += [(f"{field.name}={c}", {field.name: c}) for c in choices if c != chosen]
    return out


def family_of(attack: str, label: str, values: dict) -> str:
    disguise = values.get("disguise")
    return f"{attack} ({disguise})" if disguise else attack


def read_back(info, config, modification, model, batch, labels) -> tuple[int, float | None]:
    """Images the attack recovers (>= 30 dB, matched) from the update the client sends."""
    private = PrivateBatch(batch, labels, tuple(str(i) for i in range(len(batch))))
    guard, _ = build_defense("none")
    release = release_update(
        model,
        private,
        ClientProtocol(),
        guard,
        normalization=NORM,
        num_classes=10,
        labels_known=False,
        seed=0,
    )
    knowledge = replace(release.knowledge, server=modification)
    final = None
    for event in info.run(release.observation, knowledge, config, RunControl(1), 0):
        final = event.final
    rebuilt = to_unit_range(final.selected.images, NORM)
    originals = to_unit_range(batch, NORM)
    if len(rebuilt) == 0:
        return 0, None
    order = match(rebuilt, originals)
    scores = [psnr(rebuilt[j], originals[i]) for i, j in enumerate(order)]
    good = [s for s in scores if s >= RECOVERED_DB]
    return len(good), (statistics.fmean(min(s, 200.0) for s in good) if good else None)


def malicious_rows(samples: int, quick: bool, first: int = 0) -> list[dict]:
    """``first``: the first draw (a later part adds draws first.. to an earlier one's; the
    learned disguise, built once per base model, only in the part from draw 0)."""
    rows = []
    for attack, info in ATTACKS.items():
        if info.builds is None:
            continue
        for label, params in variants(info):
            values = {**(info.audit.values if info.audit else {}), **params}
            slow = attack in SLOW
            if slow and quick:
                values["steps"] = QUICK_STEPS
                label += f", {QUICK_STEPS} steps"
            config = build_config(info.config_type, values, attack)
            family = family_of(attack, label, values)
            draws = (1 if quick else 2) if slow else samples
            for k in range(first if not slow else (0 if first == 0 else draws), draws):
                rng = np.random.default_rng(zlib.crc32(f"{attack} {label} {k}".encode()))
                # A learned disguise trains for minutes a base: LeNet's, on two seeds.
                base = BASES[int(rng.integers(len(BASES)))] if not slow else BASES[0]
                seed = int(rng.integers(0, 10_000))
                batch, what = client_batch(rng)
                built = build_for(info, config, base, seed, len(batch))
                batches = [(batch, what)]
                if slow:  # a trained server, checked on several batches
                    batches += [client_batch(rng) for _ in range(3 if quick else 19)]
                for batch, what in batches:
                    row = {
                        "kind": "malicious",
                        "family": family,
                        "model": f"{attack} ({label}) on {base}, seed {seed}",
                        "batch": what,
                    }
                    if isinstance(built, str):
                        rows.append({**row, "built": False, "why": built})
                        print_row(rows[-1])
                        continue
                    batch = batch[: built.batch]  # a trained server's capacity is its first batch's
                    labels = torch.as_tensor(rng.integers(0, 10, len(batch)))
                    model = built.modification.model_for(0)
                    result = check(model, batch, labels)
                    try:
                        recovered, mean = read_back(
                            info, config, built.modification, model, batch, labels
                        )
                    except Exception as failure:  # said in the table
                        recovered, mean = None, f"read-back failed: {failure}"[:200]
                    rows.append(
                        {
                            **row,
                            "built": True,
                            **result,
                            "recovered": recovered,
                            "recovered_psnr": mean,
                            "images": len(batch),
                        }
                    )
                    print_row(rows[-1])
    return rows


class Built:
    def __init__(self, modification, batch: int) -> None:
        self.modification, self.batch = modification, batch


def build_for(info, config, base: str, seed: int, batch: int) -> Built | str:
    context = BuildContext(
        model=build_model(ModelSpec(base, 10, SHAPE, seed=seed)),
        input_shape=SHAPE,
        batch_size=batch,
        clients=1,
        normalization=NORM,
        audited_source=None,
        seed=seed,
    )
    try:
        return Built(info.builds(config, context), batch)
    except AuditInputError as refusal:
        return str(refusal)


# --- the check's cost --------------------------------------------------------------------


def cost_rows() -> list[dict]:
    """Seconds of each part of the check (median of 3) on an honest model's batch of 8."""
    rows = []
    for arch, size in (("lenet", 32), ("resnet18", 224)):
        shape = (3, size, size)
        model = build_model(ModelSpec(arch, 10, shape, seed=0))
        loaded = load_sample_set("photographs", 8)
        batch = to_model_batch(list(loaded.images), shape, NORM)
        labels = torch.arange(8) % 10
        parts = {
            "weights": lambda m=model: sig.weight_findings(m),
            "batch (dominance)": lambda m=model, b=batch: sig.batch_findings(m, b),
            "behaviour": lambda m=model, b=batch, y=labels: mb.behaviour(m, b, y),
        }
        for part, run in parts.items():
            times = []
            for _ in range(3):
                began = time.perf_counter()
                run()
                times.append(time.perf_counter() - began)
            rows.append(
                {
                    "model": f"{arch} {size} px, batch 8",
                    "part": part,
                    "seconds": statistics.median(times),
                }
            )
            print(rows[-1], flush=True)
    return rows


# --- rates ---------------------------------------------------------------------------------

STATS = ("ownership", "chain", "dsnr")


def operating_point(honest: list[dict]) -> dict:
    """Thresholds at which the whole check flags at most FPR of the honest checks: the
    budget left after the weight signatures' and dominance's false alarms, split evenly."""
    fixed = sum(1 for r in honest if r["weight_signatures"] or r["dominance"])
    budget = max(int(FPR * len(honest)) - fixed, 0)
    each = budget // len(STATS)
    thresholds = {}
    for stat in STATS:
        values = sorted((r[stat] for r in honest), reverse=True)
        above = values[each] if each < len(values) else 0.0
        thresholds[stat] = float(np.nextafter(above, np.inf)) if above > 0 else 1e-12
    return thresholds


def flagged(row: dict, thresholds: dict | None) -> bool:
    if thresholds is None:
        return row["refused"]
    return bool(
        row["weight_signatures"] or row["dominance"] or any(row[s] >= thresholds[s] for s in STATS)
    )


def summarise(rows: list[dict]) -> dict:
    honest = [r for r in rows if r["kind"] == "honest"]
    malicious = [r for r in rows if r["kind"] == "malicious" and r.get("built")]
    point = operating_point(honest)
    out = {
        "honest_checks": len(honest),
        "honest_models": len({(r["model"], r["seed"]) for r in honest}),
        "malicious_checks": len(malicious),
        "defaults": {"ownership": mb.OWNERSHIP, "chain": mb.CHAIN, "dsnr": mb.DSNR},
        "at_fpr": point,
        "fpr_default": sum(flagged(r, None) for r in honest) / max(len(honest), 1),
        "fpr_at_point": sum(flagged(r, point) for r in honest) / max(len(honest), 1),
        "honest_max": {s: max((r[s] for r in honest), default=0.0) for s in STATS},
        "honest_q99": {
            s: float(np.quantile([r[s] for r in honest], 0.99)) if honest else 0.0 for s in STATS
        },
        "families": {},
    }
    for family in sorted({r["family"] for r in malicious}):
        members = [r for r in malicious if r["family"] == family]
        passing = [r for r in members if not flagged(r, point)]
        passing_default = [r for r in members if not r["refused"]]
        recovered = [r["recovered"] for r in passing if isinstance(r.get("recovered"), int)]
        out["families"][family] = {
            "checks": len(members),
            "tpr_default": 1 - len(passing_default) / len(members),
            "tpr_at_point": 1 - len(passing) / len(members),
            "passing_at_point": len(passing),
            "passing_recovering": sum(1 for n in recovered if n > 0),
            "recovered_by_passing": sum(recovered),
            "images_of_passing": sum(r["images"] for r in passing),
            "recovered_when_passing_default": sum(
                r["recovered"] for r in passing_default if isinstance(r.get("recovered"), int)
            ),
        }
    return out


def render(summary: dict) -> str:
    point = summary["at_fpr"]
    lines = [
        f"Honest: {summary['honest_checks']} checks of {summary['honest_models']} models; "
        f"malicious: {summary['malicious_checks']} checks. False-positive rate with the "
        f"behaviour signals on at their thresholds (ownership {summary['defaults']['ownership']}, chain "
        f"{summary['defaults']['chain']}, D-SNR {summary['defaults']['dsnr']}): "
        f"{summary['fpr_default']:.1%}; at the operating point (ownership "
        f"{point['ownership']:.3g}, chain {point['chain']:.3g}, D-SNR {point['dsnr']:.3g}): "
        f"{summary['fpr_at_point']:.1%}.",
        "",
        "| server family | checks | TPR (behaviour on) | TPR (FPR <= 1 %) | passed | passed and recovered >= 1 image | images recovered / in batches that passed |",
        "|---|---|---|---|---|---|---|",
    ]
    for family, f in summary["families"].items():
        lines.append(
            f"| {family} | {f['checks']} | {f['tpr_default']:.0%} | {f['tpr_at_point']:.0%} | "
            f"{f['passing_at_point']} | {f['passing_recovering']} | "
            f"{f['recovered_by_passing']} / {f['images_of_passing']} |"
        )
    lines += [
        "",
        "Honest models' highest values: "
        + ", ".join(
            f"{s} {summary['honest_max'][s]:.3g} (99th percentile {summary['honest_q99'][s]:.3g})"
            for s in STATS
        )
        + ".",
    ]
    return "\n".join(lines)


def render_cost(rows: list[dict]) -> str:
    lines = ["| model | part of the check | seconds |", "|---|---|---|"]
    lines += [f"| {r['model']} | {r['part']} | {r['seconds']:.3f} |" for r in rows]
    return "\n".join(lines)


def print_row(r: dict) -> None:
    if r.get("built") is False:
        print(f"{r['model']:<58} {r['batch']:<22} not built: {r['why'][:60]}", flush=True)
        return
    verdict = "REFUSED" if r["refused"] else "passed"
    more = f" recovered {r['recovered']}" if "recovered" in r else ""
    print(
        f"{r['family']:<24} {r['model'][:50]:<50} {r['batch']:<22} {verdict:<8} "
        f"own {r['ownership']:.2f} chain {r['chain']:.2f} dsnr {r['dsnr']:.2f} "
        f"{','.join(r['weight_signatures']) or '-'}{more} {r['seconds']:.2f} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument(
        "--part",
        choices=("all", "malicious", "honest", "cost"),
        default="all",
        help="run one part alone (its rows to model_check_rates.PART.json; the two CPUs of a "
        "machine can run two parts at once), then --merge",
    )
    parser.add_argument("--merge", action="store_true", help="join the parts' files")
    parser.add_argument(
        "--samples", type=int, default=12, help="draws per malicious server variant"
    )
    parser.add_argument(
        "--first-draw",
        type=int,
        default=0,
        help="with --part malicious: start at this draw (adds draws to an earlier part)",
    )
    parser.add_argument(
        "--seeds",
        default="",
        help="with --part honest: the honest models' seeds START:STOP (another CPU runs the "
        "others); default all 5",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # one CPU a part: two parts run side by side on 2 cores
    torch.manual_seed(0)
    seeds, samples = (1, 2) if args.quick else (5, args.samples)
    if args.part != "all":
        began = time.perf_counter()
        chosen = range(*map(int, args.seeds.split(":"))) if args.seeds else seeds
        part = {
            "malicious": lambda: malicious_rows(samples, args.quick, args.first_draw),
            "honest": lambda: honest_rows(chosen, args.quick),
            "cost": cost_rows,
        }[args.part]()
        saved_part = {"seconds": time.perf_counter() - began, "rows": part}
        name = args.part + (f"-{args.seeds.replace(':', '-')}" if args.seeds else "")
        name += f"-from-{args.first_draw}" if args.first_draw else ""
        path = RESULTS.with_name(f"model_check_rates.{name}.json")
        path.write_text(json.dumps(saved_part, indent=2, default=str) + "\n")
        return
    if args.render_only:
        saved = json.loads(RESULTS.read_text())
    elif args.merge:
        files = sorted(RESULTS.parent.glob("model_check_rates.*.json"))
        parts = {f.name.split(".")[1]: json.loads(f.read_text()) for f in files}
        rows = [r for name, part in parts.items() if name != "cost" for r in part["rows"]]
        saved = {
            "machine": machine(),
            "quick": args.quick,
            "summary": summarise(rows),
            "cost": parts["cost"]["rows"],
            "seconds": sum(p["seconds"] for p in parts.values()),
            "rows": rows,
        }
        RESULTS.write_text(json.dumps(saved, indent=2, default=str) + "\n")
        for file in files:
            file.unlink()
    else:
        began = time.perf_counter()
        rows = malicious_rows(samples, args.quick) + honest_rows(seeds, args.quick)
        saved = {
            "machine": machine(),
            "quick": args.quick,
            "summary": summarise(rows),
            "cost": cost_rows(),
            "seconds": time.perf_counter() - began,
            "rows": rows,
        }
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(saved, indent=2, default=str) + "\n")
    text = (
        f"Measured on {saved['machine']} (`python -m benchmarks.model_check_rates"
        f"{' --quick' if saved['quick'] else ''}`, {saved['seconds'] / 60:.0f} min of "
        "computation).\n\n"
        f"{render(saved['summary'])}\n\n{render_cost(saved['cost'])}\n"
    )
    RESULTS.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
