"""The client's model check (``model-check``): look at the model before training on it.

A malicious server changes the model it sends so that the update holds the client's images
(Robbing the Fed's imprint, Curious Abandon Honesty's trap weights, LOKI's per-client
kernels). A client that inspects what it received can see the structure those attacks need
(``model_signatures``): rows sharing one direction with graded biases, trap rows whose
positive weights mirror their negative ones, a layer that passes the input through unchanged
(SEER's transmit ratio) or copies one number to every output, and, on its own batch, ReLU
units each fired by one image alone while most stay silent. Its behaviour signals
(``model_behaviour``) read what the model does on the batch, whatever the activation and
whether a layer is a Linear or a convolution: units each owned by one image (trap rows),
units whose sets of images are nested (an imprint's bins), and SEER's disaggregation SNR.
It sees only what a client sees: the weights and its batch, never what the server built.
When a signature is found the client refuses to train (``refuses``:
``fl.scenario.defended_update`` then sends zeros); otherwise the update leaves unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from auditlib.config import check_ranges, param
from auditlib.defenses import model_behaviour as mb
from auditlib.defenses.base import DefenseInfo, copied, register
from auditlib.defenses.model_signatures import batch_findings, summary, weight_findings


@dataclass(frozen=True)
class ModelCheckConfig:
    batch_check: bool = param(
        True,
        "also run the model on the client's own batch (2 images or more) and refuse when most "
        "of a ReLU layer's firing units fire for one image alone and most of its units stay "
        "silent",
    )
    # Off by default: measured over 205 honest models (benchmarks/model_check_rates.py) the
    # signals at these thresholds refuse 11 % of honest checks (first convolutions of
    # uniform-initialised ConvNets and ResNets split batches into nested sets; MLPs' first
    # rows are owned by single images), and under 1 % only with every threshold at its
    # maximum, where they refuse nothing: a client would lose one round in nine.
    behaviour_check: bool = param(
        False,
        "also read each image's own gradient at every Linear and convolution on the client's "
        "batch (4 images or more, one backward pass): refuse when one image owns most units "
        "(trap rows), when most units hold nested sets of images (an imprint's bins), or "
        "when one image's gradient dominates a layer (SEER's D-SNR); off by default: it "
        "refused 11 % of honest checks when measured",
    )
    behaviour_mode: Literal["eval", "train"] = param(
        "eval",
        "the mode the behaviour signals run the model in: eval (BatchNorm on its running "
        "statistics, each image's gradient its own) or train (as the client trains, the "
        "batch's statistics mixing the images; the buffers are put back)",
    )
    ownership: float = param(
        mb.OWNERSHIP,
        "refuse when one image gives 90 % or more of the gradient of at least this share of "
        "a layer's units",
        low=0,
        high=1,
        low_open=True,
    )
    chain: float = param(
        mb.CHAIN,
        "refuse when at least this share of a layer's units split the batch into nested "
        "sets of images",
        low=0,
        high=1,
        low_open=True,
    )
    dsnr: float = param(
        mb.DSNR,
        "refuse when one image's weight gradient at a layer is at least this many times the "
        "others' together (SEER's disaggregation SNR)",
        low=0,
        low_open=True,
    )

    def __post_init__(self) -> None:
        check_ranges(self)

    @property
    def thresholds(self) -> mb.BehaviourThresholds:
        return mb.BehaviourThresholds(self.ownership, self.chain, self.dsnr)


class ModelCheck:
    """Refuses a model with a malicious server's signature; leaves the update as is."""

    def __init__(self, config: ModelCheckConfig) -> None:
        self.config = config
        self.checked = 0  # models looked at (one per client round)
        self.flagged: list[str] = []  # the reason given for each refused model
        self.layers = 0  # layers looked at in the last check
        self.behaviour: mb.Behaviour | None = None  # the last batch's behaviour statistics

    def refuses(self, context) -> str | None:
        """Why the client will not train on ``context.model``, or None where it passes."""
        findings, layers = weight_findings(context.model)
        if self.config.batch_check:
            more, _ = batch_findings(context.model, context.images)
            findings += more
        if self.config.behaviour_check:
            self.behaviour = mb.behaviour(
                context.model, context.images, context.labels, self.config.behaviour_mode
            )
            findings += mb.behaviour_findings(self.behaviour, self.config.thresholds)
        self.checked += 1
        self.layers = layers
        if not findings:
            return None
        reason = summary(findings)
        self.flagged.append(reason)
        return reason

    def apply(self, update, generator, context=None):
        return copied(update)

    def privacy_report(self) -> dict[str, Any]:
        if self.flagged:
            seen = f"flagged {len(self.flagged)} of {self.checked} models: {self.flagged[-1]}"
        elif self.checked:
            seen = f"passed: checked {self.layers} layers of each of {self.checked} models"
            if self.behaviour is not None and self.behaviour.why_unavailable:
                seen += f"; behaviour signals unavailable: {self.behaviour.why_unavailable}"
        else:
            seen = "no model checked yet"
        return {
            "model_check": seen,
            "epsilon": None,
            "epsilon_unavailable_reason": "a model check refuses models built to leak; it "
            "changes nothing in an update it lets through: no DP guarantee",
        }


register(
    DefenseInfo(
        "model-check",
        "Inspect the received model before training: refuse (send zeros) when it carries a "
        "malicious server's signature (imprint rows, trap weights, a layer passing the input "
        "through, one image firing a ReLU layer's units alone) or, with behaviour_check (off "
        "by default), behaviour on the client's batch (units owned by one image, nested "
        "sets of images, one image's gradient dominating a layer).",
        ModelCheckConfig,
        ModelCheck,
    )
)
