"""Verdicts a reviewer can sign: the audit preset against the paper's at one wall-clock budget.

1. ``dlg``: the 17 bundled photographs at 32x32, LeNet (sigmoid, U(-0.5, 0.5), 100 classes),
   batch 1, FedSGD: DLG's paper preset (one start, 300 steps), the same with 3 restarts one
   after another (the paper's way to spend more time), and its audit preset (8 raced
   starts, 300 steps each), each with the same time budget per image.
2. ``resnet``: IG and GRNN on the GRNN thesis's ResNet-18 (sigmoid, uniform init), batch 1,
   paper against audit preset at one time budget.
3. ``batch``: FedLeak's batch-16 setting (ResNet-10, 16x16), where a flat grey guess beats
   the attack: the verdict beside the guesses, and the level the old rule (FedLeak's band of
   the batch's mean PSNR alone) would have printed.

Every row is one audit as the CLI runs it (``run_audit``); verdicts are the run's own (no
defense, so no control). Writes benchmarks/results/verdicts.json and the tables between
the ``verdicts-*`` markers of docs/REPRODUCTION.md.
Usage: python -m benchmarks.verdicts [--only dlg resnet batch] [--render-only]
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from auditlib.data.samples import PHOTOGRAPHS
from auditlib.engine.audit import run_audit
from auditlib.metrics.risk import leakage_level
from auditlib.spec import RunSpec
from benchmarks.common import ROOT, run_experiments
from benchmarks.reproduce_attacks import LENET, RESNET10, RESNET18, photograph, spec_of

RESULTS = ROOT / "benchmarks" / "results" / "verdicts.json"
DOC = ROOT / "docs" / "REPRODUCTION.md"
SUCCESS_PSNR = 30.0
# Budgets per image: a little above what the audit preset needs on this 2-core CPU (DLG's
# 8-start race, 480 L-BFGS steps: 55 s on average, 68 s at most; the paper preset's 300
# steps: 27 s).
DLG_SECONDS = 75.0
RESNET_SECONDS = 150.0
BATCH_SECONDS = 150.0


def audit_row(spec: RunSpec, **extra: Any) -> dict[str, Any]:
    began = time.perf_counter()
    summary = run_audit(spec, lpips_nets=()).summary.to_json()  # as result.json holds it
    metrics, verdict = summary["metrics"], summary["verdict"]
    row = {
        "attack": spec.attack.name,
        "preset": spec.attack.preset,
        "images": [p["name"] for p in metrics["per_image"]],
        "psnr": metrics["psnr_mean"],
        "ssim": metrics["ssim_mean"],
        "guess_psnr": metrics["risk"]["guess_psnr_mean"],
        "guess_ssim": metrics["risk"]["guess_ssim_mean"],
        "guesses": metrics["baseline"]["guesses"],
        "images_recovered": metrics["risk"]["images_recovered"],
        "outcome": verdict["outcome"],
        "level": verdict["level"],
        "headline": verdict["headline"],
        "old_level": leakage_level(metrics["psnr_mean"]),
        "steps": summary["timing"]["iterations"],
        "attack_seconds": summary["timing"]["seconds"],
        "seconds": time.perf_counter() - began,
        "stop_reason": summary["stop_reason"],
        "psnr_by_restart": summary["psnr_by_restart"],
        "per_image": [
            {
                k: p.get(k)
                for k in ("name", "psnr", "ssim", "guess_psnr", "guess_ssim", "leakage_level")
            }
            for p in metrics["per_image"]
        ],
        **extra,
    }
    print(row, flush=True)
    return row


DLG_ARMS = (
    ("paper", "paper", None),
    ("paper, 3 sequential restarts", "paper", {"restarts": 3}),
    ("audit", "audit", None),
)


def run_dlg() -> list[dict]:
    rows = []
    for offset in range(len(PHOTOGRAPHS)):
        # Interleaved, so that every arm sees the same machine load.
        for arm, preset, params in DLG_ARMS:
            spec = spec_of(
                LENET,
                "dlg",
                data=photograph(offset),
                iterations=300,
                params=params,
                preset=preset,
                seconds=DLG_SECONDS,
            )
            rows.append(audit_row(spec, arm=arm))
    return rows


def run_resnet() -> list[dict]:
    rows = []
    for offset in range(3):
        for attack in ("ig", "grnn"):
            for preset in ("paper", "audit"):
                spec = spec_of(
                    RESNET18,
                    attack,
                    data=photograph(offset),
                    iterations=300,
                    preset=preset,
                    seconds=RESNET_SECONDS,
                )
                rows.append(audit_row(spec))
    return rows


def run_batch() -> list[dict]:
    rows = []
    for preset in ("cpu", "audit"):
        spec = spec_of(
            RESNET10,
            "fedleak",
            data=photograph(0, 16),
            iterations=200,
            preset=preset,
            seconds=BATCH_SECONDS,
        )
        rows.append(audit_row(spec))
    return rows


def _success(rows: list[dict]) -> int:
    return sum(1 for r in rows if r["psnr"] >= SUCCESS_PSNR)


def _per_preset(rows: list[dict], preset: str) -> list[dict]:
    return [r for r in rows if r["preset"] == preset]


def _arm(rows: list[dict], arm: str) -> list[dict]:
    return [r for r in rows if r.get("arm", r["preset"]) == arm]


def render_dlg(rows: list[dict]) -> str:
    arms = [arm for arm, _, _ in DLG_ARMS if _arm(rows, arm)]
    lines = [
        "| photograph | "
        + " | ".join(f"{arm}: PSNR (dB) / verdict / steps, s" for arm in arms)
        + " |",
        "|---|" + "---|" * len(arms),
    ]
    for cells in zip(*(_arm(rows, arm) for arm in arms), strict=True):
        lines.append(
            f"| {cells[0]['images'][0]} | "
            + " | ".join(
                f"{r['psnr']:.2f} / {r['level']} / {r['steps']}, {r['attack_seconds']:.0f}"
                for r in cells
            )
            + " |"
        )
    lines.append("")
    for arm in arms:
        group = _arm(rows, arm)
        lines.append(
            f"- {arm}: PSNR >= {SUCCESS_PSNR:.0f} dB on {_success(group)}/{len(group)} "
            f"photographs (mean {statistics.mean(r['psnr'] for r in group):.2f} dB); attack time "
            f"per image mean {statistics.mean(r['attack_seconds'] for r in group):.1f} s, max "
            f"{max(r['attack_seconds'] for r in group):.1f} s (budget {DLG_SECONDS:g} s); "
            f"verdicts: {_count(group)}."
        )
    return "\n".join(lines)


def _count(rows: list[dict]) -> str:
    levels: dict[str, int] = {}
    for r in rows:
        levels[r["level"]] = levels.get(r["level"], 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(levels.items()))


def render_resnet(rows: list[dict]) -> str:
    lines = [
        "| photograph | attack | paper: PSNR / SSIM / verdict / steps, s | audit: PSNR / SSIM / verdict / steps, s |",
        "|---|---|---|---|",
    ]
    for attack in ("ig", "grnn"):
        group = [r for r in rows if r["attack"] == attack]
        for p, a in zip(_per_preset(group, "paper"), _per_preset(group, "audit"), strict=True):
            lines.append(
                f"| {p['images'][0]} | {attack} | {p['psnr']:.2f} / {p['ssim']:.3f} / {p['level']} / "
                f"{p['steps']}, {p['attack_seconds']:.0f} | {a['psnr']:.2f} / {a['ssim']:.3f} / "
                f"{a['level']} / {a['steps']}, {a['attack_seconds']:.0f} |"
            )
    lines.append("")
    for attack in ("ig", "grnn"):
        for preset in ("paper", "audit"):
            group = [r for r in rows if r["attack"] == attack and r["preset"] == preset]
            lines.append(
                f"- {attack} {preset}: mean PSNR {statistics.mean(r['psnr'] for r in group):.2f} dB "
                f"(best guess {statistics.mean(r['guess_psnr'] for r in group):.2f} dB); "
                f"verdicts: {_count(group)}; attack time per image mean "
                f"{statistics.mean(r['attack_seconds'] for r in group):.0f} s (budget {RESNET_SECONDS:g} s)."
            )
    return "\n".join(lines)


def render_batch(rows: list[dict]) -> str:
    lines = [
        "| FedLeak preset | mean PSNR / SSIM | best guess PSNR / SSIM | images beyond the guess | "
        "old level (band of the mean) | verdict | steps, s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {r['psnr']:.2f} / {r['ssim']:.3f} | {r['guess_psnr']:.2f} / "
            f"{r['guess_ssim']:.3f} | {r['images_recovered']} of {len(r['images'])} | {r['old_level']} | "
            f"{r['headline']} | {r['steps']}, {r['attack_seconds']:.0f} |"
        )
    guesses = "; ".join(
        f"{g['name']} {g['psnr_mean']:.2f} dB / {g['ssim_mean']:.3f}" for g in rows[0]["guesses"]
    )
    lines += ["", f"- The guesses (PSNR / SSIM over the batch): {guesses}."]
    for r in rows:
        recovered = [p for p in r.get("per_image", []) if p["leakage_level"]]
        if recovered:
            images = "; ".join(
                f"{p['name']} {p['psnr']:.2f} dB / {p['ssim']:.3f} (guess {p['guess_psnr']:.2f} / "
                f"{p['guess_ssim']:.3f})"
                for p in recovered
            )
            lines.append(f"- {r['preset']}: the images recovered (PSNR / SSIM): {images}.")
    return "\n".join(lines)


EXPERIMENTS = {
    "dlg": (run_dlg, render_dlg),
    "resnet": (run_resnet, render_resnet),
    "batch": (run_batch, render_batch),
}

if __name__ == "__main__":
    run_experiments(__doc__, EXPERIMENTS, RESULTS, DOC, "verdicts")
