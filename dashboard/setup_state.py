"""The Setup page's choices (the model under audit and the private batch) as plain values,
read from the session by every page, and the library's checks of them.

No torch math here: the images, the model and the weights are decoded and checked by
``auditlib``; this module only collects the choices and caches what the library says.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import streamlit as st

from auditlib.access import AccessDenied
from auditlib.data import LabelledImages, check_labels_fit, load_sample_set, load_zip
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model, load_weights
from auditlib.models.registry import architecture_info
from auditlib.store import AssetRecord
from dashboard.resources import get_store
from dashboard.state import (
    ARCHITECTURE_DEFAULT,
    AUTOMATIC_STEM,
    SETUP_DEFAULTS,
    is_torchvision,
    upload_count_key,
)

# What a torchvision model takes whatever the Setup page's hidden fields hold: colour input,
# the builder's own initialisation and activations, no stem choice.
TORCHVISION_FIXED = {"channels": 3, "init": "default", "activation": None, "stem": None}


@dataclasses.dataclass
class Setup:
    """The Setup page's choices as plain values (read from the session by every page)."""

    architecture: str = "lenet"
    num_classes: int = 10
    input_size: int = 32
    channels: int = 3
    init: str = "uniform"
    activation: str | None = None
    stem: str | None = None  # ResNets: None = by input size
    weights: str | None = None  # sha256 of an uploaded weights asset
    source: str = "samples"  # "samples" or "upload"
    sample_set: str = "photographs"
    count: int = 1
    images: str | None = None  # sha256 of an uploaded images asset (a zip)
    upload_count: int | None = None  # images of the upload in the batch; None = all
    normalization: str = "none"
    seed: int = 0

    def model_spec(self) -> ModelSpec:
        return ModelSpec(
            architecture=self.architecture,
            num_classes=self.num_classes,
            input_shape=(self.channels, self.input_size, self.input_size),
            init=self.init,
            activation=self.activation,
            stem=self.stem if self._accepts_stem() else None,
            seed=self.seed,
        )

    def _accepts_stem(self) -> bool:
        try:
            return architecture_info(self.architecture).accepts_stem
        except AuditInputError:
            return False  # ModelSpec says why

    @property
    def torchvision(self) -> bool:
        return is_torchvision(self.architecture)

    def model_text(self) -> str:
        if self.weights:
            weights = "uploaded weights"
        elif self.torchvision:
            weights = "random weights (the builder's initialisation)"
        else:
            weights = f"{self.init} initialisation"
        stem = f", {self.stem} stem" if self.stem and self.model_spec().stem else ""
        return (
            f"{self.architecture}, {self.num_classes} classes, input {self.channels}x"
            f"{self.input_size}x{self.input_size}{stem}, {weights}"
        )


def current_setup() -> Setup:
    """The setup as chosen on the Setup page (defaults where it was never opened)."""
    state = st.session_state

    def get(key: str) -> Any:
        return state.get(key, SETUP_DEFAULTS[key])

    activation = get("activation")
    images = state.get("images")
    upload_count = None
    if images:
        count = state.get(upload_count_key(images))
        upload_count = int(count) if count is not None else None
    setup = Setup(
        architecture=get("architecture"),
        num_classes=int(get("num_classes")),
        input_size=int(get("input_size")),
        channels=int(get("channels")),
        init=get("weights_init"),
        activation=None if activation == ARCHITECTURE_DEFAULT else activation,
        stem=None if get("stem") == AUTOMATIC_STEM else get("stem"),
        weights=state.get("weights") or None,
        source=get("source"),
        sample_set=get("sample_set"),
        count=int(get("count")),
        images=images or None,
        upload_count=upload_count,
        normalization=get("normalization"),
        seed=int(get("seed")),
    )
    if setup.torchvision:  # the Setup page hides these fields for a torchvision model
        setup = dataclasses.replace(setup, **TORCHVISION_FIXED)
    return setup


