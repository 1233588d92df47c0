"""The victim client: the audited model as the auditor gave it and the private batch it
holds (images decoded and checked, labels given or drawn), with the data's mean image for
RDLV and the guesses (made from the data source's images outside the audited batch) and
the attack stage's optional FedAvg pretraining.

For an observed update (``ScenarioSpec.observed``) the model is the bundle's global model
and the private batch, where the auditor has the client's images, is only the truth the
reconstructions are scored against; without them there is none (``Victim.batch`` None).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from auditlib.client.update import set_training_mode
from auditlib.data import (
    LabelledImages,
    Normalization,
    assign_labels,
    check_labels_fit,
    content_hashes,
    load_image_folder,
    load_sample_set,
    load_zip,
    to_model_batch,
)
from auditlib.data.samples import PHOTOGRAPHS
from auditlib.engine.device import resolve_device
from auditlib.errors import AuditInputError
from auditlib.fl.training import FederatedTraining, federated_averaging, pretraining_pool
from auditlib.metrics import to_unit_range
from auditlib.models import build_model, describe_model, load_trusted_archive, load_weights
from auditlib.observed import ObservedBundle, bundle_from_archive, load_bundle
from auditlib.observed.replay import TOLERANCE, ImageCheck, check_images, why_not_replayable
from auditlib.seeds import derive_seed
from auditlib.spec import MAX_BATCH, RunSpec
from auditlib.threat import PrivateBatch

PRIOR_IMAGES = 64  # sample-set images averaged into the prior (RDLV, the mean-image guess)


NO_PRIVATE_IMAGES = "no private images to compare with"


@dataclass(frozen=True, eq=False)
class Victim:
    model: nn.Module
    # None: an observed update audited without the client's images (nothing to score).
    batch: PrivateBatch | None
    normalization: Normalization
    records: dict[str, Any]
    # The data's mean image in [0, 1] (RDLV, the mean-image guess), made from images of the
    # data source outside the audited batch: it never sees the private images.
    prior: np.ndarray | None = None
    prior_unavailable_reason: str | None = None
    # The update a client sent, where the run audits one (``ScenarioSpec.observed``).
    observed: ObservedBundle | None = None
    # The private images' content hashes at the model's input size (``content_hashes``): a
    # public set holding any of them is refused as the server's prior.
    image_hashes: frozenset[str] = frozenset()


def _sha256_arrays(images: LabelledImages, labels: tuple[int, ...]) -> str:
    digest = hashlib.sha256()
    for array in images.images:
        digest.update(str(array.shape).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    digest.update(str(labels).encode())
    return digest.hexdigest()


def _asset(assets: Mapping[str, bytes] | None, sha256: str, what: str) -> bytes:
    if assets is None or sha256 not in assets:
        raise AuditInputError(f"the {what} asset {sha256[:12]}... was not handed to this worker")
    return assets[sha256]


def _load_images(
    spec: RunSpec, num_classes: int, assets: Mapping[str, bytes] | None
) -> tuple[LabelledImages, tuple[int, ...], str, tuple[np.ndarray, ...]]:
    """The victim's images, their labels, where the labels came from, and the data source's
    images outside the audited batch for the prior (every other image of a folder or upload;
    up to PRIOR_IMAGES other images of a sample set)."""
    data = spec.data
    if data.source in ("folder", "asset"):
        if data.source == "folder":
            loaded = load_image_folder(data.location, labels_csv=data.labels_csv)
        else:  # an upload, stored by content hash as a zip, passed to the worker as bytes
            # Images uploaded one by one are stored as a zip too: the source is "an upload",
            # never "zip upload" (issue 52: the PDF said so of images uploaded one by one).
            loaded = dataclasses.replace(
                load_zip(_asset(assets, data.location, "images")), source="upload"
            )
        end = len(loaded.images) if data.batch_size is None else data.offset + data.batch_size
        if end > len(loaded.images) or data.offset >= len(loaded.images):
            raise AuditInputError(
                f"{data.location} holds {len(loaded.images)} images; batch size {data.batch_size} "
                f"from offset {data.offset} needs {end}"
            )
        picked = loaded.window(data.offset, end)
        pool = loaded.images[: data.offset] + loaded.images[end:]
    elif data.source == "samples":
        count = data.batch_size or 1
        picked = load_sample_set(data.location, count, seed=spec.seed, offset=data.offset)
        pool = _sample_prior_pool(data.location, spec.seed, data.offset, count)
    else:
        raise AuditInputError(
            f"unknown data source {data.source!r}; expected folder, samples or asset"
        )
    if picked.labels is None:
        labels = assign_labels(
            len(picked.images), num_classes, derive_seed(spec.seed, "labels"), first=data.offset
        )
        source = "assigned (no labels given; seeded draw)"
    else:
        labels = picked.labels
        check_labels_fit(labels, num_classes, picked.names)
        source = "given"
    return picked, labels, source, pool


def _sample_prior_pool(name: str, seed: int, offset: int, count: int) -> tuple[np.ndarray, ...]:
    """Up to PRIOR_IMAGES images of a sample set outside the audited window (positions
    ``offset``..``offset + count - 1`` of the set's seeded order): those before it, then those
    after it, so the prior never holds an audited image."""
    before = min(offset, PRIOR_IMAGES)
    after = PRIOR_IMAGES - before
    if name == "photographs":
        after = min(after, len(PHOTOGRAPHS) - offset - count)
    # The other sets hold at least 200 images: when ``after`` > 0 the offset is under 64 and
    # the batch at most 64 images, so the images after it end before position 192.
    pool: tuple[np.ndarray, ...] = ()
    if before > 0:
        pool += load_sample_set(name, before, seed=seed).images
    if after > 0:
        pool += load_sample_set(name, after, seed=seed, offset=offset + count).images
    return pool


def data_prior(
    pool: tuple[np.ndarray, ...], batch_size: int, spec: RunSpec, normalization: Normalization
) -> tuple[np.ndarray | None, str | None]:
    """The data's mean image (H x W x C in [0, 1]) for RDLV and the mean-image guess, or None
    and why not.

    ``pool`` holds the data source's images outside the audited batch (of ``batch_size``
    images): a mean that took in the batch would see the private images (with one image it
    is the image), so a source with no other image gives no prior.
    """
    if not pool:
        return None, (
            f"the data source holds {batch_size} image(s), no more than the audited batch: "
            "with the audited images left out no image remains to give a data-level mean image"
        )
    batch = to_model_batch(list(pool), spec.model.spec.input_shape, normalization)
    return to_unit_range(batch, normalization).mean(axis=0), None


def build_audited_model(
    spec: RunSpec, *, allow_trusted_archive: bool = False, assets: Mapping[str, bytes] | None = None
) -> nn.Module:
    """The model as the auditor gave it: built-in architecture with its weights, or an archive."""
    if spec.model.trusted_archive is not None:
        if not allow_trusted_archive:
            raise AuditInputError(
                "trusted model archives run code when loaded; they are loaded only in an isolated worker"
            )
        model = load_trusted_archive(spec.model.trusted_archive)
    else:
        model = build_model(spec.model.spec)
        if spec.model.weights is not None:
            load_weights(model, spec.model.weights)
        elif spec.model.weights_asset is not None:
            load_weights(model, _asset(assets, spec.model.weights_asset, "weights"))
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def prepare_victim(
    spec: RunSpec,
    *,
    allow_trusted_archive: bool = False,
    assets: Mapping[str, bytes] | None = None,
) -> Victim:
    """Build the global model and the private batch the victim client holds."""
    if spec.scenario.observed is not None:
        return _observed_victim(spec, assets)
    device = resolve_device(spec.device)
    model_spec = spec.model.spec
    model = build_audited_model(spec, allow_trusted_archive=allow_trusted_archive, assets=assets)
    normalization = Normalization.parse(spec.data.normalization, model_spec.input_shape[0])
    batch, records, prior, prior_reason, hashes = _private_batch(spec, normalization, assets)
    if spec.scenario.pretrain_rounds > 0:
        training = FederatedTraining(rounds=spec.scenario.pretrain_rounds)
        pool, pool_labels = pretraining_pool(
            spec.scenario.pretrain_data,
            1024,
            model_spec.input_shape,
            model_spec.num_classes,
            normalization,
            derive_seed(spec.seed, "pretrain-data"),
        )
        losses = federated_averaging(
            model, pool, pool_labels, training, derive_seed(spec.seed, "pretrain")
        )
        records["pretraining"] = {
            "rounds": training.rounds,
            "dataset": spec.scenario.pretrain_data,
            "clients_per_round": training.clients_per_round,
            "examples_per_client": training.examples_per_client,
            "local": training.protocol.as_dict(),
            "loss_per_round": losses,
        }
    return _on_device(
        model, batch, normalization, records, prior, prior_reason, device, image_hashes=hashes
    )


def _private_batch(
    spec: RunSpec,
    normalization: Normalization,
    assets: Mapping[str, bytes] | None,
    choose: Callable[[torch.Tensor, torch.Tensor, bool], tuple[int, ...]] | None = None,
) -> tuple[PrivateBatch, dict[str, Any], np.ndarray | None, str | None, frozenset[str]]:
    """The private batch (on the CPU), the records of its data, the data's prior, and the
    private images' content hashes.

    ``choose`` (an observed update's image check): given the loaded images as the model
    takes them, their labels and whether the labels were given, the positions of the
    client's images among them; the others join the prior's pool."""
    model_spec = spec.model.spec
    images, labels, label_source, pool = _load_images(spec, model_spec.num_classes, assets)
    batch_images = to_model_batch(list(images.images), model_spec.input_shape, normalization)
    if choose is not None:
        picked = choose(
            batch_images, torch.tensor(labels, dtype=torch.long), label_source == "given"
        )
        if len(picked) != len(images.images):
            pool += tuple(a for i, a in enumerate(images.images) if i not in picked)
            images = dataclasses.replace(
                images,
                images=tuple(images.images[i] for i in picked),
                names=tuple(images.names[i] for i in picked),
                labels=None if images.labels is None else tuple(images.labels[i] for i in picked),
            )
            labels = tuple(labels[i] for i in picked)
            batch_images = batch_images[list(picked)]
    height, width = model_spec.input_shape[1:]
    hashes = frozenset(content_hashes(images.images, height, width))
    pool, repeats = _without_audited(pool, hashes, height, width)
    prior, prior_reason = data_prior(pool, len(images.images), spec, normalization)
    records: dict[str, Any] = {
        "data": {
            "source": images.source,
            "names": list(images.names),
            "labels": list(labels),
            "label_source": label_source,
            "class_names": list(images.class_names) if images.class_names else None,
            "content_sha256": _sha256_arrays(images, labels),
            "normalization": normalization.as_dict(),
            "rdlv_prior": prior_reason
            or f"mean of {len(pool)} images of the data source outside the audited batch"
            + (f" ({repeats} copies of audited images left out)" if repeats else ""),
        }
    }
    batch = PrivateBatch(
        images=batch_images,
        labels=torch.tensor(labels, dtype=torch.long),
        names=tuple(images.names),
    )
    return batch, records, prior, prior_reason, hashes


def _without_audited(
    pool: tuple[np.ndarray, ...], audited: frozenset[str], height: int, width: int
) -> tuple[tuple[np.ndarray, ...], int]:
    """The prior's pool without any image whose content is an audited image's (a folder
    that holds the same photograph twice, under two names): the prior never sees a private
    image. Also how many were left out."""
    kept = tuple(
        image
        for image, digest in zip(pool, content_hashes(pool, height, width), strict=True)
        if digest not in audited
    )
    return kept, len(pool) - len(kept)


def _on_device(
    model: nn.Module,
    batch: PrivateBatch | None,
    normalization: Normalization,
    records: dict[str, Any],
    prior: np.ndarray | None,
    prior_reason: str | None,
    device: torch.device,
    observed: ObservedBundle | None = None,
    *,
    image_hashes: frozenset[str] = frozenset(),
) -> Victim:
    model = model.to(device)
    set_training_mode(model, False)
    if batch is not None:
        batch = PrivateBatch(batch.images.to(device), batch.labels.to(device), batch.names)
    records["model"] = {k: v for k, v in describe_model(model).items() if k != "parameters"}
    return Victim(model, batch, normalization, records, prior, prior_reason, observed, image_hashes)


def _observed_victim(spec: RunSpec, assets: Mapping[str, bytes] | None) -> Victim:
    """The observed update's victim: the bundle's global model, and the client's images
    where the auditor has them (the truth to score against), else none."""
    observed = spec.scenario.observed
    assert observed is not None
    if observed.source == "asset":  # an uploaded bundle, stored, handed over as bytes
        archive = _asset(assets, observed.location, "observed update")
        bundle = bundle_from_archive(archive, f"upload {observed.location[:12]}")
    else:
        bundle = load_bundle(observed.location)
    check_observed_spec(spec, bundle)
    examples = bundle.training.num_examples
    if examples > MAX_BATCH:
        raise AuditInputError(
            f"the client trained on {examples} examples; an audit reconstructs at most "
            f"{MAX_BATCH} images (the batch-size limit of every audit)"
        )
    model = bundle.build_model()
    for p in model.parameters():
        p.requires_grad_(True)
    channels = spec.model.spec.input_shape[0]
    normalization = Normalization.parse(spec.data.normalization, channels)
    batch: PrivateBatch | None = None
    prior, prior_reason = None, NO_PRIVATE_IMAGES
    hashes: frozenset[str] = frozenset()
    check: list[ImageCheck] = []
    if spec.data.has_images:
        # Every image of a folder or upload: the client's are found among them by replaying
        # its training where the update allows it (observed.replay). A sample set gives
        # the batch asked for.
        whole = spec
        if spec.data.source in ("folder", "asset"):
            whole = dataclasses.replace(spec, data=dataclasses.replace(spec.data, batch_size=None))
        choose = functools.partial(_client_images, bundle, model, check)
        batch, records, prior, prior_reason, hashes = _private_batch(
            whole, normalization, assets, choose
        )
    else:
        records = {
            "data": {
                "source": "none: an observed update audited without the client's images",
                "names": [],
                "labels": [],
                "label_source": "none",
                "normalization": normalization.as_dict(),
                "rdlv_prior": NO_PRIVATE_IMAGES,
            }
        }
    records["observed"] = bundle.describe()
    if check:  # how the client's images were checked against its update
        records["observed"]["image_check"] = check[0].to_json()
    device = resolve_device(spec.device)
    return _on_device(
        model,
        batch,
        normalization,
        records,
        prior,
        prior_reason,
        device,
        bundle,
        image_hashes=hashes,
    )


def _client_images(
    bundle: ObservedBundle,
    model: nn.Module,
    found: list[ImageCheck],
    images: torch.Tensor,
    labels: torch.Tensor,
    labels_given: bool,
) -> tuple[int, ...]:
    """The positions of the client's images among ``images``, checked by replaying its
    training where the update allows it (``observed.replay``); refused where they are too
    few, or where no set of them produces the update. The check goes to ``found``."""
    count, expected = int(images.shape[0]), bundle.training.num_examples
    if count < expected:
        raise AuditInputError(
            f"the client trained on {expected} examples (training.json's num_examples), and "
            f"{count} private images were given; expected the client's {expected} images"
        )
    skipped = why_not_replayable(bundle, labels_given)
    if skipped is not None:
        if count != expected:
            raise AuditInputError(
                f"{count} images were given for a client that trained on {expected}, and the "
                f"update cannot tell which are its own ({skipped}); give the client's "
                f"{expected} images"
            )
        found.append(ImageCheck(None, skipped=skipped))
        return tuple(range(count))
    check = check_images(bundle, model, images, labels)
    found.append(check)
    if check.matches:
        assert check.replay is not None
        return check.replay.picked
    assumed = sorted(name for name, _ in bundle.training.assumed)
    closest = check.replay
    worst = max(closest.distances, key=lambda d: d[1]) if closest else ("", math.inf)
    sets = (
        "these images do not produce"
        if count == expected
        else f"none of the {check.tried:,} sets of {expected} of the {count} images tried produces"
    )
    raise AuditInputError(
        f"{sets} this update: replaying the client's training on them (training.json's "
        f"protocol) gives an update {worst[1]:.3g} away from the observed one at {worst[0]} "
        f"(relative distance; a match is within {TOLERANCE:g}); they are not the images this "
        "client trained on (another client's, other labels, another order)"
        + (
            f", or training.json's training is not the client's: {', '.join(assumed)} "
            f"{'was' if len(assumed) == 1 else 'were'} assumed, not reported"
            if assumed
            else ", or training.json's training is not the client's"
        )
    )


def check_observed_spec(spec: RunSpec, bundle: ObservedBundle) -> None:
    """The run's model, protocol and normalisation are the bundle's (the CLI fills them from
    it), and the bundle is the one the run was made for; else refused in one line."""
    observed = spec.scenario.observed
    assert observed is not None
    if observed.content_sha256 and observed.content_sha256 != bundle.content_sha256:
        raise AuditInputError(
            f"the bundle in {bundle.location} changed since this run was made (its files' "
            f"sha256 is {bundle.content_sha256[:12]}..., the run's {observed.content_sha256[:12]}"
            "...); make the run again from the bundle"
        )
    ours, theirs = spec.model.spec.resolved(), bundle.model_spec.resolved()
    for what, mine, bundles in (
        ("architecture", ours.architecture, theirs.architecture),
        ("class count", ours.num_classes, theirs.num_classes),
        ("input shape", ours.input_shape, theirs.input_shape),
        ("activation", ours.activation, theirs.activation),
        ("stem", ours.stem, theirs.stem),
        ("client protocol", spec.scenario.protocol, bundle.protocol),
        (
            "normalisation",
            Normalization.parse(spec.data.normalization, ours.input_shape[0]),
            Normalization.parse(bundle.normalization, ours.input_shape[0]),
        ),
    ):
        if mine != bundles:
            raise AuditInputError(
                f"the run's {what} ({mine}) is not the observed bundle's ({bundles}); an "
                "observed update is audited with the model and training its training.json "
                "states"
            )
