"""Attack contract: ``run(observation, knowledge, config, control, seed)`` yields events.

Every attack is a generator of :class:`ProgressEvent`; the last event carries the
:class:`Reconstruction`. Attacks honour a step budget, a wall-clock budget and a
cancellation flag through :class:`RunControl`, and draw all randomness from ``seed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from auditlib.attacks.race import HalvingPlan
from auditlib.config import build_config, config_dict
from auditlib.errors import AuditInputError
from auditlib.reconstruction import Candidate, Reconstruction, Stepped
from auditlib.threat import MATCHES_THROUGH, AttackerKnowledge, KnownDefense, Observation


def _never() -> bool:
    return False


@dataclass
class RunControl:
    """Budgets and cancellation for one attack run (runtime state, not part of the spec)."""

    max_steps: int
    max_seconds: float | None = None
    emit_every: int = 10
    image_every: int = 50
    is_cancelled: Callable[[], bool] = _never
    # Restarts raced by successive halving (the audit preset's schedule; ``attacks.loop``).
    race: HalvingPlan | None = None

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise AuditInputError(f"iterations must be >= 1, got {self.max_steps}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise AuditInputError(f"time budget must be > 0 seconds, got {self.max_seconds}")
        if self.emit_every < 1 or self.image_every < 1:
            raise AuditInputError("event intervals must be >= 1 step")


def optimisers_ready() -> None:
    """Pay torch.optim's one-off cost: a process's first optimiser imports torch._dynamo
    (1.8 to 2.0 s on a 2-core CPU), which a run's first step would otherwise spend of its
    time budget (DLG under 1 s made no step in a fresh process)."""
    import torch._dynamo  # noqa: F401


class Clock:
    """Wall clock of one run; says why the run must stop, if it must."""

    def __init__(self, control: RunControl) -> None:
        optimisers_ready()  # before the clock starts: the budget is the attack's
        self.control = control
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def stop_reason(self) -> str | None:
        if self.control.is_cancelled():
            return "cancelled"
        if self.control.max_seconds is not None and self.elapsed >= self.control.max_seconds:
            return "time budget"
        return None


@dataclass(frozen=True, eq=False)
class ProgressEvent:
    step: int  # optimiser steps so far over all restarts
    total_steps: int  # planned steps over all restarts
    elapsed_s: float
    losses: Mapping[str, float]
    restart: int = 0
    images: torch.Tensor | None = None  # current images of the running restart (CPU)
    labels: torch.Tensor | None = None
    final: Reconstruction | None = None


AttackRun = Callable[
    [Observation, AttackerKnowledge, Any, RunControl, int], Iterator[ProgressEvent]
]


UpdatesRun = Callable[
    [Sequence[Observation], Sequence[AttackerKnowledge], Any, RunControl, Sequence[int]],
    Iterator[tuple[int, ProgressEvent]],
]


@dataclass(frozen=True)
class AuditPreset:
    """The strongest configuration an attack has for an audit's budget (the default).

    ``values`` become the preset named ``audit``; its ``restarts`` race by successive
    halving (``attacks.restarts``). ``iterations`` is the step budget per start the audit
    uses by default; ``why`` says where each departure from the paper's settings comes from.
    """

    values: Mapping[str, Any]
    iterations: int
    why: str


@dataclass(frozen=True)
class AttackInfo:
    name: str
    summary: str
    config_type: type
    run: AttackRun
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    paper_iterations: int | None = None
    audit: AuditPreset | None = None
    # What the attack needs of the scenario, as a reason it does not apply (None: it does).
    not_applicable: Callable[[Observation, AttackerKnowledge], str | None] | None = None
    # What the attack's objective can take of a known defense (``KnownDefense.needs``).
    adapts: frozenset[str] = MATCHES_THROUGH
    # Whether its twin under noise is the posterior-mode one, the noise's likelihood plus the
    # image prior it weighs (``objectives.UpdateMatcher``); False: the likelihood's shape
    # alone as its distance (an attack with no image prior: its maximum-likelihood twin).
    weighs_prior: bool = True
    # A malicious server's attack: it builds the model the server sends (``auditlib.server``)
    # from the global model, its config and a ``BuildContext``; it applies only under the
    # malicious-server threat model. None: an honest-but-curious server's attack.
    builds: Callable[[Any, Any], Any] | None = None
    # A closed-form read-back (one pass, no optimiser steps): its plan is one step.
    closed_form: bool = False
    # A malicious server's own rule for a known defense (``attacks.imprint``), in place of
    # ``adapts``: its twin builds another model for the defense rather than matching through
    # it. ``known -> (why it has no twin, None where it has one; whether its twin would be
    # the plain attack)``. None: ``adapts`` decides.
    server_twin: Callable[[KnownDefense], tuple[str | None, bool]] | None = None
    # Several updates' starts as one batched computation (``attacks.updates_loop``):
    # ``(observations, knowledges, config, control, seeds)`` -> (update, event) pairs, each
    # update ending with its own final event. None: its updates run one after another.
    run_updates: UpdatesRun | None = None
    # Why a config of it runs its updates one after another all the same (None: it doesn't),
    # given the config and whether its starts are raced (each then draws from its own seed).
    why_updates_apart: Callable[[Any, bool], str | None] | None = None
    # Why its updates together gain nothing on a CPU over running them one after another
    # (measured; None: they gain). Where a scheduler can run separate runs side by side on
    # several CPUs (the dashboard's sample), it then does.
    no_cpu_gain: str | None = None
    # An evading or disguised server (built to pass the client's model check): the built
    # servers whose place it takes where the client checks the model it receives. Under a
    # model check each of them is tried beside those servers (``evading_servers``), and the
    # check is said to hold only where every one was refused or recovered nothing.
    stands_in_for: frozenset[str] = frozenset()
    # What its twin (the attacker that knows the defense) sets otherwise than the attack's
    # own settings, and why in words (``engine.twins.with_adaptive``): the twin's
    # objective is not the paper's, and a setting made for the paper's may break down on it.
    twin_params: Mapping[str, Any] = field(default_factory=dict)
    twin_why: str = ""

    def why_not_applicable(
        self, observation: Observation, knowledge: AttackerKnowledge
    ) -> str | None:
        return None if self.not_applicable is None else self.not_applicable(observation, knowledge)

    def why_not_adaptive(self, known: KnownDefense | None) -> str | None:
        """Why this attack has no adaptive twin against ``known`` (None: it has one)."""
        if self.server_twin is not None and known is not None:
            return self.server_twin(known)[0]
        missing = sorted(set() if known is None else known.needs() - self.adapts)
        if not missing:
            return None
        return (
            f"{self.name} cannot match through {known.name}: its objective does not take the "
            f"defense's {' or '.join(ADAPTIVE_PARTS[m] for m in missing)}"
        )

    def twin_adds_nothing(self, known: KnownDefense | None, config: Any) -> bool:
        """Whether knowing ``known`` leaves this attack's objective its plain one: nothing
        to match through, a rescaling of the whole update under the cosine distance (norm
        clipping: the cosine of two updates is that of any positive multiples of them), or a
        noise whose likelihood is the attack's own distance while the attack weighs no image
        prior (then its twin would be the plain attack renamed)."""
        if known is None:
            return True
        if self.server_twin is not None:
            return self.server_twin(known)[1]
        needs = known.needs() & self.adapts
        if not needs:
            return True
        own = getattr(config, "distance", "l2")
        if needs == {"transform"} and known.rescales and own == "cosine":
            return True
        return needs == {"distance"} and not self.weighs_prior and known.distance == own


ADAPTIVE_PARTS = {
    "mask": "visible survivors",
    "transform": "clip or quantiser on the candidate",
    "distance": "noise likelihood",
    "likelihood": "release likelihood (per-coordinate scales, exact parts)",
    "unknowns": "unknown model parameters (fitted jointly)",
    "postprocess": "inversion of its action on the images",
}


ATTACKS: dict[str, AttackInfo] = {}


def register(info: AttackInfo) -> None:
    if info.audit is not None:  # the audit preset is listed first: it is the default
        info = replace(info, presets={"audit": dict(info.audit.values), **info.presets})
    ATTACKS[info.name] = info


def evading_servers(name: str) -> tuple[str, ...]:
    """The registered servers built to pass the client's model check that stand in for the
    server of attack ``name`` (``AttackInfo.stands_in_for``), in registry order."""
    return tuple(n for n, info in ATTACKS.items() if name in info.stands_in_for)


def get_attack(name: str) -> AttackInfo:
    info = ATTACKS.get(name)
    if info is None:
        raise AuditInputError(f"unknown attack {name!r}; available: {', '.join(sorted(ATTACKS))}")
    return info


def build_attack_config(
    name: str, params: Mapping[str, Any] | None = None, preset: str | None = None
):
    """Config of attack ``name``: the preset's values, overridden by ``params``."""
    info = get_attack(name)
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in info.presets:
            raise AuditInputError(
                f"attack {name} has no preset {preset!r}; available: {', '.join(info.presets) or 'none'}"
            )
        values.update(info.presets[preset])
    values.update(params or {})
    config = build_config(info.config_type, values, f"attack {name}")
    return config, config_dict(config)


def snapshot(images: torch.Tensor) -> torch.Tensor:
    return images.detach().to("cpu", copy=True)


def final_event(
    candidates: list[Candidate],
    stop: str,
    steps: int,
    total_steps: int,
    clock: Clock,
    label_inference: Mapping[str, Any] | None,
    loss_name: str,
    stepped: Stepped | None = None,
) -> ProgressEvent:
    """The last event of a run: every restart's candidate and the attacker's pick.

    ``stop`` is how the run ended ("completed", "time budget", "cancelled"); a run whose
    every restart diverged is reported as "diverged". ``stepped``: how its step was
    computed, where the loop knows (else the attack tells it: ``captured.HowStepped``).
    """
    if stop == "completed" and candidates and all(c.stop_reason == "diverged" for c in candidates):
        stop = "diverged"
    final = Reconstruction(tuple(candidates), stop, steps, label_inference, stepped)
    best = final.selected
    return ProgressEvent(
        steps,
        total_steps,
        clock.elapsed,
        {loss_name: best.loss},
        best.restart,
        best.images,
        best.labels,
        final,
    )
