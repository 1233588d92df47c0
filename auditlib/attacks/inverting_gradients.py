"""Inverting Gradients (Geiping, Bauermeister, Dröge, Moeller, NeurIPS 2020).

Minimises 1 - cos(update(x), observed) + tv * TV(x) over the images x with Adam (lr 0.1),
using the sign of the image gradient ("signed gradients"), a step decay of the learning
rate by 0.1 at 3/8, 5/8 and 7/8 of the iterations, and a box constraint that keeps x inside
the valid pixel range after every step. Several restarts may run; the attacker keeps the
one with the lowest final objective.

Labels: known labels when the threat model gives them; for one image the iDLG rule; for a
larger batch with unknown labels, soft labels optimised jointly with the images (as the
public inversefed code does).
"""

from __future__ import annotations

from collections.abc import Iterator
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
from auditlib.attacks.captured import (
    CAPTURED_HELP,
    CapturedGradient,
    one_way_of_stepping,
    stepped,
    stepping,
)
from auditlib.attacks.compiled import (
    CompiledGradient,
    apart_when_compiled,
    held,
    traced_model,
    why_not_compiled,
)
from auditlib.attacks.labels import idlg_label
from auditlib.attacks.loop import run_restarts, stacked_starts
from auditlib.attacks.objectives import (
    UpdateMatcher,
    backward_to,
    total_variation,
    traced_inputs,
    unknown_rows,
    why_not_together,
)
from auditlib.attacks.row_index import RowIndex, full_rows
from auditlib.attacks.updates import UpdatesMatcher
from auditlib.attacks.updates_loop import run_updates
from auditlib.config import check_ranges, param
from auditlib.errors import AttackUnsupportedError
from auditlib.threat import AttackerKnowledge, Observation


@dataclass(frozen=True)
class InvertingGradientsConfig:
    lr: float = param(
        0.1, "Adam step size on the images (paper: 0.1)", low=0, low_open=True, high=10
    )
    tv: float = param(
        1e-4, "weight of the total-variation prior on the images (paper: 1e-4)", low=0, high=10
    )
    restarts: int = param(
        1,
        "random starts; the one with the lowest update distance is kept (raced under the "
        "audit preset)",
        low=1,
        high=64,
    )
    signed: bool = param(True, "step along the sign of the image gradient (signed gradients)")
    boxed: bool = param(True, "clamp the images into the valid pixel range after every step")
    lr_decay: bool = param(True, "divide the step size by 10 at 3/8, 5/8 and 7/8 of the iterations")
    distance: Literal["cosine", "l2"] = param(
        "cosine", "update distance: 1 - cosine similarity (paper) or squared L2"
    )
    labels: Literal["auto", "known", "idlg", "joint"] = param(
        "auto",
        "labels: known to the server, the iDLG rule (one image), soft labels optimised with "
        "the images (joint); auto: known if the server knows them, else iDLG for one image, "
        "joint for a batch",
    )
    # Restarts advance together, one batched computation (attacks.loop); False: one after
    # another. The same objective either way.
    together: bool = param(
        True,
        "advance the restarts together as one batched computation (false: one after another; "
        "the same objective)",
    )
    # The step traced and compiled (attacks.compiled): a CUDA graph on a GPU. Asked for, not
    # the default: compiling costs seconds per number of running starts before it pays.
    compiled: bool = param(
        False,
        "trace and compile the step with torch.compile (a CUDA graph on a GPU): faster steps "
        "where kernels are small, after seconds to minutes of compiling per number "
        "of running starts; the starts advance together, and several updates one after "
        "another, each its own traced step",
        identity=False,  # the same algorithm: a stored eager run stands for a compiled one
    )
    # The eager step recorded as a CUDA graph after its first steps (attacks.captured):
    # the launches saved without compiling. Asked for, on CUDA only.
    captured: bool | None = param(None, CAPTURED_HELP, identity=False)  # the same algorithm

    def __post_init__(self) -> None:
        check_ranges(self)
        one_way_of_stepping(self)


