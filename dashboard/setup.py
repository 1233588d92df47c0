"""Setup page: the model under audit and the private batch a client would hold.

Uploads are validated by ``auditlib`` as soon as they arrive and, once accepted, stored as
content-addressed assets; their sha256 goes into the URL (``images``, ``weights``) so a
refresh or a shared link keeps them. Nothing runs here: the Attack lab starts runs.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from auditlib.data import (
    DEFAULT_LIMITS,
    SAMPLE_SETS,
    LabelledImages,
    images_zip,
    load_image_uploads,
    load_zip,
)
from auditlib.errors import AuditInputError
from auditlib.grids import thumbnail
from auditlib.models import ARCHITECTURES
from auditlib.models.loading import DEFAULT_MAX_BYTES
from auditlib.words import MB, count_of, size_text
from dashboard.common import (
    LAB_PAGE,
    TRUSTED_ARCHIVES_NOTE,
    batch_of,
    check_weights,
    current_setup,
    get_store,
    image_captions,
    limits_text,
    setup_problems,
    short_names,
    upload_cap,
)
from dashboard.state import (
    ACTIVATIONS,
    CHANNELS,
    CLASSES_RANGE,
    INITS,
    INPUT_SIZE_RANGE,
    MAX_SAMPLE_COUNT,
    MAX_UPLOAD_BATCH,
    SEED_RANGE,
    SETUP_DEFAULTS,
    SOURCES,
    STEMS,
    persist,
    set_url_state,
    upload_count_key,
)

IMAGE_TYPES = ["png", "jpg", "jpeg", "bmp", "tif", "tiff", "webp"]
WEIGHT_TYPES = ["safetensors", "pt", "pth"]
THUMBNAIL = 112  # pixels
SOURCE_LABELS = {"samples": "Bundled sample set", "upload": "My own images"}


def _inline_error(shown: list[str], message: str) -> None:
    """Show an upload's problem right where the upload is (and remember it was shown)."""
    st.error(message)
    shown.append(message)


def _field(key: str) -> str:
    return persist(key, SETUP_DEFAULTS[key])


def _model_section(errors: list[str]) -> None:
    st.header("Model")
    names = sorted(ARCHITECTURES)
    architecture = st.selectbox(
        "Architecture",
        names,
        persist_state="session",
        key=_field("architecture"),
        help="Built-in architectures of the papers. To audit your own trained model, pick its "
        "architecture here and upload its weights below.",
    )
    st.caption(ARCHITECTURES[architecture].description)
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
        help=f"Default for {architecture}: {ARCHITECTURES[architecture].default_activation}.",
    )
    if ARCHITECTURES[architecture].accepts_stem:
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
        key=_field("init"),
        help="uniform = every weight ~ U(-0.5, 0.5), the DLG/GRNN setting; default = "
        "PyTorch's. Ignored when you upload weights.",
    )
    _weights_upload(errors)


