"""The dashboard's pages under Streamlit's AppTest (no browser): main paths and error paths.

Runs are real: the Attack lab starts them on the process-wide RunManager (one Ray instance
for the session, see conftest.py) backed by a SQLite store in a temporary folder.

Why one file over 400 lines: it is the specification of one package or page set, read
from top to bottom; its tests share fixtures and helpers defined here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from PIL import Image
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the dashboard is imported as a package from the repo root
    sys.path.insert(0, str(ROOT))

from auditlib.errors import AuditInputError  # noqa: E402
from auditlib.metrics.catalogue import CATALOGUE, METRIC_DEFINITION  # noqa: E402
from auditlib.metrics.scores import Scores  # noqa: E402
from auditlib.models import ModelSpec, build_model  # noqa: E402
from auditlib.result import DefenseReport  # noqa: E402
from auditlib.spec import (  # noqa: E402
    Budget,
    ComponentSpec,
    DataSpec,
    ModelRef,
    RunSpec,
    ScenarioSpec,
    run_spec_from_dict,
)
from dashboard import config_form, result_words, spec_words  # noqa: E402
from dashboard import state as url_state  # noqa: E402
from dashboard.navigation import (  # noqa: E402
    COMPARE,
    HISTORY,
    LAB,
    METHOD,
    PAGES,
    SAMPLE,
    SETUP,
    TRADEOFF,
)
from tests.page_faults import page_faults  # noqa: E402

APP = str(ROOT / "app.py")
EXAMPLES = ROOT / "assets" / "example-images"
TIMEOUT = 60
# A script run that compiles a step (the estimate of a compiled step times its tracing):
# with torch's kernel cache cold, as on a fresh CI machine, it timed out at 60 s in CI and
# took about 80 s on a 2-core Xeon (94 s the whole test); 22-24 s with the cache warm.
COMPILING_TIMEOUT = 300


def _app(user: str = "alice", **query) -> AppTest:
    """The dashboard with ``user`` signed in (as streamlit-authenticator leaves the session
    after a successful sign-in), opened at ``query``."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["authentication_status"] = True
    at.session_state["username"] = user
    at.query_params.update(query)
    return at.run()


def _errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


LOW = re.compile(r"\bLow\b")


def _page_text(at: AppTest) -> str:
    """Every text the page shows: alerts, markdown, captions, headings, metrics, tables,
    data frames and the options of its select boxes."""
    parts = [
        e.value
        for kind in ("markdown", "caption", "info", "warning", "error", "success", "subheader")
        for e in getattr(at, kind)
    ]
    parts += [f"{m.label} {m.value}" for m in at.metric]
    parts += [t.value.to_string() for t in at.table]
    parts += [d.value.to_string() for d in at.dataframe]
    parts += [str(o) for s in at.selectbox for o in s.options]
    return "\n".join(parts)


def _verdict_headlines(at: AppTest) -> list[str]:
    """The verdict's headline box (bold, coloured by outcome)."""
    return [
        a.value.strip("*")
        for kind in ("error", "success", "warning")
        for a in getattr(at, kind)
        if a.value.startswith("**")
    ]


def _start_run(at: AppTest) -> None:
    """Click Start: no exception and no error on the page but a run's verdict, which a short
    run can already show (``page_faults``)."""
    at.button(key="start").click().run()
    assert not at.exception and not page_faults(at), page_faults(at)


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _example_files() -> list[tuple[str, bytes, str]]:
    """The example images and their labels.csv, as the browser uploads them."""
    return [
        (p.name, p.read_bytes(), "text/csv" if p.suffix == ".csv" else "image/png")
        for p in sorted(EXAMPLES.iterdir())
    ]


def _lenet_weights(num_classes: int = 10) -> bytes:
    state = build_model(ModelSpec("lenet", num_classes, (3, 32, 32))).state_dict()
    return safetensors.torch.save({k: v.contiguous() for k, v in state.items()})


def _tiny_spec(iterations: int = 2) -> RunSpec:
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 32, 32), init="uniform")),
        data=DataSpec("samples", "photographs", batch_size=1),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(iterations),
    )


# --- navigation ---------------------------------------------------------------------------


def test_every_page_renders(dashboard_store):
    at = _app()
    assert not at.exception
    assert [t.value for t in at.title] == ["Setup"]
    assert not _errors(at)  # the defaults (bundled photographs, lenet) are valid
    for page, title in [
        (LAB.path, "Attack lab"),
        (COMPARE.path, "Compare defenses"),
        (TRADEOFF.path, "Utility-privacy trade-off"),
        (HISTORY.path, "History"),
        (METHOD.path, "Method"),
    ]:
        at.switch_page(page).run()
        assert not at.exception, page
        assert [t.value for t in at.title] == [title]
        assert not _errors(at), (page, _errors(at))
    shown = " ".join(e.value for e in [*at.info, *at.markdown])
    assert METRIC_DEFINITION in shown
    # The Method page lists every metric of the one catalogue, with its definition and
    # direction as the catalogue states them.
    listed = {
        row["metric"]: (row["definition"], row["direction"])
        for table in at.table
        if "definition" in table.value.columns
        for _, row in table.value.iterrows()
    }
    assert listed == {m.heading: (m.definition, m.direction) for m in CATALOGUE.values()}


def test_the_pages_are_scripts_in_their_own_folder():
    """app.py registers the page scripts of pages/; the helpers stay outside."""
    assert [p.title for p in PAGES] == [
        "Setup",
        "Attack lab",
        "Sample",
        "Compare",
        "Trade-off",
        "Text models",
        "History",
        "Method",
    ]
    pages = ROOT / "pages"
    assert {(ROOT / p.path) for p in PAGES} == set(pages.glob("[!_]*.py"))
    for page in pages.glob("[!_]*.py"):
        assert "\nthrough_app()" in page.read_text(), f"{page.name} does not go through app.py"


def test_a_page_script_run_without_app_py_still_asks_for_the_sign_in(dashboard_store):
    """With pages/ beside app.py, Streamlit's first multipage mode runs a page script before
    app.py's navigation on a process's first run (and on every AppTest run): a visitor who
    opens a page's URL then gets the sign-in form, never the page."""
    for ref in PAGES:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.switch_page(ref.path).run()
        assert not at.exception, ref.title
        assert [t.value for t in at.title] == ["FL gradient-leakage audit"], ref.title
        assert any("Sign in to see" in c.value for c in at.caption), ref.title
        assert not at.header and not at.tabs, ref.title
    # Signed in, the same direct run renders the page once, through app.py.
    at = _app()
    at.switch_page(LAB.path).run()
    assert not at.exception
    assert [t.value for t in at.title] == ["Attack lab"]


def test_the_device_is_cuda_by_default_where_ray_offers_a_gpu(dashboard_store, monkeypatch):
    """A GPU worker's dashboard offers its GPU: the Lab's device is cuda by default where
    Ray offers a GPU (this machine's or the cluster's), cpu where it offers none."""
    from auditlib.engine import ray_backend

    at = _app()
    at.switch_page(LAB.path).run()
    assert ray_backend.gpus_offered() == 0  # this machine's Ray: no GPU
    assert at.selectbox(key="device").value == "cpu"
    monkeypatch.setattr(ray_backend, "gpus_offered", lambda: 1)
    offered = _app()
    offered.switch_page(LAB.path).run()
    assert not offered.exception
    assert offered.selectbox(key="device").value == "cuda"


# --- Setup ----------------------------------------------------------------------------------


def test_setup_bundled_samples_show_thumbnails_with_sizes(dashboard_store):
    at = _app()
    at.radio(key="source").set_value("samples")
    at.selectbox(key="sample_set").set_value("digits")
    at.number_input(key="count").set_value(3).run()
    assert not at.exception
    assert not _errors(at)
    assert at.get("image"), "no thumbnails"
    assert any("3 images from sample set 'digits'" in c.value for c in at.caption), [
        c.value for c in at.caption
    ]
    # The choice survives a trip to another page and back.
    at.switch_page(LAB.path).run()
    assert any("3 from the 'digits' sample set" in m.value for m in at.markdown)
    at.switch_page(SETUP.path).run()
    assert at.selectbox(key="sample_set").value == "digits"
    assert at.number_input(key="count").value == 3


def test_setup_refuses_a_text_file_renamed_png(dashboard_store):
    store, _ = dashboard_store
    at = _app()
    at.radio(key="source").set_value("upload").run()
    assert any("No images yet" in i.value for i in at.info)  # a hint, not an error
    # On the Setup page itself, the hint points at its own upload, not "on the Setup page".
    assert not any("on the Setup page" in i.value for i in at.info)
    assert any("under Private images above" in i.value for i in at.info)
    assert not _errors(at)
    at.file_uploader(key="images_files.0").set_value(
        ("notes.png", b"just some text\n", "image/png")
    )
    at.run()
    assert not at.exception
    assert any("not an image" in message for message in _errors(at)), _errors(at)
    assert "images" not in at.query_params
    assert store.list_assets("images") == []


def test_setup_upload_is_stored_and_survives_a_refresh(dashboard_store):
    store, _ = dashboard_store
    files = _example_files()
    at = _app()
    at.radio(key="source").set_value("upload").run()
    at.file_uploader(key="images_files.0").set_value(files).run()
    assert not at.exception
    assert not _errors(at), _errors(at)
    sha = at.query_params["images"]
    asset = store.get_asset(sha)
    assert asset is not None and asset.kind == "images"
    assert asset.sha256 == hashlib.sha256(asset.data).hexdigest()
    assert asset.meta["count"] == 4 and asset.meta["labelled"]
    assert any("4 images from" in c.value and "labels given" in c.value for c in at.caption)

    # A refresh is a new session with the same URL: the upload is back, without re-uploading.
    again = _app(images=sha)
    assert not again.exception
    assert again.radio(key="source").value == "upload"
    assert any("Using uploaded images" in s.value for s in again.success)
    assert again.get("image")
    # As uploaded: the file names and the class names of labels.csv, not the stored zip's.
    captions = [c.caption for c in again.get("image")[0].proto.imgs]
    assert [c.split(" (")[0] for c in captions] == [
        "astronaut.png",
        "chelsea.png",
        "coffee.png",
        "rocket.png",
    ]
    assert captions[1].endswith("· chelsea")
    assert any("4 images from upload; labels given" in c.value for c in again.caption)
    again.number_input(key=url_state.upload_count_key(sha)).set_value(2).run()
    assert any("2 images from" in c.value for c in again.caption)
    assert again.query_params["batch"] == "2"

    # The lab, opened by that link after a server restart, uses the upload, not a sample set.
    lab = AppTest.from_file(APP, default_timeout=TIMEOUT)
    lab.session_state["authentication_status"] = True
    lab.session_state["username"] = "alice"
    lab.query_params.update(images=sha, batch="2")
    lab.switch_page(LAB.path).run()
    assert any("Private images** 2 uploaded images" in m.value for m in lab.markdown), [
        m.value for m in lab.markdown
    ]


