"""A text run's uploads in the store, as an image run's: linked to the run that uses them,
kept while it is stored, deleted with the last run that used them and by retention with
it; the run can be run again from them, and its result names each file by the sha256 of
its bytes. Real SQLite stores in temporary folders; no Ray here (the Text page's test
runs one on Ray)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from datetime import timedelta

import pytest

from auditlib.engine.text_audit import TextAuditSpec, input_digests, run_text_audit
from auditlib.engine.text_runs import (
    OWN_MODEL,
    UPLOADS_KEY,
    TextUploads,
    stored_text_spec,
    stored_uploads,
)
from auditlib.errors import AuditInputError
from auditlib.models.text import MODEL_FILES, build_text_model
from auditlib.report.text_pdf import render_text_report
from auditlib.store import COMPLETED, Store
from auditlib.store.convert import utcnow
from auditlib.store.text_runs import TextRunStore
from auditlib.text_result_json import text_result_dict
from auditlib.text_result_read import read_text_result

TEXT = b"the first private line of the notes\nand a second private line here\n"


@pytest.fixture
def store(tmp_path):
    with Store(f"sqlite:///{tmp_path / 'audit.db'}") as opened:
        yield opened


def _model_folder(path):
    built = build_text_model("gpt2-tiny", seed=3)
    built.backbone.save_pretrained(path, safe_serialization=True)
    built.tokenizer.tokenizer.save(str(path / "tokenizer.json"))
    return {name: (path / name).read_bytes() for name in MODEL_FILES}


def test_an_upload_a_text_run_uses_is_kept_until_its_last_run_goes(store):
    sha = store.put_asset("text", "notes.txt", TEXT, owner="alice")
    runs = TextRunStore(store)
    first = runs.create({"model": "gpt2-tiny"}, owner="alice", assets=[sha])
    second = runs.create({"model": "gpt2-tiny"}, owner="alice", assets=[sha])
    assert runs.assets(first) == [sha]
    assert store.runs_using_asset(sha) == 2 and store.runs_using_asset(sha, owner="bob") == 0
    with pytest.raises(AuditInputError, match="used by 2 stored run"):
        store.delete_asset(sha)
    with pytest.raises(AuditInputError, match="2 of your stored run"):
        store.release_asset(sha, "alice")
    assert runs.delete(first) == []  # the other run still names it
    assert store.get_asset_info(sha) is not None
    (freed,) = runs.delete(second)
    assert freed.sha256 == sha and freed.name == "notes.txt"
    assert store.get_asset_info(sha) is None and runs.get(second) is None


def test_retention_deletes_finished_text_runs_and_their_uploads_and_keeps_live_ones(store):
    runs = TextRunStore(store)
    old_sha = store.put_asset("text", "old.txt", b"old notes\n", owner="alice")
    live_sha = store.put_asset("text", "live.txt", b"live notes\n", owner="alice")
    done = runs.create({"model": "gpt2-tiny"}, owner="alice", assets=[old_sha])
    runs.finish(done, COMPLETED, result={"modality": "text"})
    live = runs.create({"model": "gpt2-tiny"}, owner="alice", assets=[live_sha])
    count, _, uploads = store.delete_older_than(utcnow() + timedelta(seconds=1))
    assert count == 1 and [u.sha256 for u in uploads] == [old_sha]
    assert runs.get(done) is None and store.get_asset_info(old_sha) is None
    assert runs.get(live) is not None and store.get_asset_info(live_sha) is not None


def test_a_stored_run_is_read_back_with_its_uploads_by_their_hash(store, tmp_path):
    files = _model_folder(tmp_path)
    uploads = TextUploads(files, "notes.txt", TEXT)
    digests = uploads.digests()
    for name, data in [*files.items(), ("notes.txt", TEXT)]:  # the store's keys, the same
        assert store.put_asset("text", name, data, owner="alice") in digests.values()
    spec = TextAuditSpec(model=OWN_MODEL, text_file="notes.txt", batch_size=2, length=8)
    stored = {**spec.__dict__, "attacks": list(spec.attacks), UPLOADS_KEY: digests}

    def read(sha):
        asset = store.get_asset(sha)
        return None if asset is None else asset.data

    assert stored_text_spec(stored) == spec
    back = stored_uploads(stored, read)
    assert back.model_files == files and back.text_bytes == TEXT
    assert back.text_name == "notes.txt"
    with pytest.raises(AuditInputError, match=r"^tokenizer\.json is no longer stored"):
        stored_uploads(stored, lambda sha: None if sha == digests["tokenizer.json"] else read(sha))
    with pytest.raises(AuditInputError, match=r"^notes\.txt is no longer stored"):
        stored_uploads(stored, lambda sha: None if sha == digests["text"] else read(sha))
    older = {k: v for k, v in stored.items() if k != UPLOADS_KEY}  # recorded before schema 9
    with pytest.raises(AuditInputError, match=r"without the hash of its config\.json"):
        stored_uploads(older, read)
    demo = {**stored, "model": "gpt2-tiny", "text_file": None}  # a preset: nothing to read
    assert stored_uploads(demo, lambda sha: pytest.fail("read")) == TextUploads()


def test_the_result_names_each_audited_file_by_its_hash_in_json_and_pdf(tmp_path):
    folder = tmp_path / "model"
    files = _model_folder(folder)
    text = tmp_path / "notes.txt"
    text.write_bytes(TEXT)
    spec = TextAuditSpec(model=str(folder), text_file=str(text), batch_size=2, length=6)
    expected = {n: hashlib.sha256(files[n]).hexdigest() for n in MODEL_FILES}
    expected["text"] = hashlib.sha256(TEXT).hexdigest()
    assert input_digests(spec) == expected
    assert TextUploads(files, "notes.txt", TEXT).digests() == expected  # the run's links
    result = run_text_audit(spec)
    assert result.inputs == expected
    stored = read_text_result(text_result_dict(result))
    assert dict(stored.inputs) == expected
    if shutil.which("pdftotext"):  # the report's Settings name each file by its hash
        (tmp_path / "report.pdf").write_bytes(render_text_report(stored))
        out = subprocess.run(
            ["pdftotext", "-raw", str(tmp_path / "report.pdf"), "-"],
            capture_output=True,
            check=True,
        )
        words = " ".join(out.stdout.decode("utf-8").split())
        assert all(f"sha256 of {name} {digest}" in words for name, digest in expected.items())
    assert input_digests(TextAuditSpec(model="gpt2-tiny")) == {}  # a preset reads no file
    with pytest.raises(AuditInputError, match="sha256"):
        read_text_result({**text_result_dict(result), "inputs": {"text": "not a hash"}})