def _milestones(iterations: int) -> list[int]:
    # The public code's integer divisions: 3/8, 5/8 and 7/8 of the run.
    return [int(iterations // 2.667), int(iterations // 1.6), int(iterations // 1.142)]


def _resolve_labels(observation, knowledge, strategy) -> tuple[torch.Tensor | None, dict]:
    if strategy == "auto":
        strategy = (
            "known"
            if knowledge.labels is not None
            else ("idlg" if knowledge.batch_size == 1 else "joint")
        )
    if strategy == "known":
        if knowledge.labels is None:
            raise AttackUnsupportedError(
                "labels=known needs a scenario in which the server knows the labels (--labels-known)"
            )
        return knowledge.labels.clone(), {"rule": "known to the server (threat model)"}
    if strategy == "idlg":
        label, record = idlg_label(observation, knowledge)
        return torch.tensor([label], dtype=torch.long), record
    return None, {"rule": "joint optimisation of soft labels (argmax)"}


def run_inverting_gradients(
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: InvertingGradientsConfig,
    control: RunControl,
    seed: int,
) -> Iterator[ProgressEvent]:
    fixed_labels, inference = _resolve_labels(observation, knowledge, config.labels)
    return _run(observation, knowledge, config, control, seed, fixed_labels, inference)


class _Restarts:
    """IG's restarts: signed Adam on the images (and soft labels), stacked one per restart.
    The rows are one update's restarts (an ``UpdateMatcher``) or several updates' (an
    ``UpdatesMatcher``: each row its own update's target and, where labels are fixed, its
    own labels, K x B); Adam and the sign are elementwise, so each row is its own run."""

    def __init__(self, generators, matcher, knowledge, config, iterations, fixed_labels):
        self.config = config
        self.matcher = matcher
        self.compiled: CompiledGradient | CapturedGradient | None = None
        self._index = RowIndex(knowledge.device)  # the running rows, made once per set
        self.images, self.logits = stacked_starts(knowledge, generators, fixed_labels is not None)
        self.fixed = None if fixed_labels is None else fixed_labels.to(knowledge.device)
        self.fixed_rows = self.fixed is not None and self.fixed.dim() == 2  # K x B: per row
        variables = [self.images] + ([self.logits] if self.logits is not None else [])
        # An adaptive attacker's unknowns are fitted with the images: a row per start where
        # starts advance together or the step is traced, else the model's own (one start).
        self.matcher.restart()
        self.unknowns = unknown_rows(matcher, len(generators), alone_too=stepped(config))
        variables += self.matcher.unknowns if self.unknowns is None else self.unknowns.leaves
        self.variables = variables
        self.optimizer = torch.optim.Adam(variables, lr=config.lr)
        self.scheduler = (
            torch.optim.lr_scheduler.MultiStepLR(
                self.optimizer, milestones=_milestones(iterations), gamma=0.1
            )
            if config.lr_decay
            else None
        )
        self.low, self.high = knowledge.normalization.pixel_bounds(
            torch.zeros((), device=knowledge.device)
        )

    def _labels(self, positions) -> torch.Tensor:
        rows = self._index(positions)
        if self.logits is None:
            return self.fixed.index_select(0, rows) if self.fixed_rows else self.fixed
        return torch.softmax(self.logits.index_select(0, rows), dim=-1)

    def _one(self, labels: torch.Tensor) -> torch.Tensor:
        """One restart's labels out of ``_labels([position])``."""
        return labels[0] if self.logits is not None or self.fixed_rows else labels

    def _distance(
        self, images: torch.Tensor, labels: torch.Tensor, positions, traced_unknowns=None
    ) -> torch.Tensor:
        """``positions``: the restarts' rows, or None in the traced step (one update's
        matcher, every row's target the same; ``traced_unknowns``: the rows' unknowns, its
        inputs, where the defense hides some)."""
        if positions is None:
            return self.matcher.together(images, labels, unknowns=traced_unknowns)
        matcher = self.matcher.at(positions)
        if len(positions) == 1:  # one restart: plain autograd, the fastest way alone
            own = () if self.unknowns is None else (self.unknowns.row(positions[0]),)
            return matcher(images[0], self._one(labels), *own).unsqueeze(0)
        if self.unknowns is not None:  # each row through its own unknowns
            index = self._index(positions)
            rows = self.unknowns.rows(lambda leaf: leaf.index_select(0, index))
            return matcher.together(images, labels, unknowns=rows)
        return matcher.together(images, labels)

    def _objective(self, images, labels, positions, traced_unknowns=None):
        """The restarts' objective (one value each) and their update distances."""
        distance = self._distance(images, labels, positions, traced_unknowns)
        tv = self.config.tv * total_variation(images) if self.config.tv > 0 else 0.0
        return distance + tv, distance

    def traced(self, device: torch.device, captured: bool = False) -> None:
        """Step by the traced objective from now on: compiled (``attacks.compiled``) or
        recorded as a CUDA graph (``attacks.captured``)."""
        self.matcher.factored = False
        with_logits = self.logits is not None
        names = () if self.unknowns is None else self.unknowns.names

        def objective(images, *rest):  # the rows' images, label logits, then unknowns
            logits, unknowns = traced_inputs(rest, with_logits, names)
            labels = self.fixed if not logits else torch.softmax(logits[0], dim=-1)
            value, distance = self._objective(images, labels, None, unknowns)
            return value, {"update_distance": distance}

        gradient = CapturedGradient if captured else CompiledGradient
        self.compiled = gradient(objective, device)

    def step(self, alive):
        self.optimizer.zero_grad()
        if self.compiled is None:
            images = self.images.index_select(0, self._index(alive))
            objective, distance = self._objective(images, self._labels(alive), alive)
            # Each restart's variables get its own objective's gradient.
            backward_to(objective.sum(), self.optimizer)
        else:
            # The traced step's inputs are the variables: images, logits, the unknowns' rows
            # (a traced step has rows of them, one start too: unknown_rows' alone_too).
            rows = self.variables
            index = self._index(alive)
            grads, objective, losses = self.compiled(*(v.index_select(0, index) for v in rows))
            for variable, grad in zip(rows, grads, strict=True):
                variable.grad = full_rows(variable, index, grad)
            distance = losses["update_distance"]
        if self.config.signed:
            self.images.grad.sign_()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        if self.config.boxed:
            with torch.no_grad():
                self.images.copy_(torch.maximum(torch.minimum(self.images, self.high), self.low))
        return {"objective": objective.detach(), "update_distance": distance.detach()}

    def _hard_labels(self, position: int) -> torch.Tensor:
        if self.logits is None:
            return (self.fixed[position] if self.fixed_rows else self.fixed).cpu()
        return self.logits[position].detach().argmax(-1).cpu()

    def frame(self, position):
        return snapshot(self.images[position]), self._hard_labels(position)

    def candidate(self, position):
        # Restarts are scored by the update distance alone, as the public code's
        # scoring_choice="loss" does (the TV prior is not part of the score).
        images = self.images[position].detach()
        labels = self._labels([position]).detach()
        with torch.enable_grad():
            score = float(self._distance(images.unsqueeze(0), labels, [position])[0].detach())
        return snapshot(images), self._hard_labels(position), score


def _run(observation, knowledge, config, control, seed, fixed_labels, inference):
    config, how = stepping("ig", config, knowledge, why_not_compiled(knowledge))

    def make(generators, clock):
        matcher = UpdateMatcher(observation, knowledge, config.distance)
        restarts = _Restarts(
            generators, matcher, knowledge, config, control.max_steps, fixed_labels
        )
        if stepped(config):
            restarts.traced(knowledge.device, config.captured)
            how.made(restarts.compiled)
        return restarts

    # A compiled or captured step is the batched one: the starts advance together.
    together = stepped(config) or (config.together and why_not_together(knowledge) is None)
    events = run_restarts(
        make, config.restarts, together, control, seed, "update_distance", inference
    )
    return how.told(held(traced_model(knowledge), events) if stepped(config) else events)


def run_ig_updates(observations, knowledges, config, control, seeds):
    """IG on several updates together (``AttackInfo.run_updates``): update u's restarts are
    rows u R .. u R + R - 1 of one signed-Adam run, each matching update u's target with
    update u's own labels (``attacks.updates_loop``)."""
    read = [
        _resolve_labels(o, k, config.labels) for o, k in zip(observations, knowledges, strict=True)
    ]
    fixed = [labels for labels, _ in read]
    restarts = config.restarts
    owners = [u for u in range(len(observations)) for _ in range(restarts)]
    matchers = [
        UpdateMatcher(o, k, config.distance) for o, k in zip(observations, knowledges, strict=True)
    ]
    matcher = UpdatesMatcher(matchers, owners)
    # Every update resolves its labels the same way (the same threat model): all or none fixed.
    stacked_labels = None if fixed[0] is None else torch.stack([fixed[u] for u in owners])

    def make(generators, clock):
        return _Restarts(
            generators, matcher, knowledges[0], config, control.max_steps, stacked_labels
        )

    inferences = [inference for _, inference in read]
    return run_updates(make, restarts, control, seeds, "update_distance", inferences)


register(
    AttackInfo(
        name="ig",
        summary="Inverting Gradients (Geiping et al. 2020): cosine distance + TV, signed Adam, box, restarts.",
        config_type=InvertingGradientsConfig,
        run=run_inverting_gradients,
        run_updates=run_ig_updates,
        why_updates_apart=apart_when_compiled("ig"),
        presets={
            # inversefed's reconstruct_image.py defaults (--optim ours): 24k its, TV 1e-4, 1 restart.
            "paper": {
                "lr": 0.1,
                "tv": 1e-4,
                "restarts": 1,
                "signed": True,
                "boxed": True,
                "distance": "cosine",
            },
            # The ImageNet ResNet-18 notebook of the public code: TV 1e-1, 8 restarts.
            "paper-imagenet": {"lr": 0.1, "tv": 0.1, "restarts": 8, "signed": True, "boxed": True},
        },
        audit=AuditPreset(
            {
                "lr": 0.1,
                "tv": 1e-4,
                "restarts": 4,
                "signed": True,
                "boxed": True,
                "distance": "cosine",
            },
            iterations=300,
            why="the paper's optimiser (signed Adam lr 0.1, step decay, box, TV 1e-4) with the restarts its ImageNet experiments use, raced: 4 starts",
        ),
        paper_iterations=24_000,
    )
)