def test_a_refresh_keeps_the_whole_setup_with_its_weights(dashboard_store):
    """Weights checked against a 100-class LeNet at seed 7 come back with that model: the URL
    holds every Setup choice that is not a default, not only the weights' id."""
    at = _app()
    at.number_input(key="num_classes").set_value(100)
    at.number_input(key="seed").set_value(7)
    at.selectbox(key="activation").set_value("relu").run()
    at.file_uploader(key="weights_file.0").set_value(
        ("mine.safetensors", _lenet_weights(100), "application/octet-stream")
    )
    at.run()
    assert not _errors(at), _errors(at)
    link = {k: v[0] if isinstance(v, list) else v for k, v in at.query_params.items()}
    assert link["classes"] == "100" and link["seed"] == "7" and link["activation"] == "relu"
    assert "arch" not in link  # defaults stay out of the URL

    again = _app(**link)
    assert not again.exception
    assert not _errors(again), _errors(again)
    assert again.number_input(key="num_classes").value == 100
    assert again.number_input(key="seed").value == 7
    assert again.selectbox(key="activation").value == "relu"
    assert any("Using weights `mine.safetensors`" in s.value for s in again.success)
    again.switch_page(LAB.path).run()
    assert any("lenet, 100 classes" in m.value for m in again.markdown)

    # Back to a default: the choice leaves the URL.
    again.switch_page(SETUP.path).run()
    again.selectbox(key="activation").set_value("architecture default").run()
    assert "activation" not in again.query_params


def test_a_link_with_bad_values_says_what_it_did_not_use(dashboard_store):
    at = _app(arch="vgg99", classes="1", size="64", run="../../etc")
    assert not at.exception
    warning = " ".join(w.value for w in at.warning)
    assert "`arch=vgg99` (expected one of" in warning
    assert "`classes=1` (expected an integer 2-100000)" in warning
    assert "`run=../../etc` (expected 32 lowercase hex digits)" in warning
    # The rest of the link still opens.
    assert at.number_input(key="input_size").value == 64
    assert at.selectbox(key="architecture").value == "lenet"
    assert "arch" not in at.query_params and "run" not in at.query_params


def test_a_link_cannot_put_markdown_into_the_page(dashboard_store):
    """Issue 33, item 7: a value from the URL is shown as typed, never as a link or bold."""
    at = _app(run="[Session expired, sign in](https://x.io)", arch="**vgg**")
    assert not at.exception
    warning = " ".join(w.value for w in at.warning)
    shown = "`run=[Session expired, sign in](https://x…`"  # a code span, cut at 40
    assert shown in warning and "`arch=**vgg**`" in warning
    assert "](" not in warning.replace(shown, "")


def test_setup_weights_that_do_not_fit_are_a_clear_error(dashboard_store):
    store, _ = dashboard_store
    at = _app()
    at.number_input(key="num_classes").set_value(5).run()
    at.file_uploader(key="weights_file.0").set_value(
        ("mine.safetensors", _lenet_weights(10), "application/octet-stream")
    )
    at.run()
    assert not at.exception
    assert any("do not fit" in message for message in _errors(at)), _errors(at)
    assert "weights" not in at.query_params
    assert store.list_assets("model") == []

    # With the architecture they were saved from, the same file is accepted and stored.
    at.number_input(key="num_classes").set_value(10).run()
    assert not _errors(at), _errors(at)
    sha = at.query_params["weights"]
    assert store.get_asset(sha).kind == "model"
    assert any("Using weights `mine.safetensors`" in s.value for s in at.success)
    at.switch_page(LAB.path).run()
    assert any("uploaded weights" in m.value for m in at.markdown)

    # A run with them: the worker gets the stored bytes, and the spec names them by hash.
    _, manager = dashboard_store
    at.number_input(key="iterations.dlg.audit").set_value(2)
    _start_run(at)
    run_id = at.query_params["run"]
    assert manager.wait(run_id, 120)
    record = store.get_run(run_id)
    assert record.status == "completed", record.error
    assert record.spec["model"]["weights_asset"] == sha

    # Remove takes them out of the setup; the run names them, so the store keeps them.
    at.switch_page(SETUP.path).run()
    at.button(key="remove_weights").click().run()
    assert "weights" not in at.query_params
    assert any("used by 1 stored run" in i.value for i in at.info), [i.value for i in at.info]
    assert store.get_asset_info(sha) is not None

    # Weights no run uses are deleted from the store by Remove.
    at.number_input(key="num_classes").set_value(7).run()
    at.file_uploader(key="weights_file.1").set_value(
        ("seven.safetensors", _lenet_weights(7), "application/octet-stream")
    )
    at.run()
    unused = at.query_params["weights"]
    at.button(key="remove_weights").click().run()
    assert any("deleted seven.safetensors from the store" in i.value for i in at.info)
    assert store.get_asset_info(unused) is None


def test_a_torchvision_resnet_checkpoint_is_told_which_stem_it_needs(dashboard_store):
    """At input 32 the built-in ResNet-18 has the 3x3 cifar stem; a torchvision checkpoint
    has the 7x7 one. The refusal says so and names the setting; with it, the file loads."""
    torchvision = pytest.importorskip("torchvision")
    buffer = io.BytesIO()
    torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), buffer)
    at = _app()
    at.selectbox(key="architecture").set_value("resnet18").run()
    howto = " ".join(c.value for c in at.code)
    assert "--model resnet18" in howto and "--save-weights resnet18.safetensors" in howto
    at.file_uploader(key="weights_file.0").set_value(
        ("resnet18.pth", buffer.getvalue(), "application/octet-stream")
    )
    at.run()
    message = " ".join(_errors(at))
    assert "saved with the imagenet stem" in message and "Choose the stem 'imagenet'" in message
    assert "weights" not in at.query_params

    at.selectbox(key="stem").set_value("imagenet").run()
    assert not _errors(at), _errors(at)
    assert any("Using weights `resnet18.pth`" in s.value for s in at.success)
    assert at.query_params["stem"] == "imagenet" and at.query_params["arch"] == "resnet18"
    assert 'stem="imagenet"' in " ".join(c.value for c in at.code)


# --- Attack lab -----------------------------------------------------------------------------


def test_lab_runs_dlg_and_shows_the_metrics(dashboard_store):
    store, manager = dashboard_store
    at = _app()
    at.switch_page(LAB.path).run()
    at.selectbox(key="attack").set_value("dlg").run()
    at.number_input(key="iterations.dlg.audit").set_value(5)
    _start_run(at)
    run_id = at.query_params["run"]
    assert at.session_state["run"] == run_id
    assert at.get("progress")  # the live view is drawn at once, the page does not block
    assert manager.wait(run_id, 120)

    at.run()
    assert not at.exception
    assert not _errors(at), _errors(at)
    labels = [m.label for m in at.metric]
    assert any("PSNR" in label for label in labels)
    assert any("oracle" in label.lower() and "uses ground truth" in label for label in labels)
    assert any("dlg against none: PSNR" in c.value for c in at.caption)
    assert "Verdict" in [h.value for h in at.subheader]
    assert _verdict_headlines(at), "no verdict headline"
    record = store.get_run(run_id)
    assert record.status == "completed" and record.spec["budget"]["iterations"] == 5
    assert record.spec["attack"]["preset"] == "audit"  # 5 steps per raced start
    assert record.spec["attack"]["name"] == "dlg"
    assert store.image(run_id, "reconstruction") is not None

    # The PDF report of the run, built on request.
    at.button(key="run_report").click().run()
    assert not at.exception and not _errors(at), _errors(at)
    pdf = at.get("download_button")
    assert any("PDF" in b.proto.label for b in pdf), [b.proto.label for b in pdf]

    # A refresh (a new session with the URL) reopens the finished run.
    again = _app(run=run_id)
    again.switch_page(LAB.path).run()
    assert any("PSNR" in m.label for m in again.metric)


def test_lab_bad_parameter_is_refused_and_nothing_is_recorded(dashboard_store):
    store, _ = dashboard_store
    at = _app()
    at.switch_page(LAB.path).run()
    at.selectbox(key="defense").set_value("prune").run()
    at.number_input(key="defense.prune.ratio").set_value(1.5).run()
    assert not at.exception
    assert any("ratio" in m and "[0, 1)" in m for m in _errors(at)), _errors(at)
    assert at.button(key="start").disabled  # a browser cannot click it
    assert "run" not in at.query_params
    assert store.list_runs() == []


def test_lab_every_attack_and_defense_renders_its_fields(dashboard_store):
    from auditlib.attacks import ATTACKS
    from auditlib.defenses import DEFENSES

    at = _app()
    at.switch_page(LAB.path).run()
    for name in sorted(ATTACKS):
        # Each threat model lists its own attacks (one field each).
        server = "honest" if ATTACKS[name].builds is None else "malicious"
        at.radio(key="server").set_value(server).run()
        at.selectbox(key="attack" if server == "honest" else "attack.malicious").set_value(
            name
        ).run()
        assert not at.exception, name
        assert not _errors(at), (name, _errors(at))
    at.radio(key="server").set_value("honest").run()
    for name in sorted(DEFENSES):
        at.selectbox(key="defense").set_value(name).run()
        assert not at.exception, name
        assert not _errors(at), (name, _errors(at))
    at.radio(key="algorithm").set_value("fedavg").run()
    assert at.number_input(key="local_steps")
    assert not _errors(at)

    at.selectbox(key="attack").set_value("ig").run()
    at.number_input(key="iterations.ig.audit").set_value(5).run()
    at.button(key="paper_iterations.ig").click().run()  # the paper's count, on request
    assert at.number_input(key="iterations.ig.audit").value == 24_000


def test_lab_cancel_stops_the_run_and_scores_what_it_has(dashboard_store):
    store, manager = dashboard_store
    at = _app()
    at.switch_page(LAB.path).run()
    at.number_input(key="iterations.dlg.audit").set_value(5000)
    at.button(key="start").click().run()
    run_id = at.query_params["run"]
    # Cancel once the attack has begun (the audit settings prepare 8 starts first), so
    # there is something to score.
    deadline = time.monotonic() + 60
    while store.latest_event(run_id) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    at.button(key="cancel").click().run()
    assert store.get_run(run_id).cancel_requested
    assert manager.wait(run_id, 60)
    at.run()
    assert not at.exception
    record = store.get_run(run_id)
    assert record.status == "cancelled"
    assert record.iterations is not None and record.iterations < 5000
    assert any("did not run to the end" in w.value for w in at.warning)
    assert any("PSNR" in m.label for m in at.metric)
    assert not LOW.search(_page_text(at))  # a cancelled run never reads "Low"


