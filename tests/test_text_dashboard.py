"""The Text page under Streamlit's AppTest: a bad upload is refused in words, a tiny text
audit (gpt2-tiny, 2 sequences of 10 tokens, DAGER) runs on Ray and shows its verdict and
its sequences, and another user does not see it; a run on the auditor's uploads runs
again from the store and is deleted with them. Real runs: the process-wide Ray of the
test session and a SQLite store in a temporary folder (conftest's ``dashboard_store``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the dashboard is imported as a package from the repo root
    sys.path.insert(0, str(ROOT))

from dashboard.navigation import TEXT  # noqa: E402
from dashboard.text_engine import shared_text_manager  # noqa: E402
from tests.page_faults import page_faults  # noqa: E402

APP = str(ROOT / "app.py")
TIMEOUT = 60


def _text_page(user: str = "alice", **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["authentication_status"] = True
    at.session_state["username"] = user
    at.query_params.update(query)
    at.run()
    return at.switch_page(TEXT.path).run()


def _shown(at: AppTest) -> str:
    parts = [
        e.value
        for kind in ("markdown", "caption", "info", "warning", "error", "success", "subheader")
        for e in getattr(at, kind)
    ]
    for grid in (*at.dataframe, *at.table):  # every cell whole (to_string cuts long ones)
        parts += [str(v) for v in grid.value.astype(str).to_numpy().ravel()]
    return "\n".join(parts)


def test_a_text_file_that_is_not_utf8_is_refused_in_words(dashboard_store):
    store, _ = dashboard_store
    at = _text_page()
    at.radio(key="text_data_source").set_value("upload").run()
    at.file_uploader(key="text_data_file").set_value(
        ("notes.txt", b"\xff\xfe\x00 not text", "text/plain")
    )
    at.run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any("Text file refused" in e and "not UTF-8" in e for e in errors), errors
    assert store.list_assets("text") == []  # nothing refused is stored
    at.button(key="text_start").click().run()
    assert any("Upload your text file" in e.value for e in at.error)


def test_a_model_folder_without_its_weights_is_refused(dashboard_store):
    at = _text_page()
    at.radio(key="text_model_source").set_value("upload").run()
    at.file_uploader(key="text_model_files").set_value(
        [("config.json", b'{"model_type": "gpt2"}', "application/json")]
    )
    at.run()
    assert not at.exception
    assert any("model.safetensors" in e.value and "refused" in e.value for e in at.error)


def test_an_uploaded_llama_folder_is_taken_and_named_by_its_architecture(dashboard_store, tmp_path):
    from auditlib.models.text import MODEL_FILES, build_text_model

    built = build_text_model("llama-tiny", seed=2)
    built.backbone.save_pretrained(tmp_path, safe_serialization=True)
    built.tokenizer.tokenizer.save(str(tmp_path / "tokenizer.json"))
    at = _text_page()
    at.radio(key="text_model_source").set_value("upload").run()
    at.file_uploader(key="text_model_files").set_value(
        [(n, (tmp_path / n).read_bytes(), "application/octet-stream") for n in MODEL_FILES]
    )
    at.run()
    assert not at.exception and not [e.value for e in at.error]
    count = sum(p.numel() for p in built.module.parameters())
    assert any(f"a decoder (llama), {count:,} parameters" in s.value for s in at.success)


def test_a_tiny_text_audit_runs_shows_its_verdict_and_is_its_owners_alone(dashboard_store):
    at = _text_page()
    at.selectbox(key="text_preset").set_value("gpt2-tiny")
    at.number_input(key="text_batch").set_value(2)
    at.number_input(key="text_tokens").set_value(10).run()
    at.button(key="text_start").click().run()
    assert not page_faults(at), page_faults(at)  # a fast run may show its verdict already
    run_id = at.session_state["text_run"]
    assert at.query_params["text_run"] == run_id
    assert shared_text_manager().wait(run_id, 180)
    at.run()
    record = shared_text_manager().runs.get(run_id)
    assert record.status == "completed", record.error
    shown = _shown(at)
    assert "2 sequences of 2 recovered" in shown  # the verdict (DAGER is exact here)
    private = record.result["runs"][0]["sequences"][0]["private"]
    # Compare defenses: the finished run's row, its verdict and (no defense) no epsilon.
    (compare,) = [d.value for d in at.dataframe if "defense" in d.value.columns]
    assert compare["verdict"].tolist() == [record.result["verdict"]["headline"]]
    assert compare["defense"].tolist() == ["none"] and compare["epsilon"].isna().all()
    assert private in shown  # side by side with what was recovered
    # Masked, the private words are gone from the table.
    at.checkbox(key="text_mask").check().run()
    assert private not in _shown(at)
    # Bob opens the same link: refused, and none of alice's text shows.
    bob = _text_page("bob", text_run=run_id)
    assert any("belongs to another user" in e.value for e in bob.error)
    assert private not in _shown(bob)


def test_a_bad_text_run_is_refused_before_it_is_recorded_and_orphans_are_failed(tmp_path):
    from auditlib.engine.text_audit import TextAuditSpec
    from auditlib.engine.text_runs import GONE_REASON, TextRunManager, TextUploads
    from auditlib.errors import AuditInputError
    from auditlib.store import Store

    with Store(f"sqlite:///{tmp_path / 'audit.db'}") as store:
        manager = TextRunManager(store, instance="a" * 32)
        noisy = TextAuditSpec(
            model="gpt2-tiny", defense="dp-gaussian", defense_params={"sigma": "-1"}
        )
        with pytest.raises(AuditInputError, match="sigma"):
            manager.start(noisy, TextUploads(), owner="alice")
        with pytest.raises(AuditInputError, match="model folder lacks"):
            manager.start(TextAuditSpec(model="own"), TextUploads(), owner="alice")
        assert manager.runs.list() == []
        # A run left unfinished by a process that is gone fails when the next one starts.
        left = manager.runs.create({"model": "gpt2-tiny"}, owner="alice", instance="b" * 32)
        mine = manager.runs.create({"model": "gpt2-tiny"}, owner="alice", instance="a" * 32)
        again = TextRunManager(store, instance="a" * 32)
        assert again.orphans_failed == 1
        assert manager.runs.get(left).status == "failed"
        assert manager.runs.get(left).error == GONE_REASON
        assert manager.runs.get(mine).status == "queued"


def test_a_run_on_uploads_runs_again_from_the_store_and_goes_with_them(dashboard_store, tmp_path):
    import hashlib

    from auditlib.models.text import MODEL_FILES, build_text_model

    store, _ = dashboard_store
    built = build_text_model("gpt2-tiny", seed=5)
    built.backbone.save_pretrained(tmp_path, safe_serialization=True)
    built.tokenizer.tokenizer.save(str(tmp_path / "tokenizer.json"))
    files = {name: (tmp_path / name).read_bytes() for name in MODEL_FILES}
    text = b"a private note about the ward\nanother private note on the round\n"
    at = _text_page()
    at.radio(key="text_model_source").set_value("upload").run()
    at.file_uploader(key="text_model_files").set_value(
        [(name, data, "application/octet-stream") for name, data in files.items()]
    )
    at.radio(key="text_data_source").set_value("upload").run()
    at.file_uploader(key="text_data_file").set_value(("notes.txt", text, "text/plain"))
    at.number_input(key="text_batch").set_value(2)
    at.number_input(key="text_tokens").set_value(6).run()
    at.button(key="text_start").click().run()
    assert not page_faults(at), page_faults(at)  # a fast run may show its verdict already
    first = at.session_state["text_run"]
    assert shared_text_manager().wait(first, 180)
    at.run()
    expected = {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}
    expected["text"] = hashlib.sha256(text).hexdigest()
    record = shared_text_manager().runs.get(first)
    assert record.status == "completed", record.error
    assert record.spec["uploads"] == expected == record.result["inputs"]
    assert record.result["model"].startswith("the auditor's model in uploaded-folder")
    assert sorted(shared_text_manager().runs.assets(first)) == sorted(expected.values())
    assert expected["text"][:16] in _shown(at)  # the audited files by their hash
    # Run again: the same settings on the uploads read back from the store.
    at.button(key="text_run_again").click().run()
    second = at.session_state["text_run"]
    assert second != first and not page_faults(at), page_faults(at)
    assert shared_text_manager().wait(second, 180)
    at.run()
    again = shared_text_manager().runs.get(second)
    assert again.status == "completed", again.error
    assert again.result["inputs"] == expected
    assert again.result["runs"][0]["sequences"] == record.result["runs"][0]["sequences"]
    # Deleted: the first run's uploads stay (the second uses them), then go with the second.
    at.button(key="text_delete_run").click().run()
    assert any("other runs use them" in s.value for s in at.success)
    assert shared_text_manager().runs.get(second) is None
    assert {a.sha256 for a in store.list_assets()} == set(expected.values())
    at.query_params["text_run"] = first
    at.run()
    at.button(key="text_delete_run").click().run()
    assert any("4 uploads no other run used" in s.value for s in at.success), at.success
    assert store.list_assets() == [] and shared_text_manager().runs.get(first) is None
    # The form lets go of them too: its boxes are empty and it does not store them again.
    assert any("No model folder yet" in i.value for i in at.info)
    at.run()
    assert store.list_assets() == []


def test_the_device_is_chosen_on_the_page_and_a_gpu_ray_lacks_is_refused_in_words(
    dashboard_store,
):
    at = _text_page()
    device = at.selectbox(key="text_device")
    assert device.options == ["cpu", "cuda"] and device.value == "cpu"  # Ray offers no GPU here
    at.selectbox(key="text_preset").set_value("gpt2-tiny")
    device.set_value("cuda").run()
    at.button(key="text_start").click().run()
    assert any("Not started" in e.value and "needs a GPU" in e.value for e in at.error), [
        e.value for e in at.error
    ]
    assert "text_run" not in at.session_state
    assert shared_text_manager().runs.unfinished() == []  # nothing recorded
