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
