"""Reproduce the foundation figures on the bundled photographs (32x32, batch 1, LeNet).

1. DLG (L-BFGS, 300 steps) reaches PSNR >= 30 dB: per photograph, with the step at which
   the attacker-visible reconstruction first crossed 30 dB.
2. iDLG's analytic label is right for every photograph and several labels.
3. Gaussian noise of sigma 0.1 on the gradient drops DLG below 15 dB.

Writes benchmarks/results/foundation.json and the tables in docs/REPRODUCTION.md.
Usage: python benchmarks/reproduce_foundation.py [--images N] [--seeds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from auditlib.attacks.labels import idlg_label
from auditlib.data.samples import PHOTOGRAPHS
from auditlib.defenses import build_defense
from auditlib.engine.audit import prepare_victim, run_audit
from auditlib.fl.scenario import release_update
from auditlib.metrics import psnr, to_unit_range
from auditlib.spec import ComponentSpec
from benchmarks.common import ROOT, lenet_spec, machine, replace_section


def dlg_run(
    offset: int, seed: int, defense: ComponentSpec | None = None, restarts: int = 1
) -> dict:
    spec = lenet_spec(
        "dlg", offset=offset, seed=seed, defense=defense, attack_params={"restarts": restarts}
    )
    victim_truth = {}
    crossed = {"step": None}

    def on_event(event) -> None:
        if event.images is None or crossed["step"] is not None:
            return
        if "truth" not in victim_truth:
            return
        value = psnr(to_unit_range(event.images, victim_truth["norm"])[0], victim_truth["truth"])
        if value >= 30:
            crossed["step"] = event.step

    victim = prepare_victim(spec)
    victim_truth["truth"] = to_unit_range(victim.batch.images.cpu(), victim.normalization)[0]
    victim_truth["norm"] = victim.normalization
    start = time.perf_counter()
    result = run_audit(spec, on_event=on_event, lpips_nets=(), image_every=10)
    m = result.summary.to_json()["metrics"]  # read as result.json holds it
    return {
        "image": m["per_image"][0]["name"],
        "seed": seed,
        "restarts": restarts,
        "psnr": m["psnr_mean"],
        "ssim": m["ssim_mean"],
        "label_accuracy": m["label_accuracy"],
        "first_step_at_30db": crossed["step"],
        "stop_reason": result.summary.stop_reason,
        "seconds": time.perf_counter() - start,
    }


def idlg_labels(images: int, labels_per_image: int) -> list[dict]:
    rows = []
    for offset in range(images):
        for trial in range(labels_per_image):
            label = (17 * offset + 31 * trial) % 100
            spec = lenet_spec("idlg", offset=offset, seed=trial)
            victim = prepare_victim(spec)
            batch = type(victim.batch)(
                victim.batch.images, torch.tensor([label]), victim.batch.names
            )
            release = release_update(
                victim.model,
                batch,
                spec.scenario.protocol,
                build_defense("none")[0],
                normalization=victim.normalization,
                num_classes=100,
                labels_known=False,
                seed=0,
            )
            inferred, record = idlg_label(release.observation, release.knowledge)
            rows.append(
                {
                    "image": batch.names[0],
                    "true": label,
                    "inferred": inferred,
                    "unambiguous": record["unambiguous"],
                }
            )
    return rows


def render(results: dict) -> str:
    """The Markdown table and summary for docs/REPRODUCTION.md, from the saved results."""
    dlg, noisy, labels = results["dlg"], results["dlg_dp_sigma_0.1"], results["idlg_labels"]
    retried = {(r["image"], r["seed"]): r for r in results["dlg_restarts_3_where_single_failed"]}

    def summary(rows):
        values = [r["psnr"] for r in rows]
        return statistics.mean(values), statistics.median(values), min(values), max(values)

    lines = [
        "| photograph | seed | DLG PSNR (dB) | SSIM | step first >= 30 dB | DLG, 3 restarts (only where one failed) | DLG + Gaussian sigma 0.1 PSNR (dB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for clean, dp in zip(dlg, noisy, strict=True):
        retry = retried.get((clean["image"], clean["seed"]))
        lines.append(
            f"| {clean['image']} | {clean['seed']} | {clean['psnr']:.2f} | {clean['ssim']:.3f} | "
            f"{clean['first_step_at_30db'] if clean['first_step_at_30db'] is not None else 'never'} | "
            f"{format(retry['psnr'], '.2f') if retry else '-'} | {dp['psnr']:.2f} |"
        )
    mean, median, low, high = summary(dlg)
    dp_mean, _, _, dp_high = summary(noisy)
    success = [r for r in dlg if r["psnr"] >= 30]
    rescued = sum(r["psnr"] >= 30 for r in retried.values())
    below = sum(r["psnr"] < 15 for r in noisy)
    correct = sum(r["true"] == r["inferred"] for r in labels)
    dlg_labels = sum(r["label_accuracy"] == 1.0 for r in dlg)
    lines += [
        "",
        f"- DLG reached >= 30 dB on {len(success)}/{len(dlg)} single runs (mean {mean:.2f}, median "
        f"{median:.2f}, min {low:.2f}, max {high:.2f} dB; mean over the successful runs "
        f"{statistics.mean(r['psnr'] for r in success):.2f} dB).",
        f"- With 3 restarts, the attacker keeping the lowest gradient distance, {rescued}/{len(retried)} "
        f"of the failed photographs reached it: {len(success) + rescued}/{len(dlg)} in all.",
        f"- DLG's jointly optimised label was right on {dlg_labels}/{len(dlg)} single runs.",
        f"- With Gaussian noise sigma 0.1: {below}/{len(noisy)} runs below 15 dB (mean {dp_mean:.2f}, "
        f"max {dp_high:.2f} dB).",
        f"- iDLG label rule: {correct}/{len(labels)} labels recovered "
        f"({len(labels) // len(dlg)} labels per photograph).",
        "",
        f"Measured on: {results['machine']}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=len(PHOTOGRAPHS), help="photographs to use")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument(
        "--render-only", action="store_true", help="redo the docs from the saved JSON"
    )
    args = parser.parse_args()
    out = ROOT / "benchmarks" / "results"
    if args.render_only:
        results = json.loads((out / "foundation.json").read_text())
    else:
        dlg = [dlg_run(i, s) for s in range(args.seeds) for i in range(args.images)]
        noisy = [
            dlg_run(i, s, ComponentSpec.of("dp-gaussian", {"sigma": 0.1, "clip": "none"}))
            for s in range(args.seeds)
            for i in range(args.images)
        ]
        # DLG's public code runs once; where that failed, give the attacker 3 restarts and
        # let it keep the lowest gradient distance (no ground truth involved).
        retried = [
            dlg_run(i % args.images, r["seed"], restarts=3)
            for i, r in enumerate(dlg)
            if r["psnr"] < 30
        ]
        results = {
            "machine": machine(),
            "dlg": dlg,
            "dlg_restarts_3_where_single_failed": retried,
            "dlg_dp_sigma_0.1": noisy,
            "idlg_labels": idlg_labels(args.images, 5),
        }
        out.mkdir(exist_ok=True)
        (out / "foundation.json").write_text(json.dumps(results, indent=2) + "\n")
    text = render(results)
    replace_section(ROOT / "docs" / "REPRODUCTION.md", "foundation", text)
    print(text)


if __name__ == "__main__":
    main()
