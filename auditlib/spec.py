"""A run, described by one frozen, serialisable spec (its resolved identity is
``engine.identity.run_identity``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from auditlib.client.protocol import LATER_FIELDS, ClientProtocol
from auditlib.config import require, require_choice
from auditlib.errors import AuditInputError
from auditlib.fl.federation import FederationSpec
from auditlib.models import ModelSpec


@dataclass(frozen=True)
class ModelRef:
    """A built-in architecture, optionally with uploaded weights or a trusted archive."""

    spec: ModelSpec
    weights: str | None = None  # safetensors / weights-only state_dict file
    trusted_archive: str | None = None  # TorchScript / torch.export, user marked it trusted
    weights_asset: str | None = None  # sha256 of uploaded weights handed to the worker as bytes
    content_sha256: str | None = None  # of the weights, archive or own class's file: identity
    # sha256 of the uploaded file of a model class of the user's own code (the dashboard,
    # where an admin allows trusted code), handed to the worker as bytes
    code_asset: str | None = None

    def __post_init__(self) -> None:
        require(
            self.code_asset is None or self.spec.info.source == "own code",
            "an uploaded model file is only for a model class of your own code "
            "(path/to/file.py:ClassName)",
        )


MAX_BATCH = 64  # images one audit reconstructs at most


@dataclass(frozen=True)
class DataSpec:
    """The private images. Source "none": there are none (only for an observed update,
    ``ScenarioSpec.observed``: its reconstructions are then shown, not scored)."""

    source: Literal["folder", "samples", "asset", "none"]
    location: str  # a folder path, a bundled sample-set name, or the sha256 of an uploaded zip
    batch_size: int | None = None  # None: every image in the folder
    offset: int = 0
    labels_csv: str | None = None
    normalization: str = "none"  # "none" or "MEAN/STD", see Normalization.parse
    content_sha256: str | None = None  # of the images actually used

    def __post_init__(self) -> None:
        require(
            self.batch_size is None or 1 <= self.batch_size <= MAX_BATCH,
            f"batch size must be between 1 and {MAX_BATCH}, got {self.batch_size}",
        )
        require(self.offset >= 0, f"offset must be >= 0, got {self.offset}")
        require(
            self.source != "none" or self.batch_size is None,
            "no private images (source none) take no batch size",
        )

    @property
    def has_images(self) -> bool:
        return self.source != "none"


NO_IMAGES = DataSpec("none", "")


OBSERVED_SOURCES = ("folder", "asset")


@dataclass(frozen=True)
class ObservedRef:
    """An update a client actually sent, audited in place of the simulated client: its
    bundle (``auditlib.observed``: the global weights, the client's weights or their
    difference, and training.json), a folder (``source`` "folder", ``location`` its path) or
    an upload stored as an asset (``source`` "asset", ``location`` the asset's sha256), and
    the sha256 of its files, which stands for either in the run's identity."""

    location: str
    content_sha256: str | None = None
    source: Literal["folder", "asset"] = "folder"

    def __post_init__(self) -> None:
        require_choice(self.source, OBSERVED_SOURCES, "observed bundle source")


SERVERS = ("honest", "malicious")
MAX_CLIENTS = 64


@dataclass(frozen=True)
class ScenarioSpec:
    protocol: ClientProtocol = field(default_factory=ClientProtocol)
    labels_known: bool = False  # threat model: the server learns the labels
    pretrain_rounds: int = 0  # attack stage: FedAvg rounds the global model trained before
    pretrain_data: str = "fashion-mnist"
    # Threat model: the attacker knows the defense's mechanism and public parameters and
    # runs an adaptive variant beside the plain attack. None: yes, except for the paper
    # preset (a reproduction faces the paper's own attacker).
    attacker_knows_defense: bool | None = None
    # Threat model: the honest-but-curious server observes the update of the model it
    # trained; the malicious one also changes the model it sends (the attacks that build it,
    # ``AttackInfo.builds``, apply only then).
    server: Literal["honest", "malicious"] = "honest"
    # Secure aggregation: the server sees only the example-weighted sum of this many clients'
    # updates, the audited images split over them in order; None: one client's update.
    secure_aggregation: int | None = None
    # An update a client sent (a bundle), audited instead of simulating the client: the
    # model's weights, the protocol and the number of examples are the bundle's.
    observed: ObservedRef | None = None

    def __post_init__(self) -> None:
        require(
            0 <= self.pretrain_rounds <= 1000,
            f"pretrain rounds must be in [0, 1000], got {self.pretrain_rounds}",
        )
        require_choice(self.server, SERVERS, "threat model (server)")
        require(
            self.secure_aggregation is None or 2 <= self.secure_aggregation <= MAX_CLIENTS,
            f"secure aggregation sums the updates of 2 to {MAX_CLIENTS} clients, got "
            f"{self.secure_aggregation}: with one client the sum is that client's update "
            "(leave secure aggregation off)",
        )
        if self.observed is not None:
            for clash, what in (
                (self.server != "honest", "a malicious server (it sends a model of its own)"),
                (self.secure_aggregation is not None, "secure aggregation"),
                (self.pretrain_rounds > 0, "pretraining (the global weights are the bundle's)"),
            ):
                require(
                    not clash,
                    f"an observed update is audited as the honest server received it; {what} "
                    "does not apply to it",
                )

    @property
    def clients(self) -> int:
        return self.secure_aggregation or 1


def check_clients(clients: int, batch_size: int) -> None:
    """Secure aggregation splits the audited images over the clients in order: each client
    needs at least one (the engine's ``releases.client_batches`` splits them)."""
    require(
        clients <= batch_size,
        f"secure aggregation over {clients} clients needs at least one image per client; "
        f"the batch has {batch_size}",
    )


@dataclass(frozen=True)
class ComponentSpec:
    """An attack or defense by registry name, with its parameters and optional preset."""

    name: str
    params: tuple[tuple[str, str], ...] = ()
    preset: str | None = None

    @classmethod
    def of(
        cls, name: str, params: dict[str, Any] | None = None, preset: str | None = None
    ) -> ComponentSpec:
        return cls(name, tuple(sorted((k, str(v)) for k, v in (params or {}).items())), preset)

    def params_dict(self) -> dict[str, str]:
        return dict(self.params)


# The longest time budget any run may ask for (a day), wherever it runs; a shared
# dashboard sets a lower one per run (``engine.fair_share``, AUDIT_MAX_RUN_SECONDS).
MAX_TIME_BUDGET_S = 86_400


@dataclass(frozen=True)
class Budget:
    iterations: int
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        require(
            1 <= self.iterations <= 1_000_000,
            f"iterations must be in [1, 1000000], got {self.iterations}",
        )
        if self.max_seconds is not None:
            require(
                0 < self.max_seconds <= MAX_TIME_BUDGET_S,
                f"time budget must be > 0 s and at most {MAX_TIME_BUDGET_S:,} s (a day), got "
                f"{self.max_seconds:g} s",
            )


UTILITY_DATASETS = ("fashion-mnist", "digits")


@dataclass(frozen=True)
class UtilitySpec:
    """The defense's cost: FedAvg training of the audited model under the same defense.

    Small by default (3 clients, 5 rounds of 2 local epochs, 3000 training examples: the
    defense benchmark's setting, about 7.5 s for LeNet on one CPU thread) so that every point
    of a comparison or sweep gets its utility quickly; the CLI's ``utility`` command runs
    longer trainings. Undefended, it takes the default LeNet from chance level (11.7 %) to
    72 % on 10-class Fashion-MNIST (71 % with 100 classes; ReLU LeNet 77 %, MLP 75 %), from
    the initialisation ``measure_utility`` picks for the activation.

    ``seconds`` bounds the training, as ``Budget.max_seconds`` bounds the attack: a defense
    whose client step is costly (Soteria's per-feature Jacobian) would otherwise hold its run
    for many minutes after the attack ended. Checked before every client's local training; the
    rounds done by then are the result, marked incomplete.
    """

    dataset: str = "fashion-mnist"
    train: int = 3000
    test: int = 1000
    federation: FederationSpec = field(
        default_factory=lambda: FederationSpec(clients=3, rounds=5, local_epochs=2, local_lr=0.05)
    )
    seconds: float = 300.0

    def __post_init__(self) -> None:
        require_choice(self.dataset, UTILITY_DATASETS, "utility dataset")
        require(
            10 <= self.train <= 60_000,
            f"utility training examples must be in [10, 60000], got {self.train}",
        )
        require(
            10 <= self.test <= 10_000,
            f"utility test examples must be in [10, 10000], got {self.test}",
        )
        require(
            1 <= self.seconds <= 86_400,
            f"the utility training's time budget must be in [1, 86400] seconds, got {self.seconds}",
        )
        require(
            self.dataset != "digits" or self.train + self.test <= 1797,
            f"the digits set has 1797 images; {self.train} training and {self.test} test "
            "examples need more",
        )


@dataclass(frozen=True)
class RunSpec:
    model: ModelRef
    data: DataSpec
    scenario: ScenarioSpec
    attack: ComponentSpec
    defense: ComponentSpec
    budget: Budget
    seed: int = 0
    device: str = "cpu"
    utility: UtilitySpec | None = None  # also measure the defense's cost in accuracy

    def __post_init__(self) -> None:
        if self.data.batch_size is not None:  # None: every image of the source, known later
            check_clients(self.scenario.clients, self.data.batch_size)
        observed = self.scenario.observed is not None
        require(
            observed or self.data.has_images,
            "a simulated client needs private images; only an observed update is audited "
            "without them",
        )
        if observed:
            require(
                self.defense.name == "none",
                f"an observed update is what the client sent; the defense {self.defense.name} "
                "cannot be applied to it afterwards (audit it with defense none)",
            )
            require(
                self.model.weights is None
                and self.model.trusted_archive is None
                and self.model.weights_asset is None,
                "an observed update's model is the bundle's global.safetensors; give no other "
                "weights",
            )
            require(
                self.utility is None,
                "an observed update has no defense whose cost a utility training would measure",
            )
            require(
                self.data.has_images or not self.scenario.labels_known,
                "the server knows the labels only with the private images that hold them",
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def control(self) -> RunSpec | None:
        """The positive control of a defended run: the same model, images, scenario, attack,
        budget and utility training without the defense (None for an undefended run)."""
        if self.defense.name == "none":
            return None
        return replace(self, defense=ComponentSpec("none"))

    def payload(self) -> dict[str, Any]:
        """The spec as the JSON an identity hashes: everything that determines the result.

        Paths are left out where a content hash stands for them; the device is kept, since
        CUDA kernels are not bit-identical to CPU ones.
        """
        payload = self.to_dict()
        if payload["utility"] is None:  # runs recorded before utility existed keep their id
            del payload["utility"]
        scenario = payload["scenario"]  # runs recorded before the malicious server keep theirs
        if scenario["server"] == "honest":
            del scenario["server"]
        if scenario["secure_aggregation"] is None:
            del scenario["secure_aggregation"]
        if scenario["observed"] is None:  # and before observed updates
            del scenario["observed"]
        else:
            # The files' sha256 stands for the folder or the stored upload alike: one bundle,
            # one run, however it was brought in (and ids from before uploads stay).
            if scenario["observed"]["source"] == "folder" or scenario["observed"]["content_sha256"]:
                del scenario["observed"]["source"]
            if scenario["observed"]["content_sha256"]:
                scenario["observed"]["location"] = None
        protocol = scenario["protocol"]  # and before the local optimiser and shuffling
        for name, default in LATER_FIELDS.items():
            if protocol[name] == default:
                del protocol[name]
        if payload["model"]["spec"].get("model_args") is None:  # and before own classes
            payload["model"]["spec"].pop("model_args", None)
        if payload["model"]["code_asset"] is None:  # and before uploaded class files
            del payload["model"]["code_asset"]
        if self.model.content_sha256:
            payload["model"]["weights"] = payload["model"]["trusted_archive"] = None
        if self.data.content_sha256:
            payload["data"]["location"] = payload["data"]["labels_csv"] = None
        return payload

    def identity(self) -> str:
        """The *legacy* (raw) id: sha256 of :meth:`payload` with the attack's and defense's
        parameters as written (``lr=1`` and ``lr=1.0`` differ).

        Runs are stored under ``engine.identity.run_identity`` (the resolved configuration);
        this id is how runs recorded before it are still found (``engine.identity``).
        """
        text = json.dumps(self.payload(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _fields(cls: type, data: Any, what: str) -> dict[str, Any]:
    """``data`` as keyword arguments of ``cls``; anything but a mapping of its fields is refused."""
    if not isinstance(data, dict):
        raise AuditInputError(f"{what} must be a JSON object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise AuditInputError(f"{what} has unknown fields {', '.join(unknown)}")
    return dict(data)


def _component(data: Any, what: str) -> ComponentSpec:
    values = _fields(ComponentSpec, data, what)
    values["params"] = tuple((str(k), str(v)) for k, v in values.get("params", ()))
    return ComponentSpec(**values)


def run_spec_from_dict(data: Any) -> RunSpec:
    """The inverse of :meth:`RunSpec.to_dict` (a stored run's spec back into a spec)."""
    values = _fields(RunSpec, data, "run spec")
    model = _fields(ModelRef, values["model"], "model")
    model["spec"] = ModelSpec.from_dict(model["spec"])
    scenario = _fields(ScenarioSpec, values["scenario"], "scenario")
    scenario["protocol"] = ClientProtocol(
        **_fields(ClientProtocol, scenario["protocol"], "protocol")
    )
    if scenario.get("observed") is not None:
        scenario["observed"] = ObservedRef(**_fields(ObservedRef, scenario["observed"], "observed"))
    utility = values.get("utility")
    if utility is not None:
        utility = _fields(UtilitySpec, utility, "utility")
        utility["federation"] = FederationSpec(
            **_fields(FederationSpec, utility["federation"], "federation")
        )
        utility = UtilitySpec(**utility)
    return RunSpec(
        model=ModelRef(**model),
        data=DataSpec(**_fields(DataSpec, values["data"], "data")),
        scenario=ScenarioSpec(**scenario),
        attack=_component(values["attack"], "attack"),
        defense=_component(values["defense"], "defense"),
        budget=Budget(**_fields(Budget, values["budget"], "budget")),
        seed=int(values.get("seed", 0)),
        device=str(values.get("device", "cpu")),
        utility=utility,
    )
