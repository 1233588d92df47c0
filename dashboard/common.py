"""Shared UI helpers of the dashboard pages (not a page: ``app.py`` does not list it).

- The process-wide :class:`~auditlib.store.Store` and :class:`~auditlib.engine.runs.RunManager`
  (``st.cache_resource``): runs live in the server process, not in a browser session, so
  closing the browser does not stop them.
- (State that survives a page switch or a refresh is in ``dashboard/state.py``.)
- The setup (model + private batch) as plain values, its checks, and the ``RunSpec`` of a run.
- Formatting of results in plain words.

No torch math here: every decision about images, models, attacks and metrics is made in
``auditlib``; this module only collects choices and shows what the library says.
"""

from __future__ import annotations

import dataclasses
import io
import math
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import streamlit as st
from PIL import Image

from auditlib.attacks import ALL_ATTACKS, ALL_ATTACKS_LABEL
from auditlib.config import optional_inner
from auditlib.data import (
    DEFAULT_LIMITS,
    LabelledImages,
    check_labels_fit,
    load_sample_set,
    load_zip,
)
from auditlib.defenses import build_defense
from auditlib.engine.attack_phase import plan_attacks
from auditlib.engine.controls import stored_verdict, verdict_of
from auditlib.engine.runs import RunManager
from auditlib.errors import AuditInputError
from auditlib.fl.protocol import ClientProtocol
from auditlib.metrics.verdict import Verdict
from auditlib.models import ARCHITECTURES, ModelSpec, build_model, load_weights
from auditlib.spec import (
    Budget,
    ComponentSpec,
    DataSpec,
    ModelRef,
    RunSpec,
    ScenarioSpec,
    run_spec_from_dict,
)
from auditlib.store import AssetRecord, RunRecord, Store
from auditlib.store.convert import assets_in_spec
from auditlib.words import count_of, size_text
from dashboard.state import SETUP_DEFAULTS, persist, upload_count_key

SETUP_PAGE = "dashboard/setup.py"
LAB_PAGE = "dashboard/lab.py"
HISTORY_PAGE = "dashboard/history.py"
COMPARE_PAGE = "dashboard/compare.py"
TRADEOFF_PAGE = "dashboard/tradeoff.py"
METHOD_PAGE = "dashboard/about.py"

TRUSTED_ARCHIVES_NOTE = (
    "TorchScript and torch.export archives can run code when they are loaded, so the dashboard "
    "does not accept them: trusted archives are CLI-only (`python -m auditlib audit "
    "--trusted-model FILE --i-trust-this-file ...`)."
)

# --- process-wide resources -----------------------------------------------------------------


@st.cache_resource(show_spinner=False)
def get_store() -> Store:
    """The run store of this server process (``$AUDIT_DATABASE_URL`` or SQLite in ./data)."""
    return Store()


# Progress granularity of dashboard runs: an event every EMIT_EVERY steps and a live image
# every IMAGE_EVERY steps, so a run of a hundred steps shows its reconstruction converging.
EMIT_EVERY = 5
IMAGE_EVERY = 10


@st.cache_resource(show_spinner="Starting the run engine (Ray; once per server, a few seconds) ...")
def get_manager() -> RunManager:
    """The run manager of this server process; its runs outlive every browser session.

    Creating it marks runs that an earlier server left unfinished as failed
    (``orphans_failed``). Ray starts in the background (``app.py`` asks for it on the first
    page view) and ``RunManager.start`` waits for it.
    """
    return RunManager(get_store(), emit_every=EMIT_EVERY, image_every=IMAGE_EVERY)