@st.cache_data(max_entries=32, show_spinner=False)
def sample_batch(name: str, count: int, seed: int) -> LabelledImages:
    """A bundled sample batch, as the engine will draw it (cached: some sets are large)."""
    return load_sample_set(name, count, seed=seed)


def stored_images(sha: str) -> LabelledImages | None:
    """The uploaded images stored as asset ``sha``, decoded (once per session), or None."""
    cache = st.session_state.setdefault("_stored_images", {})
    if sha not in cache:
        asset = get_store().get_asset(sha)
        cache[sha] = None if asset is None or asset.kind != "images" else _uploaded(asset)
    return cache[sha]


def _uploaded(asset: AssetRecord) -> LabelledImages:
    """A stored upload as it was uploaded: the stored zip numbers its files to keep their
    order and writes labels as class ids, so the names, the class names and where the images
    came from are read back from the upload's record."""
    images = load_zip(asset.data)
    meta = asset.meta
    names, classes = meta.get("names"), meta.get("class_names")
    if isinstance(names, list) and len(names) == len(images):
        images = dataclasses.replace(images, names=tuple(map(str, names)))
    labels = images.labels
    if isinstance(classes, list) and labels and all(i < len(classes) for i in labels):
        images = dataclasses.replace(images, class_names=tuple(map(str, classes)))
    return dataclasses.replace(images, source=str(meta.get("source", "upload")))


def weights_problem(sha: str, spec: ModelSpec) -> str | None:
    """Why the stored weights ``sha`` do not fit ``spec`` (None when they do); cached.

    The check is the library's: build the architecture, load the weights without running
    code (safetensors or ``torch.load(weights_only=True)``), compare keys and shapes.
    """
    cache = st.session_state.setdefault("_weights_fit", {})
    key = (sha, repr(spec))
    if key not in cache:
        try:
            asset = get_store().get_asset(sha)
        except AccessDenied as exc:  # another user's upload (a shared link): not cached
            return str(exc)
        if asset is None or asset.kind != "model":
            cache[key] = (
                f"the weights {sha[:12]}... are not in this dashboard's store; upload them again"
            )
        else:
            cache[key] = check_weights(asset.data, asset.name, spec)
    return cache[key]


def check_weights(data: bytes, name: str, spec: ModelSpec) -> str | None:
    """None when ``data`` are weights for ``spec``; otherwise the library's reason."""
    try:
        load_weights(build_model(spec), data, filename=name)
    except AuditInputError as exc:
        return str(exc)
    return None


def batch_of(setup: Setup) -> LabelledImages | None:
    """The private batch the run will use, or None when there is none yet.

    Raises AuditInputError when the library refuses the choice.
    """
    if setup.source == "samples":
        return sample_batch(setup.sample_set, setup.count, setup.seed)
    if not setup.images:
        return None
    images = stored_images(setup.images)
    if images is None:
        raise AuditInputError(
            f"the uploaded images {setup.images[:12]}... are not in this dashboard's store; "
            "upload them again on the Setup page"
        )
    return images.window(0, setup.upload_count or len(images))


def setup_problems(setup: Setup, where: str = "on the Setup page") -> tuple[list[str], list[str]]:
    """(errors, missing): what the library refuses, and what has not been given yet."""
    errors: list[str] = []
    missing: list[str] = []
    spec = None
    try:
        spec = setup.model_spec()
    except AuditInputError as exc:
        errors.append(f"Model: {exc}")
    if setup.weights and spec is not None:
        problem = weights_problem(setup.weights, spec)
        if problem:
            errors.append(
                f"Weights: {problem}. Change the model on the Setup page or remove the weights."
            )
    try:
        images = batch_of(setup)
    except AuditInputError as exc:
        errors.append(f"Images: {exc}")
        images = None
    if images is None and setup.source == "upload" and not errors:
        missing.append(f"No images yet: upload them {where}, or pick a bundled sample set.")
    if images is not None and images.labels is not None:
        try:
            check_labels_fit(images.labels, setup.num_classes, images.names)
        except AuditInputError as exc:
            errors.append(f"Labels: {exc}")
    return errors, missing
