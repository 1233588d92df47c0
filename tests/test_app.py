"""The dashboard: pages render, the main audit path runs, bad uploads are refused in words.

Streamlit's AppTest runs the scripts in this process, without a browser.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
from PIL import Image
from streamlit.testing.v1 import AppTest

from auditlib.engine.audit import METRIC_DEFINITION, prepare_victim
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
AUDIT_PAGE = str(ROOT / "pages" / "audit.py")
TIMEOUT = 60


def _page_module():
    """pages/audit.py as a module (its UI runs only as __main__)."""
    spec = importlib.util.spec_from_file_location("audit_page", AUDIT_PAGE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


page = _page_module()


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def test_app_shows_audit_page_then_method_page():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert [t.value for t in at.title] == ["Gradient-leakage audit"]
    assert not _errors(at)  # the defaults (bundled photographs, lenet, dlg) are valid
    assert not at.button(key="start").disabled

    at.switch_page("pages/about.py").run()
    assert not at.exception
    assert [t.value for t in at.title] == ["Method"]
    shown = " ".join(e.value for e in [*at.info, *at.markdown])
    assert METRIC_DEFINITION in shown
    assert "honest-but-curious" in shown


def test_audit_main_path_runs_and_keeps_result():
    at = AppTest.from_file(AUDIT_PAGE, default_timeout=TIMEOUT).run()
    assert not at.exception
    at.radio(key="source").set_value("samples")
    at.selectbox(key="sample_set").set_value("photographs")
    at.selectbox(key="architecture").set_value("lenet")
    at.selectbox(key="attack").set_value("dlg")
    at.run()
    at.number_input(key="iterations.dlg").set_value(5)
    at.button(key="start").click().run(timeout=TIMEOUT)

    assert not at.exception
    assert not _errors(at)
    assert any("PSNR" in s.value for s in at.success)
    assert any("PSNR" in m.label for m in at.metric)
    assert any("oracle" in m.label.lower() and "ground truth" in m.label for m in at.metric)
    result = at.session_state["last_run"]["result"]
    assert result.summary["attack"] == "dlg"
    assert result.summary["timing"]["iterations"] == 5
    assert result.reconstruction.shape == result.originals.shape

    # A rerun (any widget change) keeps showing the last result.
    at.run()
    assert any("PSNR" in s.value for s in at.success)
    assert "last_run" in at.session_state


def test_upload_that_is_not_an_image_is_refused_in_words():
    at = AppTest.from_file(AUDIT_PAGE, default_timeout=TIMEOUT).run()
    at.radio(key="source").set_value("images").run()
    assert any("Upload one or more images" in i.value for i in at.info)  # a hint, not an error
    assert not _errors(at)
    assert at.button(key="start").disabled
    at.file_uploader(key="images").set_value(("notes.png", b"just some text\n", "image/png"))
    at.run()
    assert not at.exception
    assert any("not an image" in message for message in _errors(at)), _errors(at)
    assert at.button(key="start").disabled


def test_uploaded_images_preview_with_labels():
    red = np.zeros((16, 16, 3), np.uint8)
    red[..., 0] = 255
    gray = np.full((20, 12), 90, np.uint8)
    at = AppTest.from_file(AUDIT_PAGE, default_timeout=TIMEOUT).run()
    at.radio(key="source").set_value("images").run()
    at.file_uploader(key="images").set_value(
        [
            ("b.png", _png(gray), "image/png"),
            ("a.png", _png(red), "image/png"),
            ("labels.csv", b"filename,label\na.png,3\nb.png,7\n", "text/csv"),
        ]
    )
    at.run()
    assert not at.exception
    assert not _errors(at)
    assert not at.button(key="start").disabled
    assert any("2 image(s) from upload; labels given" in c.value for c in at.caption)

    at.number_input(key="num_classes").set_value(5).run()  # label 7 does not fit 5 classes
    assert any("outside the model's 5 classes" in message for message in _errors(at))


def test_every_attack_and_defense_renders_its_fields():
    from auditlib.attacks import ATTACKS
    from auditlib.defenses import DEFENSES

    at = AppTest.from_file(AUDIT_PAGE, default_timeout=TIMEOUT).run()
    for name in sorted(ATTACKS):
        at.selectbox(key="attack").set_value(name).run()
        assert not at.exception, name
        assert not _errors(at), (name, _errors(at))
    for name in sorted(DEFENSES):
        at.selectbox(key="defense").set_value(name).run()
        assert not at.exception, name
        assert not _errors(at), (name, _errors(at))


def test_bad_defense_value_is_refused_before_running():
    at = AppTest.from_file(AUDIT_PAGE, default_timeout=TIMEOUT).run()
    at.selectbox(key="defense").set_value("prune").run()
    at.number_input(key="defense.prune.ratio").set_value(1.5).run()
    assert not at.exception
    assert any("ratio" in message and "[0, 1)" in message for message in _errors(at))
    assert at.button(key="start").disabled


def test_weights_that_do_not_fit_are_an_error_not_a_traceback():
    state = build_model(ModelSpec("lenet", 10, (3, 32, 32))).state_dict()
    data = safetensors.torch.save({k: v.contiguous() for k, v in state.items()})
    at = AppTest.from_file(AUDIT_PAGE, default_timeout=TIMEOUT).run()
    at.number_input(key="num_classes").set_value(5)
    at.file_uploader(key="weights").set_value(
        ("mine.safetensors", data, "application/octet-stream")
    )
    at.run()
    at.button(key="start").click().run(timeout=TIMEOUT)
    assert not at.exception
    assert any("do not fit" in message for message in _errors(at)), _errors(at)
    assert "last_run" not in at.session_state


def test_uploads_become_a_folder_the_engine_reads_back(tmp_path):
    red = np.zeros((16, 16, 3), np.uint8)
    red[..., 0] = 255
    gray = np.arange(12 * 20, dtype=np.uint8).reshape(20, 12)
    uploaded = page.decode_uploads(
        [
            ("photo one.png", _png(red)),
            ("b.png", _png(gray)),
            ("labels.csv", b"filename,label\nphoto one.png,1\nb.png,4\n"),
        ]
    )
    choices = page.Choices(
        source="upload", uploaded=uploaded, input_size=16, channels=3, attack="dlg"
    )
    spec = page.build_spec(choices, tmp_path)
    assert spec.data.source == "folder"
    assert (Path(spec.data.location) / "labels.csv").is_file()
    victim = prepare_victim(spec)
    assert victim.records["data"]["labels"] == [4, 1]  # name order: b.png, photo one.png
    assert victim.records["data"]["label_source"] == "given"
    assert victim.records["data"]["names"] == ["0-b.png", "1-photo_one.png"]
    assert tuple(victim.batch.images.shape) == (2, 3, 16, 16)


def test_uploaded_weights_are_loaded_and_hashed(tmp_path):
    spec = ModelSpec("lenet", 10, (3, 32, 32), init="default", seed=7)
    state = {k: v.contiguous() for k, v in build_model(spec).state_dict().items()}
    data = safetensors.torch.save(state)
    choices = page.Choices(init="default", seed=0, weights=("my model.safetensors", data))
    run_spec = page.build_spec(choices, tmp_path)
    assert run_spec.model.content_sha256 is not None
    assert Path(run_spec.model.weights).name == "my_model.safetensors"
    victim = prepare_victim(run_spec)
    for name, tensor in victim.model.state_dict().items():
        assert (tensor == state[name]).all(), name


def test_torchscript_weights_are_refused(tmp_path):
    # A TorchScript archive is a zip with code/ and constants.pkl; the library refuses it.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model/code/__torch__.py", "def forward(self): pass\n")
        archive.writestr("model/constants.pkl", b"\x80\x02}q\x00.")
        archive.writestr("model/data.pkl", b"\x80\x02}q\x00.")
    choices = page.Choices(weights=("model.pt", buffer.getvalue()))
    with pytest.raises(AuditInputError, match="TorchScript"):
        prepare_victim(page.build_spec(choices, tmp_path))


def test_result_helpers_speak_plainly():
    metrics = {
        "psnr_mean": 12.3456,
        "psnr_std": 0.5,
        "psnr_max": 13.0,
        "ssim_mean": None,
        "ssim_unavailable_reason": "images smaller than the 11-pixel window",
        "mse_mean": 0.06,
        "lpips_mean": None,
        "lpips_unavailable_reason": "LPIPS-alex unavailable: no weights",
        "lpips_vgg_mean": 0.4,
        "label_accuracy": 0.5,
    }
    rows = {r["Metric"]: r["Value"] for r in page.metric_rows(metrics)}
    assert rows["PSNR mean (dB)"] == "12.35"
    assert rows["SSIM mean"] == "unavailable: images smaller than the 11-pixel window"
    assert rows["LPIPS mean (AlexNet)"] == "unavailable: LPIPS-alex unavailable: no weights"
    assert rows["Label accuracy"] == "50%"

    assert page.privacy_text({"update_norm_before": 1.0}).startswith("No formal privacy")
    assert "set clip" in page.privacy_text(
        {"epsilon": None, "epsilon_unavailable_reason": "no clip bound; set clip=C"}
    )
    assert page.privacy_text({"epsilon": 2.5, "delta": 1e-5}).startswith("ε = 2.5, δ = 1e-05")

    text = page.summary_json({"a": math.nan, "b": (1, 2), "c": Path("/x")})
    assert json.loads(text) == {"a": None, "b": [1, 2], "c": "/x"}


def test_form_fields_record_only_changes():
    from auditlib.defenses.dp_noise import GaussianNoiseConfig

    defaults = page.config_defaults(GaussianNoiseConfig)
    assert defaults["clip"] is None and defaults["sigma"] == 0.1
    values = {"sigma": 0.1, "clip": "", "delta": 1e-5, "rounds": 3, "sample_rate": 1.0}
    assert page.changed_params(values, defaults) == {"rounds": 3}
    assert page.changed_params({**values, "clip": "2"}, defaults) == {"rounds": 3, "clip": "2"}
