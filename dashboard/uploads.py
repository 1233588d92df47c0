"""The Setup page's uploads: the model's weights, the private images, an observed update's
bundle and, where its training.json names a model class of the client's own code and an
admin allows trusted code (``auditlib.access.trusted_code``), that class's ``.py`` file.

Uploads are validated by ``auditlib`` as soon as they arrive (weights against the chosen
architecture, images against the data limits) and, once accepted, stored as
content-addressed assets; their sha256 goes into the URL (``images``, ``weights``) so a
refresh or a shared link keeps them. Remove takes an upload out of the setup and deletes it
from the store unless stored runs use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import streamlit as st

from auditlib.access.users import trusted_code_setting
from auditlib.data import DEFAULT_LIMITS, LabelledImages, images_zip, load_image_uploads, load_zip
from auditlib.errors import AuditInputError
from auditlib.models import ARCHITECTURES, own_code
from auditlib.models.loading import DEFAULT_MAX_BYTES
from auditlib.models.registry import architecture_info
from auditlib.observed import (
    CLIENT_FILE,
    DELTA_FILE,
    GLOBAL_FILE,
    TRAINING_FILE,
    bundle_from_upload,
)
from auditlib.observed.upload import max_archive_bytes, own_class_refusal
from auditlib.words import MB, count_of, size_text
from dashboard.auth import signed_in_only
from dashboard.plain import literal
from dashboard.resources import get_store
from dashboard.setup_state import TRUST_KEY, check_weights, current_setup, observed_upload
from dashboard.state import (
    MAX_UPLOAD_BATCH,
    TORCHVISION_PREFIX,
    persist,
    set_url_state,
    upload_count_key,
)

IMAGE_TYPES = ["png", "jpg", "jpeg", "bmp", "tif", "tiff", "webp"]
WEIGHT_TYPES = ["safetensors", "pt", "pth"]
TRUSTED_ARCHIVES_NOTE = (
    "TorchScript and torch.export archives can run code when they are loaded, so the dashboard "
    "does not accept them: trusted archives are CLI-only (`python -m auditlib audit "
    "--trusted-model FILE --i-trust-this-file ...`)."
)


def upload_cap(wanted_mb: int) -> tuple[int, str]:
    """Per-widget upload limit in MB and a note when the server's own cap is lower."""
    server_cap = int(st.get_option("server.maxUploadSize"))
    if server_cap >= wanted_mb:
        return wanted_mb, ""
    return server_cap, (
        f" This server accepts uploads up to {server_cap} MB (server.maxUploadSize); start it "
        f"with `--server.maxUploadSize {wanted_mb}` to allow {wanted_mb} MB."
    )


def limits_text() -> str:
    limits = DEFAULT_LIMITS
    return (
        f"At most {limits.max_images} images, each file up to {size_text(limits.max_file_bytes)} "
        f"and {limits.max_pixels / 1e6:.0f} megapixels ({limits.max_total_pixels / 1e6:.0f} "
        f"megapixels together), {limits.min_side} to {limits.max_side} "
        "pixels per side; PNG, JPEG, BMP, TIFF or WebP; or one zip of them up to "
        f"{size_text(limits.max_archive_bytes)}."
    )


