"""The client's model check (``model-check``) on every malicious model built here and on
every built-in honest model, untrained and after 3 FedAvg rounds on Fashion-MNIST.

Malicious: the models ``auditlib.server.build`` makes for rtf, cah and loki (each attack's
``audit`` and ``paper`` presets, through the attack's ``builds``), in front of LeNet and
ResNet-18 at 32 px (rtf and cah also in front of ResNet-18 at 224 px), for client batches
of 8 and 64 Fashion-MNIST images and of 16 photographs, LOKI with 8 clients (client 0's and
client 7's models). Honest: every
architecture of ``ARCHITECTURES`` (inits default and uniform; the MLP also with ReLU, the
only built-in model with a linear layer followed by a ReLU) untrained and trained 3 FedAvg
rounds (its trainable init), ResNet-18 at 224 px untrained, each checked with the same
three client batches. For each model: refused or not, the signatures
found, seconds per check, and how close it came to each threshold (``margins``).

Writes benchmarks/results/model_check.json, prints the table (markdown) and, unless
--quick, writes the summary between the model-check-results markers of docs/ALGORITHMS.md.
Usage: python -m benchmarks.model_check [--quick | --render-only]
(--quick: 32 px only, batches of 8 Fashion-MNIST images and 16 photographs)
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from torch import nn

from auditlib.attacks import ATTACKS
from auditlib.client.protocol import ClientProtocol
from auditlib.config import build_config
from auditlib.data.model_input import to_model_batch
from auditlib.data.normalization import Normalization
from auditlib.data.samples import load_sample_set
from auditlib.defenses import ClientContext, build_defense
from auditlib.defenses import model_signatures as sig
from auditlib.errors import AuditInputError
from auditlib.fl.training import FederatedTraining, federated_averaging, pretraining_pool
from auditlib.models import ModelSpec, build_model
from auditlib.models.registry import ARCHITECTURES, trainable_init
from auditlib.server import BuildContext
from benchmarks.common import ROOT, machine, replace_section

NORM = Normalization.identity(3)
SMALL, LARGE = (3, 32, 32), (3, 224, 224)
# The client's batch: (sample set, images); the server builds for that many images.
BATCHES = (("fashion-mnist", 8), ("fashion-mnist", 64), ("photographs", 16))
QUICK = (BATCHES[0], BATCHES[2])
CLIENTS = 8  # LOKI's secure aggregation
ROUNDS = 3
RESULTS = ROOT / "benchmarks" / "results" / "model_check.json"


def client_batch(source: str, count: int, shape) -> torch.Tensor:
    return to_model_batch(list(load_sample_set(source, count).images), shape, NORM)


def check(model: nn.Module, batch: torch.Tensor) -> dict:
    defense, _ = build_defense("model-check")
    labels = torch.arange(len(batch)) % 10
    parameters = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    context = ClientContext(model, parameters, batch, labels, ClientProtocol())
    start = time.perf_counter()
    reason = defense.refuses(context)
    seconds = time.perf_counter() - start
    findings, _ = sig.weight_findings(model)
    more, _ = sig.batch_findings(model, batch)
    return {
        "refused": reason is not None,
        "signatures": sorted({f.signature for f in findings + more}),
        "reason": reason,
        "seconds": seconds,
        "report": defense.privacy_report()["model_check"],
        "margins": margins(model, batch),
    }


def margins(model: nn.Module, batch: torch.Tensor) -> dict:
    """How close the model comes to each threshold (the most suspicious layer's value)."""
    out = {
        "max_row_cosine": 0.0,  # imprint: rows parallel when |cos| > PARALLEL
        "max_balanced_rows": 0.0,  # trap: share of rows with as many + as - weights
        "min_mirror_error": math.inf,  # trap: mirror when < MIRROR_TOLERANCE
        "min_median_z": math.inf,  # trap: flagged below -TRAP_SUM_Z
        "max_layer_transmit": 0.0,  # transmit: a layer's weakest live kernel, flagged > 10
        "max_kernel_transmit": 0.0,  # SEER's statistic: the largest of any kernel
        "min_column_spread": math.inf,  # identical columns when < IDENTICAL
        "dominance": None,  # (single share, silent share) of the most single-fired ReLU layer
    }
    generator = torch.Generator().manual_seed(0)
    for _, weight, _ in sig.linear_layers(model):
        rows, features = weight.shape
        if rows >= sig.MIN_ROWS and features >= 2:
            pick = torch.randperm(rows, generator=generator)[:256]
            w = weight[pick].double()
            live = w.norm(dim=1) > 0
            unit = w[live] / w[live].norm(dim=1, keepdim=True)
            cos = (unit @ unit.T).abs().fill_diagonal_(0)
            out["max_row_cosine"] = max(out["max_row_cosine"], float(cos.max()))
            positive, negative = (w > 0).sum(1), (w < 0).sum(1)
            balanced = (positive == negative) & (positive > 0)
            out["max_balanced_rows"] = max(
                out["max_balanced_rows"], float(balanced.double().mean())
            )
            if bool(balanced.any()):
                error = float(sig.mirror_errors(w[balanced].float()).min())
                out["min_mirror_error"] = min(out["min_mirror_error"], error)
            spread = w.std(1)
            z = torch.where(spread > 0, w.sum(1) / (math.sqrt(features) * spread), 0)
            out["min_median_z"] = min(out["min_median_z"], float(z.median()))
        if rows >= 2 and features >= 2 and float(weight.abs().max()) > 0:
            low, high = torch.aminmax(weight, dim=1)
            column = float((high - low).max()) / float(weight.abs().max())
            out["min_column_spread"] = min(out["min_column_spread"], column)
    for _, kernels in sig.kernel_layers(model):
        if kernels[0].numel() >= sig.MIN_TAPS:
            ratio = sig.transmit_ratios(kernels)
            live = ratio[~ratio.isnan()]
            if len(live):
                out["max_layer_transmit"] = max(out["max_layer_transmit"], float(live.min()))
                out["max_kernel_transmit"] = max(out["max_kernel_transmit"], float(live.max()))
    for activations in sig.relu_activations(model, batch).values():
        fired = (activations.flatten(1) > 0).sum(0)
        active = int((fired > 0).sum())
        single = int((fired == 1).sum()) / active if active else 0.0
        silent = 1 - active / fired.numel()
        if out["dominance"] is None or single > out["dominance"][0]:
            out["dominance"] = (single, silent)
    return out


def malicious_rows(quick: bool) -> list[dict]:
    cases = [("lenet", SMALL), ("resnet18", SMALL)] + ([] if quick else [("resnet18", LARGE)])
    rows = []
    for arch, shape in cases:
        model = build_model(ModelSpec(arch, 10, shape))
        for source, batch_size in QUICK if quick else BATCHES:
            batch = client_batch(source, batch_size, shape)
            attacks = ("rtf", "cah") if shape == LARGE else ("rtf", "cah", "loki")
            for attack, preset in [(a, p) for a in attacks for p in ("audit", "paper")]:
                info = ATTACKS[attack]
                values = info.audit.values if preset == "audit" else info.presets[preset]
                clients = CLIENTS if attack == "loki" else 1
                context = BuildContext(
                    model=model,
                    input_shape=shape,
                    batch_size=batch_size,
                    clients=clients,
                    normalization=NORM,
                    audited_source="fashion-mnist",
                    seed=0,
                )
                row = {
                    "kind": "malicious",
                    "model": f"{attack} ({preset}) on {arch} {shape[1]} px",
                    "batch": f"{source} {batch_size}",
                }
                try:
                    built = info.builds(
                        build_config(info.config_type, dict(values), attack), context
                    )
                except AuditInputError as refusal:
                    rows.append({**row, "built": False, "why": str(refusal)})
                    print_row(rows[-1])
                    continue
                for client in sorted({0, clients - 1}):
                    sent = built.model_for(client)
                    who = f", client {client}" if clients > 1 else ""
                    rows.append(
                        {**row, "model": row["model"] + who, "built": True, **check(sent, batch)}
                    )
                    print_row(rows[-1])
                del built
    return rows


def honest_specs(quick: bool):
    for arch in ARCHITECTURES:
        for init in ("default", "uniform"):
            yield ModelSpec(arch, 10, SMALL, init=init), False
        yield ModelSpec(arch, 10, SMALL, init=trainable_init(ModelSpec(arch, 10, SMALL))), True
    for init in ("default", "uniform"):
        yield ModelSpec("mlp", 10, SMALL, init=init, activation="relu"), False
    yield ModelSpec("mlp", 10, SMALL, activation="relu"), True
    if not quick:
        yield ModelSpec("resnet18", 10, LARGE), False


def honest_rows(quick: bool) -> list[dict]:
    rows = []
    pool = pretraining_pool("fashion-mnist", 512, SMALL, 10, NORM, seed=0)
    batches = {(s, b): client_batch(s, b, SMALL) for s, b in (QUICK if quick else BATCHES)}
    for spec, trained in honest_specs(quick):
        model = build_model(spec)
        name = f"{spec.architecture}{'-' + spec.activation if spec.activation else ''} {spec.input_shape[1]} px, init {spec.init}"
        losses = None
        if trained:
            losses = federated_averaging(model, *pool, FederatedTraining(rounds=ROUNDS), seed=0)
            name += f", {ROUNDS} FedAvg rounds"
        else:
            name += ", untrained"
        for (source, count), batch in batches.items():
            if spec.input_shape != SMALL:
                batch = client_batch(source, count, spec.input_shape)
            row = {"kind": "honest", "model": name, "batch": f"{source} {count}", "built": True}
            if losses is not None:
                row["training_losses"] = losses  # the clients' mean loss in each round
            rows.append({**row, **check(model, batch)})
            print_row(rows[-1])
    return rows


def print_row(r: dict) -> None:
    if not r["built"]:
        print(f"{r['model']:<58} {r['batch']:<16} not built: {r['why'][:70]}", flush=True)
        return
    verdict = "REFUSED" if r["refused"] else "passed"
    print(
        f"{r['model']:<58} {r['batch']:<16} {verdict:<8} {','.join(r['signatures']) or '-':<32} "
        f"{r['seconds']:.3f} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--render-only", action="store_true", help="redo the docs from the saved JSON"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.render_only:
        saved = json.loads(RESULTS.read_text())
        write_docs(saved["summary"], saved["rows"], saved["machine"])
        return
    rows = malicious_rows(args.quick) + honest_rows(args.quick)
    built = [r for r in rows if r["built"]]
    malicious = [r for r in built if r["kind"] == "malicious"]
    honest = [r for r in built if r["kind"] == "honest"]
    summary = {
        "malicious_refused": f"{sum(r['refused'] for r in malicious)} of {len(malicious)}",
        "honest_passed": f"{sum(not r['refused'] for r in honest)} of {len(honest)}",
        "thresholds": {
            "PARALLEL": sig.PARALLEL,
            "MIN_GROUP": sig.MIN_GROUP,
            "MOST": sig.MOST,
            "DISTINCT_THRESHOLDS": sig.DISTINCT_THRESHOLDS,
            "MIRROR_TOLERANCE": sig.MIRROR_TOLERANCE,
            "TRAP_SUM_Z": sig.TRAP_SUM_Z,
            "TRANSMIT_RATIO": sig.TRANSMIT_RATIO,
            "IDENTICAL": sig.IDENTICAL,
            "EXTREME": sig.EXTREME,
            "SILENT": sig.SILENT,
        },
        "honest_closest": closest(honest),
    }
    print(render(rows))
    print(json.dumps(summary, indent=2))
    saved = {"machine": machine(), "quick": args.quick, "summary": summary, "rows": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(saved, indent=2) + "\n")
    if not args.quick:
        write_docs(summary, rows, machine())


def write_docs(summary: dict, rows: list[dict], where: str) -> None:
    honest_note = ", ".join(f"{k} {v:.3g}" for k, v in summary["honest_closest"].items())
    body = (
        f"{summary['malicious_refused']} checks of malicious models refused, "
        f"{summary['honest_passed']} checks of honest ones passed ({where}).\n\n"
        f"{compact(rows)}\n\nThe honest models' values nearest each threshold: "
        f"{honest_note}."
    )
    replace_section(ROOT / "docs" / "ALGORITHMS.md", "model-check-results", body)


def render(rows: list[dict]) -> str:
    """One line per model and client batch: refused or passed, the signatures, s/check."""
    lines = ["| model | client batch | check | signatures | s / check |", "|---|---|---|---|---|"]
    for r in rows:
        if not r["built"]:
            lines.append(f"| {r['model']} | {r['batch']} | not built (the builder refuses) | | |")
            continue
        verdict = "**refused**" if r["refused"] else "passed"
        found = ", ".join(r["signatures"]) or "-"
        lines.append(f"| {r['model']} | {r['batch']} | {verdict} | {found} | {r['seconds']:.3f} |")
    return "\n".join(lines)


def compact(rows: list[dict]) -> str:
    """One line per model (LOKI's clients together) over its client batches."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["model"].split(", client ")[0], []).append(r)
    lines = [
        "| model | checks | refused | signatures | s / check (max) |",
        "|---|---|---|---|---|",
    ]
    for model, members in groups.items():
        built = [r for r in members if r["built"]]
        found = sorted({s for r in built for s in r["signatures"]})
        refused = sum(r["refused"] for r in built)
        seconds = max((r["seconds"] for r in built), default=0.0)
        unbuilt = len(members) - len(built)
        note = f" ({unbuilt} not built)" if unbuilt else ""
        lines.append(
            f"| {model} | {len(built)}{note} | {refused} | {', '.join(found) or '-'} | "
            f"{seconds:.2f} |"
        )
    return "\n".join(lines)


def closest(rows: list[dict]) -> dict:
    """Over all honest models: the value nearest each threshold."""
    m = [r["margins"] for r in rows]
    dominance = [d for d in (x["dominance"] for x in m) if d is not None]
    return {
        "max_row_cosine": max(x["max_row_cosine"] for x in m),
        "max_balanced_rows": max(x["max_balanced_rows"] for x in m),
        "min_mirror_error": min(x["min_mirror_error"] for x in m),
        "min_median_z": min(x["min_median_z"] for x in m),
        "max_layer_transmit": max(x["max_layer_transmit"] for x in m),
        "max_kernel_transmit": max(x["max_kernel_transmit"] for x in m),
        "min_column_spread": min(x["min_column_spread"] for x in m),
        "max_single_share": max((d[0] for d in dominance), default=None),
        "max_silent_share": max((d[1] for d in dominance), default=None),
    }


if __name__ == "__main__":
    main()