# --- the setup: model and private batch -------------------------------------------------------


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
            stem=self.stem if ARCHITECTURES[self.architecture].accepts_stem else None,
            seed=self.seed,
        )

    def model_text(self) -> str:
        weights = "uploaded weights" if self.weights else f"{self.init} initialisation"
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
    return Setup(
        architecture=get("architecture"),
        num_classes=int(get("num_classes")),
        input_size=int(get("input_size")),
        channels=int(get("channels")),
        init=get("init"),
        activation=None if activation == "architecture default" else activation,
        stem=None if get("stem") == "automatic" else get("stem"),
        weights=state.get("weights") or None,
        source=get("source"),
        sample_set=get("sample_set"),
        count=int(get("count")),
        images=images or None,
        upload_count=upload_count,
        normalization=get("normalization"),
        seed=int(get("seed")),
    )


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


# --- the lab's choices and the run spec ---------------------------------------------------------


@dataclasses.dataclass
class LabChoices:
    """The Attack lab's choices: scenario, attack, defense and budget."""

    algorithm: str = "fedsgd"
    local_steps: int = 1
    local_lr: float = 0.01
    local_batch_size: int | None = None
    share: str = "delta"
    labels_known: bool = False
    attacker_knows_defense: bool = True
    attack: str = "dlg"
    preset: str | None = None
    attack_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    iterations: int = 100
    defense: str = "none"
    defense_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    time_budget: float | None = 120.0
    device: str = "cpu"

    def protocol(self) -> ClientProtocol:
        return ClientProtocol(
            algorithm=self.algorithm,
            local_steps=self.local_steps,
            local_lr=self.local_lr,
            local_batch_size=self.local_batch_size,
            shared=self.share,
        )


def build_run(setup: Setup, lab: LabChoices) -> tuple[RunSpec, dict[str, bytes], str]:
    """The run's spec, the uploaded assets it needs (sha256 -> bytes) and a title.

    Every check is the library's, so a bad value raises ``AuditInputError``.
    """
    store = get_store()
    assets: dict[str, bytes] = {}
    if setup.weights:
        asset = store.get_asset(setup.weights)
        if asset is None:
            raise AuditInputError("the uploaded weights are gone from the store; upload them again")
        assets[asset.sha256] = asset.data
    model = ModelRef(
        spec=setup.model_spec(), weights_asset=setup.weights, content_sha256=setup.weights
    )
    if setup.source == "samples":
        data = DataSpec(source="samples", location=setup.sample_set, batch_size=setup.count)
        images_text = f"{count_of(setup.count, 'image')} from '{setup.sample_set}'"
    else:
        if not setup.images:
            raise AuditInputError("no images uploaded yet; upload images or pick a sample set")
        asset = store.get_asset(setup.images)
        if asset is None:
            raise AuditInputError("the uploaded images are gone from the store; upload them again")
        assets[asset.sha256] = asset.data
        data = DataSpec(source="asset", location=asset.sha256, batch_size=setup.upload_count)
        count = setup.upload_count or asset.meta.get("count", "?")
        images_text = (
            count_of(count, "uploaded image") if isinstance(count, int) else "uploaded images"
        )
    data = dataclasses.replace(data, normalization=setup.normalization)
    spec = RunSpec(
        model=model,
        data=data,
        scenario=ScenarioSpec(
            protocol=lab.protocol(),
            labels_known=lab.labels_known,
            attacker_knows_defense=lab.attacker_knows_defense,
        ),
        attack=ComponentSpec.of(lab.attack, lab.attack_params, lab.preset),
        defense=ComponentSpec.of(lab.defense, lab.defense_params),
        budget=Budget(iterations=lab.iterations, max_seconds=lab.time_budget),
        seed=setup.seed,
        device=lab.device,
    )
    title = f"{attack_label(lab.attack)} vs {lab.defense} · {setup.architecture} · {images_text}"
    return spec, assets, title


def run_assets(spec: RunSpec) -> dict[str, bytes]:
    """The uploads a stored run spec needs (sha256 -> bytes), read back from the store.

    Raises AuditInputError when one is gone (a resumed batch cannot run without it).
    """
    store = get_store()
    assets = {}
    for sha in sorted(assets_in_spec(spec.to_dict())):
        asset = store.get_asset(sha)
        if asset is None:
            raise AuditInputError(
                f"the upload {sha[:12]}... is gone from the store; upload it again"
            )
        assets[sha] = asset.data
    return assets


