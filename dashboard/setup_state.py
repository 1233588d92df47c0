"""The Setup page's choices (the model under audit and the private batch) as plain values,
read from the session by every page, and the library's checks of them.

No torch math here: the images, the model and the weights are decoded and checked by
``auditlib``; this module only collects the choices and caches what the library says.
"""

from __future__ import annotations

import dataclasses
from pathlib import PurePosixPath
from typing import Any

import streamlit as st

from auditlib.access.users import trusted_code_setting
from auditlib.client.protocol import ClientProtocol, Shared
from auditlib.data import (
    DEFAULT_SAMPLE_SET,
    LabelledImages,
    check_labels_fit,
    load_sample_set,
    load_zip,
)
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model, load_weights, own_code
from auditlib.models.registry import architecture_info
from auditlib.observed import TrainingRecord
from auditlib.observed.upload import own_class_refusal
from auditlib.spec import ModelRef
from auditlib.store import AssetRecord
from auditlib.words import count_of
from dashboard.resources import get_store
from dashboard.spec_words import protocol_words
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
# The box a user ticks to say they trust the uploaded file of their own model class; kept in
# the session only, so it is ticked again after a refresh.
TRUST_KEY = "trust_own_code"


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
    sample_set: str = DEFAULT_SAMPLE_SET
    count: int = 1
    images: str | None = None  # sha256 of an uploaded images asset (a zip)
    upload_count: int | None = None  # images of the upload in the batch; None = all
    normalization: str = "none"
    seed: int = 0
    observed: str | None = None  # sha256 of an uploaded observed-update bundle
    # That bundle as stored (its training.json, what the client sent, its files' sha256);
    # None when none is in use or it is not in the store (setup_problems says so).
    bundle: ObservedUpload | None = None
    code: str | None = None  # sha256 of the uploaded file of an own model class
    code_trusted: bool = False  # the user ticked that they trust that file

    @property
    def own_class(self) -> bool:
        """Whether the observed update's model is a class of the client's own code."""
        return self.bundle is not None and own_code.is_own_class(self.bundle.training.model)

    def model_spec(self) -> ModelSpec:
        if self.bundle is not None:  # an observed update's model is the bundle's
            return self.bundle.training.model_spec()
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

    def images_text(self) -> str:
        """The private images in words: '1 from the 'photographs' sample set'."""
        if self.source == "samples":
            return f"{self.count} from the '{self.sample_set}' sample set"
        if self.source == "none":
            return "none (the reconstructions are shown, not scored)"
        if self.upload_count:
            return count_of(self.upload_count, "uploaded image")
        return "every uploaded image"

    def model_text(self) -> str:
        if self.bundle is not None:
            spec = self.model_spec()
            shape = "x".join(str(v) for v in spec.input_shape)
            return (
                f"{spec.architecture}, {spec.num_classes} classes, input {shape}, the observed "
                f"update's global weights (bundle {self.bundle.content_sha256[:12]})"
            )
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


@dataclasses.dataclass(frozen=True)
class ObservedUpload:
    """An uploaded observed-update bundle as its stored record says (the bundle was checked
    when it was uploaded; the run checks its files again)."""

    training: TrainingRecord
    shared: Shared
    content_sha256: str
    name: str

    @property
    def protocol(self) -> ClientProtocol:
        return self.training.protocol(self.shared)

    def describe(self) -> str:
        """What the client sent and how it trained, in words."""
        examples = count_of(self.training.num_examples, "example")
        return f"{self.name}: {protocol_words(self.protocol)}, on {examples}"


