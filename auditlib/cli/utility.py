"""``python -m auditlib utility``: federated training under a defense, its accuracy per
round, and optionally the trained weights."""

from __future__ import annotations

import argparse
from pathlib import Path

from auditlib.cli.arguments import model_spec_of
from auditlib.errors import AuditInputError
from auditlib.output_folder import replace_file
from auditlib.words import size_text


def utility_command(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from auditlib.config import parse_key_values
    from auditlib.data import ImageLimits, Normalization, load_image_folder
    from auditlib.data.training_sets import bundled_sets, labelled_sets
    from auditlib.defenses import build_defense
    from auditlib.fl.federated import train_federated, utility_tensors
    from auditlib.fl.federation import FederationSpec
    from auditlib.models import build_model
    from auditlib.models.loading import load_weights

    spec = model_spec_of(args)
    federation = FederationSpec(
        clients=args.clients,
        clients_per_round=args.clients_per_round,
        split=args.split,
        alpha=args.alpha,
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        local_lr=args.local_lr,
        local_batch_size=args.local_batch_size,
        seed=args.seed,
    )
    defense, settings = build_defense(
        args.defense, parse_key_values(args.defense_param, "defense parameter")
    )
    if args.samples:
        sets = bundled_sets(args.samples, args.train, args.test, args.seed)
    else:
        if args.max_images < 2:
            raise AuditInputError(f"--max-images must be >= 2, got {args.max_images}")
        images = load_image_folder(
            args.images, ImageLimits(max_images=args.max_images), labels_csv=args.labels_csv
        )
        sets = labelled_sets(images, args.test_fraction, args.seed)
    normalization = Normalization.parse(args.normalization, spec.input_shape[0])
    train, test = utility_tensors(sets, spec.input_shape, spec.num_classes, normalization)
    model = build_model(spec)
    if args.weights:
        load_weights(model, args.weights)
    save_to = Path(args.save_weights) if args.save_weights else None
    if save_to is not None and not save_to.parent.is_dir():
        raise AuditInputError(
            f"--save-weights {save_to}: the folder {save_to.parent} does not exist"
        )
    print(
        f"{args.model} on {sets.source}: {len(train[1])} training examples over "
        f"{federation.clients} clients ({federation.split}), {len(test[1])} held out; "
        f"defense {args.defense} {settings}"
    )
    rounds = []
    for result in train_federated(model, train, test, federation, defense):
        rounds.append(asdict(result))
        print(
            f"round {result.round:3d}: accuracy {result.accuracy:.3f}, macro F1 "
            f"{result.macro_f1:.3f}"
            + ("" if result.train_loss is None else f", train loss {result.train_loss:.3f}")
            + (
                ""
                if result.accuracy_without_key is None
                else f", without the key {result.accuracy_without_key:.3f}"
            )
            + f" ({result.seconds:.1f} s)",
            flush=True,
        )
    if save_to is not None:
        _save_weights(model, spec, save_to, args.defense)
    if args.out:
        replace_file(  # whole: a stop leaves the earlier file or this one
            Path(args.out),
            json.dumps(
                {
                    "model": spec.as_dict(),
                    "data": sets.source,
                    "federation": federation.as_dict(),
                    "defense": {"name": args.defense, "settings": settings},
                    "privacy": defense.privacy_report(),
                    "rounds": rounds,
                    # A protocol's own record per round (FedBoosting: weights, time, bytes).
                    "protocol_rounds": getattr(defense, "rounds", None),
                },
                indent=2,
                default=str,
            ).encode()
            + b"\n",
        )
    return 0


def _save_weights(model, spec, path: Path, defense: str) -> None:
    """The trained model's state_dict as safetensors, when it is still the architecture's
    (a defense that inserts layers, such as FedKL's lock, changes it)."""
    import safetensors.torch

    from auditlib.models import build_model

    state = model.state_dict()
    expected = build_model(spec).state_dict()
    if set(state) != set(expected):
        raise AuditInputError(
            f"--save-weights: the defense {defense} changed the model's layers, so its weights "
            f"no longer fit {spec.architecture}; train with --defense none to save weights"
        )
    safetensors.torch.save_file({k: v.detach().contiguous() for k, v in state.items()}, path)
    print(f"weights saved to {path} ({size_text(path.stat().st_size)})")