def check_components(lab: LabChoices) -> list[str]:
    """The library's objections to the attack and defense parameters and the protocol."""
    errors = []
    try:
        lab.protocol()
    except AuditInputError as exc:
        errors.append(f"Scenario: {exc}")
    try:
        plan_attacks(ComponentSpec.of(lab.attack, lab.attack_params, lab.preset), lab.iterations)
    except AuditInputError as exc:
        errors.append(f"Attack: {exc}")
    try:
        build_defense(lab.defense, lab.defense_params)
    except AuditInputError as exc:
        errors.append(f"Defense: {exc}")
    return errors


def spec_text(spec: Mapping[str, Any]) -> dict[str, str]:
    """Attack, defense, model and batch of a stored run spec (``RunSpec.to_dict()``)."""

    def component(part: Mapping[str, Any]) -> str:
        params = ", ".join(f"{k}={v}" for k, v in part.get("params") or [])
        preset = f" [{part['preset']}]" if part.get("preset") else ""
        return f"{attack_label(part.get('name', '?'))}{preset}" + (f" ({params})" if params else "")

    model = spec.get("model", {})
    model_spec = model.get("spec", {})
    shape = "x".join(str(v) for v in model_spec.get("input_shape", ()))
    data = spec.get("data", {})
    if data.get("source") == "samples":
        images = f"{data.get('batch_size') or 1} from '{data.get('location')}'"
    elif data.get("source") == "asset":
        images = f"{data.get('batch_size') or 'all'} uploaded ({str(data.get('location'))[:8]})"
    else:
        images = f"{data.get('batch_size') or 'all'} from {data.get('location')}"
    protocol = spec.get("scenario", {}).get("protocol", {})
    scenario = str(protocol.get("algorithm", "?"))
    if protocol.get("algorithm") == "fedavg":
        scenario += f", {protocol.get('local_steps')} local steps, lr {protocol.get('local_lr')}"
    return {
        "attack": component(spec.get("attack", {})),
        "defense": component(spec.get("defense", {})),
        "model": f"{model_spec.get('architecture', '?')} ({shape}, "
        f"{model_spec.get('num_classes', '?')} classes"
        + (", uploaded weights" if model.get("weights_asset") else "")
        + ")",
        "batch": images,
        "scenario": scenario,
        "iterations": str(spec.get("budget", {}).get("iterations", "?")),
    }


# --- results in words ---------------------------------------------------------------------------


def number(value: Any, fmt: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, fmt)


def metric_rows(
    metrics: Mapping[str, Any], verdict: Verdict | None = None
) -> tuple[list[dict[str, str]], list[str]]:
    """The headline metrics as (metric, value) rows, the verdict first, and the notes that
    say why a metric is unavailable: the table says "unavailable (note 1)" and each
    distinct reason is written once below it, however many rows share it. The run's FedLeak
    band is never shown alone: only the verdict's level, which is "Inconclusive" where
    nothing follows from the run."""
    rows = [
        ("PSNR mean (dB)", "psnr_mean", ".2f", "psnr"),
        ("PSNR std (dB)", "psnr_std", ".2f", "psnr"),
        ("PSNR max (dB)", "psnr_max", ".2f", "psnr"),
        ("SSIM mean", "ssim_mean", ".3f", "ssim"),
        ("MSE mean", "mse_mean", ".4g", "mse"),
        ("LPIPS mean (AlexNet)", "lpips_mean", ".3f", "lpips"),
        ("LPIPS mean (VGG)", "lpips_vgg_mean", ".3f", "lpips_vgg"),
        ("Label accuracy", "label_accuracy", ".0%", "label_accuracy"),
        ("RDLV mean (vs the data's mean image)", "rdlv_mean", ".3f", "rdlv"),
    ]
    out = [{"Metric": "Verdict", "Value": verdict.headline if verdict else NO_VERDICT}]
    notes: list[str] = []
    for label, key, fmt, base in rows:
        value = metrics.get(key)
        if value is not None:
            text = number(value, fmt)
        elif reason := metrics.get(f"{base}_unavailable_reason"):
            if reason not in notes:
                notes.append(reason)
            text = f"unavailable (note {notes.index(reason) + 1})"
        else:
            text = "not computed"
        out.append({"Metric": label, "Value": text})
    return out, [f"{i}. {reason}" for i, reason in enumerate(notes, 1)]