def test_lab_defaults_to_the_audit_preset_and_offers_every_applicable_attack(dashboard_store):
    from auditlib.attacks import ALL_ATTACKS, ATTACKS

    at = _app()
    at.switch_page(LAB.path).run()
    attack = at.selectbox(key="attack")
    assert attack.value == "dlg"
    assert "every applicable attack" in attack.options  # the label of ALL_ATTACKS
    preset = at.selectbox(key="preset.dlg")
    assert preset.value == "audit" and preset.options[0] == "audit (strongest, default)"
    assert "paper settings (reproduction)" in preset.options
    # The iterations follow the settings: the audit budget, or the paper's count.
    at.selectbox(key="attack").set_value("ig").run()
    assert at.number_input(key="iterations.ig.audit").value == ATTACKS["ig"].audit.iterations
    at.selectbox(key="preset.ig").set_value("paper").run()
    assert at.number_input(key="iterations.ig.paper").value == ATTACKS["ig"].paper_iterations
    # Every applicable attack: no settings and no attack parameters to choose.
    at.selectbox(key="attack").set_value(ALL_ATTACKS).run()
    assert not at.exception and not _errors(at), _errors(at)
    assert not [s for s in at.selectbox if s.key and s.key.startswith("preset.")]
    assert "Attack parameters" not in [e.label for e in at.expander]
    assert not at.button(key="start").disabled


def _run_lab_with_defense(at: AppTest, manager, store) -> tuple[str, str]:
    """Start the lab's run (a defended one) and wait for it and its control."""
    _start_run(at)
    run_id = at.query_params["run"]
    control_id = at.session_state["control_started"]
    assert control_id and control_id != run_id
    assert store.get_run(control_id).spec["defense"]["name"] == "none"
    assert manager.wait(run_id, 600) and manager.wait(control_id, 600)
    at.run()
    # A leak's verdict is drawn in red: no other error on the page.
    assert not at.exception and not page_faults(at), page_faults(at)
    return run_id, control_id


def test_lab_defended_run_whose_control_did_not_leak_is_inconclusive(dashboard_store):
    store, manager = dashboard_store
    at = _app()
    at.switch_page(LAB.path).run()
    at.selectbox(key="defense").set_value("prune").run()
    at.number_input(key="iterations.dlg.audit").set_value(1).run()  # too short to leak
    _, control_id = _run_lab_with_defense(at, manager, store)
    assert store.get_run(control_id).summary["verdict"]["finding"]["leaked"] is False
    [headline] = _verdict_headlines(at)
    assert headline.startswith("Inconclusive: the attack did not break even the undefended")
    assert any(headline in w.value for w in at.warning)  # drawn in the inconclusive colour
    text = _page_text(at)
    assert "did not break even the undefended update" in text
    assert not LOW.search(text)
    assert "Scope" in [h.value for h in at.subheader]
    assert f"control run {control_id[:8]}" in text  # the control's figures and note
    assert "guess: grey" in text  # the baseline beside the attack
    assert "SoK model C: Parameter-Aware Eavesdropper" in text
    assert any(b.key == "open_control" for b in at.button)


def test_lab_defended_run_whose_control_leaked_is_a_finding_about_the_defense(dashboard_store):
    store, manager = dashboard_store
    at = _app()
    at.number_input(key="num_classes").set_value(100).run()  # DLG's LeNet: leaks in 60 steps
    at.switch_page(LAB.path).run()
    at.selectbox(key="preset.dlg").set_value("paper").run()
    at.number_input(key="iterations.dlg.paper").set_value(60)
    at.selectbox(key="defense").set_value("dp-gaussian").run()
    # sigma 10, not 1: the plain pick is then noise on any CPU's kernels, clearly held
    # (tests/test_cli.py, the same case).
    at.number_input(key="defense.dp-gaussian.sigma").set_value(10.0).run()
    # The verdict is the point here, not the speed: a budget no loaded machine runs out of.
    at.number_input(key="time_budget").set_value(900).run()
    run_id, control_id = _run_lab_with_defense(at, manager, store)
    assert store.get_run(control_id).summary["verdict"]["finding"]["leaked"] is True
    [headline] = _verdict_headlines(at)
    assert headline.startswith(("Low: the defense stopped dlg", "the defense did not stop"))
    assert any(headline in s.value for s in at.success)  # green: the defense held
    text = _page_text(at)
    assert "broke the undefended update" in text
    metric_rows = [t.value for t in at.table if "Metric" in t.value.columns]
    assert metric_rows and metric_rows[0]["Value"].iloc[0] == headline  # the verdict row

    at.switch_page(HISTORY.path).run()
    table = at.dataframe[0].value
    verdicts = dict(zip(table["run"], table["verdict"], strict=True))
    assert verdicts[run_id].startswith("Low: defense held · control leaked")
    assert verdicts[control_id].startswith(("Very High", "High", "Medium"))


def test_a_run_stopped_by_its_time_budget_that_recovered_nothing_never_reads_low(
    dashboard_store,
):
    store, manager = dashboard_store
    at = _app()
    at.switch_page(LAB.path).run()
    at.number_input(key="iterations.dlg.audit").set_value(100_000)
    at.number_input(key="time_budget").set_value(1).run()
    at.button(key="start").click().run()
    run_id = at.query_params["run"]
    assert manager.wait(run_id, 120)
    record = store.get_run(run_id)
    assert record.status == "timed_out"
    assert record.summary["verdict"]["finding"]["images_recovered"] == 0
    at.run()
    assert not at.exception and not _errors(at), _errors(at)
    [headline] = _verdict_headlines(at)
    assert headline.startswith("Inconclusive: the attack was stopped by its time budget")
    assert not LOW.search(_page_text(at)), _page_text(at)

    at.switch_page(HISTORY.path).run()
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["verdict"]) == ["Inconclusive (time budget)"]
    assert not LOW.search(_page_text(at)), _page_text(at)


def test_lab_unknown_run_in_the_link_is_explained(dashboard_store):
    at = _app(run="0" * 32)
    at.switch_page(LAB.path).run()
    assert not at.exception
    assert any("not in this dashboard's store" in w.value for w in at.warning)
    at.button(key="close_run").click().run()
    assert "run" not in at.query_params


def test_a_reopened_run_says_its_model_and_that_start_runs_the_setup(dashboard_store):
    """Issue 35: a 100-class run reopened from History sat under the header "Model lenet,
    10 classes" (the Setup's), and Start would have run the 10-class model. The run says
    its own model, the header says Start runs the Setup, and where the two differ, so."""
    _, manager = dashboard_store
    spec = _tiny_spec()
    spec = dataclasses.replace(
        spec, model=dataclasses.replace(spec.model, spec=ModelSpec("lenet", 100, (3, 32, 32)))
    )
    run_id = manager.start(spec, {}, title="a 100-class run")
    assert manager.wait(run_id, 120)
    at = _app(run=run_id)
    at.switch_page(LAB.path).run()
    assert not at.exception and not _errors(at), _errors(at)
    markdown = [m.value for m in at.markdown]
    assert any(m.startswith("**This run's model** lenet (3x32x32, 100 classes)") for m in markdown)
    assert any(
        m.startswith("**Start runs the Setup** · **Model** lenet, 10 classes") for m in markdown
    ), markdown
    differs = [i.value for i in at.info if "not the Setup's" in i.value]
    assert differs and "Start runs the Setup's" in differs[0] and "10 classes" in differs[0]

    same = _app(run=run_id, classes="100")  # the Setup now describes the run's model
    same.switch_page(LAB.path).run()
    assert not same.exception
    assert not [i.value for i in same.info if "not the Setup's" in i.value]

    closed = _app()  # no run open: the header is the Setup's alone
    closed.switch_page(LAB.path).run()
    assert not any("Start runs the Setup" in m.value for m in closed.markdown)


def test_the_lab_estimates_the_time_before_anything_runs(dashboard_store):
    """Issue 35: a ResNet-18 at 224 px ran out of its budget at step 3 of 475 with no word
    beforehand. The lab measures a few real steps of the run's attacks on the chosen model
    and says what the planned steps take here, and which budget would let them finish;
    issue 52: the box kept an old estimate after an input changed; now it measures again."""
    store, manager = dashboard_store
    at = _app()
    at.switch_page(LAB.path).run()
    at.number_input(key="time_budget").set_value(1).run()
    at.button(key="estimate").click().run()
    assert not at.exception and not _errors(at), _errors(at)
    [estimate] = [i.value for i in at.info if "planned steps take about" in i.value]
    assert estimate.startswith("dlg [audit] on lenet (3x32x32, 10 classes)"), estimate
    assert "Measured here on a few real steps: dlg (audit preset) " in estimate
    # The count the progress will show (issue 52: 480 in the estimate, "of 475" in the
    # progress): DLG's 8 starts raced over 300 steps each, rungs on the page's 5-step grid.
    assert "so the 475 planned steps take about" in estimate
    assert "the time budget of 1 s stops the attack" in estimate
    assert "a budget of at least" in estimate and "would let it finish" in estimate
    # The sidebar says the same count under its per-start iterations.
    assert any(c.value.startswith("475 planned steps in all") for c in at.caption)
    # An input that changes the run: the box measures again, never shows the old words.
    at.number_input(key="iterations.dlg.audit").set_value(100).run()
    assert not at.exception and not _errors(at), _errors(at)
    [again] = [i.value for i in at.info if "planned steps take about" in i.value]
    assert "so the 165 planned steps take about" in again, again
    assert store.list_runs() == []  # nothing ran
    # The run then counts the same steps: its progress reads "of" the estimate's count.
    at.number_input(key="time_budget").set_value(120)
    at.number_input(key="iterations.dlg.audit").set_value(10).run()
    [short] = [i.value for i in at.info if "planned steps take about" in i.value]
    planned = re.search(r"so the ([\d,]+) planned steps", short).group(1)
    at.button(key="start").click().run()
    assert manager.wait(at.query_params["run"], 120)
    at.run()
    [bar] = at.get("progress")
    assert bar.proto.text.startswith(f"completed: step {planned} of {planned} "), bar.proto.text


CONTROL_BESIDE = (
    " Start also runs its control (the same attack without the defense) beside it, sharing "
    "this machine: "
)


