"""Audit page: choose a model, a private batch, a scenario, an attack and a defense; run it.

UI only. Every decision about images, models, attacks, defenses and metrics is made in
``auditlib``; this page collects choices, shows what the library says about them (in plain
words, before anything runs), runs one audit in this process and shows its result.

The helpers above ``main()`` do not touch Streamlit and can be imported by tests; Streamlit
runs this file as ``__main__``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import shutil
import tempfile
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import streamlit as st
from PIL import Image

from auditlib.attacks import ATTACKS, build_attack_config
from auditlib.data import (
    DEFAULT_LIMITS,
    SAMPLE_SETS,
    LabelledImages,
    check_labels_fit,
    load_image_uploads,
    load_sample_set,
    load_zip,
)
from auditlib.data.images import safe_stem, write_image_folder
from auditlib.defenses import DEFENSES, build_defense
from auditlib.engine.audit import AuditResult, run_audit
from auditlib.errors import AuditInputError
from auditlib.fl.protocol import ClientProtocol
from auditlib.models import ARCHITECTURES, ModelSpec
from auditlib.models.loading import DEFAULT_MAX_BYTES
from auditlib.report.images import comparison_grid, thumbnail
from auditlib.report.result_json import summary_json
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

MIB = 2**20
IMAGE_TYPES = ["png", "jpg", "jpeg", "bmp", "tif", "tiff", "webp"]
WEIGHT_TYPES = ["safetensors", "pt", "pth"]
MAX_SAMPLE_COUNT = 8
# A first run should take seconds to minutes, not the paper's hours; the paper's count is
# shown next to the field.
FIRST_RUN_ITERATIONS = {"dlg": 100, "idlg": 100, "ig": 300}
DEFAULT_ITERATIONS = 100
SOURCES = {
    "samples": "Bundled sample set",
    "images": "Upload image files",
    "zip": "Upload a zip",
}
TRUSTED_ARCHIVES_NOTE = (
    "TorchScript and torch.export archives can run code when they are loaded, so the dashboard "
    "does not accept them: trusted archives are CLI-only for now (`python -m auditlib audit "
    "--trusted-model FILE --i-trust-this-file ...`)."
)


# --- helpers without Streamlit -------------------------------------------------------------


@dataclasses.dataclass
class Choices:
    """Everything the form collects for one run, as plain values."""

    architecture: str = "lenet"
    num_classes: int = 10
    input_size: int = 32
    channels: int = 3
    init: str = "uniform"
    activation: str | None = None
    # (uploaded file name, bytes or a function returning them: read only when a run starts)
    weights: tuple[str, bytes | Callable[[], bytes]] | None = None
    source: str = "samples"  # "samples", or "upload" for validated uploaded images
    sample_set: str = "photographs"
    count: int = 1
    uploaded: LabelledImages | None = None
    upload_count: int | None = None  # images of the upload in the batch; None = all
    normalization: str = "none"
    algorithm: str = "fedsgd"
    local_steps: int = 1
    local_lr: float = 0.01
    local_batch_size: int | None = None
    share: str = "delta"
    labels_known: bool = False
    attack: str = "dlg"
    preset: str | None = None
    attack_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    iterations: int = 100
    defense: str = "none"
    defense_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    time_budget: float | None = 120.0
    seed: int = 0
    device: str = "cpu"

    def model_spec(self) -> ModelSpec:
        return ModelSpec(
            architecture=self.architecture,
            num_classes=self.num_classes,
            input_shape=(self.channels, self.input_size, self.input_size),
            init=self.init,
            activation=self.activation,
            seed=self.seed,
        )

    def protocol(self) -> ClientProtocol:
        return ClientProtocol(
            algorithm=self.algorithm,
            local_steps=self.local_steps,
            local_lr=self.local_lr,
            local_batch_size=self.local_batch_size,
            shared=self.share,
        )


def decode_uploads(files: Sequence[tuple[str, bytes]]) -> LabelledImages:
    """Uploaded image files (and an optional ``labels.csv``), validated by ``auditlib.data``.

    Raises ``AuditInputError`` with a plain-words message for anything that is not accepted.
    """
    return load_image_uploads(list(files))


def decode_zip(data: bytes) -> LabelledImages:
    """An uploaded zip of images, validated by ``auditlib.data``."""
    return load_zip(data)


def build_spec(choices: Choices, workdir: Path) -> RunSpec:
    """The ``RunSpec`` of the chosen run; uploaded files are written under ``workdir``.

    Built from the same objects as the CLI (``auditlib.cli.spec_from_args``); every check is
    the library's, so a bad value raises ``AuditInputError``.
    """
    weights_path = None
    weights_sha = None
    if choices.weights is not None:
        name, content = choices.weights
        data = content() if callable(content) else content
        suffix = Path(name).suffix.lower()
        # The library names the file in its messages: keep the uploaded name recognisable.
        suffix = suffix if suffix[1:] in WEIGHT_TYPES else ""
        weights_file = workdir / "weights" / f"{safe_stem(Path(name).name)}{suffix}"
        weights_file.parent.mkdir(parents=True, exist_ok=True)
        weights_file.write_bytes(data)
        weights_path = str(weights_file)
        weights_sha = hashlib.sha256(data).hexdigest()
    model = ModelRef(spec=choices.model_spec(), weights=weights_path, content_sha256=weights_sha)

    if choices.source == "samples":
        data_spec = DataSpec(
            source="samples", location=choices.sample_set, batch_size=choices.count
        )
    else:
        if choices.uploaded is None:
            raise AuditInputError("no images uploaded yet; upload images or pick a sample set")
        folder = workdir / "images"
        write_image_folder(choices.uploaded, folder)
        data_spec = DataSpec(
            source="folder",
            location=str(folder),
            batch_size=choices.upload_count,
            labels_csv=str(folder / "labels.csv") if choices.uploaded.labels is not None else None,
        )
    data_spec = dataclasses.replace(data_spec, normalization=choices.normalization)
    scenario = ScenarioSpec(protocol=choices.protocol(), labels_known=choices.labels_known)
    return RunSpec(
        model=model,
        data=data_spec,
        scenario=scenario,
        attack=ComponentSpec.of(choices.attack, choices.attack_params, choices.preset),
        defense=ComponentSpec.of(choices.defense, choices.defense_params),
        budget=Budget(iterations=choices.iterations, max_seconds=choices.time_budget),
        seed=choices.seed,
        device=choices.device,
    )


def _number(value: Any, fmt: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, fmt)


def _unavailable(metrics: Mapping[str, Any], key: str) -> str:
    reason = metrics.get(f"{key}_unavailable_reason")
    return f"unavailable: {reason}" if reason else "not computed"


def metric_rows(metrics: Mapping[str, Any]) -> list[dict[str, str]]:
    """The headline metrics as (metric, value) rows; an unavailable metric shows its reason."""
    rows = [
        ("PSNR mean (dB)", "psnr_mean", ".2f", "psnr"),
        ("PSNR std (dB)", "psnr_std", ".2f", "psnr"),
        ("PSNR max (dB)", "psnr_max", ".2f", "psnr"),
        ("SSIM mean", "ssim_mean", ".3f", "ssim"),
        ("MSE mean", "mse_mean", ".4g", "mse"),
        ("LPIPS mean (AlexNet)", "lpips_mean", ".3f", "lpips"),
        ("LPIPS mean (VGG)", "lpips_vgg_mean", ".3f", "lpips_vgg"),
        ("Label accuracy", "label_accuracy", ".0%", "label_accuracy"),
    ]
    out = []
    for label, key, fmt, base in rows:
        value = metrics.get(key)
        text = _unavailable(metrics, base) if value is None else _number(value, fmt)
        out.append({"Metric": label, "Value": text})
    return out


def privacy_text(report: Mapping[str, Any]) -> str:
    """The defense's privacy statement in words: epsilon, or why there is none."""
    if "epsilon" not in report:
        return "No formal privacy guarantee: the update leaves the client as computed."
    epsilon = report["epsilon"]
    if epsilon is None:
        reason = report.get("epsilon_unavailable_reason") or "no reason given"
        return f"ε unavailable: {reason}"
    parts = [f"ε = {_number(epsilon, '.4g')}"]
    if report.get("delta") is not None:
        parts.append(f"δ = {_number(report['delta'], '.3g')}")
    if report.get("noise_multiplier") is not None:
        parts.append(f"noise multiplier {_number(report['noise_multiplier'], '.3g')}")
    text = ", ".join(parts)
    details = [str(report[k]) for k in ("accountant", "unit") if report.get(k)]
    return f"{text} ({'; '.join(details)})" if details else text