# --- verdicts -----------------------------------------------------------------------------------

NO_VERDICT = "no verdict (recorded before verdicts)"
# How each outcome is drawn: Streamlit's alert (red, green, yellow) and an icon.
OUTCOME_STYLE = {
    "leaks": ("error", ":material/warning:"),
    "defense_held": ("success", ":material/shield:"),
    "inconclusive": ("warning", ":material/help:"),
}
SOK_CITATION = "Carletti et al., USENIX Security 2025"


def run_verdict(record: RunRecord) -> Verdict | None:
    """The verdict of a stored run with its undefended control (None for runs stored before
    verdicts, or without a result)."""
    if not record.summary:
        return None
    try:
        return verdict_of(get_store(), record)
    except (AuditInputError, KeyError, TypeError, ValueError):  # a spec of an older version
        return stored_verdict(record.summary)


def defended_spec(record: RunRecord) -> RunSpec | None:
    """The stored run's spec when it has a defense (and so a control); None otherwise, or
    for a spec of an older version."""
    try:
        spec = run_spec_from_dict(record.spec)
    except (AuditInputError, KeyError, TypeError, ValueError):
        return None
    return spec if spec.control() is not None else None


def finding_words(finding: Any) -> str:
    """A control's (or a run's) finding in a few words: its level, or that it recovered nothing."""
    if finding is None:
        return "n/a"
    if finding.leaked:
        return f"leaked ({finding.level}, {finding.images_recovered} of {finding.batch_size})"
    cut = f", {finding.stop_reason}" if finding.cut_short else ""
    return f"recovered nothing{cut}"


def verdict_cell(verdict: Verdict | None, *, control: bool = True) -> str:
    """The verdict in a table cell: level and outcome, and the control's result where the
    run had a defense. Only a finding carries a level; anything else reads "Inconclusive"."""
    if verdict is None:
        return NO_VERDICT
    if verdict.outcome == "leaks":
        text = f"{verdict.level}: leaks"
    elif verdict.outcome == "defense_held":
        text = "Low: defense held"
    else:
        text = "Inconclusive"
        if verdict.finding.cut_short:
            text += f" ({verdict.finding.stop_reason})"
    if control and verdict.scope.defense != "none":
        if verdict.control is not None:
            text += f" · control {finding_words(verdict.control)}"
        else:
            text += " · no control result yet"
    return text


def attack_label(name: str) -> str:
    return ALL_ATTACKS_LABEL if name == ALL_ATTACKS else name


def privacy_text(report: Mapping[str, Any]) -> str:
    """The defense's privacy statement in words: epsilon, or why there is none."""
    if "epsilon" not in report:
        return "No formal privacy guarantee: the update leaves the client as computed."
    epsilon = report["epsilon"]
    if epsilon is None:
        reason = report.get("epsilon_unavailable_reason") or "no reason given"
        return f"ε unavailable: {reason}"
    parts = [f"ε = {number(epsilon, '.4g')}"]
    if report.get("delta") is not None:
        parts.append(f"δ = {number(report['delta'], '.3g')}")
    if report.get("noise_multiplier") is not None:
        parts.append(f"noise multiplier {number(report['noise_multiplier'], '.3g')}")
    text = ", ".join(parts)
    details = [
        str(report[k]) for k in ("accountant", "unit", "neighbours", "sampling") if report.get(k)
    ]
    return f"{text} ({'; '.join(details)})" if details else text