def test_the_lab_estimates_a_defended_runs_control_where_start_would_run_it(dashboard_store):
    """One Start runs a defended run and, where none is stored, its control beside it: the
    estimate says the control's time too, measured as its own; once the control is stored,
    Start runs the defended run alone, and the estimate says that run's only."""
    store, manager = dashboard_store
    at = _app()
    at.switch_page(LAB.path).run()
    at.number_input(key="iterations.dlg.audit").set_value(2).run()
    at.selectbox(key="defense").set_value("prune").run()
    at.button(key="estimate").click().run()
    assert not at.exception and not _errors(at), _errors(at)
    [estimate] = [i.value for i in at.info if "planned steps take about" in i.value]
    defended, control = estimate.split(CONTROL_BESIDE)
    assert "dlg (audit preset, knows the defense)" in defended
    assert control.startswith("Measured here on a few real steps: dlg (audit preset) ")
    assert "knows the defense" not in control and "so the 16 planned steps" in control
    assert store.list_runs() == []  # nothing ran
    # The control itself, run from the lab: the undefended run at the same budget.
    at.selectbox(key="defense").set_value("none").run()
    _start_run(at)
    assert manager.wait(at.query_params["run"], 120)
    at.selectbox(key="defense").set_value("prune").run()
    at.button(key="estimate").click().run()
    [alone] = [i.value for i in at.info if "planned steps take about" in i.value]
    assert "knows the defense" in alone and CONTROL_BESIDE not in alone, alone


def test_asking_for_a_compiled_step_estimates_again_with_its_compiling(dashboard_store):
    """IG's ``compiled`` is left out of the run's identity (it says how the run computes),
    but it changes the pace: the estimate shown must be measured for it."""
    at = _app()
    at.switch_page(LAB.path).run()
    at.selectbox(key="attack").set_value("ig").run()
    at.number_input(key="iterations.ig.audit").set_value(20).run()
    # One start: one count of starts to trace (a race's retraced counts are timed apart:
    # tests/test_preflight.py), which keeps this test's compiling to one trace.
    at.number_input(key="attack.ig.audit.restarts").set_value(1).run()
    at.button(key="estimate").click().run()
    [eager] = [i.value for i in at.info if "planned steps take about" in i.value]
    assert "of compiling" not in eager
    at.checkbox(key="attack.ig.audit.compiled").check().run(timeout=COMPILING_TIMEOUT)
    assert not at.exception and not _errors(at), _errors(at)
    [compiled] = [i.value for i in at.info if "planned steps take about" in i.value]
    assert re.search(
        r"ig \(audit preset\) [\d.e-]+ s a step after [\d.]+ (s|min) of compiling", compiled
    ), compiled


def test_a_cuda_graph_is_asked_for_refused_or_left_to_the_run_in_the_form(dashboard_store):
    """``captured`` is three-way (attacks.captured.by_default): left to the run by default,
    true asks for a CUDA graph (refused here, on the CPU, as the run would refuse it),
    false keeps the step eager whatever the run would choose."""
    at = _app()
    at.switch_page(LAB.path).run()
    at.selectbox(key="attack").set_value("ig").run()
    at.number_input(key="iterations.ig.audit").set_value(5).run()
    captured = at.selectbox(key="attack.ig.audit.captured")
    assert captured.options == ["the run decides", "true", "false"]
    assert captured.value is None
    captured.set_value(True).run()
    at.button(key="estimate").click().run()
    [refused] = [i.value for i in at.info if "None of the planned attacks" in i.value]
    assert refused.endswith(
        "None of the planned attacks will run here: ig cannot record its step as a CUDA graph "
        "here: a CUDA graph needs a CUDA device (this run is on cpu)."
    )
    at.selectbox(key="attack.ig.audit.captured").set_value(False).run()
    assert not at.exception and not _errors(at), _errors(at)
    [eager] = [i.value for i in at.info if "planned steps take about" in i.value]
    assert "of compiling" not in eager


def test_a_finished_run_states_one_attack_time_and_the_whole_runs_apart(dashboard_store):
    """Issue 35: the progress line said "63.0 s" and Timing "120.0 s for 932 iterations".
    The progress line of a finished run ends on the seconds its Timing states, both named
    as the attacks' time; the whole run's wall time is given apart, named as such."""
    store, manager = dashboard_store
    spec = dataclasses.replace(_tiny_spec(4), defense=ComponentSpec.of("prune"))
    run_id = manager.start(spec, {}, title="pruned")
    assert manager.wait(run_id, 120)
    record = store.get_run(run_id)
    at = _app(run=run_id)
    at.switch_page(LAB.path).run()
    assert not at.exception
    attacks = f"{record.seconds:.1f} s in the attacks"
    [bar] = at.get("progress")
    assert bar.proto.text.startswith(f"completed: step {record.iterations:,} of ")
    assert attacks in bar.proto.text, bar.proto.text
    [timing] = [m.value for m in at.markdown if "for" in m.value and "stop reason" in m.value]
    assert timing.startswith(f"{attacks} (every attack and twin"), timing
    whole = (record.finished_at - record.started_at).total_seconds()
    parts = "the victim's update, the attacks, scoring"
    assert f"The whole run, from its start to its end ({parts}): {whole:.1f} s." in timing
    assert timing.endswith(" Steps: eager, every attack."), timing  # dlg and its twin, CPU


def _malicious_lab(at: AppTest, attack: str = "rtf", count: int = 8) -> None:
    """LeNet at 32 px on fashion-mnist (one channel), ``count`` images; the Attack lab under
    the malicious server with ``attack`` (a closed form: one pass, about a second)."""
    at.selectbox(key="sample_set").set_value("fashion-mnist")
    at.number_input(key="count").set_value(count)
    at.selectbox(key="channels").set_value(1).run()
    at.switch_page(LAB.path).run()
    at.radio(key="server").set_value("malicious").run()
    at.selectbox(key="attack.malicious").set_value(attack).run()


def test_lab_offers_the_attacks_of_the_chosen_threat_model(dashboard_store):
    from auditlib.attacks import ATTACKS

    at = _app()
    at.switch_page(LAB.path).run()
    server = at.radio(key="server")
    assert server.value == "honest"
    assert server.options == [
        "Honest-but-curious server (observes updates)",
        "Malicious server (changes the model it sends)",
    ]
    honest = at.selectbox(key="attack").options
    assert "rtf" not in honest and "dlg" in honest and "every applicable attack" in honest
    at.radio(key="server").set_value("malicious").run()
    assert not at.exception and not _errors(at), _errors(at)
    assert at.selectbox(key="attack.malicious").options == [
        "cah",
        "cah-evading",
        "loki",
        "loki-evading",
        "rtf",
        "rtf-evading",
        "seer-disguised",
        "every applicable attack",
    ]
    assert at.selectbox(key="attack.malicious").value == "rtf"
    text = _page_text(at)
    assert "model-check" in text and "changes the model it sends" in text  # the help
    assert ATTACKS["rtf"].summary in text
    assert "no iterations" in text and not _has_number_input(at, "iterations.rtf.audit")
    assert "**Threat model** malicious server" in text
    at.selectbox(key="attack.malicious").set_value("all").run()  # rtf, cah and loki
    assert not at.exception and not _errors(at), _errors(at)
    assert not _has_number_input(at, "iterations.all.None")
    assert not at.button(key="start").disabled
    # Secure aggregation: more clients than images (the default batch: 1) is refused.
    at.checkbox(key="secure_aggregation.on").check().run()
    assert at.number_input(key="secure_aggregation.clients").value == 4
    assert any("needs at least one image per client; the batch has 1" in e for e in _errors(at))
    assert at.button(key="start").disabled
    # Back to the honest server: its attack is where it was left.
    at.radio(key="server").set_value("honest").run()
    assert at.selectbox(key="attack").value == "dlg"


def test_lab_refuses_a_malicious_servers_attack_under_the_honest_one():
    from dashboard.run_choices import LabChoices, check_components

    errors = check_components(LabChoices(attack="rtf", iterations=1))
    assert errors == [
        "Attack: rtf is a malicious server's attack (it changes the model the server sends): "
        "choose the malicious-server threat model to run it"
    ]
    assert check_components(LabChoices(attack="rtf", iterations=1, server="malicious")) == []
    [error] = check_components(LabChoices(secure_aggregation=1))
    assert error.startswith("Scenario: secure aggregation sums the updates of 2 to 64 clients")


def _has_number_input(at: AppTest, key: str) -> bool:
    return any(getattr(w, "key", None) == key for w in at.number_input)


def test_lab_malicious_server_shows_what_it_changed_and_what_the_model_check_saw(
    dashboard_store,
):
    store, manager = dashboard_store
    at = _app()
    _malicious_lab(at)
    at.selectbox(key="defense").set_value("model-check").run()
    assert not at.exception and not _errors(at), _errors(at)
    run_id, control_id = _run_lab_with_defense(at, manager, store)
    record, control = store.get_run(run_id), store.get_run(control_id)
    assert record.spec["scenario"]["server"] == "malicious"
    assert control.spec["scenario"]["server"] == "malicious"  # the control faces it too
    assert "malicious server" in record.title
    text = _page_text(at)
    assert "fedsgd, malicious server" in text  # the run's caption
    assert "rtf (malicious server) against model-check" in text  # the headline
    assert "SoK model F-H: Active server (modifies the model it sends)" in text
    assert "**What the server changed** " in text and "**Could the client have noticed** " in text
    # The check refused rtf's model; the servers built to pass it stood in (issue 54).
    assert re.search(r"Model check: flagged [12] of 3 models", text)  # seer-disguised's: either
    assert "**Servers the check was tried against** the model check was tried against 3" in text
    assert "rtf refused; rtf-evading passed the check" in text
    assert "attributed" not in text  # rtf does not attribute
    # The undefended control faced the same server, which recovered images from its update.
    assert control.summary["verdict"]["finding"]["images_recovered"] > 0


