"""``audit --observed DIR``: the bundle's training.json sets the model and the scenario.

Each audit option the bundle fills takes the bundle's value; one the command line gave
with another value is refused in one line naming both, and options that mean nothing for
an update already sent (weights, init, a defense...) are refused, never ignored.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from auditlib.errors import AuditInputError

if TYPE_CHECKING:
    from auditlib.observed import ObservedBundle

# Options an observed update has no use for: the global weights are the bundle's, and what
# the client sent is what is audited.
NOT_WITH_OBSERVED = {
    "weights": "the weights are the bundle's global.safetensors",
    "trusted_model": "the weights are the bundle's global.safetensors",
    "init": "the weights are the bundle's global.safetensors",
    "model_args": "training.json's model_args are the model's constructor arguments",
    "model_seed": "the weights are the bundle's global.safetensors",
    "pretrain_rounds": "the global weights are the bundle's",
    "secure_aggregation": "the bundle holds one client's update",
    "updates": "the bundle holds one client's update (a sample audit simulates many)",
}


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _same(given: Any, bundles: Any) -> bool:
    if isinstance(given, str) and isinstance(bundles, str):
        return given.strip().lower() == bundles.strip().lower()
    if isinstance(given, float | int) and isinstance(bundles, float | int):
        return float(given) == float(bundles)
    return given == bundles


def bundle_options(bundle: ObservedBundle) -> dict[str, tuple[str, Any]]:
    """The audit options the bundle fills: option dest -> (its training.json field, value)."""
    record = bundle.training
    resolved = bundle.model_spec.resolved()
    protocol = bundle.protocol
    channels, height, width = record.input_shape
    options: dict[str, tuple[str, Any]] = {
        "model": ("model", resolved.architecture),
        "num_classes": ("num_classes", record.num_classes),
        "channels": ("input_size", channels),
        "activation": ("activation", resolved.activation),
        "stem": ("stem", resolved.stem),
        "scenario": (
            "one SGD step on every example, read as its gradient"
            if record.one_gradient
            else "local_epochs or local_steps",
            protocol.algorithm,
        ),
        "local_batch_size": ("local_batch_size", record.local_batch_size),
        "local_lr": ("lr", record.lr),
        "share": ("client.safetensors or delta.safetensors", bundle.shared),
        "bn_mode": ("bn_mode", record.bn_mode),
        "optimizer": ("optimizer", record.optimizer),
        "momentum": ("momentum", record.momentum),
        "weight_decay": ("weight_decay", record.weight_decay),
        "shuffle": ("shuffled", record.shuffled),
        "normalization": ("mean and std", bundle.normalization),
        "batch_size": ("num_examples", record.num_examples),
    }
    if height == width:
        options["input_size"] = ("input_size", height)
    if record.local_epochs is not None:
        options["local_epochs"] = ("local_epochs", record.local_epochs)
    if record.local_steps is not None:
        options["local_steps"] = ("local_steps", record.local_steps)
    return options


def observed_bundle(args: argparse.Namespace) -> ObservedBundle | None:
    """The bundle ``--observed`` names, read and checked, or None without it; refuses an
    option that clashes with it or has no use for it."""
    if not getattr(args, "observed", None):
        return None
    from auditlib.data import Normalization
    from auditlib.observed import load_bundle

    bundle = load_bundle(args.observed)
    given = getattr(args, "given_options", frozenset())
    for dest, why in NOT_WITH_OBSERVED.items():
        if dest in given:
            raise AuditInputError(f"{_option(dest)} does not apply with --observed: {why}")
    options = bundle_options(bundle)
    channels = bundle.training.input_shape[0]
    for dest in sorted(given & set(NON_BUNDLE_SCENARIO | options.keys())):
        if dest not in options:  # a scenario option the bundle's training has no place for
            raise AuditInputError(
                f"{_option(dest)} does not apply to this observed update: training.json "
                "gives the client's training"
            )
        field, value = options[dest]
        mine = getattr(args, dest)
        same = _same(mine, value)
        if dest == "normalization":
            same = Normalization.parse(mine, channels) == Normalization.parse(value, channels)
        if not same:
            raise AuditInputError(
                f"{_option(dest)} {mine} clashes with the observed bundle ({field} in "
                f"training.json: {value}); leave it out: the bundle states what the client ran"
            )
    return bundle


def assumption_lines(bundle: ObservedBundle) -> list[str]:
    """What the audit of ``bundle`` takes on trust, for the command line: each field the
    client did not report, with what was assumed and why, and the image check's outcome."""
    record = bundle.training
    lines = [
        f"observed update: {bundle.location} (round {record.round if record.round is not None else 'unknown'}, "
        f"client {record.client_id or 'unknown'}, {record.num_examples} examples)"
    ]
    if record.assumed:
        lines.append(
            f"assumed, not reported by the client ({len(record.assumed)} of training.json's "
            "fields; the audit simulates these):"
        )
        lines += [f"  {name} = {what}" for name, what in record.assumed]
    if record.protocol_assumed and record.one_gradient:
        lines.append("  the update is read as the batch's gradient only if these assumptions hold")
    return lines


# Scenario options a bundle may leave unset (a FedSGD-read bundle has no local steps).
NON_BUNDLE_SCENARIO = frozenset({"local_steps", "local_epochs", "input_size"})