def observed_upload(sha: str) -> ObservedUpload | None:
    """The stored bundle ``sha`` as its record says, or None when it is not among the
    user's uploads (cached per session)."""
    cache = st.session_state.setdefault("_observed_uploads", {})
    if sha not in cache:
        asset = get_store().get_asset_info(sha)
        if asset is None or asset.kind != "observed":
            return None
        meta = asset.meta
        cache[sha] = ObservedUpload(
            TrainingRecord.from_json(meta["training"]),
            meta["shared"],
            meta["content_sha256"],
            asset.name,
        )
    return cache[sha]


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
        observed=state.get("observed") or None,
        code=state.get("code") or None,
        code_trusted=bool(state.get(TRUST_KEY, False)),
    )
    if setup.observed:
        bundle = observed_upload(setup.observed)  # None: setup_problems says so
        if bundle is not None:  # the bundle's model and normalisation, not the page's fields
            channels, size, _ = bundle.training.input_shape
            setup = dataclasses.replace(
                setup,
                bundle=bundle,
                architecture=bundle.training.model_spec().architecture,
                num_classes=bundle.training.num_classes,
                input_size=size,
                channels=channels,
                weights=None,
                normalization=bundle.training.normalization,
            )
    if (
        setup.torchvision and setup.bundle is None
    ):  # the Setup page hides these fields for a torchvision model
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
        asset = get_store().get_asset(sha)
        if asset is None or asset.kind != "model":
            cache[key] = (
                f"the weights {sha[:12]}... are not among your uploads in this dashboard's "
                "store; upload them again"
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
    if setup.source == "none" or not setup.images:
        return None
    images = stored_images(setup.images)
    if images is None:
        raise AuditInputError(
            f"the uploaded images {setup.images[:12]}... are not among your uploads in this "
            "dashboard's store; "
            "upload them again on the Setup page"
        )
    return images.window(0, setup.upload_count or len(images))


def setup_problems(setup: Setup, where: str = "on the Setup page") -> tuple[list[str], list[str]]:
    """(errors, missing): what the library refuses, and what has not been given yet."""
    errors: list[str] = []
    missing: list[str] = []
    if setup.observed and setup.bundle is None:
        errors.append(
            f"Observed update: the bundle {setup.observed[:12]}... is not among your uploads "
            f"in this dashboard's store; upload it again {where}"
        )
    if setup.source == "none" and setup.bundle is None:
        errors.append(
            "Images: only an observed update is audited without the client's images; pick a "
            f"sample set or upload images {where}, or upload an observed update"
        )
    if setup.own_class:
        _own_class_problems(setup, where, errors, missing)
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
    if images is not None and setup.bundle is not None:
        expected = setup.bundle.training.num_examples
        if len(images) != expected:
            errors.append(
                f"Images: the client trained on {expected} examples (the bundle's "
                f"num_examples) and the batch holds {len(images)}; give the client's {expected} "
                f"images {where}, or none (the reconstructions are then shown, not scored)"
            )
    if images is not None and images.labels is not None:
        try:
            check_labels_fit(images.labels, setup.num_classes, images.names)
        except AuditInputError as exc:
            errors.append(f"Labels: {exc}")
    return errors, missing


def _own_class_problems(setup: Setup, where: str, errors: list[str], missing: list[str]) -> None:
    """What a model class of the client's own code still needs: the admin's setting, its
    file uploaded, and the user's word that they trust it."""
    assert setup.bundle is not None
    model = setup.bundle.training.model
    name = PurePosixPath(own_code.parts(model)[0]).name
    if not trusted_code_setting().allowed:
        errors.append(f"Model: {own_class_refusal(model)}")
        return
    asset = get_store().get_asset_info(setup.code) if setup.code else None
    if setup.code and (asset is None or asset.kind != "code"):
        errors.append(
            f"Model: the file {setup.code[:12]}... named in the link is not among your uploads "
            f"in this dashboard's store; upload {name} again {where}"
        )
    elif asset is not None and asset.name != name:
        errors.append(
            f"Model: the uploaded file is {asset.name}; training.json names {model}, so upload "
            f"{name} {where}"
        )
    elif asset is None:
        missing.append(f"Model: upload {name}, the file that defines {model} {where}.")
    if not setup.code_trusted:
        missing.append(
            f"Model: tick that you trust {name} {where}: its code runs on this server, in a "
            "process of its own."
        )


def own_class_model(model: ModelRef, setup: Setup, assets: dict[str, bytes]) -> ModelRef:
    """``model`` built from the uploaded file of the client's own class (its bytes added to
    ``assets``; its sha256 in the run's identity, as the command line's file is); refused
    until the admin's setting, the file and the user's tick are all there."""
    errors: list[str] = []
    missing: list[str] = []
    _own_class_problems(setup, "on the Setup page", errors, missing)
    if errors or missing:
        raise AuditInputError((errors + missing)[0].removeprefix("Model: ").rstrip("."))
    asset = get_store().get_asset(setup.code) if setup.code else None
    if asset is None:
        raise AuditInputError("the model's file is gone from the store; upload it again")
    assets[asset.sha256] = asset.data
    return dataclasses.replace(model, content_sha256=asset.sha256, code_asset=asset.sha256)
