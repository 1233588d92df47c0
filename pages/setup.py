"""Setup page: the model under audit and the private batch a client would hold.

The uploads (weights, images) are ``dashboard/uploads.py``: validated by ``auditlib`` as
soon as they arrive, stored as assets, their sha256 in the URL. Nothing runs here: the
Attack lab starts runs.
"""

from __future__ import annotations

import streamlit as st

from auditlib.data import SAMPLE_SETS
from auditlib.data.samples import sample_set_size
from auditlib.errors import AuditInputError
from auditlib.grids import thumbnail
from auditlib.models.registry import architecture_info
from auditlib.words import count_of
from dashboard.entry import through_app
from dashboard.image_display import image_captions, inline
from dashboard.navigation import LAB, TEXT
from dashboard.setup_state import batch_of, current_setup, setup_problems
from dashboard.state import (
    ACTIVATIONS,
    CHANNELS,
    CLASSES_RANGE,
    INITS,
    INPUT_SIZE_RANGE,
    MAX_SAMPLE_COUNT,
    SEED_RANGE,
    SETUP_DEFAULTS,
    SOURCES,
    STEMS,
    architecture_options,
    is_torchvision,
    persist,
)
from dashboard.uploads import images_upload, observed_bundle_upload, stored_uploads, weights_upload

through_app()  # a run that did not come through app.py goes through it (dashboard/entry.py)

THUMBNAIL = 112  # pixels
SOURCE_LABELS = {
    "samples": "Bundled sample set",
    "upload": "My own images",
    "none": "None (the reconstructions are shown, not scored)",
}


def _field(key: str) -> str:
    return persist(key, SETUP_DEFAULTS[key])


def _architecture_label(name: str) -> str:
    """'resnet18 (built-in)', 'resnet18 (torchvision)': the source said once."""
    if is_torchvision(name):
        return f"{name.split(':', 1)[1]} (torchvision)"
    return f"{name} (built-in)"


def _update_section(errors: list[str]) -> None:
    observed = bool(st.session_state.get("observed"))
    expander = st.expander(
        "Audit an update a client actually sent (an observed-update bundle)", expanded=observed
    )
    status = st.container()  # in sight whether the expander is open or not
    with expander:
        st.caption(
            "By default the audit simulates the client: the model below trains on the private "
            "images below. To audit what your federation really sent, upload the bundle the "
            "Flower recorder (`auditlib.flower`, docs/FLOWER.md) or your own code "
            "(docs/OBSERVED.md) wrote for one client of one round: the model, its weights and "
            "the client's training are then the bundle's, and the private images are optional "
            "(without them the reconstructions are shown, not scored)."
        )
        observed_bundle_upload(errors, status)


def _model_section(errors: list[str]) -> None:
    st.header("Model")
    setup = current_setup()
    if setup.bundle is not None:
        st.info(
            f"The observed update's model: {setup.model_text()}. Its architecture, classes, "
            "input size, normalisation and weights are the bundle's; remove the bundle above "
            "to choose a model here."
        )
        return
    architecture = st.selectbox(
        "Architecture",
        architecture_options(),
        format_func=_architecture_label,
        persist_state="session",
        key=_field("architecture"),
        help="The built-in architectures of the papers, then every torchvision classification "
        "model (type to search, e.g. mobilenet). To audit your own trained model, pick its "
        "architecture here and upload its weights below.",
    )
    try:
        info = architecture_info(architecture)
    except AuditInputError as exc:  # not expected: the options are the library's names
        _problem(errors, f"Model: {exc}")
        return
    st.caption(info.description)
    torchvision = info.source == "torchvision"
    left, right = st.columns(2)
    left.number_input(
        "Classes", *CLASSES_RANGE, step=1, persist_state="session", key=_field("num_classes")
    )
    right.number_input(
        "Input size (pixels, height = width)",
        *INPUT_SIZE_RANGE,
        step=1,
        persist_state="session",
        key=_field("input_size"),
        help="Images are centre-cropped and resized to this size.",
    )
    if torchvision:
        st.caption(
            f"{architecture} is built by torchvision (`weights=None`: nothing is downloaded) "
            "with your classes and input size. It takes colour input (3 channels; grayscale "
            "images are repeated to three), keeps its builder's activations and its "
            "PyTorch default initialisation, so the channel, activation, stem and "
            "initialisation choices of the built-ins do not apply."
        )
    else:
        _builtin_fields(architecture, info)
    weights_upload(errors)


def _problem(errors: list[str], message: str) -> None:
    st.error(message)
    errors.append(message)


