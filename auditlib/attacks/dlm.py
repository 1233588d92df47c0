"""Deep Leakage from Model, DLM and DLM+ (Zhao, Luo, Ding; arXiv 2206.04887, CPAL 2023).

The client runs FedAvg and uploads its new weights W' (or W' - W); the server does not
trust the client's learning rate alpha. Both attacks take the dummy gradient at the global
weights W (one gradient of the dummy batch, as DLG does) and compare it with the observed
descent W - W' = alpha * gradient, which is known only up to alpha:

- DLM (Eq. 3): ||grad(x, y) - gamma * (W - W')||^2, with a tuning factor gamma (ideally
  1 / alpha) optimised jointly with the dummy images and labels by the same optimiser.
- DLM+ (Eq. 8): ||grad / n(grad) - (W - W') / n(W - W')||^2 with n the Frobenius norm
  (Eq. 8) or the mean of the per-layer norms (the public code, our default); alpha cancels.

Defaults are the paper's LeNet settings (Sec. 5): L-BFGS, lr 1, history 100, 200 iterations,
dummy images and label logits drawn from N(0, 1), soft labels softmax(logits). Options and
departures (the factor on the dummy side, unrolled client simulation, known or inferred
labels, TV for batches, Adam) are documented in docs/ALGORITHMS.md.

Why one module over 400 lines: DLM and DLM+ are one paper with one objective; their configs
(fields declared with the paper's defaults and ranges), the objective, the restarts and
the presets read against the paper in one file; the objective is ``dlm_objective.py``,
the starts together ``dlm_starts.py``.
Shared parts: ``lbfgs.py``, ``loop.py``.
"""

from __future__ import annotations

import dataclasses
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
from auditlib.attacks.captured import CAPTURED_LBFGS_HELP, stepping
from auditlib.attacks.compiled import (
    apart_when_compiled,
    held,
    traced_model,
    why_not_compiled,
)
from auditlib.attacks.dlm_objective import ModelLeakageObjective
from auditlib.attacks.dlm_starts import Starts
from auditlib.attacks.labels import infer_batch_labels
from auditlib.attacks.lbfgs import LbfgsSteps
from auditlib.attacks.loop import run_restarts
from auditlib.attacks.objectives import (
    random_images,
    random_label_logits,
    total_variation,
    why_not_together,
)
from auditlib.attacks.updates import UpdatesMatcher
from auditlib.attacks.updates_loop import run_updates
from auditlib.config import check_ranges, param
from auditlib.errors import AttackUnsupportedError
from auditlib.threat import AttackerKnowledge, Observation


