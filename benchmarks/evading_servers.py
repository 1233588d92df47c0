"""Servers that know the client's model check, measured (issue 54's table rerun).

For each malicious server as built (rtf, cah, loki) and each evading variant
(``rtf-evading``, ``cah-evading``, ``loki-evading``, every disguise): the model it sends
LeNet (1 x 32 x 32, seed 0) with 64 rows (LOKI: 4 clients of 2 images, 16 rows each),
checked by ``ModelCheck`` as it stands when this runs (refused or passed, the reason, and
the weight and batch signatures of ``model_signatures`` and the behaviour signals of
``model_behaviour``), then the client's FedSGD update
of 8 Fashion-MNIST images (the bundled set, seed 0's order; refused: nothing is sent and
nothing recovered) read back: per-image PSNR of the best matches (Hungarian), recovered
counted at >= 30 dB. Beside them, cah's trap rows at 224 px (3 x 224 x 224 LeNet), where the
row-sum test catches noisy mirrors and not balanced ones.

Writes benchmarks/results/evading_servers.json and prints the table (markdown).
Usage: python -m benchmarks.evading_servers [--render-only]
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace

import torch

from auditlib.attacks import ATTACKS, build_attack_config
from auditlib.attacks.base import RunControl
from auditlib.client.protocol import ClientProtocol
from auditlib.data.model_input import to_model_batch
from auditlib.data.normalization import Normalization
from auditlib.data.samples import load_sample_set
from auditlib.defenses import ClientContext, build_defense
from auditlib.defenses import model_behaviour as mb
from auditlib.defenses import model_signatures as sig
from auditlib.engine.releases import client_batches
from auditlib.fl.scenario import release_aggregate, release_update
from auditlib.metrics import match, psnr, to_unit_range
from auditlib.models import ModelSpec, build_model
from auditlib.server import BuildContext
from auditlib.threat import PrivateBatch
from benchmarks.common import ROOT, machine

RESULTS = ROOT / "benchmarks" / "results" / "evading_servers.json"
BATCH = 8
ROWS = 64
CLIENTS = 4  # LOKI's secure aggregation: 4 clients of 2 images, 16 rows each
RECOVERED_DB = 30.0
SMALL, LARGE = (1, 32, 32), (3, 224, 224)
# (attack, parameters beyond the audit preset, clients, shape)
VARIANTS = (
    ("rtf", {}, 1, SMALL),
    ("rtf-evading", {"disguise": "conv", "decoys": 0.0}, 1, SMALL),
    ("rtf-evading", {"disguise": "conv"}, 1, SMALL),
    ("rtf-evading", {"disguise": "jitter"}, 1, SMALL),
    ("rtf-evading", {"disguise": "jitter", "activation": "relu"}, 1, SMALL),
    ("rtf-evading", {"disguise": "after-conv"}, 1, SMALL),
    ("rtf-evading", {"disguise": "conv", "activation": "threshold"}, 1, SMALL),
    ("cah", {}, 1, SMALL),
    ("cah-evading", {"disguise": "balanced", "decoys": 0.0}, 1, SMALL),
    ("cah-evading", {"disguise": "balanced"}, 1, SMALL),
    ("cah-evading", {"disguise": "noisy"}, 1, SMALL),
    ("cah-evading", {"disguise": "balanced", "activation": "relu"}, 1, SMALL),
    ("loki", {}, CLIENTS, SMALL),
    ("loki-evading", {"disguise": "taps", "decoys": 0.0}, CLIENTS, SMALL),
    ("loki-evading", {"disguise": "taps"}, CLIENTS, SMALL),
    ("loki-evading", {"disguise": "random"}, CLIENTS, SMALL),
    ("cah", {}, 1, LARGE),
    ("cah-evading", {"disguise": "noisy"}, 1, LARGE),
    ("cah-evading", {"disguise": "balanced"}, 1, LARGE),
)


def rows_param(attack: str, clients: int) -> dict:
    if attack.startswith("cah"):
        return {"rows": ROWS}
    return {"bins": ROWS // clients}


def normalization(shape) -> Normalization:
    return Normalization((0.5,) * shape[0], (0.25,) * shape[0])


def case(attack: str, params: dict, clients: int, shape) -> dict:
    norm = normalization(shape)
    images = to_model_batch(list(load_sample_set("fashion-mnist", BATCH).images), shape, norm)
    labels = torch.arange(BATCH) % 10
    private = PrivateBatch(images, labels, tuple(map(str, range(BATCH))))
    config, _ = build_attack_config(attack, {**rows_param(attack, clients), **params}, "audit")
    model = build_model(ModelSpec("lenet", 10, shape, seed=0))
    context = BuildContext(model, shape, BATCH // clients, clients, norm, "fashion-mnist", 0)
    began = time.perf_counter()
    server = ATTACKS[attack].builds(config, context)
    built_s = time.perf_counter() - began
    # The check as it stands, on every client's model (LOKI's differ by client).
    check, _ = build_defense("model-check")
    reasons, signatures = [], set()
    per_client = BATCH // clients
    check_s = 0.0
    for client in range(clients):
        sent = server.model_for(client)
        own = images[client * per_client : (client + 1) * per_client]
        parameters = {n: p.detach() for n, p in sent.named_parameters()}
        start = time.perf_counter()
        reason = check.refuses(
            ClientContext(sent, parameters, own, labels[: len(own)], ClientProtocol())
        )
        check_s += time.perf_counter() - start
        if reason is not None:
            reasons.append(reason)
        weights, _ = sig.weight_findings(sent)
        batch, _ = sig.batch_findings(sent, own)
        seen = mb.behaviour(sent, own, labels[: len(own)])
        behaviour = mb.behaviour_findings(seen)
        signatures |= {f.signature for f in weights + batch + behaviour}
    # The read-back of the update the client would send if it trained (none is sent where
    # the check refused: then nothing is recovered).
    guard, _ = build_defense("none")
    arguments = {"normalization": norm, "num_classes": 10, "labels_known": False, "seed": 0}
    if clients == 1:
        release = release_update(server.model_for(0), private, ClientProtocol(), guard, **arguments)
    else:
        release = release_aggregate(
            server.model_for, client_batches(private, clients), ClientProtocol(), guard, **arguments
        )
    knowledge = replace(release.knowledge, server=server)
    began = time.perf_counter()
    for event in ATTACKS[attack].run(release.observation, knowledge, config, RunControl(1), 0):
        final = event.final
    read_s = time.perf_counter() - began
    rebuilt = to_unit_range(final.selected.images, norm)
    originals = to_unit_range(images, norm)
    order = match(rebuilt, originals)
    scores = sorted((psnr(rebuilt[j], originals[i]) for i, j in enumerate(order)), reverse=True)
    refused = bool(reasons)
    return {
        "attack": attack,
        "params": params,
        "shape": list(shape),
        "clients": clients,
        "refused": refused,
        "reason": reasons[0] if reasons else None,
        "signatures": sorted(signatures),
        "psnr": scores,
        "recovered_if_trained": sum(s >= RECOVERED_DB for s in scores),
        "recovered": 0 if refused else sum(s >= RECOVERED_DB for s in scores),
        "evasion": server.evasion,
        "inference": {
            k: v
            for k, v in (final.label_inference or {}).items()
            if isinstance(v, int | float | str)
        },
        "seconds": {"build": built_s, "check": check_s, "read_back": read_s},
    }


def label(row: dict) -> str:
    params = ", ".join(f"{k} {v}" for k, v in row["params"].items())
    size = f"{row['shape'][1]} px"
    clients = f", {row['clients']} clients" if row["clients"] > 1 else ""
    return f"{row['attack']}" + (f" ({params})" if params else " as built") + f", {size}{clients}"


def render(results: dict) -> str:
    lines = [
        f"Measured on {results['machine']} (`python -m benchmarks.evading_servers`): LeNet, "
        f"{BATCH} Fashion-MNIST images, {ROWS} rows, FedSGD; the model check as it stood.",
        "",
        "| model | model check | signatures | recovered >= 30 dB | PSNR of the read-back (dB) |",
        "|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        verdict = "refused" if row["refused"] else "passed"
        signatures = ", ".join(row["signatures"]) or "none"
        kept = [s for s in row["psnr"] if s >= RECOVERED_DB]
        scores = ", ".join(f"{s:.0f}" for s in kept) or "-"
        recovered = f"{row['recovered']} of {BATCH}"
        if row["refused"]:
            recovered += f" (if trained: {row['recovered_if_trained']})"
        lines.append(f"| {label(row)} | {verdict} | {signatures} | {recovered} | {scores} |")
    return "\n".join(lines)


def main() -> None:
    torch.set_num_threads(1)
    if "--render-only" in sys.argv:
        results = json.loads(RESULTS.read_text())
    else:
        results = {"machine": machine(), "rows": []}
        for attack, params, clients, shape in VARIANTS:
            row = case(attack, params, clients, shape)
            print(label(row), row["refused"], row["signatures"], row["recovered"], flush=True)
            results["rows"].append(row)
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(render(results))


if __name__ == "__main__":
    main()