def test_lab_loki_under_secure_aggregation_attributes_the_images(dashboard_store):
    store, manager = dashboard_store
    at = _app()
    _malicious_lab(at, "loki")
    at.checkbox(key="secure_aggregation.on").check().run()
    at.number_input(key="secure_aggregation.clients").set_value(4).run()
    assert not at.exception and not _errors(at), _errors(at)
    assert any(
        "8 private images are split over 4 clients in order, 2 each" in c.value for c in at.caption
    )
    _start_run(at)
    run_id = at.query_params["run"]
    assert manager.wait(run_id, 120)
    at.run()
    assert not at.exception
    [headline] = _verdict_headlines(at)
    assert headline.startswith("Very High: loki")  # drawn as an error: a leak
    assert _errors(at) == [f"**{headline}**"], _errors(at)
    record = store.get_run(run_id)
    assert record.spec["scenario"]["secure_aggregation"] == 4
    [attributed] = [a["images_attributed"] for a in record.summary["attacks"]]
    text = _page_text(at)
    assert f"**Attributed** {attributed} of 8 attributed to the client that held them" in text
    assert "malicious server, secure aggregation of 4" in text
    # Said once, with whether the server could tell whose image it was (issue 52).
    assert "**Secure aggregation** only the example-weighted sum of 4 clients' updates" in text
    assert "**Whose images** the server could tell whose image it was: " in text
    # LOKI's per-image table says which client held each image and whom the server named.
    [table] = [t for t in at.table if "held by client" in t.value.columns]
    assert sorted(table.value["held by client"]) == ["1", "1", "2", "2", "3", "3", "4", "4"]
    assert "attributed to client" in table.value.columns
    # "Could the client have noticed" is its own line, not a tick under "knows".
    assert not any("whether the client could have noticed" in str(t.value.values) for t in at.table)


# --- Compare and Trade-off -------------------------------------------------------------------


def _small_utility(at: AppTest) -> None:
    """A utility training of seconds: 2 clients, 1 round, 200 examples, a 120 s budget."""
    at.number_input(key="utility.rounds").set_value(1)
    at.number_input(key="utility.clients").set_value(2)
    at.number_input(key="utility.train").set_value(200)
    at.number_input(key="utility.seconds").set_value(120)


def _wait_batch(manager, store, batch_id: str) -> list:
    from auditlib.engine.batches import batch_state

    states = batch_state(store, store.get_batch(batch_id))
    for state in states:
        assert state.run is not None
        assert manager.wait(state.run.id, 180)
    return batch_state(store, store.get_batch(batch_id))


def test_an_empty_compare_page_points_at_nothing_it_does_not_show(dashboard_store):
    # Issue 21, item 15: "open a stored one above" with nothing above.
    store, _ = dashboard_store
    at = _app()
    at.switch_page(COMPARE.path).run()
    assert not at.exception
    infos = [i.value for i in at.info]
    assert "No comparison open, and none is stored yet. Run one with the button above." in infos
    assert not _has_key(at, "comparison.picker")
    store.create_batch("comparison", "an earlier one", {"members": []})
    at.run()
    infos = [i.value for i in at.info]
    assert any("or open a stored one above" in i for i in infos), infos
    assert _has_key(at, "comparison.picker")


def _has_key(at: AppTest, key: str) -> bool:
    return any(getattr(w, "key", None) == key for w in at.selectbox)


def test_compare_runs_defenses_side_by_side_and_resumes_nothing_twice(dashboard_store):
    store, manager = dashboard_store
    at = _app()
    at.switch_page(COMPARE.path).run()
    at.number_input(key="iterations.dlg.audit").set_value(5)
    at.multiselect(key="compare.defenses").set_value(["none", "dp-gaussian"])
    _small_utility(at)
    at.run()
    assert not at.exception and not _errors(at), _errors(at)
    at.button(key="compare.start").click().run()
    assert not at.exception and not _errors(at), _errors(at)
    batch_id = at.query_params["comparison"]
    states = _wait_batch(manager, store, batch_id)
    assert [s.member.series for s in states] == ["none", "dp-gaussian"]
    assert all(s.run.status == "completed" for s in states)
    for state in states:
        utility = state.run.summary["utility"]
        assert utility["complete"] and 0.0 <= utility["accuracy"] <= 1.0
        assert utility["budget_s"] == 120 and state.run.spec["utility"]["seconds"] == 120
        # The last progress the run gave: its utility training's rounds, not "step 5".
        assert state.run.stage.startswith("utility training: 1 of 1 rounds done")

    at.run()
    assert not at.exception and not _errors(at), _errors(at)
    table = at.dataframe[0].value
    assert list(table["defense"]) == ["none", "dp-gaussian"]
    assert table["PSNR (dB)"].str.match(r"^-?\d+\.\d\d$").all()
    assert table["Utility accuracy"].str.contains("%").all()
    # The verdict column: the defended run is judged beside "none", its control.
    assert not table["verdict"].str.contains("n/a|no verdict").any(), list(table["verdict"])
    assert "control" in table["verdict"][1] and "control" not in table["verdict"][0]
    assert "no defense" in table["Utility accuracy"][1]
    assert any("2 of 2 runs have results" in c.value for c in at.caption)
    assert len(at.get("image")) == 2  # one grid per defense
    assert at.get("plotly_chart")
    # A redraw with the runs unchanged (a live view's every second) reuses the figure.
    drawn = at.session_state["_chart.comparison"][1]
    at.run()
    assert at.session_state["_chart.comparison"][1] is drawn and at.get("plotly_chart")
    assert not any(b.key == "comparison.resume" for b in at.button)  # nothing missing
    at.button(key="comparison.report").click().run()
    assert not at.exception and not _errors(at), _errors(at)
    assert any("PDF" in b.proto.label for b in at.get("download_button"))

    # The same comparison again reuses both runs: nothing is recomputed.
    runs_before = len(store.list_runs())
    at.button(key="compare.start").click().run()
    assert len(store.list_runs()) == runs_before
    assert at.query_params["comparison"] != batch_id  # a second batch over the same runs

    # A refresh with the link reopens it.
    again = _app(comparison=batch_id)
    again.switch_page(COMPARE.path).run()
    assert not again.exception
    assert list(again.dataframe[0].value["defense"]) == ["none", "dp-gaussian"]


def test_compare_defenses_against_the_malicious_server(dashboard_store):
    store, manager = dashboard_store
    at = _app()
    _malicious_lab(at)  # the lab's threat model is the comparison's
    at.switch_page(COMPARE.path).run()
    assert at.radio(key="server").value == "malicious"
    assert at.selectbox(key="attack.malicious").value == "rtf"
    defenses = ["none", "model-check", "dp-gaussian", "clip", "prune"]
    at.multiselect(key="compare.defenses").set_value(defenses)
    at.checkbox(key="utility.on").uncheck().run()
    assert not at.exception and not _errors(at), _errors(at)
    assert any("**malicious server**" in m.value for m in at.markdown)
    at.button(key="compare.start").click().run()
    assert not at.exception and not _errors(at), _errors(at)
    batch_id = at.query_params["comparison"]
    states = _wait_batch(manager, store, batch_id)
    assert [s.member.series for s in states] == defenses
    assert all(s.run.spec["scenario"]["server"] == "malicious" for s in states)
    assert all(s.run.status == "completed" for s in states)
    assert store.get_batch(batch_id).title == "rtf · malicious server · 5 defenses · lenet"

    at.run()
    assert not at.exception
    assert any("attack rtf [audit] · fedsgd, malicious server" in c.value for c in at.caption), [
        c.value for c in at.caption
    ]
    table = at.dataframe[0].value
    assert list(table["defense"]) == defenses
    verdicts = dict(zip(table["defense"], table["verdict"], strict=True))
    assert verdicts["none"].startswith(("Very High", "High", "Medium"))  # rtf leaks
    # rtf-evading passed the check and leaked: not stopped, judged beside the same server
    assert verdicts["model-check"].startswith(("Very High", "High", "Medium"))
    check = store.get_run(states[1].run.id).summary["defense_report"]["model_check"]
    assert re.match(r"flagged [12] of 3 models", check)


def test_tradeoff_sweeps_dp_and_draws_the_curve(dashboard_store):
    store, manager = dashboard_store
    at = _app()
    at.switch_page(TRADEOFF.path).run()
    at.number_input(key="iterations.dlg.audit").set_value(5)
    _small_utility(at)
    at.text_input(key="sweep.dp-gaussian.grid").set_value("0.001, 0.1")
    at.run()
    assert not at.exception and not _errors(at), _errors(at)
    at.button(key="sweep.start").click().run()
    assert not _errors(at), _errors(at)
    batch_id = at.query_params["sweep"]
    states = _wait_batch(manager, store, batch_id)
    assert [s.member.value for s in states] == [0.001, 0.1]
    assert [s.run.spec["defense"]["params"] for s in states] == [
        [["sigma", "0.001"]],
        [["sigma", "0.1"]],
    ]
    at.run()
    assert not at.exception and not _errors(at), _errors(at)
    chart = at.get("plotly_chart")[0]
    figure = json.loads(chart.proto.spec)
    trace = figure["data"][0]
    assert trace["name"] == "dp-gaussian" and len(trace["x"]) == 2
    psnr = [s.run.summary["metrics"]["psnr_mean"] for s in states]
    assert trace["x"] == pytest.approx(psnr)


def test_tradeoff_bad_grid_is_refused_before_anything_runs(dashboard_store):
    store, _ = dashboard_store
    at = _app()
    at.switch_page(TRADEOFF.path).run()
    at.text_input(key="sweep.dp-gaussian.grid").set_value("0.1, lots").run()
    assert not at.exception
    assert any("'lots' is not a number" in m for m in _errors(at)), _errors(at)
    assert at.button(key="sweep.start").disabled
    assert store.list_runs() == [] and store.list_batches() == []


# --- History --------------------------------------------------------------------------------


def test_history_lists_runs_opens_and_deletes_one(dashboard_store):
    store, manager = dashboard_store
    weights = store.put_asset("model", "mine.safetensors", _lenet_weights(10))
    spec = _tiny_spec()
    spec = dataclasses.replace(
        spec,
        model=dataclasses.replace(spec.model, weights_asset=weights, content_sha256=weights),
    )
    run_id = manager.start(spec, {weights: _lenet_weights(10)}, title="tiny dlg")
    assert manager.wait(run_id, 120)
    at = _app()
    at.switch_page(HISTORY.path).run()
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["run"]) == [run_id]
    assert list(table["status"]) == ["completed"]
    assert "dlg" in table["attack"][0] and "lenet" in table["model"][0]
    assert table["PSNR (dB)"][0] is not None
    # The verdict and PSNR come right after the status, not off to the right.
    assert list(table.columns)[:4] == ["started", "status", "verdict", "PSNR (dB)"]
    assert table["verdict"][0].startswith(("Inconclusive", "Very High", "High", "Medium"))

    at.selectbox(key="history_run").set_value(run_id)
    at.button(key="open_run").click().run()
    assert not at.exception
    assert at.query_params["run"] == run_id
    assert [t.value for t in at.title] == ["Attack lab"]
    assert any("PSNR" in m.label for m in at.metric)

    # Deleting it (finished runs only) forgets it everywhere.
    at.switch_page(HISTORY.path).run()
    at.button(key="delete_run").click().run()
    assert not at.exception
    assert store.get_run(run_id) is None
    assert "run" not in at.query_params
    assert any("No runs yet" in i.value for i in at.info)
    # With it went the weights it alone used, and the page says so.
    assert store.get_asset_info(weights) is None
    assert any(
        "Deleted run" in m.value and "1 upload no other run used: mine.safetensors" in m.value
        for m in at.success
    ), [m.value for m in at.success]