@dataclass(frozen=True)
class _ModelLeakageConfig:
    optimizer: Literal["lbfgs", "adam"] = param(
        "lbfgs",
        "optimiser of the dummy images and labels: L-BFGS (the paper's LeNet) or Adam (its MLP)",
    )
    lr: float = param(
        1.0, "step size (paper: 1 with L-BFGS, 0.1 with Adam)", low=0, low_open=True, high=100
    )
    lbfgs_max_iter: int = param(
        20,
        "objective evaluations per L-BFGS step at most (torch's max_iter, its default)",
        low=1,
        high=100,
    )
    history_size: int = param(100, "L-BFGS curvature pairs kept (paper: 100)", low=1, high=1000)
    line_search: Literal["none", "strong_wolfe"] = param(
        "none", "L-BFGS line search: none (a fixed step) or strong Wolfe"
    )
    # "gradient": one dummy gradient at the global weights (paper); "client": unroll the
    # protocol's local steps at the server's nominal learning rate (our option).
    simulate: Literal["gradient", "client"] = param(
        "gradient",
        "dummy side: one gradient at the global weights (paper), or the client's local steps "
        "unrolled at the server's nominal learning rate",
    )
    labels: Literal["auto", "joint", "known", "inferred"] = param(
        "auto",
        "labels: soft labels optimised with the images (joint, as DLG), known to the server, or "
        "inferred from the last layer's update; auto: known if the server knows them, else joint",
    )
    tv: float = param(
        0.0,
        "weight of a total-variation prior on the images (for batches; 0: off, the paper)",
        low=0,
        high=10,
    )
    restarts: int = param(
        1,
        "random starts; the one with the lowest update distance is kept (raced under the "
        "audit preset)",
        low=1,
        high=64,
    )
    # Starts advance together (dlm_starts): on one batched L-BFGS, one history each
    # (lbfgs_batched), or on one Adam over the stacked starts (elementwise: each start's
    # own); False: one after another on torch's own optimiser.
    together: bool = param(
        True,
        "advance the starts together as one batched computation: L-BFGS with one history "
        "each, or Adam (elementwise, so each start's own) (false: one after another on "
        "torch's optimiser; the same algorithm per start)",
    )
    # Each L-BFGS evaluation recorded as a CUDA graph and replayed (attacks.captured,
    # lbfgs.RecordedRows): the same algorithm, on the batched L-BFGS.
    captured: bool | None = param(None, CAPTURED_LBFGS_HELP, identity=False)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class DlmConfig(_ModelLeakageConfig):
    # Initial gamma as a multiple of its ideal value under the server's nominal learning rate
    # eta (1 / eta, or 1 / (eta * K) for K local steps matched by one gradient). The paper
    # sweeps gamma around 1 / alpha = 100 (alpha = 0.01) and finds 120 best for LeNet (Fig. 2a).
    gamma_init_ratio: float = param(
        1.2,
        "initial gamma as a multiple of its ideal value under the server's nominal learning "
        "rate, 1 / (lr x local steps); 1.2 is the paper's best for LeNet (120 at lr 0.01)",
        low=0,
        low_open=True,
        high=1000,
    )
    # "update": ||grad - gamma (W - W')||^2 (paper Eq. 3 and its code); "dummy": the factor on
    # the dummy side, ||grad / gamma - (W - W')||^2, where the factor sits in Eq. 10 (DLG with
    # a tuning factor k) and in the public DLG_k script; it has no trivial zero at gamma = 0.
    gamma_on: Literal["update", "dummy"] = param(
        "update",
        "side gamma multiplies: the observed descent, ||grad - gamma (W - W')||^2 (Eq. 3), or "
        "the dummy gradient, ||grad / gamma - (W - W')||^2 (Eq. 10)",
    )


@dataclass(frozen=True)
class DlmPlusConfig(_ModelLeakageConfig):
    # "layer-mean": the mean of the per-layer norms, as the public code that produced the
    # paper's results computes it; "frobenius": the norm of the whole update, as Eq. 8 is
    # printed. Both are one scalar per update, so alpha cancels either way. With L-BFGS at a
    # fixed step the Frobenius form (bounded by 4) stalls more often (docs/ALGORITHMS.md).
    norm: Literal["frobenius", "layer-mean"] = param(
        "layer-mean",
        "the scalar each update is divided by: the mean of its per-layer norms (the public "
        "code) or the norm of the whole update (Eq. 8)",
    )


# --- The objective -------------------------------------------------------------------------


def _resolve_labels(
    observation: Observation, knowledge: AttackerKnowledge, strategy: str
) -> tuple[torch.Tensor | None, dict]:
    if strategy == "auto":
        strategy = "known" if knowledge.labels is not None else "joint"
    if strategy == "known":
        if knowledge.labels is None:
            raise AttackUnsupportedError(
                "labels=known needs a scenario in which the server knows the labels (--labels-known)"
            )
        return knowledge.labels.clone(), {"rule": "known to the server (threat model)"}
    if strategy == "inferred":
        # The rules compare or share out last-layer scores, so the unknown positive scale
        # of the learning rate (which gradient_estimate divides by) does not change them.
        return infer_batch_labels(observation, knowledge)
    return None, {"rule": "joint optimisation of soft labels (argmax), as DLG"}


# --- The attack ----------------------------------------------------------------------------


