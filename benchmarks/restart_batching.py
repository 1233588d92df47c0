"""Restarts advanced together against one after the other, through the product's attacks.

Each attack runs R = 8 restarts (IG also 4 and 16) on DLG's LeNet at 32x32 (one photograph, FedSGD) twice per
repetition, interleaved: ``together=false`` (the restarts one after another, each its own
step loop) and ``together=true`` (``attacks.loop``: the R restarts are one batched
computation, ``torch.func.vmap`` over the restarts). The figure is restart-steps per second
(steps summed over restarts, over wall-clock seconds of the whole run, events included),
the median of the repetitions. Agreement: the largest relative difference of the restarts'
final objectives and the largest pixel difference, after ``SHORT`` steps, same seeds.
Attacks whose restarts cannot advance together say why instead (their row has one arm).
``dlm-adam`` is DLM with the paper's MLP optimiser (Adam, lr 0.1) on the same LeNet's
FedAvg upload (one local step at the client's lr 0.01, weights sent: DLM attacks weights);
``ig-clip-twin`` is IG's adaptive twin under clipping (the update's norm clipped to 0.5,
which the attacker knows and applies to its candidates' updates); ``ig-qsgd-twin`` is IG's
twin under QSGD at 4 bits with stochastic rounding (the attacker weighs each entry by the
release's likelihood, read off the release); ``ig-outpost-twin`` under OUTPOST (its
release modelled from each candidate's own pruning and Fisher ranking); the ``-fedkl-twin``
rows are IG's, DLG's and GRNN's twins under FedKL (each start fits the lock's scale and
shift the client hides, from the server's guess, with its images).

Writes benchmarks/results/restart_batching.json and the table in docs/PERFORMANCE.md.
Usage: python -m benchmarks.restart_batching [--steps 100] [--repeats 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from auditlib.attacks import RunControl, build_attack_config, get_attack
from auditlib.client.protocol import ClientProtocol
from auditlib.defenses import build_defense
from auditlib.engine.audit import prepare_victim
from auditlib.fl.scenario import release_update
from auditlib.spec import ScenarioSpec
from benchmarks.common import ROOT, lenet_spec, machine, replace_section

RESULTS = ROOT / "benchmarks" / "results" / "restart_batching.json"
DOC = ROOT / "docs" / "PERFORMANCE.md"
SHORT = 3
# (attack, restarts): every attack at the issue's R = 8, and IG at 4 and 16 for the trend.
CASES = (
    ("ig", 8),
    ("grnn", 8),
    ("grnn-thesis-text", 8),
    ("fedleak", 8),
    ("dlg", 8),
    ("dlm-adam", 8),
    ("ig-clip-twin", 8),
    ("ig-qsgd-twin", 8),
    ("ig-outpost-twin", 8),
    ("ig-fedkl-twin", 8),
    ("dlg-fedkl-twin", 8),
    ("grnn-fedkl-twin", 8),
    ("ig", 4),
    ("ig", 16),
)
ATTACKS = tuple(dict.fromkeys(a for a, _ in CASES))
# An L-BFGS step makes up to 20 objective evaluations: DLG's row runs a fifth of the steps.
STEP_SHARE = {"dlg": 0.2, "dlg-fedkl-twin": 0.2}
FEDAVG = ClientProtocol(algorithm="fedavg", local_steps=1, local_lr=0.01, shared="weights")


@dataclasses.dataclass(frozen=True)
class Variant:
    """A case that is an attack with other parameters, on another upload or as the twin
    that knows a defense."""

    attack: str
    params: dict
    protocol: ClientProtocol | None = None  # None: the case's FedSGD
    defense: tuple[str, dict] = ("none", {})


VARIANTS = {
    # The thesis's own words: W1 between the updates' sorted values, absolute TV.
    "grnn-thesis-text": Variant("grnn", {"wasserstein": "sorted", "tv_form": "absolute"}),
    "dlm-adam": Variant("dlm", {"optimizer": "adam", "lr": 0.1}, FEDAVG),
    "ig-clip-twin": Variant("ig", {}, defense=("clip", {"mode": "norm", "bound": 0.5})),
    "ig-qsgd-twin": Variant("ig", {}, defense=("quantize", {"bits": 4})),
    "ig-outpost-twin": Variant("ig", {}, defense=("outpost", {})),
    "ig-fedkl-twin": Variant("ig", {}, defense=("fedkl", {})),
    "dlg-fedkl-twin": Variant("dlg", {}, defense=("fedkl", {})),
    "grnn-fedkl-twin": Variant("grnn", {}, defense=("fedkl", {})),
}


def case_variant(case: str) -> Variant:
    return VARIANTS.get(case, Variant(case, {}))


def case_release(case: str):
    variant = case_variant(case)
    spec = lenet_spec(variant.attack)
    if variant.protocol is not None:
        spec = dataclasses.replace(spec, scenario=ScenarioSpec(protocol=variant.protocol))
    victim = prepare_victim(spec)
    release = release_update(
        victim.model,
        victim.batch,
        spec.scenario.protocol,
        build_defense(*variant.defense)[0],
        normalization=victim.normalization,
        num_classes=spec.model.spec.num_classes,
        labels_known=False,
        seed=0,
    )
    if release.known_defense is None:
        return release
    # The twin: the attacker knows the defense (engine.attack_phase does the same).
    knowledge = dataclasses.replace(release.knowledge, defense=release.known_defense)
    return dataclasses.replace(release, knowledge=knowledge)


def _run(case: str, release, steps: int, together: bool | None, restarts: int):
    variant = case_variant(case)
    attack, params = variant.attack, {**variant.params, "restarts": restarts}
    if together is not None:
        params["together"] = together
    config, _ = build_attack_config(attack, params)
    control = RunControl(steps, emit_every=10, image_every=50)
    start = time.perf_counter()
    final = None
    for event in get_attack(attack).run(release.observation, release.knowledge, config, control, 0):
        final = event.final or final
    seconds = time.perf_counter() - start
    return sum(c.steps for c in final.candidates) / seconds, final


def _has_together(case: str) -> bool:
    attack = case_variant(case).attack
    return any(f.name == "together" for f in dataclasses.fields(get_attack(attack).config_type))


def measure(attack: str, restarts: int, steps: int, repeats: int) -> dict:
    steps = max(1, int(steps * STEP_SHARE.get(attack, 1)))
    release = case_release(attack)
    arms = (False, True) if _has_together(attack) else (None,)
    _run(attack, release, 2, arms[-1], restarts)  # warm-up: lazy imports, allocator
    rates: dict = {arm: [] for arm in arms}
    for _ in range(repeats):
        for arm in arms:
            rates[arm].append(_run(attack, release, steps, arm, restarts)[0])
    row = {"attack": attack, "steps": steps, "restarts": restarts}
    row["apart"] = statistics.median(rates[arms[0]])
    if len(arms) == 2:
        row["together"] = statistics.median(rates[True])
        row["speedup"] = row["together"] / row["apart"]
        apart = _run(attack, release, SHORT, False, restarts)[1].candidates
        joint = _run(attack, release, SHORT, True, restarts)[1].candidates
        row["objective_rel_diff"] = max(
            abs(a.loss - b.loss) / max(abs(a.loss), 1e-12)
            for a, b in zip(apart, joint, strict=True)
        )
        row["pixel_diff"] = max(
            float((a.images - b.images).abs().max()) for a, b in zip(apart, joint, strict=True)
        )
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| attack (LeNet 32x32, batch 1) | restarts | steps | apart: restart-steps/s | "
        f"together: restart-steps/s | speed-up | after {SHORT} steps: objective rel. diff / "
        "largest pixel diff |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "together" in r:
            lines.append(
                f"| {r['attack']} | {r['restarts']} | {r['steps']} | {r['apart']:.0f} | "
                f"{r['together']:.0f} | "
                f"{r['speedup']:.2f}x | {r['objective_rel_diff']:.1e} / {r['pixel_diff']:.1e} |"
            )
        else:
            lines.append(
                f"| {r['attack']} | {r['restarts']} | {r['steps']} | {r['apart']:.1f} | "
                "apart only (L-BFGS) | - | - |"
            )
    return "\n".join(lines) + f"\n\nMeasured on: {machine()}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=ATTACKS, default=list(ATTACKS))
    args = parser.parse_args()
    torch.set_num_threads(2)
    previous = json.loads(RESULTS.read_text())["rows"] if RESULTS.exists() else []
    kept = {(r["attack"], r["restarts"]): r for r in previous if "attack" in r}
    for attack, restarts in CASES:
        if attack in args.only:
            kept[attack, restarts] = measure(attack, restarts, args.steps, args.repeats)
    rows = [kept[case] for case in CASES if case in kept]
    RESULTS.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2) + "\n")
    text = table(rows)
    replace_section(DOC, "restart-batching", text)
    print(text)


if __name__ == "__main__":
    main()