def preset_label(preset: str | None) -> str:
    if preset is None:
        return "library defaults"
    if preset == "audit":
        return "audit: strongest settings (default)"
    if preset == "paper":
        return "paper settings (reproduction)"
    if preset.startswith("paper-"):
        return f"paper settings ({preset.removeprefix('paper-')})"
    return preset


# --- forms ------------------------------------------------------------------------------------


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


def _same_text(text: str, default: Any) -> bool:
    """Whether an optional field's text stands for its default ("30" for 30.0 too)."""
    if text.strip() == str(default):
        return True
    if isinstance(default, int | float) and not isinstance(default, bool):
        try:
            return float(text) == float(default)
        except ValueError:
            return False
    return False


def changed_params(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The form values that differ from the shown defaults (an empty text stands for None).

    Only these go into the spec, so a run with untouched fields has the same identity as the
    CLI run without parameters.
    """
    changed = {}
    for name, value in values.items():
        default = defaults.get(name)
        if isinstance(value, str) and not isinstance(default, str):
            same = (value.strip() == "" and default is None) or _same_text(value, default)
        else:
            same = value == default
        if not same:
            changed[name] = value
    return changed


def config_inputs(
    config_type: type, key: str, defaults: Mapping[str, Any], exclude: Sequence[str] = ()
) -> dict[str, Any]:
    """One input per field of a config dataclass (but ``exclude``): numbers, choices,
    switches, optional numbers.

    Values come back as the widgets give them; ``auditlib.config`` converts and checks them.
    """
    hints = typing.get_type_hints(config_type)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(config_type):
        if not f.init or f.name in exclude:
            continue
        name, annotation, default = f.name, hints[f.name], defaults.get(f.name)
        widget_key = f"{key}.{name}"
        label = name.replace("_", " ")
        if typing.get_origin(annotation) is typing.Literal:
            options = list(typing.get_args(annotation))
            start = default if default in options else options[0]
            values[name] = st.selectbox(
                label, options, persist_state="session", key=persist(widget_key, start)
            )
        elif annotation is bool:
            values[name] = st.checkbox(
                label, persist_state="session", key=persist(widget_key, bool(default))
            )
        elif annotation is int:
            values[name] = int(
                st.number_input(
                    label,
                    step=1,
                    persist_state="session",
                    key=persist(widget_key, int(default or 0)),
                )
            )
        elif annotation is float:
            values[name] = st.number_input(
                label,
                format="%g",
                persist_state="session",
                key=persist(widget_key, float(default or 0.0)),
            )
        else:
            optional = optional_inner(annotation) is not None
            values[name] = st.text_input(
                f"{label} (optional)" if optional else label,
                help="Leave empty for none." if optional else None,
                persist_state="session",
                key=persist(widget_key, "" if default is None else str(default)),
            )
    return values


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
        f"and {limits.max_pixels / 1e6:.0f} megapixels, {limits.min_side} to {limits.max_side} "
        "pixels per side; PNG, JPEG, BMP, TIFF or WebP; or one zip of them up to "
        f"{size_text(limits.max_archive_bytes)}."
    )


def image_captions(images: LabelledImages) -> list[str]:
    """'name (WxH) · label' for each image: the detected size before any resizing."""
    captions = []
    for i, name in enumerate(images.names):
        h, w = images.images[i].shape[:2]
        label = ""
        if images.labels is not None:
            label_id = images.labels[i]
            classes = images.class_names
            label = f" · {classes[label_id] if classes and label_id < len(classes) else label_id}"
        captions.append(f"{name} ({w}x{h}){label}")
    return captions


def png_width(png: bytes) -> int:
    """The pixel width of a PNG: images are shown at their natural size, pixels sharp."""
    with Image.open(io.BytesIO(png)) as image:
        return image.width


def short_names(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