@dataclass
class _Restart:
    images: torch.Tensor
    logits: torch.Tensor | None
    gamma: torch.Tensor | None  # DLM's tuning factor, optimised with the images
    fixed_labels: torch.Tensor | None

    @property
    def variables(self) -> list[torch.Tensor]:
        return [v for v in (self.images, self.logits, self.gamma) if v is not None]

    def soft_labels(self) -> torch.Tensor:
        if self.logits is None:
            return self.fixed_labels
        return torch.softmax(self.logits, dim=-1)

    def hard_labels(self) -> torch.Tensor:
        if self.logits is None:
            return self.fixed_labels.cpu()
        return self.logits.detach().argmax(dim=-1).cpu()


def run_dlm(observation, knowledge, config: DlmConfig, control: RunControl, seed: int):
    return run_model_leakage(observation, knowledge, config, control, seed)


def run_dlm_plus(observation, knowledge, config: DlmPlusConfig, control: RunControl, seed: int):
    return run_model_leakage(observation, knowledge, config, control, seed)


def run_model_leakage(
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: DlmConfig | DlmPlusConfig,
    control: RunControl,
    seed: int,
) -> Iterator[ProgressEvent]:
    """DLM when ``config`` is a DlmConfig, DLM+ when it is a DlmPlusConfig."""
    # Validation happens here, before the generator starts, so errors surface at the call.
    objective = ModelLeakageObjective(observation, knowledge, config)
    attack = "dlm+" if objective.plus else "dlm"
    config, how = stepping(attack, config, knowledge, _why_not_recorded(knowledge, config))
    fixed_labels, inference = _resolve_labels(observation, knowledge, config.labels)
    if fixed_labels is not None:
        fixed_labels = fixed_labels.to(knowledge.device)
    return how.told(_run(objective, knowledge, config, control, seed, fixed_labels, inference, how))


def _run(objective, knowledge, config, control, seed, fixed_labels, inference, how):
    gamma0 = None if objective.plus else config.gamma_init_ratio * objective.nominal_gamma()
    record = dict(inference)
    gammas: dict[int, float] = {}
    if gamma0 is not None:
        record["gamma_init"] = gamma0
        # gamma / nominal gamma ~ nominal lr / client lr: the client's lr as the attack sees it.
        record["gamma_ratio_by_restart"] = gammas  # filled in as restarts finish

    # A captured evaluation is the batched L-BFGS's: the starts (one too) advance together.
    together = config.captured or (
        config.together and config.restarts > 1 and why_not_together(knowledge) is None
    )
    # Apart: one per restart, made in restart order; together: one, a row per restart. Adam's
    # starts are always rows of ``Starts`` (one row each apart: the same Adam as alone, and
    # no read back in a step); a lone L-BFGS start runs on torch's own L-BFGS.
    made: list[_Restarts | Starts] = []
    rows = together or config.optimizer == "adam"

    def make(generators, clock):
        args = (generators, objective, knowledge, config, fixed_labels, gamma0, clock)
        made.append(Starts(*args, objective.nominal_gamma()) if rows else _Restarts(*args))
        if rows and made[-1].recorded is not None:
            how.made(made[-1].recorded.gradient)
        return made[-1]

    def ratio(restart: int) -> float | None:
        return made[0].gamma_ratio[restart] if together else made[restart].gamma_ratio[0]

    events = run_restarts(make, config.restarts, together, control, seed, "update_distance", record)
    if config.captured:
        events = held(traced_model(knowledge), events)
    for event in events:
        if event.final is not None and gamma0 is not None:
            gammas.update({c.restart: ratio(c.restart) for c in event.final.candidates})
            event = dataclasses.replace(
                event, losses={**event.losses, "gamma_ratio": gammas[event.restart]}
            )
        yield event


