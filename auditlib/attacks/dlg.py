"""Deep Leakage from Gradients (Zhu, Liu, Han, NeurIPS 2019).

Dummy images and dummy label logits, both drawn from N(0, 1), are optimised jointly with
L-BFGS (lr 1) so that the update they produce matches the observed one in squared L2
distance; the soft label is softmax(dummy logits). The recovered label is the argmax.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from auditlib.attacks.base import (
    AttackInfo,
    AuditPreset,
    Candidate,
    Clock,
    ProgressEvent,
    RunControl,
    final_event,
    register,
)
from auditlib.attacks.lbfgs import RestartOutcome, lbfgs_restart
from auditlib.attacks.objectives import UpdateMatcher, random_images, random_label_logits
from auditlib.config import require
from auditlib.threat import AttackerKnowledge, Observation


@dataclass(frozen=True)
class LbfgsConfig:
    lr: float = 1.0
    lbfgs_max_iter: int = 20  # objective evaluations per L-BFGS step (torch default, as in DLG)
    history_size: int = 100
    line_search: Literal["none", "strong_wolfe"] = "none"
    restarts: int = 1
    distance: Literal["l2", "cosine"] = "l2"

    def __post_init__(self) -> None:
        require(0 < self.lr <= 100, f"lr must be in (0, 100], got {self.lr}")
        require(
            1 <= self.lbfgs_max_iter <= 100,
            f"lbfgs_max_iter must be in [1, 100], got {self.lbfgs_max_iter}",
        )
        require(
            1 <= self.history_size <= 1000,
            f"history_size must be in [1, 1000], got {self.history_size}",
        )
        require(1 <= self.restarts <= 64, f"restarts must be in [1, 64], got {self.restarts}")


def run_lbfgs_attack(
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: LbfgsConfig,
    control: RunControl,
    seed: int,
    fixed_labels: torch.Tensor | None,
    label_inference: dict | None,
) -> Iterator[ProgressEvent]:
    """DLG when ``fixed_labels`` is None (labels optimised jointly), else iDLG-style."""
    matcher = UpdateMatcher(observation, knowledge, config.distance)
    generator = torch.Generator().manual_seed(seed)
    clock = Clock(control)
    total = control.max_steps * config.restarts
    candidates: list[Candidate] = []
    steps_done = 0
    stop = "completed"
    line_search = None if config.line_search == "none" else config.line_search

    for restart in range(config.restarts):
        images = random_images(knowledge, generator).requires_grad_(True)
        if fixed_labels is None:
            logits = random_label_logits(knowledge, generator).requires_grad_(True)
            variables = [images, logits]

            def objective(images=images, logits=logits) -> torch.Tensor:
                return matcher(images, torch.softmax(logits, dim=-1))

            def current_labels(logits=logits) -> torch.Tensor:
                return logits.detach().argmax(dim=-1).cpu()
        else:
            labels = fixed_labels.to(knowledge.device)
            variables = [images]

            def objective(images=images, labels=labels) -> torch.Tensor:
                return matcher(images, labels)

            def current_labels(labels=labels) -> torch.Tensor:
                return labels.cpu()

        matcher.restart()
        outcome = RestartOutcome()
        yield from lbfgs_restart(
            [*variables, *matcher.unknowns],  # unknowns: fitted by an adaptive attacker
            objective,
            images,
            current_labels,
            lr=config.lr,
            max_iter=config.lbfgs_max_iter,
            history_size=config.history_size,
            line_search=line_search,
            control=control,
            clock=clock,
            restart=restart,
            step_offset=steps_done,
            total_steps=total,
            outcome=outcome,
        )
        steps_done += outcome.steps
        final_images = outcome.images.to(knowledge.device)
        final_labels = current_labels()
        with torch.enable_grad():
            soft = (
                torch.softmax(logits.detach(), -1)
                if fixed_labels is None
                else final_labels.to(knowledge.device)
            )
            final_loss = float(matcher(final_images, soft).detach())
        candidates.append(
            Candidate(
                outcome.images,
                final_labels,
                final_loss,
                restart,
                outcome.steps,
                outcome.stop_reason,
            )
        )
        if outcome.stop_reason in {"cancelled", "time budget"}:
            stop = outcome.stop_reason
            break

    yield final_event(
        candidates, stop, steps_done, total, clock, label_inference, "gradient_distance"
    )


def run_dlg(observation, knowledge, config: LbfgsConfig, control: RunControl, seed: int):
    inference = {"rule": "DLG joint optimisation (argmax of the optimised soft label)"}
    return run_lbfgs_attack(observation, knowledge, config, control, seed, None, inference)


register(
    AttackInfo(
        name="dlg",
        summary="DLG (Zhu et al. 2019): L-BFGS on dummy images and soft labels, L2 update distance.",
        config_type=LbfgsConfig,
        run=run_dlg,
        presets={"paper": {"lr": 1.0, "lbfgs_max_iter": 20, "restarts": 1, "distance": "l2"}},
        audit=AuditPreset(
            {"lr": 1.0, "lbfgs_max_iter": 20, "restarts": 8, "distance": "l2"},
            iterations=300,
            why="DLG's own settings (L-BFGS lr 1, L2), which converge in about 100 steps when they converge at all; its failures are bad starts (a first step that never moves, a poor minimum), so 8 starts race and the lowest gradient distance wins",
        ),
        paper_iterations=300,
    )
)
