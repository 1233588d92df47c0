"""A run's settings in words: attack, defense, model, batch, scenario and budget of its typed
``RunSpec``, as the Attack lab's caption and the History table show them."""

from __future__ import annotations

from dataclasses import dataclass

from auditlib.attacks import ALL_ATTACKS, ALL_ATTACKS_LABEL
from auditlib.client.protocol import ClientProtocol
from auditlib.spec import ComponentSpec, RunSpec, ScenarioSpec
from auditlib.words import count_of

OLDER_SPEC = "?"  # a part of a spec this version cannot read (stored by an older version)


def attack_label(name: str) -> str:
    return ALL_ATTACKS_LABEL if name == ALL_ATTACKS else name


# The threat models (``auditlib.spec.SERVERS``) in words: the form's options and the labels.
SERVER_WORDS = {
    "honest": "Honest-but-curious server (observes updates)",
    "malicious": "Malicious server (changes the model it sends)",
}
SERVER_SHORT = {"honest": "honest-but-curious server", "malicious": "malicious server"}


def threat_words(server: str, secure_aggregation: int | None = None) -> str:
    """The threat model where it is not the default one, for headers and labels:
    'malicious server, secure aggregation of 8'; '' for an honest server seeing one update."""
    parts = []
    if server != "honest":
        parts.append(SERVER_SHORT.get(server, f"{server} server"))
    if secure_aggregation is not None:
        parts.append(f"secure aggregation of {secure_aggregation}")
    return ", ".join(parts)


def scenario_threat(scenario: ScenarioSpec) -> str:
    """``threat_words`` of a spec's scenario."""
    return threat_words(scenario.server, scenario.secure_aggregation)


def preset_label(preset: str | None) -> str:
    if preset is None:
        return "library defaults"
    if preset == "audit":
        return "audit (strongest, default)"  # short: the sidebar cuts a longer one
    if preset == "paper":
        return "paper settings (reproduction)"
    if preset.startswith("paper-"):
        return f"paper settings ({preset.removeprefix('paper-')})"
    return preset


@dataclass(frozen=True)
class RunSettings:
    """A run's settings in words."""

    attack: str
    defense: str
    model: str
    batch: str
    scenario: str
    iterations: int | None  # None: not readable from the stored spec

    @property
    def iterations_text(self) -> str:
        return OLDER_SPEC if self.iterations is None else str(self.iterations)


def component_text(part: ComponentSpec) -> str:
    """'dlg [audit] (lr=0.1)': the registry name, its preset and its changed parameters."""
    params = ", ".join(f"{k}={v}" for k, v in part.params)
    preset = f" [{part.preset}]" if part.preset else ""
    return f"{attack_label(part.name)}{preset}" + (f" ({params})" if params else "")


ALGORITHM_WORDS = {"fedsgd": "FedSGD", "fedavg": "FedAvg"}
SHARED_WORDS = {"delta": "weight change", "weights": "new weights"}


def protocol_words(protocol: ClientProtocol) -> str:
    """'FedAvg, 2 local epochs at lr 0.05 (SGD, momentum 0.9), mini-batches of 2, sends new
    weights': what the client does, in words."""
    if protocol.algorithm == "fedsgd":
        return "FedSGD: one gradient of the whole batch"
    rounds = (
        count_of(protocol.local_epochs, "local epoch")
        if protocol.local_epochs is not None
        else count_of(protocol.local_steps, "local step")
    )
    optimiser = protocol.optimizer.upper() if protocol.optimizer != "sgd" else "SGD"
    extras = [
        f"momentum {protocol.momentum:g}" if protocol.momentum else "",
        f"weight decay {protocol.weight_decay:g}" if protocol.weight_decay else "",
    ]
    how = ", ".join([optimiser, *(e for e in extras if e)])
    batches = (
        f", mini-batches of {protocol.local_batch_size}"
        + (" in an order only the client knows" if protocol.shuffle else "")
        if protocol.local_batch_size
        else ""
    )
    sent = SHARED_WORDS.get(protocol.shared, protocol.shared)
    return (
        f"{ALGORITHM_WORDS['fedavg']}, {rounds} at lr {protocol.local_lr:g} ({how}){batches}, "
        f"sends {sent}"
    )


def settings_text(spec: RunSpec) -> RunSettings:
    model = spec.model.spec
    shape = "x".join(str(v) for v in model.input_shape)
    data = spec.data
    if data.source == "samples":
        images = f"{data.batch_size or 1} from '{data.location}'"
    elif data.source == "asset":
        images = f"{data.batch_size or 'all'} uploaded ({data.location[:8]})"
    elif data.source == "none":
        images = "none (the reconstructions are not scored)"
    else:
        images = f"{data.batch_size or 'all'} from {data.location}"
    protocol = spec.scenario.protocol
    scenario: str = protocol.algorithm  # short, for a table's column
    if protocol.algorithm == "fedavg":
        rounds = (
            f"{protocol.local_epochs} local epochs"
            if protocol.local_epochs is not None
            else f"{protocol.local_steps} local steps"
        )
        scenario += f", {rounds}, lr {protocol.local_lr}"
    observed = spec.scenario.observed
    if observed is not None:
        scenario = f"observed update ({scenario})"
    threat = scenario_threat(spec.scenario)
    if threat:
        scenario += f", {threat}"
    weights = ", uploaded weights" if spec.model.weights_asset else ""
    if observed is not None:
        weights = ", the observed update's global weights"
    return RunSettings(
        attack=component_text(spec.attack),
        defense=component_text(spec.defense),
        model=f"{model.architecture} ({shape}, {model.num_classes} classes{weights})",
        batch=images,
        scenario=scenario,
        iterations=spec.budget.iterations,
    )


def older_spec_settings(attack: str | None = None, defense: str | None = None) -> RunSettings:
    """The settings of a run whose spec is of an older version (``run_spec_from_dict``
    refuses it): the attack and defense its result names, where it has one, "?" for the rest."""
    return RunSettings(
        attack=attack_label(attack) if attack else OLDER_SPEC,
        defense=defense or OLDER_SPEC,
        model=f"{OLDER_SPEC} (a spec of an older version)",
        batch=OLDER_SPEC,
        scenario=OLDER_SPEC,
        iterations=None,
    )