class _Restarts:
    """One DLM/DLM+ restart on torch's own L-BFGS: images (and soft labels, and DLM's gamma)."""

    def __init__(self, generators, objective, knowledge, config, fixed_labels, gamma0, clock):
        (generator,) = generators
        device = knowledge.device
        self.objective = objective
        self.config = config
        self.state = _Restart(
            random_images(knowledge, generator).requires_grad_(True),
            None
            if fixed_labels is not None
            else random_label_logits(knowledge, generator).requires_grad_(True),
            None
            if gamma0 is None
            else torch.tensor(gamma0, dtype=torch.float32, device=device).requires_grad_(),
            fixed_labels,
        )
        self.lbfgs = LbfgsSteps.of(
            self.state.variables, lambda: self.loss_terms()[0], clock, config
        )
        self.gamma_ratio: dict[int, float] = {}  # gamma / nominal gamma at the candidate

    def loss_terms(self) -> tuple[torch.Tensor, torch.Tensor]:
        state = self.state
        distance = self.objective(state.images, state.soft_labels(), state.gamma)
        if self.config.tv > 0:
            return distance + self.config.tv * total_variation(state.images), distance
        return distance, distance

    def step(self, alive):
        losses = {"objective": self.lbfgs.step(), "evaluations": self.lbfgs.evaluations}
        gamma = self.state.gamma
        if gamma is not None:
            losses["gamma"] = float(gamma.detach())
            # ~ nominal lr / client lr once converged: 1 when the server's lr is the client's.
            losses["gamma_ratio"] = float(gamma.detach()) / self.objective.nominal_gamma()
        return {k: torch.tensor([float(v)]) for k, v in losses.items()}

    def frame(self, position):
        return snapshot(self.state.images), self.state.hard_labels()

    def candidate(self, position):
        self.lbfgs.restore()
        # Restarts are scored by the attack's own distance (the TV prior is not part of it).
        with torch.enable_grad():
            score = float(self.loss_terms()[1].detach())
        if self.state.gamma is not None:
            self.gamma_ratio[position] = (
                float(self.state.gamma.detach()) / self.objective.nominal_gamma()
            )
        return snapshot(self.state.images), self.state.hard_labels(), score


def _why_not_recorded(knowledge: AttackerKnowledge, config) -> str | None:
    """What keeps DLM's evaluations from being recorded (None: nothing)."""
    if config.optimizer != "lbfgs":
        return "its evaluations are recorded on L-BFGS; with Adam its step runs eagerly"
    return why_not_compiled(knowledge)


def run_model_leakage_updates(observations, knowledges, config, control, seeds):
    """DLM or DLM+ on several updates together (``AttackInfo.run_updates``): update u's
    starts are rows u R .. u R + R - 1 of one batched L-BFGS or Adam (``dlm_starts``), each
    matching update u's observed descent with update u's own labels
    (``attacks.updates_loop``)."""
    pairs = list(zip(observations, knowledges, strict=True))
    objectives = [ModelLeakageObjective(o, k, config) for o, k in pairs]
    resolved = [_resolve_labels(o, k, config.labels) for o, k in pairs]
    restarts = config.restarts
    owners = [u for u in range(len(pairs)) for _ in range(restarts)]
    device = knowledges[0].device
    # Every update resolves its labels the same way (the same threat model): all or none.
    fixed = (
        None if resolved[0][0] is None else torch.stack([resolved[u][0] for u in owners]).to(device)
    )
    nominal = objectives[0].nominal_gamma()  # the protocol's, the same for every update
    gamma0 = None if objectives[0].plus else config.gamma_init_ratio * nominal
    records, gammas = [], [{} for _ in pairs]
    for u, (_, inference) in enumerate(resolved):
        records.append(dict(inference))
        if gamma0 is not None:
            records[u]["gamma_init"] = gamma0
            records[u]["gamma_ratio_by_restart"] = gammas[u]  # filled in as restarts finish
    made: list[Starts] = []
    many = UpdatesMatcher(objectives, owners)

    def make(generators, clock):
        made.append(Starts(generators, many, knowledges[0], config, fixed, gamma0, clock, nominal))
        return made[-1]

    for u, event in run_updates(make, restarts, control, seeds, "update_distance", records):
        if event.final is not None and gamma0 is not None:
            ratios = made[0].gamma_ratio
            gammas[u].update(
                {c.restart: ratios[u * restarts + c.restart] for c in event.final.candidates}
            )
            event = dataclasses.replace(
                event, losses={**event.losses, "gamma_ratio": gammas[u][event.restart]}
            )
        yield u, event