def _optional_type(annotation: Any) -> Any | None:
    """``X`` for ``X | None`` annotations, else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if type(None) in args:
            others = [a for a in args if a is not type(None)]
            return others[0] if len(others) == 1 else None
    return None


def config_defaults(config_type: type, overrides: Mapping[str, Any] | None = None) -> dict:
    """Default value of every init field of a config dataclass, with ``overrides`` applied."""
    values = {}
    for f in dataclasses.fields(config_type):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
    values.update(overrides or {})
    return values


def changed_params(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The form values that differ from the shown defaults (an empty text stands for None).

    Only these go into the spec, so a run with untouched fields has the same identity as the
    CLI run without parameters.
    """
    changed = {}
    for name, value in values.items():
        default = defaults.get(name)
        if isinstance(value, str) and not isinstance(default, str):
            same = (value.strip() == "" and default is None) or value.strip() == str(default)
        else:
            same = value == default
        if not same:
            changed[name] = value
    return changed


def _preset_label(preset: str | None) -> str:
    if preset is None:
        return "library defaults"
    if preset == "paper":
        return "paper settings"
    if preset.startswith("paper-"):
        return f"paper settings ({preset.removeprefix('paper-')})"
    return preset


def _mib(num_bytes: int) -> int:
    return num_bytes // MIB


