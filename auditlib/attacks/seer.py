"""SEER's learned disguise (Garov, Dimitrov, Jovanović, Vechev, ICLR 2024): the server
trains the shared model's own weights jointly with a secret decoder on public data
(``server.disguise``), and reads one image of the batch, the top of a secret property (the
brightest by default), off the client's FedSGD update with that decoder. The rest of the
candidate is the public mean brightness as a flat image (``imprint.candidate_of``), so at
most one image counts as recovered.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from auditlib.attacks.base import Clock, RunControl, register
from auditlib.attacks.imprint import ReadBack, server_attack, single_event
from auditlib.config import check_ranges, param
from auditlib.errors import AttackUnsupportedError
from auditlib.server.disguise import DisguisedModification, DisguiseSettings, build_disguise
from auditlib.server.modification import BuildContext
from auditlib.threat import AttackerKnowledge, Observation

NAME = "seer-disguised"
Property = Literal["brightest", "darkest"]
Public = Literal["fashion-mnist-train", "faces", "digits"]
Batches = Literal["natural", "one-above"]


@dataclass(frozen=True)
class SeerConfig:
    property: Property = param(
        "brightest",
        "the secret property choosing the one image the update carries: the batch's "
        "brightest (SEER's 'bright') or darkest ('dark') by mean pixel",
    )
    public: Public = param(
        "fashion-mnist-train",
        "public images the server trains on (never the audited images): Fashion-MNIST's "
        "train split (the audits' sample set is its test split), or the bundled faces or "
        "digits",
    )
    batches: Batches = param(
        "one-above",
        "how the training draws its public batches: 'natural' (at random; SEER's prop_mode "
        "max) or 'one-above' (one image above the public 1 - 1/B quantile of the property, "
        "the others below, as SEER's prop_mode thresh draws its positive batches): a model "
        "without batch statistics can only learn an absolute threshold, which these teach "
        "faster (measured: benchmarks/disguise.py)",
    )
    dsnr_bound: float = param(
        0.0,
        "0: SEER's loss alone; above 0, a server that knows a D-SNR check: it also holds, "
        "at every linear and convolutional weight, the top image's gradient norm under this "
        "multiple of the others' (an upper bound on SEER's D-SNR, penalised in the training)",
        low=0.0,
        high=100.0,
    )
    steps: int = param(
        1500,
        "training steps of the model and its decoder together (each a double backward "
        "through the model on one public batch); the paper trains about a million on GPUs",
        low=1,
        high=20000,
    )
    lr: float = param(1e-3, "the decoder's Adam learning rate", low=0.0, high=1.0, low_open=True)
    model_lr: float = param(
        3e-3, "the shared model's Adam learning rate", low=0.0, high=1.0, low_open=True
    )
    hidden: int = param(
        256,
        "width of the decoder's linear disaggregator (SEER's 'orig' decoder); 0: none, one "
        "affine map from the entries read to the pixels (SEER's default 'nomid')",
        low=0,
        high=4096,
    )
    per_layer: int = param(
        8400,
        "update entries the decoder reads of each parameter at least, at random (SEER's "
        "par_sel_size); all of a smaller one",
        low=1,
        high=1_000_000,
    )
    fraction: float = param(
        0.001,
        "and at least this share of each parameter's entries (SEER's par_sel_frac)",
        low=0.0,
        high=1.0,
    )

    def __post_init__(self) -> None:
        check_ranges(self)

    def settings(self) -> DisguiseSettings:
        return DisguiseSettings(
            property=self.property,
            public=self.public,
            steps=self.steps,
            lr=self.lr,
            model_lr=self.model_lr,
            hidden=self.hidden,
            per_layer=self.per_layer,
            fraction=self.fraction,
            batches=self.batches,
            dsnr_bound=self.dsnr_bound,
        )


def build(config: SeerConfig, context: BuildContext) -> DisguisedModification:
    return build_disguise(context, config.settings(), NAME)


def run_seer(
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: SeerConfig,
    control: RunControl,
    seed: int,
):
    clock = Clock(control)
    server = knowledge.server
    if not isinstance(server, DisguisedModification):
        raise AttackUnsupportedError(f"{NAME} reads the update of the model its own server trained")
    if observation.kind != "gradient":
        raise AttackUnsupportedError(
            f"{NAME}'s decoder reads a FedSGD gradient; this update is {observation.kind}"
        )
    update = dict(zip(observation.parameter_names, observation.tensors, strict=True))
    try:
        image = server.decoder.read(update, server.images)
    except KeyError as missing:
        raise AttackUnsupportedError(
            f"the update has no {missing.args[0]!r}: the client did not send the whole model "
            "the server trained (or a defense removed part of its update)"
        ) from None
    # An update of zeros (a client that refused to train) carries nothing: the decoder's
    # output would be its bias, the public guess, not a read-back.
    if all(not bool(t.any()) for t in observation.tensors):
        read = ReadBack(pixels=image[None][:0], clients=None, support=())
    else:
        read = ReadBack(pixels=image[None], clients=None, support=(1.0,))
    outcome = server.outcome
    inference = {
        "rule": f"SEER: the secret decoder applied to the update times the {server.images} "
        f"images it averages gives the {server.property} image; the others are the public "
        "mean brightness",
        "server_held_out_psnr": round(outcome.held_out_psnr, 2),
        "server_guess_psnr": round(outcome.guess_psnr, 2),
    }
    return single_event(read, knowledge, clock, inference)


register(
    replace(
        server_attack(
            NAME,
            "SEER (Garov et al. 2024), disguised: the model's own weights trained with a "
            "secret decoder on public data so that the update carries the batch's brightest "
            "image; no layer inserted, one approximate image per update.",
            SeerConfig,
            run_seer,
            build,
            paper={
                "steps": 20000,
                "lr": 1e-4,
                "model_lr": 1e-4,
                "hidden": 0,
                "batches": "natural",
            },
            audit={},
            why="a few minutes of CPU training (1500 steps on LeNet at 32 px), the learning "
            "rates raised from the paper's 1e-4 to learn in that time, a 256-wide "
            "disaggregator (SEER's 'orig' decoder) to keep each step cheap, and training "
            "batches with one image above the property's threshold (SEER's thresh mode), "
            "which a model without batch statistics learns from faster; the paper's preset "
            "trains 20000 steps, the most here, against its million on GPUs",
        ),
        stands_in_for=frozenset({"rtf", "cah", "loki"}),
    )
)