def _weights_upload(errors: list[str]) -> None:
    """Weights for the chosen architecture: checked against it at once, stored when they fit."""
    cap, cap_note = upload_cap(DEFAULT_MAX_BYTES // MB)
    upload = st.file_uploader(
        "Your trained weights (optional)",
        type=WEIGHT_TYPES,
        key=f"weights_file.{st.session_state.get('_weights_uploader', 0)}",
        max_upload_size=cap,
        help=f"A .safetensors file or a state_dict saved with torch.save (.pt/.pth), read "
        f"without running code, up to {size_text(DEFAULT_MAX_BYTES)}, for the architecture, "
        f"classes and input size chosen above.{cap_note}",
    )
    st.caption(
        "Upload weights (a state_dict or safetensors) of one of the built-in architectures. "
        + TRUSTED_ARCHIVES_NOTE
    )
    _removed_note("weights")
    setup = current_setup()
    try:
        spec = setup.model_spec()
    except AuditInputError as exc:
        _inline_error(errors, f"Model: {exc}")
        return
    with st.expander("How do I get weights for this model?"):
        _weights_howto(setup, spec)
    if upload is not None:
        signature = (upload.file_id, upload.name, upload.size, repr(spec))
        cached = st.session_state.get("_weights_upload")
        if cached is None or cached[0] != signature:
            data = upload.getvalue()
            problem = check_weights(data, upload.name, spec)
            sha = None
            if problem is None:
                sha = get_store().put_asset(
                    "model",
                    upload.name,
                    data,
                    meta={"architecture": spec.architecture, "num_classes": spec.num_classes},
                )
            cached = (signature, problem, sha)
            st.session_state["_weights_upload"] = cached
            set_url_state("weights", sha)
        _, problem, sha = cached
        if problem is not None:
            _inline_error(errors, f"Weights: {problem}")
            return
    sha = st.session_state.get("weights")
    if sha:
        asset = get_store().get_asset_info(sha)
        name = asset.name if asset is not None else "unknown file"
        size = size_text(asset.size) if asset is not None else "?"
        col_text, col_button = st.columns([4, 1])
        col_text.success(f"Using weights {name} ({size}, sha256 {sha[:12]}...).")
        col_button.button(
            "Remove",
            key="remove_weights",
            on_click=_remove,
            args=("weights",),
            help="Go back to the built-in initialisation; the file is deleted from the store "
            "unless stored runs use it.",
        )


def _weights_howto(setup, spec) -> None:
    """Three ways to weights that fit the model chosen above, with its own values filled in."""
    shape = f"({setup.channels}, {setup.input_size}, {setup.input_size})"
    stem = f', stem="{spec.stem}"' if spec.stem else ""
    file = f"{setup.architecture}.safetensors"
    st.markdown(
        "**Train it here** (FedAvg on a bundled labelled set, or `--images FOLDER` of your "
        "own), and save the trained model:"
    )
    st.code(
        f"python -m auditlib utility --model {setup.architecture} --num-classes "
        f"{setup.num_classes} --input-size {setup.input_size} --channels {setup.channels}"
        + (f" --stem {spec.stem}" if spec.stem else "")
        + f" --samples fashion-mnist --rounds 10 --save-weights {file}",
        language="bash",
    )
    st.markdown("**From your own training code**: build the same model, train it, save it:")
    st.code(
        "from safetensors.torch import save_file\n"
        "from auditlib.models import ModelSpec, build_model\n\n"
        f'model = build_model(ModelSpec("{setup.architecture}", {setup.num_classes}, '
        f"{shape}{stem}))\n"
        "...  # your training loop\n"
        f'save_file(model.state_dict(), "{file}")',
        language="python",
    )
    if ARCHITECTURES[setup.architecture].accepts_stem:
        st.markdown(
            "**A torchvision ResNet checkpoint** has the same layer names as the built-in "
            "ResNets with Stem **imagenet** (its 7x7 first convolution); choose that stem, its "
            "class count and input size, and upload its `state_dict` saved with `torch.save`."
        )
    st.caption(
        "The classes, the input size and the channels above must be the ones the weights "
        "were trained with; the upload is checked against them at once."
    )


def _remove(kind: str) -> None:
    """Take the upload out of the setup, empty its uploader (a new key gives a new widget)
    and delete it from the store unless stored runs use it (they name it)."""
    sha = st.session_state.get(kind)
    set_url_state(kind, None)
    st.session_state.pop(f"_{kind}_upload", None)
    st.session_state[f"_{kind}_uploader"] = st.session_state.get(f"_{kind}_uploader", 0) + 1
    if not sha:
        return
    store = get_store()
    users = store.runs_using_asset(sha)
    if users:
        note = (
            "Removed from the setup. The upload stays in the store, used by "
            f"{count_of(users, 'stored run')}; deleting those on the History page deletes it."
        )
    else:
        deleted = store.delete_asset(sha)
        note = "Removed" + (f" and deleted {deleted.name} from the store." if deleted else ".")
    st.session_state[f"_{kind}_removed"] = note


def _removed_note(kind: str) -> None:
    """What the last Remove did with the upload, shown once."""
    note = st.session_state.pop(f"_{kind}_removed", None)
    if note:
        st.info(note)


def _decode(files: list) -> LabelledImages:
    """One zip, or image files with an optional labels.csv, validated by ``auditlib.data``."""
    zips = [f for f in files if Path(f.name).suffix.lower() == ".zip"]
    if zips:
        if len(files) > 1:
            raise AuditInputError(
                "upload either one zip or image files (with an optional labels.csv), not both"
            )
        return load_zip(zips[0].getvalue())
    return load_image_uploads([(f.name, f.getvalue()) for f in files])


def _images_upload(errors: list[str]) -> None:
    """Validated uploads become a stored images asset; its sha256 goes into the URL."""
    limits = DEFAULT_LIMITS
    cap, cap_note = upload_cap(limits.max_archive_bytes // MB)
    files = st.file_uploader(
        "Images, a labels.csv, or one zip",
        type=[*IMAGE_TYPES, "csv", "zip"],
        accept_multiple_files=True,
        key=f"images_files.{st.session_state.get('_images_uploader', 0)}",
        max_upload_size=cap,
        help=f"{limits_text()} Labels: a labels.csv with columns filename,label (class ids or "
        "names), or in a zip one level of class folders (the folder names become the labels); "
        "without labels they are drawn at random from the model's classes. A zip may hold up "
        f"to {size_text(limits.max_archive_bytes)} unpacked in {limits.max_archive_members} "
        f"entries.{cap_note}",
    )
    st.caption(limits_text())
    _removed_note("images")
    if files:
        signature = tuple((f.file_id, f.name, f.size) for f in files)
        cached = st.session_state.get("_images_upload")
        if cached is None or cached[0] != signature:
            try:
                decoded = _decode(files)
            except AuditInputError as exc:
                cached = (signature, str(exc), None)
            else:
                data = images_zip(decoded)
                images = [f.name for f in files if not f.name.lower().endswith(".csv")]
                name = images[0] if len(images) == 1 else short_names(images)
                sha = get_store().put_asset(
                    "images",
                    name,
                    data,
                    meta={
                        "count": len(decoded),
                        "names": list(decoded.names),
                        "source": decoded.source,
                        "class_names": decoded.class_names and list(decoded.class_names),
                        "labelled": decoded.labels is not None,
                    },
                )
                st.session_state.setdefault("_stored_images", {})[sha] = decoded
                cached = (signature, None, sha)
            st.session_state["_images_upload"] = cached
            set_url_state("images", cached[2])
        if cached[1] is not None:
            _inline_error(errors, f"Upload refused: {cached[1]}")
            return
    sha = st.session_state.get("images")
    if not sha:
        return
    asset = get_store().get_asset_info(sha)
    if asset is None:
        _inline_error(
            errors,
            f"The images {sha[:12]}... named in the link are not in this dashboard's store; "
            "upload them again.",
        )
        return
    total = int(asset.meta.get("count") or 1)
    col_text, col_button = st.columns([4, 1])
    col_text.success(f"Using uploaded images: {asset.name} ({count_of(total, 'image')}).")
    col_button.button("Remove", key="remove_images", on_click=_remove, args=("images",))
    st.number_input(
        "Images in the batch",
        1,
        min(total, MAX_UPLOAD_BATCH),
        step=1,
        persist_state="session",
        key=persist(upload_count_key(sha), min(total, MAX_UPLOAD_BATCH)),
        help=f"The first images, in file-name order (at most {MAX_UPLOAD_BATCH} in one batch).",
    )


def _data_section(errors: list[str]) -> None:
    st.header("Private images")
    source = st.radio(
        "Images the client holds",
        list(SOURCES),
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
        st.number_input(
            "Images in the batch",
            1,
            MAX_SAMPLE_COUNT,
            step=1,
            persist_state="session",
            key=_field("count"),
        )
    else:
        _images_upload(errors)
    left, right = st.columns(2)
    left.text_input(
        "Normalisation",
        persist_state="session",
        key=_field("normalization"),
        help="'none' (the model sees pixels in [0, 1], as in DLG) or per-channel MEAN/STD, "
        "e.g. 0.5,0.5,0.5/0.5,0.5,0.5.",
    )
    right.number_input(
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
        [thumbnail(a, THUMBNAIL) for a in images.images],
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
    errors: list[str] = []
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
        st.page_link(LAB_PAGE, label="Continue to the Attack lab", icon=":material/science:")


main()
