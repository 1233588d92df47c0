"""Checks a run passes before anything is recorded or started, wherever it comes from (the
CLI, the dashboard's worker): what would otherwise fail in the middle of the run in
torch's words; and what the run will take on this machine (``estimate_time``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


def smallest_forward_batch(spec) -> int | None:
    """The fewest images one forward of the client's update takes: the smallest client's
    share under secure aggregation (``engine.releases.client_batches`` splits in order, as
    evenly as they go), then its smallest local mini-batch. None while the batch size is
    unknown (a folder's images, counted when they are read)."""
    batch = spec.data.batch_size
    if batch is None:
        return None
    share = batch // spec.scenario.clients
    slices = spec.scenario.protocol.minibatch_slices(share)
    return min(len(range(*s.indices(share))) for s in slices)


def check_model_trains(spec) -> None:
    """Refuse, before any run, a model whose training-mode BatchNorm cannot take the
    client's batch (one image whose feature map shrinks to 1x1): torch would fail in the
    middle of the run with its own words. Built only where that can happen."""
    from auditlib.models import build_model
    from auditlib.models.registry import MAX_SIDE
    from auditlib.models.shapes import check_training_batch

    model_spec = spec.model.spec
    if spec.model.trusted_archive is not None or not model_spec.info.has_batchnorm:
        return
    if spec.scenario.protocol.batchnorm_mode != "train" or smallest_forward_batch(spec) != 1:
        return
    model = build_model(model_spec)
    check_training_batch(model, model_spec.input_shape, 1, MAX_SIDE)


@dataclass(frozen=True)
class TimeEstimate:
    """What a run's attacks will take on this machine, from one measured evaluation of the
    gradient-matching loss on the run's model and batch (``estimate_time``)."""

    evaluation_s: float  # one evaluation: forward, gradient with its graph, distance, backward
    planned_steps: int  # every planned attack's steps, its twin's included
    budget_s: float | None  # the run's time budget (None: none)

    @property
    def at_least_s(self) -> float:
        """The planned steps at one evaluation each: a lower bound (an L-BFGS step evaluates
        the loss once or more, an Adam step once)."""
        return self.evaluation_s * self.planned_steps

    @property
    def fits(self) -> bool:
        return self.budget_s is None or self.at_least_s <= self.budget_s

    def words(self) -> str:
        """'one evaluation ... takes 2.1 s here, so the 475 planned steps take at least 17
        min; the time budget of 120 s stops the attack after about 57 of them: a budget of
        at least 998 s would let it finish'."""
        text = (
            f"one evaluation of the attack's gradient-matching loss takes "
            f"{self.evaluation_s:.2g} s on this machine, so the {self.planned_steps:,} planned "
            f"steps take at least {duration_words(self.at_least_s)}"
        )
        if self.budget_s is not None and not self.fits:
            done = int(self.budget_s / self.evaluation_s)
            text += (
                f"; the time budget of {self.budget_s:g} s stops the attack after at most about "
                f"{done:,} of them: a budget of at least {math.ceil(self.at_least_s):,} s would "
                "let it finish"
            )
        return text


def duration_words(seconds: float) -> str:
    """'45 s', '17 min', '3.2 h'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_time(spec) -> TimeEstimate | None:
    """Time one evaluation of the gradient-matching loss (the cost every optimising attack
    pays per step at least) on the run's model, input size and batch, on its device, and
    scale it by the planned steps (the twins' included where the attacker knows the
    defense). None where it says nothing: closed-form attacks (one pass), a malicious
    server's, a trusted archive (run in its own process), a batch of unknown size."""
    from auditlib.engine.attack_phase import adaptive_wanted, plan_attacks

    batch = spec.data.batch_size
    if spec.model.trusted_archive is not None or batch is None:
        return None
    if spec.scenario.server != "honest":
        return None
    planned = plan_attacks(spec.attack, spec.budget.iterations, server=spec.scenario.server)
    steps = sum(p.planned_steps for p in planned if p.planned_steps > 1)
    if not steps:
        return None
    if spec.defense.name != "none" and adaptive_wanted(
        spec.scenario.attacker_knows_defense, spec.attack
    ):
        steps *= 2  # each attack beside its twin that knows the defense
    return TimeEstimate(_evaluation_seconds(spec, batch), steps, spec.budget.max_seconds)


# A cheap evaluation is timed a few times (the fastest counts: the machine's other work
# only ever adds time); one that takes a second or more, once.
MEASURED_EVALUATIONS = 5
MEASURING_S = 1.0


def _evaluation_seconds(spec, batch: int) -> float:
    """Seconds of one evaluation of the distance between a dummy batch's gradient and the
    client's (the objective of DLG and its successors), after one untimed warm-up."""
    import torch
    import torch.nn.functional as F

    from auditlib.engine.device import resolve_device
    from auditlib.models import build_model

    device = resolve_device(spec.device)
    model_spec = spec.model.spec
    model = build_model(model_spec).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(0)
    images = torch.rand((batch, *model_spec.input_shape), generator=generator).to(device)
    labels = torch.randint(model_spec.num_classes, (batch,), generator=generator).to(device)
    target = [
        g.detach() for g in torch.autograd.grad(F.cross_entropy(model(images), labels), params)
    ]
    dummy = torch.rand(images.shape, generator=generator).to(device).requires_grad_(True)

    def evaluate() -> None:
        grads = torch.autograd.grad(
            F.cross_entropy(model(dummy), labels), params, create_graph=True
        )
        distance = sum(((g - t) ** 2).sum() for g, t in zip(grads, target, strict=True))
        distance.backward()  # type: ignore[union-attr]

    evaluate()  # the first call pays for allocations that later ones do not
    times: list[float] = []
    while len(times) < MEASURED_EVALUATIONS and sum(times) < MEASURING_S:
        started = time.perf_counter()
        evaluate()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return min(times)  # the least disturbed by whatever else the machine runs
