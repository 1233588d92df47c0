"""The client's model check (``model-check``): look at the model before training on it.

A malicious server changes the model it sends so that the update holds the client's images
(Robbing the Fed's imprint, Curious Abandon Honesty's trap weights, LOKI's per-client
kernels). A client that inspects what it received can see the structure those attacks need
(``model_signatures``): rows sharing one direction with graded biases, trap rows whose
positive weights mirror their negative ones, a layer that passes the input through unchanged
(SEER's transmit ratio) or copies one number to every output, and, on its own batch, ReLU
units each fired by one image alone while most stay silent. It sees only what a client sees:
the weights and its batch, never what the server built. When a signature is found the
client refuses to train (``refuses``: ``fl.scenario.defended_update`` then sends zeros);
otherwise the update leaves unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from auditlib.config import check_ranges, param
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

    def __post_init__(self) -> None:
        check_ranges(self)


class ModelCheck:
    """Refuses a model with a malicious server's signature; leaves the update as is."""

    def __init__(self, config: ModelCheckConfig) -> None:
        self.config = config
        self.checked = 0  # models looked at (one per client round)
        self.flagged: list[str] = []  # the reason given for each refused model
        self.layers = 0  # layers looked at in the last check

    def refuses(self, context) -> str | None:
        """Why the client will not train on ``context.model``, or None where it passes."""
        findings, layers = weight_findings(context.model)
        if self.config.batch_check:
            more, _ = batch_findings(context.model, context.images)
            findings += more
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
        "through, one image firing a ReLU layer's units alone).",
        ModelCheckConfig,
        ModelCheck,
    )
)