def test_history_says_when_runs_of_a_previous_dashboard_were_failed(
    tmp_path, monkeypatch, ray_session
):
    import streamlit as st

    from auditlib.store import Store

    monkeypatch.setenv("AUDIT_DATA_DIR", str(tmp_path / "data"))
    st.cache_resource.clear()
    with Store() as store:  # runs left "queued" by a dashboard that was killed
        for owner in ("alice", "bob"):
            store.create_run(
                _tiny_spec().to_dict(), _tiny_spec().identity(), "left behind", owner=owner
            )
    try:
        at = _app()
        at.switch_page(HISTORY.path).run()
        assert not at.exception
        # Each user is told of their own runs only (issue 57): bob's is not alice's news.
        assert any("1 of your runs was still in progress" in w.value for w in at.warning)
        assert list(at.dataframe[0].value["status"]) == ["failed"]
    finally:
        st.cache_resource.clear()


def test_history_gives_each_run_its_own_start(dashboard_store):
    """Issue 35: a sweep's runs all read the sweep's creation time (they are recorded
    together, then start one after another). Each row gives its run's own start, and a run
    not started yet says it is queued."""
    from dashboard.resources import shared_store

    store, spec = shared_store(), _tiny_spec()  # runs recorded as a batch records them
    first, second, waiting = (
        store.create_run(spec.to_dict(), spec.identity(), title, owner="alice")
        for title in ("first", "second", "waiting")
    )
    store.mark_running(first)
    store.finish(first, "failed", error="test")
    time.sleep(1.1)  # the second starts a second later than both were recorded
    store.mark_running(second)
    store.finish(second, "failed", error="test")
    at = _app()
    at.switch_page(HISTORY.path).run()
    assert not at.exception
    table = at.dataframe[0].value
    started = dict(zip(table["run"], table["started"], strict=True))
    for run_id in (first, second):
        expected = store.get_run(run_id).started_at.astimezone()
        assert started[run_id] == f"{expected:%Y-%m-%d %H:%M:%S}"
    assert started[first] != started[second]
    created = store.get_run(waiting).created_at.astimezone()
    assert started[waiting] == f"queued {created:%Y-%m-%d %H:%M:%S}"
    # The verdict column is wide enough for "Low: defense held · control leaked (...)".
    config = json.loads(at.dataframe[0].proto.columns)
    assert config["verdict"]["width"] == "large", config["verdict"]


def test_the_batch_table_marks_a_setting_whose_model_learns_nothing():
    """Issue 35: beside the verdict of a Trade-off point whose defended model learns
    nothing (9.8% against chance 11.7%), the table says it is not usable."""
    from auditlib.report.subject import RunRow
    from dashboard.batch_table import NOT_USABLE, display_rows

    values = {f.name: None for f in dataclasses.fields(RunRow)}
    values |= {"series": "dp-gaussian", "status": "completed", "has_result": True}
    values |= {"finding": False, "psnr": 4.5, "utility_chance": 0.117}
    values |= {"utility_undefended": 0.767}
    dead = RunRow(**(values | {"label": "sigma=1", "utility_accuracy": 0.098}))
    alive = RunRow(**(values | {"label": "sigma=0.1", "utility_accuracy": 0.7}))
    shown = {r["defense"]: r["verdict"] for r in display_rows([dead, alive], [None, None])}
    assert shown["sigma=1"].endswith(f" · {NOT_USABLE}")
    assert NOT_USABLE not in shown["sigma=0.1"]


# --- helpers --------------------------------------------------------------------------------


def _scores(**metrics) -> Scores:
    """Scores as result.json's flat keys hold them (every stored shape reads this way)."""
    flat = {}
    for key, value in metrics.items():
        if value is None or key.endswith("_reason") or key == "label_accuracy":
            flat[key] = value
        else:  # a spread: mean, std, min and max
            flat.update({f"{key}_mean": value, f"{key}_std": 0.5, f"{key}_min": value - 1})
            flat[f"{key}_max"] = value + 0.6544
    return Scores.from_json({**flat, "per_image": []})


def test_result_helpers_speak_plainly():
    scores = _scores(
        psnr=12.3456,
        ssim_mean=None,
        ssim_unavailable_reason="images smaller than the 11-pixel window",
        mse=0.06,
        lpips_mean=None,
        lpips_unavailable_reason="LPIPS-alex unavailable: no weights",
        lpips_vgg_mean=None,
        lpips_vgg_unavailable_reason="LPIPS-alex unavailable: no weights",
        label_accuracy=0.5,
    )
    table, notes = result_words.metric_rows(scores)
    rows = {r["Metric"]: r["Value"] for r in table}
    assert table[0] == {"Metric": "Verdict", "Value": "no verdict (recorded before verdicts)"}
    assert rows["PSNR mean (dB)"] == "12.35"
    assert rows["PSNR std (dB)"] == "0.50" and rows["PSNR max (dB)"] == "13.00"
    assert rows["SSIM mean"] == "unavailable (note 1)"
    # A reason two rows share is written once, below the table, not in each row.
    assert rows["LPIPS (AlexNet) mean"] == rows["LPIPS (VGG) mean"] == "unavailable (note 2)"
    assert notes == [
        "1. images smaller than the 11-pixel window",
        "2. LPIPS-alex unavailable: no weights",
    ]
    assert rows["Label accuracy"] == "50%"
    assert rows["MSE mean"] == "0.06"
    assert rows["RDLV mean"] == "not computed"  # scored before RDLV existed
    # Every row is a catalogue metric: its label, and its format.
    labels = [m.label for m in CATALOGUE.values()]
    assert all(any(r["Metric"].startswith(label) for label in labels) for r in table[1:])
    assert result_words.number(math.nan, ".2f") == "nan"
    assert result_words.number(None, ",") == "n/a" and result_words.number(1234, ",") == "1,234"

    privacy = result_words.privacy_text
    assert privacy(DefenseReport(update_norm_before=1.0)).startswith("No formal privacy")
    assert privacy(None).startswith("No formal privacy")
    assert "set clip" in privacy(
        DefenseReport(epsilon_unavailable_reason="no clip bound; set clip=C")
    )
    assert privacy(DefenseReport(epsilon=2.5, delta=1e-5)).startswith("ε = 2.5, δ = 1e-05")
    report = DefenseReport.from_json(
        {"epsilon": 2.06e-5, "delta": 1e-5, "accountant": "opacus RDPAccountant", "rounds": 3}
    )
    assert privacy(report) == "ε = 2.06e-5, δ = 1e-05 (opacus RDPAccountant)"


def test_form_fields_record_only_changes():
    from auditlib.defenses.dp_noise import GaussianNoiseConfig

    defaults = config_form.config_defaults(GaussianNoiseConfig)
    assert defaults["clip"] == 30.0 and defaults["sigma"] == 0.1
    values = {
        "sigma": 0.1,
        "clip": "30",
        "delta": 1e-5,
        "rounds": 3,
        "neighbours": "replace-one",
        "sample_rate": 1.0,
        "trusted_sampler": False,
    }
    assert config_form.changed_params(values, defaults) == {"rounds": 3}
    assert config_form.changed_params({**values, "clip": "2"}, defaults) == {
        "rounds": 3,
        "clip": "2",
    }
    # An emptied optional field is a change to None ("no clip"), not the default.
    assert config_form.changed_params({**values, "clip": ""}, defaults) == {
        "rounds": 3,
        "clip": "",
    }


def test_a_three_way_field_records_a_change_only_when_it_leaves_the_run_s_choice():
    from auditlib.attacks.inverting_gradients import InvertingGradientsConfig

    defaults = config_form.config_defaults(InvertingGradientsConfig)
    assert defaults["captured"] is None  # the run decides
    assert config_form.changed_params({"captured": None}, defaults) == {}
    assert config_form.changed_params({"captured": False}, defaults) == {"captured": False}
    assert config_form.changed_params({"captured": True}, defaults) == {"captured": True}


def test_settings_text_names_the_settings():
    stored = json.loads(json.dumps(_tiny_spec().to_dict()))  # as the store hands it back
    text = spec_words.settings_text(run_spec_from_dict(stored))
    assert text.attack == "dlg" and text.defense == "none"
    assert text.model.startswith("lenet (3x32x32, 10 classes")
    assert text.batch == "1 from 'photographs'"
    assert text.scenario == "fedsgd" and text.iterations_text == "2"
    fedavg = dataclasses.replace(
        _tiny_spec(),
        attack=ComponentSpec.of("dlg", {"lr": 0.5}, "audit"),
        scenario=ScenarioSpec(
            protocol=dataclasses.replace(ScenarioSpec().protocol, algorithm="fedavg", local_steps=3)
        ),
    )
    text = spec_words.settings_text(fedavg)
    assert text.attack == "dlg [audit] (lr=0.5)"
    assert text.scenario == "fedavg, 3 local steps, lr 0.01"
    # The threat model where it is not the honest server seeing one client's update.
    malicious = dataclasses.replace(
        _tiny_spec(),
        data=DataSpec("samples", "photographs", batch_size=8),
        attack=ComponentSpec.of("rtf", preset="audit"),
        scenario=ScenarioSpec(server="malicious", secure_aggregation=8),
    )
    text = spec_words.settings_text(malicious)
    assert text.scenario == "fedsgd, malicious server, secure aggregation of 8"
    assert spec_words.threat_words("honest", 4) == "secure aggregation of 4"
    with pytest.raises(AuditInputError, match="needs at least one image per client"):
        dataclasses.replace(malicious, data=DataSpec("samples", "photographs", batch_size=4))
    # A spec this version cannot read (an older one): what its result names, "?" elsewhere.
    older = spec_words.older_spec_settings("all", "prune")
    assert older.attack == "every applicable attack" and older.defense == "prune"
    assert older.batch == "?" and older.iterations_text == "?"