def _fedavg_only(observation: Observation, knowledge: AttackerKnowledge) -> str | None:
    if observation.kind == "gradient":
        return "DLM attacks the weights of FedAvg; on a FedSGD gradient it is DLG"
    return None


_LENET = {"optimizer": "lbfgs", "lr": 1.0, "lbfgs_max_iter": 20, "history_size": 100}
# The paper's three-layer MLP: Adam, lr 0.1, 4000 iterations (Sec. 5, "Setup").
_MLP = {"optimizer": "adam", "lr": 0.1}

register(
    AttackInfo(
        name="dlm",
        summary="DLM (Zhao et al. 2022): matches the dummy gradient to gamma * (W - W'), "
        "gamma learned with the images (unknown client learning rate).",
        config_type=DlmConfig,
        run=run_dlm,
        run_updates=run_model_leakage_updates,
        why_updates_apart=apart_when_compiled("dlm"),
        presets={
            "paper": {**_LENET, "gamma_init_ratio": 1.2},
            "paper-mlp": {**_MLP, "gamma_init_ratio": 0.6},
            # The public script's DLM(k_init=200) with the client's lr 0.01.
            "public-code": {**_LENET, "gamma_init_ratio": 2.0},
            # Ours, not the paper's: Eq. 3 with the paper's optimiser collapses to gamma = 0
            # at 32x32 (docs/ALGORITHMS.md); the factor on the dummy side converges, and the
            # line search keeps the fixed step from throwing gamma away (3 of 9 runs without).
            "stable": {
                **_LENET,
                "gamma_init_ratio": 1.2,
                "gamma_on": "dummy",
                "line_search": "strong_wolfe",
            },
        },
        audit=AuditPreset(
            {
                **_LENET,
                "gamma_init_ratio": 1.2,
                "gamma_on": "dummy",
                "line_search": "strong_wolfe",
                "restarts": 4,
            },
            iterations=200,
            why="the stable variant (the factor on the dummy side, strong-Wolfe line search), which converges where the paper's Eq. 3 collapses to gamma = 0, with 4 raced starts",
        ),
        paper_iterations=200,
        not_applicable=_fedavg_only,
        adapts=frozenset({"mask", "distance", "postprocess"}),
        weighs_prior=False,  # no image prior: the noise's likelihood as its distance
    )
)

register(
    AttackInfo(
        name="dlm+",
        summary="DLM+ (Zhao et al. 2022): matches the normalised dummy gradient to the "
        "normalised W - W', so the client's learning rate cancels.",
        config_type=DlmPlusConfig,
        run=run_dlm_plus,
        run_updates=run_model_leakage_updates,
        why_updates_apart=apart_when_compiled("dlm+"),
        presets={
            # The norm of the public code that produced the paper's tables (see the config).
            "paper": {**_LENET, "norm": "layer-mean"},
            "paper-mlp": {**_MLP, "norm": "layer-mean"},
            # Appendix A.4 adds beta * TV for batches; beta is not given, 1e-4 is IG's value.
            "paper-batch": {**_LENET, "norm": "layer-mean", "tv": 1e-4},
            # Eq. 8 as printed: the Frobenius norm of the whole update.
            "paper-eq8": {**_LENET, "norm": "frobenius"},
        },
        audit=AuditPreset(
            {**_LENET, "norm": "layer-mean", "restarts": 4},
            iterations=200,
            why="the paper's settings (the public code's layer-mean norm, L-BFGS) with 4 raced starts",
        ),
        paper_iterations=200,
        not_applicable=_fedavg_only,
        adapts=frozenset({"mask", "distance", "postprocess"}),
        weighs_prior=False,  # no image prior: the noise's likelihood as its distance
    )
)
