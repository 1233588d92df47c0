"""Files the product writes are its owner's: the data folder 0700, the database 0600 (its
-wal and -shm take the database's mode), the users file 0600; a report the CLI writes
follows the user's umask like any file they write."""

from __future__ import annotations

import os
import stat

from auditlib.paths import data_dir
from auditlib.store import Store


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_data_folder_and_the_database_are_private(tmp_path, monkeypatch):
    folder = tmp_path / "data"
    monkeypatch.setenv("AUDIT_DATA_DIR", str(folder))
    old = os.umask(0o022)  # a usual umask: files 0644 and folders 0755 unless asked otherwise
    try:
        assert _mode(data_dir()) == 0o700
        with Store(f"sqlite:///{folder / 'audit.db'}") as store:
            store.create_batch("comparison", "t", {"members": []})  # something written
            modes = {p.name: _mode(p) for p in folder.iterdir()}
        assert modes["audit.db"] == 0o600, modes
        assert all(m & 0o077 == 0 for m in modes.values()), modes
        # A folder made open before is closed again.
        folder.chmod(0o755)
        assert _mode(data_dir()) == 0o700
    finally:
        os.umask(old)


def test_a_report_written_by_the_cli_follows_the_users_umask(tmp_path):
    from auditlib.report.pdf import build_report
    from tests.test_report_unscored import unscored_subject

    subject = unscored_subject(tmp_path)
    old = os.umask(0o027)
    try:
        build_report(subject, tmp_path / "report.pdf", charts=False)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "report.pdf") == 0o640


def test_no_message_carries_the_database_password():
    """An error about the store names it without its password (the dashboard shows them)."""
    import pytest

    from auditlib.errors import AuditInputError
    from auditlib.report.subject import batch_subject, run_subject
    from auditlib.store.retention import where_and_how_long

    class Planted:  # a store whose URL holds a password; nothing in it
        url = "postgresql+psycopg://audit:s3cret-pw@127.0.0.1:5432/audit"

        def get_run(self, run_id):
            return None

        def get_batch(self, batch_id):
            return None

    for read in (run_subject, batch_subject):
        with pytest.raises(AuditInputError) as refused:
            read(Planted(), "nope")
        assert "s3cret-pw" not in str(refused.value) and "127.0.0.1" in str(refused.value)
    assert "s3cret-pw" not in where_and_how_long(Planted())


def test_a_set_of_small_files_that_decodes_to_gigabytes_is_refused_from_its_headers():
    """Issue 33, item 5: 64 black 6300x6300 PNGs are a few MB and decode to 7.6 GB; the set
    is refused from the headers before any image is decoded, with memory bounded."""
    import io
    import resource

    import numpy as np
    import pytest
    from PIL import Image

    from auditlib.data import load_image_uploads
    from auditlib.errors import AuditInputError

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((6300, 6300), dtype=np.uint8)).save(buffer, format="PNG")
    bomb = buffer.getvalue()
    assert len(bomb) < 200_000  # a small file each
    files = [(f"black-{i:02d}.png", bomb) for i in range(64)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(AuditInputError, match="pixels together; at most 160,000,000"):
        load_image_uploads(files)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 200_000, grown_kib  # not one image decoded (one is 40 MB)


def test_each_user_holds_uploads_within_a_quota(tmp_path, monkeypatch):
    """Issue 33, item 5: a per-user storage quota (AUDIT_USER_QUOTA_MB); the same bytes
    again cost nothing; another user's uploads are theirs; a refusal stores nothing."""
    import pytest

    from auditlib.access import Principal
    from auditlib.errors import AuditInputError
    from auditlib.store.scoped import DEFAULT_QUOTA_MB, UserStore, user_quota_bytes

    assert user_quota_bytes() == DEFAULT_QUOTA_MB * 1_000_000
    monkeypatch.setenv("AUDIT_USER_QUOTA_MB", "0.001")  # 1,000 bytes
    with Store(f"sqlite:///{tmp_path / 'audit.db'}") as store:
        alice, bob = UserStore(store, Principal("alice")), UserStore(store, Principal("bob"))
        first = alice.put_asset("images", "a.zip", b"a" * 800)
        assert alice.put_asset("images", "again.zip", b"a" * 800) == first
        with pytest.raises(AuditInputError, match="to 1,100 bytes, over your quota of 1,000 bytes"):
            alice.put_asset("images", "b.zip", b"b" * 300)
        assert [a.name for a in alice.list_assets()] == ["again.zip"]  # as she last named it
        bob.put_asset("images", "c.zip", b"c" * 900)  # bob's own quota
    monkeypatch.setenv("AUDIT_USER_QUOTA_MB", "lots")
    with pytest.raises(AuditInputError, match="must be a number"):
        user_quota_bytes()
