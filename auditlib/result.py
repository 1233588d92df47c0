"""An audit's result as typed values, with one JSON form (result.json, the store).

``AuditSummary`` is what ``engine.audit`` builds and what the store, the pages, the CLI and
the report read: attributes, never string paths. ``AuditSummary.to_json`` writes the shape
result.json has always had, plus ``schema``; ``AuditSummary.from_json`` reads it and every
earlier shape (results stored before the guesses, the verdict, the attack list or the
utility existed read with those parts ``None``; tests/fixtures/results holds real ones).
A result written by a newer schema than this code knows is refused, not misread. An
unscored result (an observed update audited without the client's images) has no scores:
``metrics`` and ``oracle_best`` are ``None`` and ``unscored`` says why (schema 3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from auditlib.errors import AuditInputError
from auditlib.fl.federation import FederationSpec
from auditlib.metrics.scores import Scores
from auditlib.metrics.verdict import Verdict

# 1: every result.json written before this module (no "schema" key); 2: with "schema";
# 3: "metrics" and "oracle_best" may be null, with "unscored" saying why.
SCHEMA_VERSION = 3


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: data[k] for k in cls.__dataclass_fields__ if k in data}


@dataclass(frozen=True)
class RecordedConfig:
    """The run's spec as recorded (``RunSpec.to_dict``) and the settings it resolved to."""

    spec: Mapping[str, Any]
    attack_settings: Mapping[str, Any]  # one attack's settings, or {attack: settings}
    defense_settings: Mapping[str, Any]
    lpips_nets: tuple[str, ...]
    metric_definition: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            **self.spec,
            "attack_settings": dict(self.attack_settings),
            "defense_settings": dict(self.defense_settings),
            "lpips_nets": list(self.lpips_nets),
            "metric_definition": self.metric_definition,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecordedConfig:
        extra = ("attack_settings", "defense_settings", "lpips_nets", "metric_definition")
        return cls(
            spec={k: v for k, v in data.items() if k not in extra},
            attack_settings=data.get("attack_settings") or {},
            defense_settings=data.get("defense_settings") or {},
            lpips_nets=tuple(data.get("lpips_nets") or ()),
            metric_definition=data.get("metric_definition"),
        )


@dataclass(frozen=True)
class ThreatModel:
    observation: str  # "gradient", "weights", ...
    server_knows: tuple[str, ...]


@dataclass(frozen=True)
class VictimData:
    """The private batch as the victim held it (no pixels: names, labels, provenance)."""

    source: str
    names: tuple[str, ...]
    labels: tuple[int, ...]
    label_source: str
    class_names: tuple[str, ...] | None = None
    content_sha256: str | None = None
    normalization: Mapping[str, Any] | None = None
    rdlv_prior: str | None = None


@dataclass(frozen=True)
class VictimRecord:
    data: VictimData
    model: Mapping[str, Any]  # describe_model: architecture, layers, parameter count
    pretraining: Mapping[str, Any] | None = None
    # The update a client sent, where the run audited one: its bundle's location, sha256,
    # what it held and its training.json (``ObservedBundle.describe``).
    observed: Mapping[str, Any] | None = None

    @property
    def num_parameters(self) -> int | None:
        value = self.model.get("num_parameters")
        return None if value is None else int(value)

    def to_json(self) -> dict[str, Any]:
        data = dict(self.data.__dict__)
        for key in ("names", "labels", "class_names"):
            data[key] = None if data[key] is None else list(data[key])
        out: dict[str, Any] = {"data": data, "model": dict(self.model)}
        if self.pretraining is not None:
            out["pretraining"] = dict(self.pretraining)
        if self.observed is not None:
            out["observed"] = dict(self.observed)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VictimRecord:
        raw = dict(data.get("data") or {})
        for key in ("names", "labels", "class_names"):
            if raw.get(key) is not None:
                raw[key] = tuple(raw[key])
        return cls(
            data=VictimData(**_known(VictimData, raw)),
            model=data.get("model") or {},
            pretraining=data.get("pretraining"),
            observed=data.get("observed"),
        )


@dataclass(frozen=True)
class DefenseReport:
    """What the defense reports of itself (its DP accounting where it has one) and the
    update's norm before and after it."""

    epsilon: float | None = None
    epsilon_unavailable_reason: str | None = None
    delta: float | None = None
    noise_multiplier: float | None = None
    accountant: str | None = None  # how epsilon was computed
    unit: str | None = None  # what epsilon protects ("this client's update, per round")
    neighbours: str | None = None  # the neighbouring relation it holds for
    sampling: str | None = None  # amplification by subsampling, or why none
    update_norm_before: float | None = None
    update_norm_after: float | None = None
    details: Mapping[str, Any] = field(default_factory=dict)  # each defense's own facts

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "details"}
        return {**self.details, **data}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DefenseReport:
        typed = _known(cls, data)
        typed.pop("details", None)
        details = {k: v for k, v in data.items() if k not in cls.__dataclass_fields__}
        return cls(**typed, details=details)