def short_names(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _stored(kind: str, name: str, data: bytes, meta: dict) -> tuple[str | None, str | None]:
    """The upload stored (its sha256), or why not (the user's quota): one of the two."""
    try:
        return get_store().put_asset(kind, name, data, meta=meta), None
    except AuditInputError as exc:
        return None, str(exc)


def _inline_error(shown: list[str], message: str) -> None:
    """Show an upload's problem right where the upload is (and remember it was shown)."""
    st.error(message)
    shown.append(message)


def weights_upload(errors: list[str]) -> None:
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
        "Upload weights (a state_dict or safetensors) of the architecture chosen above: a "
        "built-in one or any torchvision classification model. " + TRUSTED_ARCHIVES_NOTE
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
                meta = {"architecture": spec.architecture, "num_classes": spec.num_classes}
                sha, problem = _stored("model", upload.name, data, meta)
            cached = (signature, problem, sha)
            st.session_state["_weights_upload"] = cached
            set_url_state("weights", sha)
        _, problem, sha = cached
        if problem is not None:
            _inline_error(errors, f"Weights: {problem}")
            st.info(auditable_note(spec.architecture))
            return
    sha = st.session_state.get("weights")
    if sha:
        asset = get_store().get_asset_info(sha)  # None: setup_problems says so
        size = size_text(asset.size) if asset is not None else "?"
        col_text, col_button = st.columns([4, 1])
        col_text.success(
            f"Using weights {_shown_name(upload, sha, asset)} ({size}, sha256 {sha[:12]}...)."
        )
        col_button.button(
            "Remove",
            key="remove_weights",
            on_click=_remove,
            args=("weights",),
            help="Go back to the built-in initialisation; the file is deleted from the store "
            "unless stored runs use it.",
        )


BUNDLE_TYPES = ["safetensors", "json", "zip"]


def observed_bundle_upload(errors: list[str], status) -> None:
    """An update a client sent (an observed-update bundle): checked by ``auditlib.observed``
    as it arrives, stored as one archive, its sha256 in the URL (``observed``). What became
    of it (refused, or in use with Remove) is drawn in ``status``, a container the page
    keeps in sight (the uploader's expander may be closed)."""
    cap, cap_note = upload_cap(max_archive_bytes() // MB)
    files = st.file_uploader(
        "The bundle's files, or one zip of its folder",
        type=BUNDLE_TYPES,
        accept_multiple_files=True,
        key=f"observed_files.{st.session_state.get('_observed_uploader', 0)}",
        max_upload_size=cap,
        help=f"{GLOBAL_FILE} (the weights the round started from), {CLIENT_FILE} (what the "
        f"client returned) or {DELTA_FILE} (its change), and {TRAINING_FILE} (how it "
        "trained), as written by the Flower recorder (auditlib.flower) or by your own code "
        f"(docs/OBSERVED.md); weights as safetensors only, never unpickled.{cap_note}",
    )
    with status:
        _observed_status(files, errors)


def _observed_status(files, errors: list[str]) -> None:
    _removed_note("observed")
    if files:
        trusted_code = trusted_code_setting().allowed  # the admin's, as the file has it now
        signature = (tuple((f.file_id, f.name, f.size) for f in files), trusted_code)
        cached = st.session_state.get("_observed_upload")
        if cached is None or cached[0] != signature:
            try:
                bundle, archive = bundle_from_upload(
                    [(f.name, f.getvalue()) for f in files], trusted_code=trusted_code
                )
            except AuditInputError as exc:
                cached = (signature, str(exc), None)
            else:
                name = (
                    files[0].name
                    if len(files) == 1
                    else f"bundle of {short_names([f.name for f in files])}"
                )
                record = bundle.training
                sha, problem = _stored(
                    "observed",
                    name,
                    archive,
                    {
                        "training": record.to_json(),
                        "shared": bundle.shared,
                        "content_sha256": bundle.content_sha256,
                        "architecture": bundle.model_spec.architecture,
                        "num_examples": record.num_examples,
                    },
                )
                cached = (signature, problem, sha)
            st.session_state["_observed_upload"] = cached
            set_url_state("observed", cached[2])
        if cached[1] is not None:
            _inline_error(errors, f"Observed update refused: {cached[1]}")
            return
    sha = st.session_state.get("observed")
    if not sha:
        return
    bundle = observed_upload(sha)
    if bundle is None:
        _inline_error(
            errors,
            f"The observed update {sha[:12]}... named in the link is not among your uploads in "
            "this dashboard's store; upload it again.",
        )
        return
    col_text, col_button = st.columns([4, 1])
    col_text.success(f"Auditing the update a client sent: {literal(bundle.describe())}.")
    col_button.button(
        "Remove",
        key="remove_observed",
        on_click=_remove,
        args=("observed",),
        help="Go back to simulating the client; the bundle is deleted from the store unless "
        "stored runs use it.",
    )
    if own_code.is_own_class(bundle.training.model):
        own_class_upload(errors, bundle.training.model)


def own_class_upload(errors: list[str], model: str) -> None:
    """The file of the model class of the client's own code that training.json names
    (``path/to/file.py:ClassName``), where an admin allows trusted code: checked without
    running it (``own_code.check_own_file``), stored as the user's private upload, its
    sha256 in the URL (``code``); the run builds the class only in a process of its own,
    and only once the user ticked that they trust the file."""
    file, cls = own_code.parts(model)
    name = Path(file).name
    if not trusted_code_setting().allowed:  # turned off since the bundle was taken
        _inline_error(errors, f"Model: {own_class_refusal(model)}")
        return
    st.markdown(
        f"training.json names **{literal(cls)}** in `{literal(file)}`, a model class of the "
        f"client's own code. Upload that file ({literal(name)}, one module: its sibling modules "
        "are not uploaded); it is kept as your private upload, seen only by you and an admin."
    )
    st.checkbox(
        f"I trust {literal(name)}: its code runs on this server, in a process of its own, "
        "when the audit builds the model",
        key=TRUST_KEY,
        help="An admin allows trusted code on this server. Tick this only for code you would "
        "run yourself: importing the file runs it on the server's workers.",
    )
    limit = own_code.MAX_FILE_BYTES
    upload = st.file_uploader(
        f"{literal(name)}, the file that defines {literal(cls)}",
        type=["py"],
        key=f"code_file.{st.session_state.get('_code_uploader', 0)}",
        max_upload_size=max(1, limit // MB),
        help=f"Python source up to {size_text(limit)}, read and parsed here without running "
        "it; it runs only in the audit's own process.",
    )
    _removed_note("code")
    if upload is not None:
        signature = (upload.file_id, upload.name, upload.size, model)
        cached = st.session_state.get("_code_upload")
        if cached is None or cached[0] != signature:
            data = upload.getvalue()
            try:
                own_code.check_own_file(data, upload.name, model)
            except AuditInputError as exc:
                cached = (signature, str(exc), None)
            else:
                sha, problem = _stored("code", name, data, {"model": model})
                cached = (signature, problem, sha)
            st.session_state["_code_upload"] = cached
            set_url_state("code", cached[2])
        if cached[1] is not None:
            _inline_error(errors, f"Model file refused: {cached[1]}")
            return
    sha = st.session_state.get("code")
    if not sha:
        return
    col_text, col_button = st.columns([4, 1])
    col_text.success(f"Building {literal(cls)} from your upload {literal(name)} ({sha[:12]}...).")
    col_button.button(
        "Remove",
        key="remove_code",
        on_click=_remove,
        args=("code",),
        help="The file is deleted from the store unless stored runs use it.",
    )


def auditable_note(architecture: str) -> str:
    """Which architectures the dashboard can audit, said beside a refusal of weights."""
    return (
        f"The weights were checked against **{architecture}**, the architecture chosen above. "
        f"Auditable are the built-in architectures ({', '.join(sorted(ARCHITECTURES))}) and "
        "any torchvision classification model as `torchvision:NAME` (e.g. "
        "`torchvision:resnet18`, `torchvision:mobilenet_v3_small`): the Architecture list "
        "above has them all, and `python -m auditlib models` lists them. Choose the one your "
        "weights were saved from, with its classes and input size; another model needs its "
        "weights converted to one of these first."
    )


def _shown_name(upload, sha: str, asset) -> str:
    """The name of the file in use: the one in the uploader when it holds these weights
    (the stored name is the one this user last uploaded these bytes under), else the stored
    one."""
    stored = literal(asset.name) if asset is not None else "an unknown file"
    if upload is None or literal(upload.name) == stored:
        return stored
    cached = st.session_state.get("_weights_upload")
    if cached is None or cached[2] != sha:
        return stored
    return f"{literal(upload.name)} (the same bytes as {stored}, uploaded before)"


def _weights_howto(setup, spec) -> None:
    """Three ways to weights that fit the model chosen above, with its own values filled in."""
    shape = f"({setup.channels}, {setup.input_size}, {setup.input_size})"
    stem = f', stem="{spec.stem}"' if spec.stem else ""
    file = f"{setup.architecture.removeprefix(TORCHVISION_PREFIX)}.safetensors"
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
    if setup.torchvision:
        name = setup.architecture.removeprefix(TORCHVISION_PREFIX)
        st.markdown(
            f"**A torchvision checkpoint**: the `state_dict` of `torchvision.models.{name}("
            f"num_classes={setup.num_classes})`, saved with `torch.save` or as safetensors, "
            "loads as it is (the input size above must be the one it was trained at for a "
            "ViT)."
        )
    if architecture_info(spec.architecture).accepts_stem:
        st.markdown(
            "**A torchvision ResNet checkpoint** has the same layer names as the built-in "
            "ResNets with Stem **imagenet** (its 7x7 first convolution); choose that stem, its "
            "class count and input size, and upload its `state_dict` saved with `torch.save`."
        )
    st.caption(
        "The classes, the input size and the channels above must be the ones the weights "
        "were trained with; the upload is checked against them at once."
    )


@signed_in_only
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


def images_upload(errors: list[str]) -> None:
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
                sha, problem = _stored(
                    "images",
                    name,
                    data,
                    {
                        "count": len(decoded),
                        "names": list(decoded.names),
                        "source": decoded.source,
                        "class_names": decoded.class_names and list(decoded.class_names),
                        "labelled": decoded.labels is not None,
                    },
                )
                if sha is not None:
                    st.session_state.setdefault("_stored_images", {})[sha] = decoded
                cached = (signature, problem, sha)
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
            f"The images {sha[:12]}... named in the link are not among your uploads in this "
            "dashboard's store; "
            "upload them again.",
        )
        return
    total = int(asset.meta.get("count") or 1)
    name = asset.name
    cached = st.session_state.get("_images_upload")
    if files and cached is not None and cached[2] == sha:  # as uploaded this time
        uploaded = [f.name for f in files if not f.name.lower().endswith(".csv")]
        name = uploaded[0] if len(uploaded) == 1 else short_names(uploaded)
    col_text, col_button = st.columns([4, 1])
    col_text.success(f"Using uploaded images: {literal(name)} ({count_of(total, 'image')}).")
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


def stored_uploads() -> None:
    """The signed-in user's uploads in the store (an admin's: everyone's), with Delete: an
    upload their runs use stays (the runs name it), one nobody else holds goes."""
    note = st.session_state.pop("_stored_deleted", None)
    if note:
        st.success(note)
    store = get_store()
    assets = store.list_assets()
    with st.expander(f"Your uploads in the store ({len(assets)})"):
        if not assets:
            st.caption("None yet: weights and images you upload above are kept here.")
            return
        st.dataframe(
            [
                {
                    "name": a.name,
                    "kind": a.kind,
                    "size": size_text(a.size),
                    "uploaded": f"{a.created_at.astimezone():%Y-%m-%d %H:%M}",
                    "your runs using it": store.runs_using_asset(a.sha256),
                    "sha256": a.sha256[:12],
                }
                for a in assets
            ],
            hide_index=True,
        )
        names = {a.sha256: f"{a.name} ({a.kind}, {a.sha256[:12]})" for a in assets}
        sha = st.selectbox("Upload", list(names), format_func=names.__getitem__, key="_stored")
        if st.button("Delete this upload", key="_stored_delete"):
            try:
                deleted = store.delete_asset(sha)
            except AuditInputError as exc:
                st.error(f"Not deleted: {exc}")
                return
            for kind in ("weights", "images", "observed", "code"):
                if st.session_state.get(kind) == sha:
                    set_url_state(kind, None)
            st.session_state["_stored_deleted"] = (
                f"Deleted {deleted.name} from the store."
                if deleted
                else "Your claim to it is gone; another user's upload of the same file stays."
            )
            st.rerun()