def _builtin_fields(architecture: str, info) -> None:
    """The choices only the built-in architectures take."""
    left, right = st.columns(2)
    left.selectbox(
        "Channels",
        list(CHANNELS),
        format_func=lambda c: "3 (colour)" if c == 3 else "1 (grayscale)",
        persist_state="session",
        key=_field("channels"),
    )
    right.selectbox(
        "Activation",
        list(ACTIVATIONS),
        persist_state="session",
        key=_field("activation"),
        help=f"Default for {architecture}: {info.default_activation}.",
    )
    if info.accepts_stem:
        st.selectbox(
            "Stem",
            list(STEMS),
            persist_state="session",
            key=_field("stem"),
            help="The first layers of a ResNet: cifar = one 3x3 convolution; imagenet = "
            "torchvision's 7x7 convolution and max pool (torchvision checkpoints need it). "
            "automatic = cifar up to 64 pixels, imagenet above.",
        )
    st.radio(
        "Initialisation",
        list(INITS),
        horizontal=True,
        persist_state="session",
        key=_field("weights_init"),
        help="uniform = every weight ~ U(-0.5, 0.5), the DLG/GRNN setting; default = "
        "PyTorch's. Ignored when you upload weights.",
    )


def _data_section(errors: list[str]) -> None:
    st.header("Private images")
    observed = current_setup().bundle is not None
    sources = [s for s in SOURCES if observed or s != "none"]
    if st.session_state.get("source") not in (None, *sources):
        st.session_state["source"] = "samples"  # no images only for an observed update
    source = st.radio(
        "Images the client holds",
        sources,
        format_func=SOURCE_LABELS.get,
        horizontal=True,
        persist_state="session",
        key=_field("source"),
    )
    if source == "samples":
        names = list(SAMPLE_SETS)
        sample_set = st.selectbox(
            "Sample set", names, persist_state="session", key=_field("sample_set")
        )
        info = SAMPLE_SETS[sample_set]
        st.caption(f"{info.description}. {info.license_note}.")
        largest = min(MAX_SAMPLE_COUNT, sample_set_size(sample_set))
        # No bounds on the field itself: a value out of range is said here in words, never
        # refused silently by the widget (issue 52: 16 typed, a red icon, 1 image kept).
        count = st.number_input(
            "Images in the batch",
            step=1,
            persist_state="session",
            key=_field("count"),
            help=f"1 to {largest}: the client's batch, drawn from the sample set.",
        )
        if not 1 <= count <= largest:
            st.error(
                f"Images in the batch: {count} is out of range; the '{sample_set}' sample set "
                f"gives a batch of 1 to {largest} images (the attacks take at most "
                f"{MAX_SAMPLE_COUNT}). Nothing runs until it is in range."
            )
    elif source == "upload":
        images_upload(errors)
    else:
        st.caption(
            "The observed update is audited without the client's images: the attacks' "
            "reconstructions and their own losses are shown; nothing can be scored, and the "
            "verdict says so."
        )
    if observed:  # the bundle's normalisation; only the seed is chosen here
        st.caption(f"Normalisation: the bundle's ({current_setup().normalization}).")
        _seed_input(st)
        return
    left, right = st.columns(2)
    left.text_input(
        "Normalisation",
        persist_state="session",
        key=_field("normalization"),
        help="'none' (the model sees pixels in [0, 1], as in DLG) or per-channel MEAN/STD, "
        "e.g. 0.5,0.5,0.5/0.5,0.5,0.5.",
    )
    _seed_input(right)


def _seed_input(where) -> None:
    where.number_input(
        "Seed",
        *SEED_RANGE,
        step=1,
        persist_state="session",
        key=_field("seed"),
        help="Seeds the model initialisation, the sample draw, the labels and the attack.",
    )


def _batch_preview() -> None:
    """Thumbnails of the private batch with their detected sizes and labels."""
    setup = current_setup()
    try:
        images = batch_of(setup)
    except AuditInputError:
        return  # setup_problems reports it
    if images is None:
        return
    st.image(
        [inline(thumbnail(a, THUMBNAIL)) for a in images.images],
        caption=image_captions(images),
        width=THUMBNAIL,  # one size for all, whatever the caption's length
    )
    labels_note = (
        "labels given"
        if images.labels is not None
        else "no labels: they will be drawn at random from the model's classes (seeded)"
    )
    st.caption(
        f"{count_of(len(images), 'image')} from {images.source}; {labels_note}. Sizes as uploaded; "
        f"the model sees them at {setup.input_size}x{setup.input_size}."
    )


def main() -> None:
    st.title("Setup")
    st.caption(
        "Step 1 of 2: the model under audit and the private images one client holds. "
        "Then choose the attack and the defense in the Attack lab."
    )
    st.page_link(
        TEXT.path,
        label="A language model (GPT-2, BERT; every weight or LoRA)? Audit its text on Text models",
        icon=":material/article:",
    )
    errors: list[str] = []
    _update_section(errors)
    model_col, data_col = st.columns(2, gap="large")
    with model_col:
        _model_section(errors)
    with data_col:
        _data_section(errors)

    st.header("Private batch")
    more_errors, missing = setup_problems(current_setup(), where="under Private images above")
    _batch_preview()
    if not errors:  # with an upload refused above, "no images yet" says nothing new
        for message in missing:
            st.info(message)
    for message in more_errors:
        if message not in errors:
            st.error(message)
    errors += more_errors
    if not errors and not missing:
        st.page_link(LAB.path, label="Continue to the Attack lab", icon=":material/science:")
    stored_uploads()


main()
