"""The Attack lab's choices (scenario, attack, defense, budget) and the ``RunSpec`` they
make with the setup; the library's objections to them.

Every check is the library's (``auditlib.spec``, ``auditlib.client.protocol``, the attack and
defense registries): this module only assembles the spec.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from auditlib.client.protocol import Algorithm, ClientProtocol, Shared
from auditlib.defenses import build_defense
from auditlib.engine.attack_phase import plan_attacks
from auditlib.errors import AuditInputError
from auditlib.spec import (
    Budget,
    ComponentSpec,
    DataSpec,
    ModelRef,
    ObservedRef,
    RunSpec,
    ScenarioSpec,
    check_clients,
)
from auditlib.store.convert import assets_in_spec
from auditlib.words import count_of
from dashboard.resources import get_store
from dashboard.setup_state import Setup, batch_of, own_class_model
from dashboard.spec_words import attack_label, threat_words


@dataclasses.dataclass
class LabChoices:
    """The Attack lab's choices: scenario, attack, defense and budget."""

    algorithm: Algorithm = "fedsgd"
    local_steps: int = 1
    local_lr: float = 0.01
    local_batch_size: int | None = None
    share: Shared = "delta"
    labels_known: bool = False
    attacker_knows_defense: bool = True
    server: str = "honest"  # the threat model: "honest" (observes) or "malicious"
    secure_aggregation: int | None = None  # clients whose updates the server sees summed
    attack: str = "dlg"
    preset: str | None = None
    attack_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    iterations: int = 100
    defense: str = "none"
    defense_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    time_budget: float | None = 120.0
    device: str = "cpu"

    def protocol(self) -> ClientProtocol:
        return ClientProtocol(
            algorithm=self.algorithm,
            local_steps=self.local_steps,
            local_lr=self.local_lr,
            local_batch_size=self.local_batch_size,
            shared=self.share,
        )

    def scenario(self) -> ScenarioSpec:
        return ScenarioSpec(
            protocol=self.protocol(),
            labels_known=self.labels_known,
            attacker_knows_defense=self.attacker_knows_defense,
            server=self.server,  # type: ignore[arg-type]  # checked by ScenarioSpec
            secure_aggregation=self.secure_aggregation,
        )


def build_run(setup: Setup, lab: LabChoices) -> tuple[RunSpec, dict[str, bytes], str]:
    """The run's spec, the uploaded assets it needs (sha256 -> bytes) and a title.

    Every check is the library's, so a bad value raises ``AuditInputError``.
    """
    store = get_store()
    assets: dict[str, bytes] = {}
    if setup.weights:
        asset = store.get_asset(setup.weights)
        if asset is None:
            raise AuditInputError("the uploaded weights are gone from the store; upload them again")
        assets[asset.sha256] = asset.data
    model = ModelRef(
        spec=setup.model_spec(), weights_asset=setup.weights, content_sha256=setup.weights
    )
    if setup.own_class:  # built from its uploaded file, whose sha256 is in the identity
        model = own_class_model(model, setup, assets)
    if setup.source == "samples":
        data = DataSpec(source="samples", location=setup.sample_set, batch_size=setup.count)
        images_text = f"{count_of(setup.count, 'image')} from '{setup.sample_set}'"
    elif setup.source == "none":
        data, images_text = DataSpec("none", ""), "no private images"
    else:
        if not setup.images:
            raise AuditInputError("no images uploaded yet; upload images or pick a sample set")
        asset = store.get_asset(setup.images)
        if asset is None:
            raise AuditInputError("the uploaded images are gone from the store; upload them again")
        assets[asset.sha256] = asset.data
        data = DataSpec(source="asset", location=asset.sha256, batch_size=setup.upload_count)
        count = setup.upload_count or asset.meta.get("count", "?")
        images_text = (
            count_of(count, "uploaded image") if isinstance(count, int) else "uploaded images"
        )
    data = dataclasses.replace(data, normalization=setup.normalization)
    scenario = lab.scenario()
    if setup.observed:
        scenario, update_text = _observed_scenario(setup, scenario, assets)
        images_text = f"{update_text}, {images_text}"
    spec = RunSpec(
        model=model,
        data=data,
        scenario=scenario,
        attack=ComponentSpec.of(lab.attack, lab.attack_params, lab.preset),
        defense=ComponentSpec.of(lab.defense, lab.defense_params),
        budget=Budget(iterations=lab.iterations, max_seconds=lab.time_budget),
        seed=setup.seed,
        device=lab.device,
    )
    threat = threat_words(lab.server, lab.secure_aggregation)
    title = (
        f"{attack_label(lab.attack)} vs {lab.defense}"
        + (f" · {threat}" if threat else "")
        + f" · {setup.architecture} · {images_text}"
    )
    return spec, assets, title


def _observed_scenario(
    setup: Setup, scenario: ScenarioSpec, assets: dict[str, bytes]
) -> tuple[ScenarioSpec, str]:
    """The lab's scenario on the uploaded bundle: its protocol, the bundle as the update
    (added to ``assets``), and the run's title words."""
    if setup.bundle is None or not setup.observed:
        raise AuditInputError(
            "the observed update is gone from the store; upload it again on the Setup page"
        )
    asset = get_store().get_asset(setup.observed)
    if asset is None:
        raise AuditInputError(
            "the observed update is gone from the store; upload it again on the Setup page"
        )
    assets[asset.sha256] = asset.data
    observed = ObservedRef(asset.sha256, setup.bundle.content_sha256, source="asset")
    scenario = dataclasses.replace(scenario, protocol=setup.bundle.protocol, observed=observed)
    return scenario, f"observed update {setup.bundle.content_sha256[:12]}"


def run_assets(spec: RunSpec) -> dict[str, bytes]:
    """The uploads a stored run spec needs (sha256 -> bytes), read back from the store.

    Raises AuditInputError when one is gone (a resumed batch cannot run without it).
    """
    store = get_store()
    assets = {}
    for sha in sorted(assets_in_spec(spec.to_dict())):
        asset = store.get_asset(sha)
        if asset is None:
            raise AuditInputError(
                f"the upload {sha[:12]}... is gone from the store; upload it again"
            )
        assets[sha] = asset.data
    return assets


def check_components(lab: LabChoices) -> list[str]:
    """The library's objections to the attack and defense parameters and the scenario (the
    protocol and the threat model: an attack of the malicious server under the honest one)."""
    errors = []
    try:
        lab.scenario()
    except AuditInputError as exc:
        errors.append(f"Scenario: {exc}")
    try:
        plan_attacks(
            ComponentSpec.of(lab.attack, lab.attack_params, lab.preset),
            lab.iterations,
            server=lab.server,
        )
    except AuditInputError as exc:
        errors.append(f"Attack: {exc}")
    try:
        build_defense(lab.defense, lab.defense_params)
    except AuditInputError as exc:
        errors.append(f"Defense: {exc}")
    return errors


def batch_size(setup: Setup) -> int | None:
    """How many images the run audits; None where the setup has no batch yet (or the library
    refuses it: ``setup_problems`` says why)."""
    try:
        images = batch_of(setup)
    except AuditInputError:
        return None
    return None if images is None else len(images)


def check_clients_fit(setup: Setup, lab: LabChoices) -> list[str]:
    """The library's objection to secure aggregation over more clients than images."""
    size = batch_size(setup)
    if lab.secure_aggregation is None or size is None:
        return []
    try:
        check_clients(lab.secure_aggregation, size)
    except AuditInputError as exc:
        return [f"Scenario: {exc}. Lower the clients, or take more images on the Setup page."]
    return []