def test_the_scenario_choices_come_from_the_protocol_and_the_registry(dashboard_store):
    from typing import get_args

    from auditlib.attacks import ATTACKS, default_iterations
    from auditlib.client.protocol import Algorithm, Shared
    from dashboard.forms import ALGORITHM_WORDS, SHARED_WORDS

    at = _app()
    at.switch_page(LAB.path).run()
    # The options are the Literal's values, in its order (shown in words).
    assert at.radio(key="algorithm").options == [ALGORITHM_WORDS[a] for a in get_args(Algorithm)]
    at.radio(key="algorithm").set_value("fedavg").run()
    assert at.radio(key="share").options == [SHARED_WORDS[s] for s in get_args(Shared)]
    assert at.radio(key="share").value == "delta"
    # The iterations that go with each attack's settings are the registry's.

    for name, info in ATTACKS.items():
        assert default_iterations(name, "audit") == info.audit.iterations
        assert default_iterations(name, "paper") == info.paper_iterations
        assert default_iterations(name, None) == info.audit.iterations


@pytest.mark.parametrize("value", ["0" * 31, "zz" * 16, "../../etc", "A" * 32])
def test_url_ids_are_checked(value):
    assert not url_state.is_url_id("run", value)
    assert url_state.is_url_id("run", "0" * 32)


def test_each_user_sees_and_deletes_only_their_own_uploads(dashboard_store):
    """Setup lists the signed-in user's uploads; another user's upload is not listed, and
    its link answers as a link to an upload nobody made."""
    from auditlib.access import Principal
    from auditlib.store.scoped import UserStore

    store, _ = dashboard_store
    mine = store.put_asset("model", "mine.safetensors", _lenet_weights(10))
    theirs = UserStore(store.raw, Principal("bob")).put_asset("model", "bobs.safetensors", b"w")
    at = _app()
    assert not at.exception
    assert any(e.label == "Your uploads in the store (1)" for e in at.expander)
    assert list(at.dataframe[0].value["name"]) == ["mine.safetensors"]
    # bob's upload by its link: to alice it is not stored (the same words as for bytes
    # nobody uploaded), and nothing of it is shown.
    linked = _app(weights=theirs)
    assert any("are not among your uploads" in e.value for e in linked.error), (
        _errors(linked),
        [str(x.value)[:300] for x in linked.exception],
        [w.value for w in linked.warning],
    )
    nobodys = _app(weights="0" * 64)
    assert [e.replace("0" * 12, theirs[:12]) for e in _errors(nobodys)] == _errors(linked)
    assert "bobs.safetensors" not in _page_text(linked)
    # Deleting mine (no run uses it) removes it from the store.
    at.selectbox(key="_stored").set_value(mine)
    at.button(key="_stored_delete").click().run()
    assert not at.exception
    assert store.raw.get_asset_info(mine) is None
    assert any("Deleted mine.safetensors" in s.value for s in at.success)
    assert store.raw.get_asset_info(theirs) is not None
    root = _app(user="root")
    assert any(e.label == "Your uploads in the store (1)" for e in root.expander)  # bob's


# --- torchvision models on the Setup page and in the lab -----------------------------------

MOBILENET = "torchvision:mobilenet_v3_small"


def _mobilenet_weights(num_classes: int = 10, side: int = 64) -> bytes:
    model = build_model(ModelSpec(MOBILENET, num_classes, (3, side, side), seed=0))
    return safetensors.torch.save({k: v.contiguous() for k, v in model.state_dict().items()})


def test_setup_offers_torchvision_models_and_the_lab_runs_one(dashboard_store):
    """A torchvision model is chosen like a built-in: the built-ins' own fields go, its
    weights are checked against it, and a run with it starts and is titled by its name."""
    store, manager = dashboard_store
    at = _app()
    options = at.selectbox(key="architecture").options
    assert at.selectbox(key="architecture").value == "lenet"  # the default stays
    # The source said once: "mobilenet_v3_small (torchvision)", never "torchvision:... (torchvision)"
    assert options[0] == "convnet (built-in)" and "mobilenet_v3_small (torchvision)" in options
    assert not any(o.startswith("torchvision:") for o in options)
    assert options.index("mobilenet_v3_small (torchvision)") > options.index("resnet34 (built-in)")
    at.selectbox(key="architecture").set_value(MOBILENET)
    at.number_input(key="input_size").set_value(64).run()
    assert not at.exception and not _errors(at), _errors(at)
    assert at.query_params["arch"] == MOBILENET and at.query_params["size"] == "64"
    for key in ("channels", "activation", "stem"):
        assert not any(s.key == key for s in at.selectbox), key
    assert not any(r.key == "weights_init" for r in at.radio)
    assert any("do not apply" in c.value for c in at.caption)
    assert 'ModelSpec("torchvision:mobilenet_v3_small", 10, (3, 64, 64)' in " ".join(
        c.value for c in at.code
    )

    at.file_uploader(key="weights_file.0").set_value(
        ("mobilenet.safetensors", _mobilenet_weights(), "application/octet-stream")
    )
    at.run()
    assert not _errors(at), _errors(at)
    sha = at.query_params["weights"]
    assert any("Using weights `mobilenet.safetensors`" in s.value for s in at.success)

    # A refresh (a link) brings the torchvision model back with its weights.
    again = _app(**{k: v[0] if isinstance(v, list) else v for k, v in at.query_params.items()})
    assert not again.exception and not _errors(again), _errors(again)
    assert again.selectbox(key="architecture").value == MOBILENET

    at.switch_page(LAB.path).run()
    assert any(
        f"{MOBILENET}, 10 classes, input 3x64x64, uploaded weights" in m.value for m in at.markdown
    ), [m.value for m in at.markdown]
    at.selectbox(key="attack").set_value("dlg").run()
    # One step of each raced start: the audit preset races eight, each a MobileNet step.
    at.number_input(key="iterations.dlg.audit").set_value(1)
    _start_run(at)
    run_id = at.query_params["run"]
    assert manager.wait(run_id, 180)
    record = store.get_run(run_id)
    assert record.status == "completed", record.error
    assert record.spec["model"]["spec"]["architecture"] == MOBILENET
    assert record.spec["model"]["weights_asset"] == sha
    at.run()
    assert not at.exception and not _errors(at), _errors(at)
    assert any(MOBILENET in h.value for h in at.header), [h.value for h in at.header]
    assert _verdict_headlines(at), "no verdict headline"


def test_weights_for_another_architecture_say_which_can_be_audited(dashboard_store):
    store, _ = dashboard_store
    at = _app()
    at.selectbox(key="architecture").set_value(MOBILENET)
    at.number_input(key="input_size").set_value(64).run()
    at.file_uploader(key="weights_file.0").set_value(
        ("lenet.safetensors", _lenet_weights(), "application/octet-stream")
    )
    at.run()
    assert not at.exception
    assert any(e.startswith("Weights: ") for e in _errors(at)), _errors(at)
    note = " ".join(i.value for i in at.info)
    assert f"checked against **{MOBILENET}**" in note
    assert "built-in architectures (convnet, lenet, mlp," in note
    assert "`torchvision:NAME`" in note and "`python -m auditlib models`" in note
    assert "weights" not in at.query_params and store.list_assets("model") == []

    # The same refusal for a built-in says the same.
    at.selectbox(key="architecture").set_value("convnet").run()
    assert any(e.startswith("Weights: ") for e in _errors(at)), _errors(at)
    assert any("checked against **convnet**" in i.value for i in at.info)


def test_the_weights_label_follows_the_latest_upload(dashboard_store):
    """The store keeps the first name of the same bytes; the label names the file in the
    uploader, never the previous upload's, and a refused upload shows no label at all."""
    at = _app()
    uploader = "weights_file.0"
    at.file_uploader(key=uploader).set_value(
        ("first.safetensors", _lenet_weights(), "application/octet-stream")
    )
    at.run()
    assert any("Using weights `first.safetensors`" in s.value for s in at.success)

    at.file_uploader(key=uploader).set_value(
        ("second.safetensors", _lenet_weights(), "application/octet-stream")
    )
    at.run()
    labels = [s.value for s in at.success if "Using weights" in s.value]
    assert len(labels) == 1 and labels[0].startswith("Using weights `second.safetensors`"), labels

    at.file_uploader(key=uploader).set_value(
        ("third.safetensors", _lenet_weights(7), "application/octet-stream")
    )
    at.run()
    assert any(e.startswith("Weights: ") for e in _errors(at)), _errors(at)
    assert not [s.value for s in at.success if "Using weights" in s.value]
    assert "weights" not in at.query_params


def test_the_images_label_follows_the_latest_upload(dashboard_store):
    """The same image under a new name: the label names the file now in the uploader."""
    data = (EXAMPLES / "coffee.png").read_bytes()
    at = _app()
    at.radio(key="source").set_value("upload").run()
    at.file_uploader(key="images_files.0").set_value([("one.png", data, "image/png")]).run()
    assert any("Using uploaded images: `one.png`" in s.value for s in at.success)
    at.file_uploader(key="images_files.0").set_value([("two.png", data, "image/png")]).run()
    labels = [s.value for s in at.success if "Using uploaded images" in s.value]
    assert labels == ["Using uploaded images: `two.png` (1 image)."], labels


# --- An observed update, uploaded ----------------------------------------------------------


def _observed_bundle_files(tmp_path) -> list[tuple[str, bytes, str]]:
    """The files of a bundle written by plain PyTorch code outside the product
    (``tests/test_observed.py``: LeNet at 32 px, SGD with momentum, 2 local epochs of 2
    batches), as an uploader hands them over."""
    from tests.test_observed import _plain_pytorch_client

    folder = _plain_pytorch_client(tmp_path)[0]
    return [(p.name, p.read_bytes(), "application/octet-stream") for p in sorted(folder.iterdir())]


def test_an_uploaded_observed_update_is_audited_without_the_images_and_not_scored(
    dashboard_store, tmp_path
):
    store, manager = dashboard_store
    files = _observed_bundle_files(tmp_path)
    at = _app()
    # A bundle without its training.json is refused in one line, and nothing is stored.
    at.file_uploader(key="observed_files.0").set_value(files[:2]).run()
    assert any("Observed update refused" in e and "no training.json" in e for e in _errors(at))
    assert store.list_assets() == [] and "observed" not in at.query_params
    at.file_uploader(key="observed_files.0").set_value(files).run()
    assert not at.exception
    sha = at.query_params["observed"]
    asset = store.get_asset(sha)
    assert asset is not None and asset.kind == "observed"
    assert any("Auditing the update a client sent" in s.value for s in at.success)
    # The model is the bundle's; the images may be none.
    assert any("The observed update's model: lenet, 10 classes" in i.value for i in at.info)
    at.radio(key="source").set_value("none").run()
    assert not _errors(at), _errors(at)

    at.switch_page(LAB.path).run()
    assert not at.exception
    assert any("the bundle's (FedAvg" in c.value for c in at.caption), [c.value for c in at.caption]
    assert "defense" not in [s.key for s in at.selectbox]  # nothing is added to what was sent
    at.selectbox(key="attack").set_value("ig").run()
    at.number_input(key="iterations.ig.audit").set_value(3)
    _start_run(at)
    run_id = at.query_params["run"]
    assert manager.wait(run_id, 300)
    record = store.get_run(run_id)
    assert record.status == "completed", record.error
    observed = record.spec["scenario"]["observed"]
    assert observed["source"] == "asset" and observed["location"] == sha
    assert record.spec["data"]["source"] == "none"
    assert store.runs_using_asset(sha) == 1  # the bundle stays while the run names it

    at.run()
    assert not at.exception and not _errors(at), _errors(at)
    headlines = [i.value for i in at.info if i.value.startswith("**")]
    assert any("Unavailable" in v for v in headlines), headlines
    assert not any("PSNR" in m.label for m in at.metric)
    assert any("not scored (no private images to compare with)" in c.value for c in at.caption)
    assert any("its own loss" in str(t.value.columns) for t in at.table)
    at.button(key="run_report").click().run()
    assert not at.exception and not _errors(at), _errors(at)
    assert any("PDF" in b.proto.label for b in at.get("download_button"))