@dataclass(frozen=True)
class AttackRecord:
    """One attack the run planned: ran (with its steps and stop reason) or skipped (why)."""

    attack: str
    label: str
    preset: str | None = None
    adaptive: bool = False
    skipped: str | None = None
    seconds: float | None = None
    stop_reason: str | None = None
    steps: int | None = None
    psnr_mean: float | None = None  # with several attacks: each attack's own scores
    ssim_mean: float | None = None
    images_recovered: int | None = None
    level: str | None = None
    # The attack's oracle best (the restart with the highest mean PSNR, chosen with the
    # private images) beside its own pick; None in results recorded before it was kept.
    oracle_psnr_mean: float | None = None
    oracle_ssim_mean: float | None = None
    label_accuracy: float | None = None  # its own pick's labels
    # Under secure aggregation, images recovered and attributed to the client that held
    # them (an attack that attributes: LOKI); None where it does not attribute.
    images_attributed: int | None = None
    # The attacker's own loss of its pick and of each restart's candidate (what it can judge
    # its images by without the private ones); None where not recorded.
    attack_loss: float | None = None
    loss_by_restart: Mapping[str, float] | None = None
    # Ran at the same time as the run's other attacks (on CUDA, ``engine.at_once``): its
    # seconds overlap theirs, and theirs add up to more than the run's.
    at_once: bool = False
    # How its step was computed (``reconstruction.Stepped``: "eager", "compiled" or
    # "recorded as a CUDA graph") and why, where that is not simply what was asked; None
    # where it has no optimisation step, did not run, or was recorded before this was kept.
    step: str | None = None
    step_note: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        for key in ("attack_loss", "loss_by_restart", "step", "step_note"):  # absent: not kept
            if data[key] is None:
                del data[key]
        if not self.at_once:  # written only where it is so: records in turn keep their shape
            del data["at_once"]
        if self.loss_by_restart is not None:
            data["loss_by_restart"] = dict(self.loss_by_restart)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AttackRecord:
        values = _known(cls, data)
        values.setdefault("label", data.get("attack", "?"))
        return cls(**values)


@dataclass(frozen=True)
class UtilityRound:
    """The global model after a round of the utility training (round 0: before training)."""

    round: int
    accuracy: float
    macro_f1: float
    train_loss: float | None = None
    seconds: float = 0.0
    accuracy_without_key: float | None = None
    macro_f1_without_key: float | None = None


@dataclass(frozen=True)
class UtilityRecord:
    """The defense's cost: the model trained with FedAvg under the defense."""

    dataset: str
    train_examples: int
    test_examples: int
    federation: FederationSpec
    starts_from: str
    rounds: tuple[UtilityRound, ...]
    rounds_completed: int
    complete: bool
    stop_reason: str
    budget_s: float | None
    accuracy: float
    macro_f1: float
    accuracy_without_key: float | None
    initial_accuracy: float
    chance_accuracy: float | None
    learned: bool | None
    privacy: Mapping[str, Any]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["federation"] = self.federation.as_dict()
        data["rounds"] = [dict(r.__dict__) for r in self.rounds]
        data["privacy"] = dict(self.privacy)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UtilityRecord:
        values = _known(cls, data)
        values["federation"] = FederationSpec(
            **_known(FederationSpec, data.get("federation") or {})
        )
        values["rounds"] = tuple(UtilityRound(**_known(UtilityRound, r)) for r in data["rounds"])
        values.setdefault("budget_s", None)
        values.setdefault("chance_accuracy", None)
        values.setdefault("learned", None)
        values.setdefault("accuracy_without_key", None)
        values.setdefault("privacy", {})
        values.setdefault("starts_from", "not recorded")
        values.setdefault("complete", True)
        values.setdefault("stop_reason", "completed")
        values.setdefault("rounds_completed", values["rounds"][-1].round)
        values.setdefault("initial_accuracy", values["rounds"][0].accuracy)
        return cls(**values)


@dataclass(frozen=True)
class UtilityUnavailable:
    """Utility was asked for and not measured (the run was cancelled first)."""

    unavailable_reason: str


@dataclass(frozen=True)
class Timing:
    seconds: float
    iterations: int
    planned_iterations: int | None = None
    iterations_per_second: float | None = None
    time_to_first_event_s: float | None = None
    began_unix: float | None = None  # wall clock, for when runs overlapped
    ended_unix: float | None = None


