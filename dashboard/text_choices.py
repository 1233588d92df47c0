"""The Text page's choices: the model (a preset or the auditor's folder of three files), the
private text (the demo text or a .txt/.csv), the client's protocol, the attacks (the
registry's, ``auditlib.attacks.text.TEXT_ATTACKS``) and the defense with its parameters;
and the ``TextAuditSpec`` with the uploads' bytes they make.

Uploads are validated by the library (``load_text_model``: safetensors only, no code run;
``parse_text_file``) before they are stored, as the user's assets (``text-model``,
``text``), and the page keeps their sha256 in the session.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import streamlit as st

from auditlib.attacks.text import TEXT_ATTACKS
from auditlib.data.text_samples import parse_text_file
from auditlib.defenses import DEFENSES
from auditlib.engine.ray_backend import offered_device
from auditlib.engine.text_audit import TEXT_DEFENSES, TextAuditSpec
from auditlib.engine.text_runs import OWN_MODEL, TextUploads, uploads_by_digest
from auditlib.errors import AuditInputError
from auditlib.models.text import MODEL_FILES, PRESETS, load_text_model
from dashboard.config_form import changed_params, config_defaults, config_inputs
from dashboard.forms import DEVICES
from dashboard.resources import get_store
from dashboard.state import persist

MODEL_ASSETS = "text_model_assets"  # session: {file name: sha256} of the uploaded folder
TEXT_ASSET = "text_data_asset"  # session: (file name, sha256) of the uploaded text
DEFAULT_PRESET = "gpt2"  # GPT-2 small: DAGER's, TAG's and LAMP's model
# session: how many times the upload boxes were emptied (their files deleted with a run);
# a box's key changes with it, as a file uploader cannot be emptied otherwise.
UPLOAD_ROUND = "text_upload_round"


def upload_key(name: str) -> str:
    """The upload box's key this round (the first round's is ``name`` itself)."""
    done = int(st.session_state.get(UPLOAD_ROUND, 0))
    return name if done == 0 else f"{name}.{done}"


def forget_uploads(deleted: set[str]) -> None:
    """The form lets go of uploads that were just deleted (their boxes emptied), so it
    neither names them nor stores them again on its next run."""
    held = st.session_state.get(TEXT_ASSET)
    model_gone = bool(set(st.session_state.get(MODEL_ASSETS, {}).values()) & deleted)
    text_gone = bool(held and held[1] in deleted)
    if model_gone:
        st.session_state.pop(MODEL_ASSETS, None)
    if text_gone:
        st.session_state.pop(TEXT_ASSET, None)
    if model_gone or text_gone:
        st.session_state[UPLOAD_ROUND] = int(st.session_state.get(UPLOAD_ROUND, 0)) + 1


@dataclass
class TextChoices:
    model: str = DEFAULT_PRESET
    text_file: str | None = None
    batch_size: int = 16
    length: int = 32
    lora_rank: int | None = None
    algorithm: str = "fedsgd"
    local_steps: int = 1
    learning_rate: float = 1e-4
    attacks: list[str] = field(default_factory=lambda: ["dager"])
    defense: str = "none"
    defense_params: dict[str, Any] = field(default_factory=dict)
    adaptive: bool = True
    preset: str = "strongest"  # TAG's and LAMP's settings: the strongest, or their papers'
    iterations: int | None = None  # TAG's and LAMP's steps; None: the preset's
    device: str = "cpu"

    def spec(self) -> TextAuditSpec:
        return TextAuditSpec(
            model=self.model, lora_rank=self.lora_rank, text_file=self.text_file,
            batch_size=self.batch_size, length=self.length, algorithm=self.algorithm,
            local_steps=self.local_steps, learning_rate=self.learning_rate,
            attacks=tuple(self.attacks), defense=self.defense,
            defense_params=dict(self.defense_params), adaptive=self.adaptive,
            preset=self.preset, iterations=self.iterations, device=self.device,
        )  # fmt: skip


def check_model_files(files: dict[str, bytes]) -> str:
    """The uploaded folder read as the library reads it; its description, or AuditInputError."""
    missing = [name for name in MODEL_FILES if name not in files]
    if missing:
        raise AuditInputError(
            f"your model folder needs {', '.join(MODEL_FILES)}; missing {', '.join(missing)}"
        )
    with tempfile.TemporaryDirectory(prefix="text-model-") as folder:
        for name in MODEL_FILES:
            (Path(folder) / name).write_bytes(files[name])
        model = load_text_model(Path(folder))
    count = sum(p.numel() for p in model.module.parameters())
    return f"a {model.family} ({model.backbone.config.model_type}), {count:,} parameters"


def _model_inputs(choices: TextChoices) -> None:
    source = st.radio(
        "Model", ["preset", "upload"], horizontal=True, key=persist("text_model_source", "preset"),
        format_func={"preset": "a preset (random weights)", "upload": "your model folder"}.get,
    )  # fmt: skip
    if source == "preset":
        names = list(PRESETS)
        choices.model = st.selectbox(
            "Preset", names, key=persist("text_preset", DEFAULT_PRESET),
            help="gpt2 and bert-base are the papers' sizes, llama-small the LLaMA architecture at "
            "GPT-2 small's; the tiny ones run in seconds.",
        )  # fmt: skip
        return
    uploads = st.file_uploader(
        "config.json, model.safetensors and tokenizer.json", accept_multiple_files=True,
        type=["json", "safetensors"], key=upload_key("text_model_files"),
    )  # fmt: skip
    if uploads:
        files = {u.name: u.getvalue() for u in uploads}
        try:
            about = check_model_files(files)
            store = get_store()
            st.session_state[MODEL_ASSETS] = {
                name: store.put_asset("text-model", name, files[name], {"role": name})
                for name in MODEL_FILES
            }
            st.session_state["text_model_about"] = about
        except AuditInputError as exc:
            st.session_state.pop(MODEL_ASSETS, None)
            st.error(f"Model folder refused: {exc}")
    if st.session_state.get(MODEL_ASSETS):
        st.success(f"Using your model: {st.session_state.get('text_model_about', '')}")
        choices.model = OWN_MODEL
    else:
        st.info("No model folder yet: upload its three files (no code in it is ever run).")
        choices.model = ""


def _text_inputs(choices: TextChoices) -> None:
    source = st.radio(
        "Private text", ["demo", "upload"], horizontal=True,
        key=persist("text_data_source", "demo"),
        format_func={"demo": "the demo text (New Testament verses)",
                     "upload": "your .txt (one sequence a line) or .csv (text, label)"}.get,
    )  # fmt: skip
    if source == "demo":
        return
    upload = st.file_uploader("Your text", type=["txt", "csv"], key=upload_key("text_data_file"))
    if upload is not None:
        data = upload.getvalue()
        try:
            rows = parse_text_file(upload.name, data)
            sha = get_store().put_asset("text", upload.name, data, {"sequences": len(rows.texts)})
            st.session_state[TEXT_ASSET] = (upload.name, sha, len(rows.texts))
        except AuditInputError as exc:
            st.session_state.pop(TEXT_ASSET, None)
            st.error(f"Text file refused: {exc}")
    held = st.session_state.get(TEXT_ASSET)
    if held:
        st.success(f"Using {held[0]}: {held[2]} sequences")
        choices.text_file = held[0]
    else:
        st.info("No text file yet: upload a .txt or .csv.")
        choices.text_file = ""


def _protocol_inputs(choices: TextChoices) -> None:
    left, middle, right = st.columns(3)
    choices.batch_size = int(
        left.number_input("Sequences (batch)", 1, 256, step=1, key=persist("text_batch", 16))
    )
    choices.length = int(
        middle.number_input("Tokens a sequence", 2, 512, step=1, key=persist("text_tokens", 32))
    )
    rank = int(
        right.number_input(
            "LoRA rank (0: every weight trains)", 0, 256, step=1, key=persist("text_lora", 0)
        )
    )
    choices.lora_rank = rank or None
    choices.algorithm = st.radio(
        "Client algorithm", ["fedsgd", "fedavg"], horizontal=True,
        key=persist("text_algorithm", "fedsgd"),
    )  # fmt: skip
    if choices.algorithm == "fedavg":
        a, b = st.columns(2)
        choices.local_steps = int(
            a.number_input("Local steps", 1, 100, key=persist("text_steps", 2))
        )
        choices.learning_rate = float(
            b.number_input("Learning rate", 1e-6, 1.0, format="%g", key=persist("text_lr", 1e-4))
        )


def _attack_inputs(choices: TextChoices) -> None:
    names = list(TEXT_ATTACKS)  # as the registry has them: helpers add theirs there
    default = ["dager"] if "dager" in names else names[:1]
    choices.attacks = st.multiselect(
        "Attacks", names, key=persist("text_attacks", default),
        format_func=lambda n: f"{n}: {TEXT_ATTACKS[n].title}",
    )  # fmt: skip
    left, right = st.columns(2)
    choices.preset = left.radio(
        "Optimising attacks' settings (TAG, LAMP)", ["strongest", "paper"], horizontal=True,
        key=persist("text_preset_kind", "strongest"),
        format_func={"strongest": "the strongest (default)", "paper": "their papers'"}.get,
    )  # fmt: skip
    steps = int(
        right.number_input(
            "Optimisation steps (0: the preset's)", 0, 100_000, step=50,
            key=persist("text_iterations", 0),
        )
    )  # fmt: skip
    choices.iterations = steps or None
    # The Lab's choice where the session made one; else cuda where Ray offers a GPU.
    default = st.session_state.get("device") or offered_device()
    choices.device = st.selectbox(
        "Device", DEVICES, key=persist("text_device", default),
        help="Where the model, the client's update and the attacks run: cuda asks Ray for one "
        "GPU (on this machine or a cluster's worker).",
    )  # fmt: skip


def defense_choice(choices: TextChoices, key: str = "text_defense") -> None:
    choices.defense = st.selectbox(
        "Defense", list(TEXT_DEFENSES), key=persist(key, "none"),
        help="The defenses that act on the update alone apply to a text model.",
    )  # fmt: skip
    info = DEFENSES[choices.defense]
    st.caption(info.summary)
    defaults = config_defaults(info.config_type)
    values = config_inputs(info.config_type, f"{key}.{choices.defense}", defaults)
    choices.defense_params = changed_params(values, defaults)
    choices.adaptive = st.checkbox(
        "Also run the attacker that knows the defense", key=persist("text_adaptive", True)
    )


def text_form() -> TextChoices:
    choices = TextChoices()
    st.subheader("Model and private text")
    _model_inputs(choices)
    _text_inputs(choices)
    st.subheader("The client's update")
    _protocol_inputs(choices)
    st.subheader("Attacks and defense")
    _attack_inputs(choices)
    defense_choice(choices)
    return choices


def problems(choices: TextChoices) -> list[str]:
    """What keeps the choices from a run, in words (empty: none)."""
    found = []
    if not choices.model:
        found.append("Upload your model folder's three files, or choose a preset.")
    if choices.text_file == "":
        found.append("Upload your text file, or choose the demo text.")
    if not choices.attacks:
        found.append("Choose at least one attack.")
    return found


def read_visible(sha256: str) -> bytes | None:
    """An upload's bytes as the signed-in user may read them (None: gone, or not theirs)."""
    asset = get_store().get_asset(sha256)
    return None if asset is None else asset.data


def uploads_of(choices: TextChoices) -> TextUploads:
    """The bytes the run needs, read back through the user's view of the store (their own
    uploads only)."""
    digests = dict(st.session_state.get(MODEL_ASSETS, {})) if choices.model == OWN_MODEL else {}
    text_name = None
    if choices.text_file:
        text_name, digests["text"], _ = st.session_state[TEXT_ASSET]
    return uploads_by_digest(digests, text_name, read_visible)