# --- The whole sample ------------------------------------------------------------------------


def test_the_sample_page_audits_every_update_and_gives_the_share_with_its_interval(
    dashboard_store,
):
    store, manager = dashboard_store
    at = _app()
    at.switch_page(SAMPLE.path).run()
    assert not at.exception and not _errors(at), _errors(at)
    at.selectbox(key="attack").set_value("dlg").run()
    at.number_input(key="sample.updates").set_value(40).run()  # the 17 photographs hold 17
    assert any("holds 17 images from offset 0: 17 updates of 1" in e for e in _errors(at))
    assert at.button(key="sample.start").disabled
    at.number_input(key="sample.updates").set_value(2)
    at.number_input(key="iterations.dlg.audit").set_value(3).run()
    assert not _errors(at), _errors(at)
    said = " ".join(c.value for c in at.caption)
    assert "The 2 updates advance together as one batched computation on one worker" in said
    at.button(key="sample.start").click().run()
    assert not at.exception and not _errors(at), _errors(at)
    batch_id = at.query_params["sample"]
    states = _wait_batch(manager, store, batch_id)
    assert [s.member.label for s in states] == ["update 1 (image 1)", "update 2 (image 2)"]
    assert [s.run.spec["data"]["offset"] for s in states] == [0, 1]
    # One task advanced both (engine.together): the attack's joint time, halved, each.
    seconds = {store.get_run(s.run.id).result.timing.seconds for s in states}
    assert len(seconds) == 1, seconds

    at.run()
    assert not at.exception and not _errors(at), _errors(at)
    assert "The sample" in [h.value for h in at.subheader]
    headline = next(m.value for m in at.markdown if "images recovered beyond" in m.value)
    assert "of 2 images recovered beyond the best guess" in headline
    assert "95% interval" in headline
    # The share alone in its figure, the interval under it: never cut (issue 52).
    [share] = [m for m in at.metric if m.label == "Share of the images recovered"]
    assert share.value.endswith("%") and "(" not in share.value
    assert any(c.value.startswith("95 % interval: ") for c in at.caption)
    # The rows are the sample's updates: their column says so, not "defense".
    [table] = at.dataframe
    assert list(table.value.columns[:2]) == ["update", "status"]
    assert len(at.get("image")) == 2  # one grid per update
    at.button(key="sample.report").click().run()
    assert not at.exception and not _errors(at), _errors(at)
    assert any("PDF" in b.proto.label for b in at.get("download_button"))


# --- issue 33: private images off /media, callbacks for the user as they are now ----------


def test_private_images_reach_the_page_inline_never_by_a_media_url(dashboard_store):
    """Issue 33, item 9: Streamlit serves st.image's bytes at /media/<hash> to anyone who
    asks, signed in or not; the uploaded batch's thumbnails come as data: URLs instead."""
    files = _example_files()
    at = _app()
    at.radio(key="source").set_value("upload").run()
    at.file_uploader(key="images_files.0").set_value(files).run()
    assert not at.exception and not _errors(at), _errors(at)
    urls = [img.url for element in at.get("image") for img in element.proto.imgs]
    assert len(urls) == 4
    assert all(url.startswith("data:image/png;base64,") for url in urls), [u[:40] for u in urls]


def test_every_image_the_dashboard_shows_goes_through_inline():
    """No ``st.image`` (or ``column.image``) call of the dashboard's hands Streamlit bytes it
    would serve at /media: its first argument is ``inline(...)`` (a data: URL)."""
    import ast

    calls = []
    for path in [*(ROOT / "dashboard").glob("*.py"), *(ROOT / "pages").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "image"
                and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "store")
                and "get_store" not in ast.unparse(node.func.value)
            ):
                calls.append((path.name, ast.unparse(node.args[0]) if node.args else ""))
    # The scan finds them: the run's grids (one helper, dashboard/image_display.py, since
    # issue 52 wraps wide results), the batch pages' two, Setup's thumbnails.
    assert len(calls) >= 4, calls
    not_inline = [c for c in calls if not c[1].lstrip("[").startswith("inline(")]
    assert not not_inline, not_inline


def test_a_removed_users_next_click_does_nothing(dashboard_store, tmp_path, monkeypatch):
    """Issue 33, item 6: a button's callback runs before app.py's sign-in check; for a user
    removed from the users file since the page was drawn it does nothing, and the next run
    shows the sign-in form."""
    import shutil

    from auditlib.access.users import remove_user, users_file

    path = tmp_path / "users.yaml"
    shutil.copy(users_file(), path)
    monkeypatch.setenv("AUDIT_USERS_FILE", str(path))
    store, _ = dashboard_store
    at = _app()
    at.file_uploader(key="weights_file.0").set_value(
        ("mine.safetensors", _lenet_weights(10), "application/octet-stream")
    )
    at.run()
    sha = at.query_params["weights"]
    assert store.get_asset_info(sha) is not None

    remove_user("alice", path=path)
    at.button(key="remove_weights").click().run()
    assert not at.exception
    assert store.raw.get_asset_info(sha) is not None  # the Remove did not delete it
    assert any("Sign in to see your runs" in c.value for c in at.caption)
    assert any("sign in again" in i.value for i in at.info), [i.value for i in at.info]


def test_the_first_admin_chooses_a_password_before_any_page(dashboard_store, tmp_path, monkeypatch):
    """Issue 33, item 12: the generated password (in a 0600 file, never printed) signs the
    first admin in to one form only, "Choose your password"; the new one ends the generated
    one and its file, and the pages follow."""
    from auditlib.access.users import init_users, read_users

    path = tmp_path / "users.yaml"
    monkeypatch.setenv("AUDIT_USERS_FILE", str(path))
    one_time = init_users(path)
    generated = one_time.read_text().strip()
    at = _app(user="admin")
    assert not at.exception
    assert any("Choose your password" in t.value for t in at.title)
    assert not any(e.label.startswith("Your uploads") for e in at.expander)  # no Setup page
    at.text_input[0].set_value("mine-at-last")
    at.text_input[1].set_value("not-the-same")
    at.button[0].click().run()
    assert any("The two passwords differ" in e for e in _errors(at))
    at.text_input[0].set_value(generated)
    at.text_input[1].set_value(generated)
    at.button[0].click().run()
    assert any("the one in use" in e for e in _errors(at)), _errors(at)
    at.text_input[0].set_value("mine-at-last")
    at.text_input[1].set_value("mine-at-last")
    at.button[0].click().run()
    assert not at.exception and not _errors(at), _errors(at)
    users = read_users(path)
    assert users.check_password("admin", "mine-at-last") and not users.users["admin"].must_change
    assert not one_time.exists()
    assert any(e.label.startswith("Your uploads in the store") for e in at.expander)
    assert any("Signed in as **admin**" in c.value for c in at.sidebar.caption)


def test_guessing_a_name_nobody_has_reads_as_guessing_a_real_one(dashboard_store):
    """Issue 33, item 2: the slowing counts the name typed whether or not anyone has it;
    slowing only real names would tell a guesser after five tries which names exist."""
    from auditlib.access.throttle import FIRST_WAIT_S, FREE_FAILURES

    def guesses(name: str) -> list[list[str]]:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
        said = []
        for attempt in range(FREE_FAILURES + 1):
            at.text_input[0].set_value(name)
            at.text_input[1].set_value(f"wrong-{attempt}")
            at.button[0].click().run()
            said.append(_errors(at))
        return said

    def worded(said: list[list[str]]) -> list[list[str]]:
        # The wait counts down by the second as the tries go: a slow machine's two series
        # may stand a second apart there, which tells nothing of the name.
        return [[re.sub(r"again in \d+ s", "again in N s", m) for m in step] for step in said]

    real, made_up = guesses("bob"), guesses("nobody-at-all")
    assert worded(real) == worded(made_up), (real, made_up)
    assert "Too many failed sign-ins" in real[FREE_FAILURES - 1][0]
    waits = [int(w) for step in real + made_up for m in step for w in re.findall(r"in (\d+) s", m)]
    assert waits and all(0 < w <= FIRST_WAIT_S for w in waits), waits
    assert "Too many failed sign-ins" in real[FREE_FAILURES][0]


def test_a_demoted_admins_next_click_acts_as_an_auditor(dashboard_store, tmp_path, monkeypatch):
    """Issue 33, item 6: an admin opens another user's weights by their link (an admin may)
    and is made an auditor before pressing Remove: the click acts for an auditor, who
    holds no claim to them, so nothing is deleted (the admin of the drawn page would have
    deleted them)."""
    import shutil

    from auditlib.access import Principal
    from auditlib.access.users import add_user, set_role, users_file
    from auditlib.store.scoped import UserStore

    path = tmp_path / "users.yaml"
    shutil.copy(users_file(), path)
    monkeypatch.setenv("AUDIT_USERS_FILE", str(path))
    add_user("ada", "ada-password", "admin", path=path)  # root is not the last admin then
    store, _ = dashboard_store
    bobs = UserStore(store.raw, Principal("bob")).put_asset(
        "model", "bobs.safetensors", _lenet_weights(10)
    )
    at = _app(user="root", weights=bobs)
    assert any("Using weights" in s.value for s in at.success), [s.value for s in at.success]
    set_role("root", "auditor", path=path)
    at.button(key="remove_weights").click().run()
    assert not at.exception
    assert store.raw.get_asset_info(bobs) is not None
    assert any("Signed in as **root** (auditor)" in c.value for c in at.sidebar.caption)