@dataclass(frozen=True)
class ControlRecord:
    """The undefended control a defended run was judged beside (written by the CLI)."""

    spec_id: str
    metrics: Scores
    stop_reason: str
    timing: Timing

    def to_json(self) -> dict[str, Any]:
        return {
            "spec_id": self.spec_id,
            "metrics": self.metrics.to_json(),
            "stop_reason": self.stop_reason,
            "timing": dict(self.timing.__dict__),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ControlRecord:
        return cls(
            spec_id=data["spec_id"],
            metrics=Scores.from_json(data["metrics"]),
            stop_reason=data["stop_reason"],
            timing=Timing(**_known(Timing, data["timing"])),
        )


@dataclass(frozen=True)
class AuditSummary:
    """One audit's result."""

    spec_id: str
    attack: str
    defense: str
    config: RecordedConfig
    threat_model: ThreatModel
    victim: VictimRecord
    defense_report: DefenseReport
    label_inference: Mapping[str, Any]
    # The attacker's selection (the headline numbers) and the oracle best (uses the ground
    # truth: never a real attacker's pick); None both where the run is ``unscored``.
    metrics: Scores | None
    oracle_best: Scores | None
    psnr_by_restart: Mapping[str, float]
    stop_reason: str
    timing: Timing
    versions: Mapping[str, str]
    attacks: tuple[AttackRecord, ...] = ()  # () before attacks were listed
    verdict: Verdict | None = None  # None before verdicts
    utility: UtilityRecord | UtilityUnavailable | None = None
    control: ControlRecord | None = None
    # Why the reconstructions were not scored (no private images to compare with); None:
    # scored.
    unscored: str | None = None
    schema: int = SCHEMA_VERSION

    @property
    def measured_utility(self) -> UtilityRecord | None:
        return self.utility if isinstance(self.utility, UtilityRecord) else None

    def to_json(self) -> dict[str, Any]:
        utility = self.utility
        data: dict[str, Any] = {
            "schema": self.schema,
            "spec_id": self.spec_id,
            "attack": self.attack,
            "defense": self.defense,
            "config": self.config.to_json(),
            "threat_model": {
                "observation": self.threat_model.observation,
                "server_knows": list(self.threat_model.server_knows),
            },
            "victim": self.victim.to_json(),
            "defense_report": self.defense_report.to_json(),
            "label_inference": dict(self.label_inference),
            "metrics": None if self.metrics is None else self.metrics.to_json(),
            "oracle_best": None if self.oracle_best is None else self.oracle_best.to_json(),
            "psnr_by_restart": dict(self.psnr_by_restart),
            "attacks": [a.to_json() for a in self.attacks],
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
            "stop_reason": self.stop_reason,
            "utility": None
            if utility is None
            else (
                {"unavailable_reason": utility.unavailable_reason}
                if isinstance(utility, UtilityUnavailable)
                else utility.to_json()
            ),
            "timing": dict(self.timing.__dict__),
            "versions": dict(self.versions),
        }
        if self.control is not None:
            data["control"] = self.control.to_json()
        if self.unscored is not None:
            data["unscored"] = self.unscored
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AuditSummary:
        if not isinstance(data, Mapping):
            raise AuditInputError(f"a result must be a JSON object, got {type(data).__name__}")
        schema = int(data.get("schema", 1))
        if schema > SCHEMA_VERSION:
            raise AuditInputError(
                f"this result was written with result schema {schema}; this version of auditlib "
                f"reads schemas up to {SCHEMA_VERSION}: upgrade auditlib to open it"
            )
        try:
            return cls._read(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise AuditInputError(f"not an audit result (schema {schema}): {exc!r}") from exc

    @classmethod
    def _read(cls, data: Mapping[str, Any]) -> AuditSummary:
        utility_data = data.get("utility")
        utility: UtilityRecord | UtilityUnavailable | None = None
        if utility_data is not None:
            if "unavailable_reason" in utility_data:
                utility = UtilityUnavailable(utility_data["unavailable_reason"])
            else:
                utility = UtilityRecord.from_json(utility_data)
        threat = data.get("threat_model") or {}
        return cls(
            spec_id=data["spec_id"],
            attack=data["attack"],
            defense=data["defense"],
            config=RecordedConfig.from_json(data.get("config") or {}),
            threat_model=ThreatModel(
                str(threat.get("observation", "not recorded")),
                tuple(threat.get("server_knows") or ()),
            ),
            victim=VictimRecord.from_json(data["victim"]),
            defense_report=DefenseReport.from_json(data.get("defense_report") or {}),
            label_inference=data.get("label_inference") or {},
            metrics=None if data["metrics"] is None else Scores.from_json(data["metrics"]),
            oracle_best=None
            if data["metrics"] is None
            else Scores.from_json(data.get("oracle_best") or data["metrics"]),
            psnr_by_restart=data.get("psnr_by_restart") or {},
            stop_reason=data["stop_reason"],
            timing=Timing(**_known(Timing, data["timing"])),
            versions=data.get("versions") or {},
            attacks=tuple(AttackRecord.from_json(a) for a in data.get("attacks") or ()),
            verdict=None if not data.get("verdict") else Verdict.from_dict(data["verdict"]),
            utility=utility,
            control=None if not data.get("control") else ControlRecord.from_json(data["control"]),
            unscored=data.get("unscored"),
            schema=SCHEMA_VERSION,
        )
