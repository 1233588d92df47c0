"""Before vectorising restarts (issue 18), the measurement that chooses how: R restarts of
IG's objective (cosine distance of FedSGD gradients, Adam lr 0.1 on the pixels) on DLG's
LeNet at 32x32, batch 1, advanced one after the other (what the attacks do today) or
together with ``torch.func.vmap`` over the restarts (per-restart gradients of the shared
weights, so each restart's objective is exactly its own; LeNet has no BatchNorm).

Both arms use the same objective code and the same starting images; the table gives
restart-steps per second and the largest pixel difference between the two arms' results
after 5 and after 50 steps. The first step's pixel gradients of the two arms agree to a
relative 1e-6 (float32 summation order); Adam's division by the root of its second moment
then amplifies that where a pixel's gradient is near zero. Not a product path yet.

Writes benchmarks/results/restart_batching.json and the table in docs/PERFORMANCE.md.
Usage: python -m benchmarks.restart_batching
"""

from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from auditlib.models import ModelSpec, build_model
from benchmarks.common import ROOT, machine, replace_section

RESULTS = ROOT / "benchmarks" / "results" / "restart_batching.json"
DOC = ROOT / "docs" / "PERFORMANCE.md"
MODEL = ModelSpec("lenet", 100, (3, 32, 32), init="uniform")
RESTARTS = (1, 4, 8, 16)
STEPS = 50


def _setting():
    torch.manual_seed(0)
    model = build_model(MODEL)
    params = {n: p.detach() for n, p in model.named_parameters()}
    label = torch.tensor([3])

    def loss(p, x):
        return F.cross_entropy(functional_call(model, p, (x,)), label)

    target = tuple(grad(loss)(params, torch.randn(1, 3, 32, 32)).values())
    return params, loss, target


def _cosine(grads, target):
    """1 - cosine per restart (the leading dimension of every tensor in ``grads``)."""
    dot = sum((g * t).flatten(1).sum(1) for g, t in zip(grads, target, strict=True))
    norm = sum(g.pow(2).flatten(1).sum(1) for g in grads).sqrt()
    return 1 - dot / (norm * sum(t.pow(2).sum() for t in target).sqrt() + 1e-12)


def _starts(restarts: int) -> torch.Tensor:
    return torch.randn(restarts, 1, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def sequential(restarts: int, steps: int) -> torch.Tensor:
    params, loss, target = _setting()
    weights = {n: p.clone().requires_grad_(True) for n, p in params.items()}
    out = []
    for start in _starts(restarts):
        x = start.clone().requires_grad_(True)
        optimizer = torch.optim.Adam([x], lr=0.1)
        for _ in range(steps):
            optimizer.zero_grad()
            grads = torch.autograd.grad(loss(weights, x), list(weights.values()), create_graph=True)
            _cosine([g.unsqueeze(0) for g in grads], target).sum().backward()
            optimizer.step()
        out.append(x.detach())
    return torch.stack(out)


def batched(restarts: int, steps: int) -> torch.Tensor:
    params, loss, target = _setting()
    x = _starts(restarts).requires_grad_(True)
    optimizer = torch.optim.Adam([x], lr=0.1)  # elementwise: each restart's own moments
    per_restart = vmap(grad(loss), in_dims=(None, 0))
    for _ in range(steps):
        optimizer.zero_grad()
        # The sum's gradient for each restart's pixels is its own objective's gradient.
        _cosine(tuple(per_restart(params, x).values()), target).sum().backward()
        optimizer.step()
    return x.detach()


def _rate(arm, restarts: int) -> float:
    arm(restarts, 2)  # warm-up (lazy imports, allocator)
    start = time.perf_counter()
    arm(restarts, STEPS)
    return restarts * STEPS / (time.perf_counter() - start)


def main() -> None:
    torch.set_num_threads(2)
    rows = []
    for restarts in RESTARTS:
        rate_seq, rate_vmap = _rate(sequential, restarts), _rate(batched, restarts)
        rows.append(
            {
                "restarts": restarts,
                "sequential": rate_seq,
                "vmap": rate_vmap,
                "speedup": rate_vmap / rate_seq,
                "max_diff_5": float((sequential(restarts, 5) - batched(restarts, 5)).abs().max()),
                "max_diff_50": float(
                    (sequential(restarts, STEPS) - batched(restarts, STEPS)).abs().max()
                ),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    RESULTS.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2) + "\n")
    lines = [
        "| restarts | sequential: restart-steps/s | vmap: restart-steps/s | speed-up | "
        "largest pixel difference after 5 / 50 steps |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['restarts']} | {r['sequential']:.0f} | {r['vmap']:.0f} | "
            f"{r['speedup']:.2f}x | {r['max_diff_5']:.1e} / {r['max_diff_50']:.1e} |"
        )
    text = "\n".join(lines) + f"\n\nMeasured on: {machine()}."
    replace_section(DOC, "restart-batching", text)
    print(text)


if __name__ == "__main__":
    main()
