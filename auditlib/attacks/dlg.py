"""Deep Leakage from Gradients (Zhu, Liu, Han, NeurIPS 2019).

Dummy images and dummy label logits, both drawn from N(0, 1), are optimised jointly with
L-BFGS (lr 1) so that the update they produce matches the observed one in squared L2
distance; the soft label is softmax(dummy logits). The recovered label is the argmax.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from auditlib.attacks.base import (
    AttackInfo,
    AuditPreset,
    ProgressEvent,
    RunControl,
    register,
    snapshot,
)
from auditlib.attacks.captured import CAPTURED_LBFGS_HELP, stepping
from auditlib.attacks.compiled import (
    apart_when_compiled,
    held,
    traced_model,
    why_not_compiled,
)
from auditlib.attacks.lbfgs import LbfgsSteps, LbfgsTogether, RecordedRows
from auditlib.attacks.lbfgs_batched import take_rows
from auditlib.attacks.loop import run_restarts, stacked_starts
from auditlib.attacks.objectives import (
    UpdateMatcher,
    random_images,
    random_label_logits,
    traced_inputs,
    unknown_rows,
    why_not_together,
)
from auditlib.attacks.updates import UpdatesMatcher
from auditlib.attacks.updates_loop import run_updates
from auditlib.config import check_ranges, param
from auditlib.threat import AttackerKnowledge, Observation

# The L-BFGS attacks' twin (the attacker that knows the defense) searches its step: its
# objective is not DLG's (a noise's likelihood plus the image prior, or a transformed
# update), and DLG's fixed step broke down on it (docs/ALGORITHMS.md, "The twin's step").
LBFGS_TWIN = {"line_search": "strong_wolfe"}
LBFGS_TWIN_WHY = (
    "searches each L-BFGS step (strong Wolfe) where the plain attack steps a fixed lr: on "
    "the twin's objective the fixed step left the finite numbers"
)


@dataclass(frozen=True)
class LbfgsConfig:
    lr: float = param(1.0, "L-BFGS step size (DLG: 1)", low=0, low_open=True, high=100)
    lbfgs_max_iter: int = param(
        20,
        "objective evaluations per L-BFGS step at most (torch's max_iter; DLG: 20)",
        low=1,
        high=100,
    )
    history_size: int = param(
        100, "L-BFGS curvature pairs kept (torch's history_size)", low=1, high=1000
    )
    line_search: Literal["none", "strong_wolfe"] = param(
        "none", "L-BFGS line search: none (a fixed step, as in DLG) or strong Wolfe"
    )
    restarts: int = param(
        1,
        "random starts; the one with the lowest gradient distance is kept (raced under the "
        "audit preset)",
        low=1,
        high=64,
    )
    distance: Literal["l2", "cosine"] = param(
        "l2", "distance between the dummy and the observed update: squared L2 (DLG) or cosine"
    )
    # Starts advance together on a batched L-BFGS with a history per start (lbfgs_batched);
    # False: one after another on torch's own L-BFGS. The same algorithm per start.
    together: bool = param(
        True,
        "advance the starts together, one L-BFGS history each, as one batched computation "
        "(false: one after another on torch's L-BFGS; the same algorithm per start)",
    )
    # Each evaluation recorded as a CUDA graph and replayed (attacks.captured, lbfgs.
    # RecordedRows): the same algorithm, on the batched L-BFGS.
    captured: bool | None = param(None, CAPTURED_LBFGS_HELP, identity=False)

    def __post_init__(self) -> None:
        check_ranges(self)


class _Restart:
    """One L-BFGS restart on torch's own optimiser: a single start (the paper's run, on the
    paper's optimiser), starts apart (``together=false``), or an objective that cannot be
    batched (``why_not_together``)."""

    def __init__(self, generators, observation, knowledge, config, fixed_labels, clock):
        (generator,) = generators
        self.matcher = UpdateMatcher(observation, knowledge, config.distance)
        self.images = random_images(knowledge, generator).requires_grad_(True)
        self.logits = None
        self.fixed = None if fixed_labels is None else fixed_labels.to(knowledge.device)
        variables = [self.images]
        if fixed_labels is None:
            self.logits = random_label_logits(knowledge, generator).requires_grad_(True)
            variables.append(self.logits)
        self.matcher.restart()
        self.steps = LbfgsSteps.of(
            [*variables, *self.matcher.unknowns],  # unknowns: fitted by an adaptive attacker
            self._objective,
            clock,
            config,
        )

    def _labels(self) -> torch.Tensor:
        return self.fixed if self.logits is None else torch.softmax(self.logits, dim=-1)

    def _objective(self) -> torch.Tensor:
        return self.matcher(self.images, self._labels())

    def _hard_labels(self) -> torch.Tensor:
        return (self.fixed if self.logits is None else self.logits.detach().argmax(-1)).cpu()

    def step(self, alive):
        loss = self.steps.step()
        return {
            "gradient_distance": torch.tensor([loss]),
            "evaluations": torch.tensor([float(self.steps.evaluations)]),
        }

    def frame(self, position):
        return snapshot(self.images), self._hard_labels()

    def candidate(self, position):
        self.steps.restore()  # the last full step, not a cut-short or diverged one
        with torch.enable_grad():
            score = float(self.matcher(self.images.detach(), self._labels().detach()).detach())
        return snapshot(self.images), self._hard_labels(), score


class _Starts:
    """K starts on one batched L-BFGS (``LbfgsTogether``): images (and label logits)
    stacked one row per start; each row's objective is its own update distance, computed
    for the rows still stepping in one ``matcher.at(rows).together`` pass. The rows are one
    update's starts (an ``UpdateMatcher``) or several updates' (``UpdatesMatcher``: each row
    its own update's target and, where labels are fixed, its own labels, K x B)."""

    def __init__(self, generators, matcher, knowledge, config, fixed_labels, clock):
        self.matcher = matcher
        self.images, self.logits = stacked_starts(knowledge, generators, fixed_labels is not None)
        self.fixed = None if fixed_labels is None else fixed_labels.to(knowledge.device)
        self.fixed_rows = self.fixed is not None and self.fixed.dim() == 2  # K x B: per row
        variables = [self.images] + ([self.logits] if self.logits is not None else [])
        # An adaptive attacker's unknowns: a row per start, each fitted by its own L-BFGS.
        self.unknowns = unknown_rows(matcher, len(generators), alone_too=bool(config.captured))
        variables += () if self.unknowns is None else self.unknowns.leaves
        self.recorded = self._recorded(variables, knowledge.device) if config.captured else None
        self.steps = LbfgsTogether.of(
            variables, self.recorded or self._objective, clock, len(generators), config
        )

    def _labels(self, rows: list[int]) -> torch.Tensor:
        if self.logits is not None:
            return torch.softmax(take_rows(self.logits, rows), dim=-1)
        return take_rows(self.fixed, rows) if self.fixed_rows else self.fixed

    def _recorded(self, variables: list[torch.Tensor], device: torch.device) -> RecordedRows:
        """The evaluations recorded as a CUDA graph: the rows' distances by one
        ``together`` pass (a Linear weight's update formed densely, as a traced step's)."""

        with_logits = self.logits is not None
        names = () if self.unknowns is None else self.unknowns.names

        def objective(images, *rest):  # the rows' images, label logits, then unknowns
            logits, unknowns = traced_inputs(rest, with_logits, names)
            labels = torch.softmax(logits[0], dim=-1) if logits else self.fixed
            return self.matcher.together(images, labels, unknowns=unknowns), {}

        recorded = RecordedRows(variables, objective, device, self.matcher)
        self.matcher.factored = False
        return recorded

    def _one(self, labels: torch.Tensor) -> torch.Tensor:
        """One row's labels out of ``_labels([row])``."""
        return labels[0] if self.logits is not None or self.fixed_rows else labels

    def _objective(self, rows: list[int]) -> torch.Tensor:
        return self._distance(self.images, self._labels(rows), rows)

    def _distance(self, images: torch.Tensor, labels: torch.Tensor, rows: list[int]):
        """The ``rows``' update distances; ``images`` stacked one row per start."""
        matcher = self.matcher.at(rows)
        if len(rows) == 1:  # one start: plain autograd, the fastest way alone
            own = () if self.unknowns is None else (self.unknowns.row(rows[0]),)
            return matcher(images[rows[0]], self._one(labels), *own).unsqueeze(0)
        if self.unknowns is not None:  # each row through its own unknowns
            unknowns = self.unknowns.rows(lambda leaf: take_rows(leaf, rows))
            return matcher.together(take_rows(images, rows), labels, unknowns=unknowns)
        return matcher.together(take_rows(images, rows), labels)

    def _hard_labels(self, row: int) -> torch.Tensor:
        if self.logits is not None:
            return self.logits[row].detach().argmax(-1).cpu()
        return (self.fixed[row] if self.fixed_rows else self.fixed).cpu()

    def step(self, alive):
        losses = self.steps.step(list(alive))
        return {
            "gradient_distance": torch.tensor(losses),
            "evaluations": torch.tensor([float(self.steps.evaluations[r]) for r in alive]),
        }

    def frame(self, position):
        return snapshot(self.images[position]), self._hard_labels(position)

    def candidate(self, position):
        self.steps.restore([position])  # its last full step, not a cut-short or diverged one
        labels = self._labels([position]).detach()
        with torch.enable_grad():
            score = float(self._distance(self.images.detach(), labels, [position])[0].detach())
        return snapshot(self.images[position]), self._hard_labels(position), score


def lbfgs_together(config, knowledge: AttackerKnowledge) -> bool:
    """Whether an L-BFGS attack's starts advance together: asked for, more than one (a
    single start runs on torch's own L-BFGS, the paper's optimiser, bit for bit as before),
    and an objective that ``UpdateMatcher.together`` can batch."""
    return config.together and config.restarts > 1 and why_not_together(knowledge) is None


def run_lbfgs_attack(
    attack: str,
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: LbfgsConfig,
    control: RunControl,
    seed: int,
    fixed_labels: torch.Tensor | None,
    label_inference: dict | None,
) -> Iterator[ProgressEvent]:
    """DLG when ``fixed_labels`` is None (labels optimised jointly), else iDLG-style;
    ``attack`` names it in a refusal."""

    config, how = stepping(attack, config, knowledge, why_not_compiled(knowledge))
    # A captured evaluation is the batched L-BFGS's: the starts (one too) advance together.
    together = config.captured or lbfgs_together(config, knowledge)

    def make(generators, clock):
        if together:
            matcher = UpdateMatcher(observation, knowledge, config.distance)
            starts = _Starts(generators, matcher, knowledge, config, fixed_labels, clock)
            if starts.recorded is not None:
                how.made(starts.recorded.gradient)
            return starts
        return _Restart(generators, observation, knowledge, config, fixed_labels, clock)

    events = run_restarts(
        make, config.restarts, together, control, seed, "gradient_distance", label_inference
    )
    return how.told(held(traced_model(knowledge), events) if config.captured else events)


def run_lbfgs_updates(
    observations: Sequence[Observation],
    knowledges: Sequence[AttackerKnowledge],
    config: LbfgsConfig,
    control: RunControl,
    seeds: Sequence[int],
    fixed_labels: Sequence[torch.Tensor] | None,
    label_inferences: Sequence[dict | None],
) -> Iterator[tuple[int, ProgressEvent]]:
    """Several updates' starts on one batched L-BFGS (``attacks.updates_loop``): update u's
    starts are rows u R .. u R + R - 1, each matching update u's target (with update u's
    own labels where they are fixed), each its own L-BFGS as in :func:`run_lbfgs_attack`.
    The caller checked ``attacks.updates.why_updates_apart``."""
    restarts = config.restarts
    owners = [u for u in range(len(observations)) for _ in range(restarts)]
    matchers = [
        UpdateMatcher(o, k, config.distance) for o, k in zip(observations, knowledges, strict=True)
    ]
    matcher = UpdatesMatcher(matchers, owners)
    fixed = None if fixed_labels is None else torch.stack([fixed_labels[u] for u in owners])

    def make(generators, clock):
        return _Starts(generators, matcher, knowledges[0], config, fixed, clock)

    return run_updates(make, restarts, control, seeds, "gradient_distance", label_inferences)


DLG_INFERENCE = {"rule": "DLG joint optimisation (argmax of the optimised soft label)"}


def run_dlg(observation, knowledge, config: LbfgsConfig, control: RunControl, seed: int):
    return run_lbfgs_attack(
        "dlg", observation, knowledge, config, control, seed, None, dict(DLG_INFERENCE)
    )


def run_dlg_updates(observations, knowledges, config: LbfgsConfig, control, seeds):
    """DLG on several updates together (``AttackInfo.run_updates``)."""
    inferences = [dict(DLG_INFERENCE) for _ in observations]
    return run_lbfgs_updates(observations, knowledges, config, control, seeds, None, inferences)


register(
    AttackInfo(
        name="dlg",
        summary="DLG (Zhu et al. 2019): L-BFGS on dummy images and soft labels, L2 update distance.",
        config_type=LbfgsConfig,
        run=run_dlg,
        run_updates=run_dlg_updates,
        why_updates_apart=apart_when_compiled("dlg"),
        presets={"paper": {"lr": 1.0, "lbfgs_max_iter": 20, "restarts": 1, "distance": "l2"}},
        audit=AuditPreset(
            {"lr": 1.0, "lbfgs_max_iter": 20, "restarts": 8, "distance": "l2"},
            iterations=300,
            why="DLG's own settings (L-BFGS lr 1, L2), which converge in about 100 steps when they converge at all; its failures are bad starts (a first step that never moves, a poor minimum), so 8 starts race and the lowest gradient distance wins",
        ),
        paper_iterations=300,
        twin_params=LBFGS_TWIN,
        twin_why=LBFGS_TWIN_WHY,
    )
)
