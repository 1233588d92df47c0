"""The server's side of the round: the model each client receives and what comes back.

An honest-but-curious server sends the global model; under the malicious-server threat
model each attack that builds a model (``AttackInfo.builds``) gets the release of its own
model (``auditlib.server``). With secure aggregation the audited images are split over the
clients in order and the server sees only their summed update (``fl.scenario``). An
observed update (``auditlib.observed``) is the release as the client sent it: the same
``Release`` a simulated client's round makes, so no attack can tell the two apart.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

import torch

from auditlib.attacks import ATTACKS
from auditlib.client.update import trainable_parameters
from auditlib.engine.attack_phase import PlannedAttack, refuse_without_its_server
from auditlib.engine.victim import Victim
from auditlib.fl.scenario import Release, release_aggregate, release_update
from auditlib.observed import ObservedBundle
from auditlib.seeds import derive_seed
from auditlib.server import BuildContext, ServerModification
from auditlib.server.bins import AuditedPixels
from auditlib.spec import RunSpec, check_clients
from auditlib.threat import AttackerKnowledge, KnownDefense, Observation, PrivateBatch


def client_batches(batch: PrivateBatch, clients: int) -> tuple[PrivateBatch, ...]:
    """The audited images split over ``clients`` in order, as evenly as they go."""
    size = int(batch.images.shape[0])
    check_clients(clients, size)  # a folder's batch size is known only once it is read
    parts = torch.arange(size).tensor_split(clients)
    return tuple(
        PrivateBatch(batch.images[p], batch.labels[p], tuple(batch.names[i] for i in p.tolist()))
        for p in parts
    )


def client_of_image(batch: PrivateBatch, clients: int) -> tuple[int, ...]:
    """Which client holds each audited image (``client_batches``' split)."""
    parts = torch.arange(int(batch.images.shape[0])).tensor_split(clients)
    return tuple(k for k, p in enumerate(parts) for _ in range(len(p)))


@dataclass
class Rounds:
    """The releases of one run, made once each: the honest one and each modified model's."""

    spec: RunSpec
    victim: Victim
    defense: object
    _made: dict[str, Release] = field(default_factory=dict)
    modifications: dict[str, ServerModification] = field(default_factory=dict)

    def for_attack(self, attack: PlannedAttack) -> Release:
        info = ATTACKS[attack.name]
        if info.builds is None:
            return self._release("honest", None)
        refuse_without_its_server(info, self.spec.scenario.server)
        if attack.twin_of is not None:  # an evading server: its own model, as its plain run's
            return self.for_attack(replace(attack, adaptive=False, twin_of=None))
        key = f"{attack.name}:{sorted(attack.settings.items())}"
        name, known = attack.name, None
        if attack.adaptive:
            # The twin's server knows the defense and builds its model for it; where it has
            # no twin, or its twin is the plain attack, the plain release serves (the attack
            # phase then says why).
            plain = self.for_attack(replace(attack, adaptive=False))
            known = plain.known_defense
            if (
                known is None
                or info.why_not_adaptive(known) is not None
                or info.twin_adds_nothing(known, attack.config)
            ):
                return plain
            key, name = f"{key}:knows the defense", f"{attack.name} (knows the defense)"
        if key not in self._made:
            modification = info.builds(attack.config, self._context(known))
            self.modifications[name] = modification
            release = self._release(key, modification)
            self._made[key] = replace(
                release, knowledge=replace(release.knowledge, server=modification)
            )
        return self._made[key]

    def _context(self, known: KnownDefense | None = None) -> BuildContext:
        """What the server knows when it builds its model; ``known``: the client's defense,
        for a server that knows it."""
        scenario = self.spec.scenario
        images = self.victim.batch.images
        clients = scenario.clients
        data = self.spec.data
        return BuildContext(
            model=self.victim.model,
            input_shape=tuple(images.shape[1:]),  # type: ignore[arg-type]
            batch_size=-(-int(images.shape[0]) // clients),  # the largest client's batch
            clients=clients,
            normalization=self.victim.normalization,
            audited_source=data.location if data.source == "samples" else None,
            audited_pixels=AuditedPixels(*images.shape[2:], self.victim.image_hashes),
            seed=derive_seed(self.spec.seed, "server"),
            local_lr=None
            if scenario.protocol.algorithm == "fedsgd"
            else scenario.protocol.local_lr,
            noise_std=None if known is None else known.entry_noise_std,
            clip_norm=None if known is None else known.clip_norm,
            training=scenario.protocol.batchnorm_mode == "train",
        )

    def _release(self, key: str, modification: ServerModification | None) -> Release:
        if key in self._made:
            return self._made[key]
        spec, victim = self.spec, self.victim
        arguments = {
            "normalization": victim.normalization,
            "num_classes": spec.model.spec.num_classes,
            "labels_known": spec.scenario.labels_known,
            "seed": derive_seed(spec.seed, "defense"),
        }
        protocol = spec.scenario.protocol
        clients = spec.scenario.clients
        if victim.observed is not None:
            release = observed_release(victim.observed, victim, spec, self.defense)
        elif clients == 1:
            model = victim.model if modification is None else modification.model_for(0)
            release = release_update(model, victim.batch, protocol, self.defense, **arguments)
        else:
            release = release_aggregate(
                (lambda k: victim.model) if modification is None else modification.model_for,
                client_batches(victim.batch, clients),
                protocol,
                self.defense,
                **arguments,
            )
        self._made[key] = release
        return release


def observed_release(
    bundle: ObservedBundle, victim: Victim, spec: RunSpec, defense: object
) -> Release:
    """What the server received from the client that sent ``bundle``, as a simulated round's
    release holds it: the observation of the model's trainable parameters (its new weights,
    their difference, or the gradient a one-step update is exactly; ``ObservedBundle
    .observed_update``) and the server's knowledge: its global model, the client's training
    (``spec.scenario.protocol``, the bundle's) and its number of examples. No defense acts
    on it (the spec refuses one): what was sent is what is audited."""
    model = victim.model
    device = next(model.parameters()).device
    names = tuple(trainable_parameters(model))
    kind, tensors = bundle.observed_update(names)
    observation = Observation(
        kind=kind,  # type: ignore[arg-type]
        tensors=tuple(t.detach().to(device).clone() for t in tensors),
        parameter_names=names,
    )
    batch = victim.batch
    knowledge = AttackerKnowledge(
        model=copy.deepcopy(model),
        protocol=spec.scenario.protocol,
        batch_size=bundle.training.num_examples,
        input_shape=spec.model.spec.input_shape,
        num_classes=spec.model.spec.num_classes,
        normalization=victim.normalization,
        labels=batch.labels.clone() if spec.scenario.labels_known and batch is not None else None,
        notes=bundle.notes(),
    )
    change = bundle.weight_change(names)
    norm = float(torch.linalg.vector_norm(torch.cat([c.reshape(-1) for c in change])))
    return Release(
        observation=observation,
        knowledge=knowledge,
        undefended_norm=norm,
        defended_norm=norm,
        privacy=defense.privacy_report(),  # type: ignore[attr-defined]
    )