# --- Streamlit ------------------------------------------------------------------------------


def _upload_cap(wanted_mib: int) -> tuple[int, str]:
    """Per-widget upload limit in MB and a note when the server's own cap is lower."""
    server_cap = int(st.get_option("server.maxUploadSize"))
    if server_cap >= wanted_mib:
        return wanted_mib, ""
    return server_cap, (
        f" This server accepts uploads up to {server_cap} MB (server.maxUploadSize); start it "
        f"with `--server.maxUploadSize {wanted_mib}` to allow {wanted_mib} MB."
    )


def _config_inputs(config_type: type, key: str, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """One input per field of a config dataclass: numbers, choices, switches, optional numbers.

    Values come back as the widgets give them; ``auditlib.config`` converts and checks them.
    """
    hints = typing.get_type_hints(config_type)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(config_type):
        if not f.init:
            continue
        name, annotation, default = f.name, hints[f.name], defaults.get(f.name)
        widget_key = f"{key}.{name}"
        label = name.replace("_", " ")
        if typing.get_origin(annotation) is typing.Literal:
            options = list(typing.get_args(annotation))
            index = options.index(default) if default in options else 0
            values[name] = st.selectbox(label, options, index=index, key=widget_key)
        elif annotation is bool:
            values[name] = st.checkbox(label, value=bool(default), key=widget_key)
        elif annotation is int:
            values[name] = int(
                st.number_input(label, value=int(default or 0), step=1, key=widget_key)
            )
        elif annotation is float:
            values[name] = st.number_input(
                label, value=float(default or 0.0), format="%g", key=widget_key
            )
        elif _optional_type(annotation) is not None:
            values[name] = st.text_input(
                f"{label} (optional)",
                value="" if default is None else str(default),
                help="Leave empty for none.",
                key=widget_key,
            )
        else:
            values[name] = st.text_input(
                label,
                value="" if default is None else str(default),
                key=widget_key,
            )
    return values


def _decoded_upload(kind: str, files: list) -> LabelledImages | AuditInputError:
    """Decode uploads once per distinct set of files (widgets rerun the page often)."""
    signature = (kind, tuple((f.file_id, f.name, f.size) for f in files))
    cached = st.session_state.get("_decoded_upload")
    if cached is not None and cached[0] == signature:
        return cached[1]
    try:
        if kind == "zip":
            result: LabelledImages | AuditInputError = decode_zip(files[0].getvalue())
        else:
            result = decode_uploads([(f.name, f.getvalue()) for f in files])
    except AuditInputError as exc:
        result = exc
    st.session_state["_decoded_upload"] = (signature, result)
    return result


def _model_inputs(choices: Choices, errors: list[str]) -> None:
    st.header("Model")
    names = sorted(ARCHITECTURES)
    choices.architecture = st.selectbox(
        "Architecture",
        names,
        index=names.index("lenet"),
        key="architecture",
        help="Built-in architectures of the papers; upload weights below to audit your own.",
    )
    st.caption(ARCHITECTURES[choices.architecture].description)
    choices.num_classes = int(st.number_input("Classes", 2, 100_000, 10, step=1, key="num_classes"))
    choices.input_size = int(
        st.number_input(
            "Input size (pixels, height = width)",
            8,
            512,
            32,
            step=1,
            key="input_size",
            help="Images are centre-cropped and resized to this size.",
        )
    )
    choices.channels = st.selectbox(
        "Channels",
        [3, 1],
        format_func=lambda c: "3 (colour)" if c == 3 else "1 (grayscale)",
        key="channels",
    )
    choices.init = st.radio(
        "Initialisation",
        ["default", "uniform"],
        index=1,
        horizontal=True,
        key="init",
        help="uniform = every weight ~ U(-0.5, 0.5), the DLG/GRNN setting; default = "
        "PyTorch's. Ignored for weights you upload.",
    )
    activation = st.selectbox(
        "Activation",
        ["architecture default", "sigmoid", "relu"],
        key="activation",
        help=f"Default for {choices.architecture}: "
        f"{ARCHITECTURES[choices.architecture].default_activation}.",
    )
    choices.activation = None if activation == "architecture default" else activation
    cap, cap_note = _upload_cap(_mib(DEFAULT_MAX_BYTES))
    weights = st.file_uploader(
        "Weights (optional)",
        type=WEIGHT_TYPES,
        key="weights",
        max_upload_size=cap,
        help=f"A .safetensors file or a state_dict saved with torch.save (.pt/.pth), read "
        f"without running code, up to {_mib(DEFAULT_MAX_BYTES)} MB, for the architecture and "
        f"shape chosen above. {TRUSTED_ARCHIVES_NOTE}{cap_note}",
    )
    if weights is not None:
        choices.weights = (weights.name, weights.getvalue)
        st.caption(f"Weights: {weights.name} ({weights.size / MIB:.1f} MB), checked at start.")
    try:
        choices.model_spec()
    except AuditInputError as exc:
        errors.append(f"Model: {exc}")


def _data_inputs(choices: Choices, errors: list[str], missing: list[str]) -> None:
    st.header("Data")
    source = st.radio(
        "Images",
        list(SOURCES),
        format_func=SOURCES.get,
        key="source",
    )
    limits = DEFAULT_LIMITS
    limits_text = (
        f"At most {limits.max_images} images, each up to {_mib(limits.max_file_bytes)} MB and "
        f"{limits.max_pixels / 1e6:.0f} megapixels, at least {limits.min_side} pixels per side; "
        "PNG, JPEG, BMP, TIFF or WebP."
    )
    if source == "samples":
        names = list(SAMPLE_SETS)
        choices.source = "samples"
        choices.sample_set = st.selectbox(
            "Sample set",
            names,
            index=names.index("photographs"),
            key="sample_set",
        )
        info = SAMPLE_SETS[choices.sample_set]
        st.caption(f"{info.description}. {info.license_note}.")
        choices.count = int(
            st.number_input(
                "Images in the batch",
                1,
                MAX_SAMPLE_COUNT,
                1,
                step=1,
                key="count",
            )
        )
    elif source == "images":
        choices.source = "upload"
        cap, cap_note = _upload_cap(_mib(limits.max_file_bytes))
        files = st.file_uploader(
            "Image files (and an optional labels.csv)",
            type=[*IMAGE_TYPES, "csv"],
            accept_multiple_files=True,
            key="images",
            max_upload_size=cap,
            help=f"{limits_text} Labels: a labels.csv with columns filename,label (class ids "
            f"or names); without it labels are drawn at random from the model's classes.{cap_note}",
        )
        if files:
            decoded = _decoded_upload("images", files)
            if isinstance(decoded, AuditInputError):
                errors.append(str(decoded))
            else:
                choices.uploaded = decoded
        else:
            missing.append("Upload one or more images, or pick a bundled sample set.")
    else:
        choices.source = "upload"
        cap, cap_note = _upload_cap(_mib(limits.max_archive_bytes))
        archive = st.file_uploader(
            "Zip of images",
            type=["zip"],
            key="zip",
            max_upload_size=cap,
            help=f"Images at the top level or in one level of class subfolders (the folder "
            f"names become the labels), optionally with labels.csv. {limits_text} Up to "
            f"{_mib(limits.max_archive_bytes)} MB unpacked and {limits.max_archive_members} "
            f"entries.{cap_note}",
        )
        if archive is not None:
            decoded = _decoded_upload("zip", [archive])
            if isinstance(decoded, AuditInputError):
                errors.append(str(decoded))
            else:
                choices.uploaded = decoded
        else:
            missing.append("Upload a zip of images, or pick a bundled sample set.")
    if choices.uploaded is not None:
        total = len(choices.uploaded)
        choices.upload_count = int(
            st.number_input(
                "Images in the batch",
                1,
                total,
                total,
                step=1,
                key=f"upload_count.{total}",
                help="The first images, in file-name order.",
            )
        )
    choices.normalization = st.text_input(
        "Normalisation",
        "none",
        key="normalization",
        help="'none' (the model sees pixels in [0, 1], as in DLG) or per-channel MEAN/STD, "
        "e.g. 0.5,0.5,0.5/0.5,0.5,0.5.",
    )


def _scenario_inputs(choices: Choices, errors: list[str]) -> None:
    st.header("Scenario")
    choices.algorithm = st.radio(
        "Client protocol",
        ["fedsgd", "fedavg"],
        format_func={"fedsgd": "FedSGD", "fedavg": "FedAvg"}.get,
        horizontal=True,
        key="algorithm",
        help="FedSGD: the client sends one gradient of its whole batch. FedAvg: it takes "
        "local SGD steps and sends the change of its weights.",
    )
    if choices.algorithm == "fedavg":
        choices.local_steps = int(
            st.number_input("Local steps", 1, 1000, 1, step=1, key="local_steps")
        )
        choices.local_lr = st.number_input(
            "Local learning rate", value=0.01, format="%g", key="local_lr"
        )
        local_batch = int(
            st.number_input(
                "Local mini-batch size (0 = whole batch)",
                0,
                64,
                0,
                step=1,
                key="local_batch_size",
            )
        )
        choices.local_batch_size = local_batch or None
        choices.share = st.radio(
            "Client sends",
            ["delta", "weights"],
            format_func={"delta": "weight change", "weights": "new weights"}.get,
            horizontal=True,
            key="share",
        )
    choices.labels_known = st.checkbox(
        "Server knows the labels",
        key="labels_known",
        help="Threat model: the client shares its labels with the server.",
    )
    try:
        choices.protocol()
    except AuditInputError as exc:
        errors.append(f"Scenario: {exc}")


def _attack_inputs(choices: Choices, errors: list[str]) -> None:
    st.header("Attack")
    names = sorted(ATTACKS)
    choices.attack = st.selectbox(
        "Attack",
        names,
        index=names.index("dlg") if "dlg" in names else 0,
        key="attack",
    )
    info = ATTACKS[choices.attack]
    st.caption(info.summary)
    presets = [None, *info.presets]
    choices.preset = st.selectbox(
        "Settings",
        presets,
        index=presets.index("paper") if "paper" in presets else 0,
        format_func=_preset_label,
        key=f"preset.{choices.attack}",
    )
    paper = (
        f"The paper runs {info.paper_iterations:,} iterations; "
        if info.paper_iterations
        else "The paper gives no iteration count; "
    )
    choices.iterations = int(
        st.number_input(
            "Iterations",
            1,
            1_000_000,
            FIRST_RUN_ITERATIONS.get(choices.attack, DEFAULT_ITERATIONS),
            step=1,
            key=f"iterations.{choices.attack}",
            help=paper + "a small count keeps a first run short (the time budget stops it too).",
        )
    )
    defaults = config_defaults(
        info.config_type, info.presets.get(choices.preset) if choices.preset else None
    )
    with st.expander("Attack parameters"):
        st.caption(f"Shown: {_preset_label(choices.preset)}. Only changed values are recorded.")
        values = _config_inputs(
            info.config_type, f"attack.{choices.attack}.{choices.preset}", defaults
        )
    choices.attack_params = changed_params(values, defaults)
    try:
        build_attack_config(choices.attack, choices.attack_params, choices.preset)
    except AuditInputError as exc:
        errors.append(f"Attack: {exc}")


def _defense_inputs(choices: Choices, errors: list[str]) -> None:
    st.header("Defense")
    names = sorted(DEFENSES, key=lambda n: (n != "none", n))
    choices.defense = st.selectbox("Defense", names, key="defense")
    info = DEFENSES[choices.defense]
    st.caption(info.summary)
    defaults = config_defaults(info.config_type)
    values = _config_inputs(info.config_type, f"defense.{choices.defense}", defaults)
    choices.defense_params = changed_params(values, defaults)
    try:
        build_defense(choices.defense, choices.defense_params)
    except AuditInputError as exc:
        errors.append(f"Defense: {exc}")


def _run_inputs(choices: Choices) -> None:
    st.header("Run")
    choices.time_budget = float(
        st.number_input(
            "Time budget (seconds)",
            1,
            86_400,
            120,
            step=10,
            key="time_budget",
            help="The attack stops when this time is up and is scored as it stands.",
        )
    )
    choices.seed = int(
        st.number_input(
            "Seed",
            0,
            2**31 - 1,
            0,
            step=1,
            key="seed",
            help="Seeds the model initialisation, the sample draw, the labels and the attack.",
        )
    )
    choices.device = st.selectbox("Device", ["cpu", "cuda"], key="device")


def _show_batch(choices: Choices, errors: list[str]) -> None:
    """Thumbnails of the private batch, and the label check, before anything runs."""
    if choices.source == "samples":
        try:
            images = load_sample_set(choices.sample_set, choices.count, seed=choices.seed)
        except AuditInputError as exc:
            errors.append(str(exc))
            return
    elif choices.uploaded is not None:
        images = choices.uploaded
        used = choices.upload_count or len(images)
        images = dataclasses.replace(
            images,
            images=images.images[:used],
            names=images.names[:used],
            labels=None if images.labels is None else images.labels[:used],
        )
    else:
        return
    if images.labels is not None:
        try:
            check_labels_fit(images.labels, choices.num_classes, images.names)
        except AuditInputError as exc:
            errors.append(f"Labels: {exc}")
    captions = []
    for i, name in enumerate(images.names):
        h, w = images.images[i].shape[:2]
        label = ""
        if images.labels is not None:
            label_id = images.labels[i]
            classes = images.class_names
            label = f" · {classes[label_id] if classes and label_id < len(classes) else label_id}"
        captions.append(f"{name} ({w}x{h}){label}")
    st.image([thumbnail(a) for a in images.images], caption=captions)
    labels_note = (
        "labels given"
        if images.labels is not None
        else "no labels: they will be drawn at random from the model's classes (seeded)"
    )
    st.caption(f"{len(images)} image(s) from {images.source}; {labels_note}.")


def _run(choices: Choices) -> None:
    """Run one audit here and now, with a progress bar; keep the result in the session.

    The run happens inside this page run. Any click (Stop, a changed setting, another page)
    makes Streamlit abort it at the next progress update; ``run_state`` then stays
    "running" and the next page run says that the run was stopped.
    """
    st.session_state["run_state"] = "running"
    st.session_state.pop("run_error", None)
    workdir = Path(tempfile.mkdtemp(prefix="audit-upload-"))
    stop_slot = st.empty()
    try:
        stop_slot.button("Stop the audit", key="stop", help="Stops the run; nothing is kept.")
        with st.status("Running the audit ...", expanded=True) as status:
            progress = st.progress(0.0, text="preparing the victim's update")

            def on_event(event) -> None:
                total = max(int(event.total_steps), 1)
                losses = ", ".join(f"{k} {v:.4g}" for k, v in event.losses.items())
                text = f"step {event.step:,} of {total:,} · {event.elapsed_s:.1f} s"
                progress.progress(
                    min(max(event.step / total, 0.0), 1.0),
                    text=f"{text} · {losses}" if losses else text,
                )

            try:
                # Short runs report every step or so; long ones every 10 steps (the default).
                every = max(1, min(10, choices.iterations // 50))
                result = run_audit(
                    build_spec(choices, workdir), on_event=on_event, emit_every=every
                )
            except AuditInputError as exc:
                st.session_state["run_error"] = str(exc)
                status.update(label="The audit could not run", state="error")
            except Exception as exc:
                st.session_state["run_error"] = (
                    f"The audit failed: {type(exc).__name__}: {exc}. This is a bug in the audit "
                    "tool, not a problem with your input."
                )
                status.update(label="The audit failed", state="error")
            else:
                st.session_state["last_run"] = {"result": result, "choices": choices}
                status.update(label="Audit finished", state="complete", expanded=False)
        st.session_state.pop("run_state", None)
        stop_slot.empty()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _show_result(result: AuditResult) -> None:
    summary = result.summary
    metrics = summary["metrics"]
    oracle = summary["oracle_best"]
    timing = summary["timing"]
    st.header("Result")
    st.success(
        f"{summary['attack']} against {summary['defense']}: PSNR {_number(metrics['psnr_mean'], '.2f')} dB "
        f"(mean over {len(result.originals)} image(s)), {timing['iterations']} iterations in "
        f"{timing['seconds']:.1f} s, stopped: {summary['stop_reason']}."
    )
    height = result.originals.shape[1]
    scale = max(1, min(4, 128 // max(height, 1)))
    grid = comparison_grid(result.originals, result.reconstruction, scale=scale)
    st.image(
        grid,
        width=grid.width,  # natural size: upscaled pixels stay sharp
        caption="Top: the private images (only the auditor sees them). Bottom: the attacker's "
        "reconstruction (its lowest-loss restart, chosen without ground truth), each matched "
        "to its original.",
    )
    col1, col2, col3 = st.columns(3)
    col1.metric("PSNR mean (attacker's pick)", f"{_number(metrics['psnr_mean'], '.2f')} dB")
    col2.metric(
        "Oracle best PSNR (uses ground truth)",
        f"{_number(oracle['psnr_mean'], '.2f')} dB",
        help="The best restart chosen with the private images: an upper bound on what the "
        "attack found, not a choice the attacker can make.",
    )
    ssim = metrics.get("ssim_mean")
    col3.metric("SSIM mean", _number(ssim, ".3f") if ssim is not None else "n/a")

    st.subheader("Metrics (attacker's pick)")
    st.table(metric_rows(metrics))
    st.caption(f"Metric definition: {summary['config']['metric_definition']}.")

    st.subheader("Defense")
    report = summary["defense_report"]
    st.write(privacy_text(report))
    before, after = report.get("update_norm_before"), report.get("update_norm_after")
    if before is not None and after is not None:
        st.caption(f"Update norm before the defense {before:.4g}, after {after:.4g}.")

    st.subheader("Timing")
    per_second = timing.get("iterations_per_second")
    st.write(
        f"{timing['seconds']:.1f} s for {timing['iterations']} iterations"
        + (f" ({per_second:.2f} per second)" if per_second else "")
        + f"; stop reason: {summary['stop_reason']}."
    )

    with st.expander("Per image"):
        rows = []
        for p in metrics["per_image"]:
            rows.append(
                {
                    "image": p["name"],
                    "true label": str(p["true_label"]),
                    "recovered label": str(p.get("recovered_label", "n/a")),
                    "PSNR (dB)": _number(p["psnr"], ".2f"),
                    "SSIM": _number(p.get("ssim"), ".3f"),
                    "LPIPS (AlexNet)": _number(p.get("lpips_alex"), ".3f"),
                }
            )
        st.table(rows)
    with st.expander("Threat model and victim"):
        st.json(
            summary_json({"threat_model": summary["threat_model"], "victim": summary["victim"]})
        )

    col_json, col_png = st.columns(2)
    col_json.download_button(
        "Download result.json",
        summary_json(summary),
        file_name="result.json",
        mime="application/json",
        key="download_json",
    )
    png = _png_bytes(grid)
    col_png.download_button(
        "Download reconstruction.png",
        png,
        file_name="reconstruction.png",
        mime="image/png",
        key="download_png",
    )


def _png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def main() -> None:
    st.title("Gradient-leakage audit")
    st.caption(
        "How much of a client's private images can an honest-but-curious server rebuild from "
        "the update it receives? Pick a model, a private batch, an attack and a defense, then "
        "start. The run happens in this browser session: changing a setting, switching pages "
        "or pressing 'Stop the audit' while it runs ends it."
    )
    if st.session_state.pop("run_state", None) == "running":
        st.warning("The last run was stopped before it finished; nothing was kept.")

    choices = Choices()
    errors: list[str] = []  # inputs the library refuses
    missing: list[str] = []  # inputs not given yet
    with st.sidebar:
        _model_inputs(choices, errors)
        _data_inputs(choices, errors, missing)
        _scenario_inputs(choices, errors)
        _attack_inputs(choices, errors)
        _defense_inputs(choices, errors)
        _run_inputs(choices)

    st.subheader("Private batch")
    _show_batch(choices, errors)
    for message in missing:
        st.info(message)
    for message in errors:
        st.error(message)

    if st.button(
        "Start audit",
        type="primary",
        key="start",
        disabled=bool(errors or missing),
        help="Fix the problems above first." if errors or missing else None,
    ):
        _run(choices)

    if "run_error" in st.session_state:
        st.error(st.session_state["run_error"])
    last = st.session_state.get("last_run")
    if last is not None:
        _show_result(last["result"])


if __name__ == "__main__":
    main()
