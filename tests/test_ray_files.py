"""Ray's files kept to the service's user (issue 51, item 8): the embedded Ray's temp
folder is the user's own and 0700, and its auth token 0600."""

from __future__ import annotations

import os
import stat

import pytest

from auditlib.engine import ray_files


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_temp_folder_is_made_private(tmp_path, monkeypatch):
    folder = tmp_path / "ray"
    monkeypatch.setenv("AUDIT_RAY_TEMP_DIR", str(folder))
    assert ray_files.private_temp_dir() == str(folder)
    assert mode(folder) == 0o700
    folder.chmod(0o777)  # Ray's own mode for its folders
    ray_files.private_temp_dir()
    assert mode(folder) == 0o700


def test_a_temp_folder_someone_else_made_first_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "ray"
    folder.mkdir()
    monkeypatch.setenv("AUDIT_RAY_TEMP_DIR", str(folder))
    if os.getuid() == 0:  # root can give it away, as another user would have made it
        os.chown(folder, 12345, 12345)
        with pytest.raises(RuntimeError, match="belongs to user id 12345"):
            ray_files.private_temp_dir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    monkeypatch.setenv("AUDIT_RAY_TEMP_DIR", str(link))
    with pytest.raises(RuntimeError, match="not a plain folder"):
        ray_files.private_temp_dir()


def test_the_token_file_is_made_readable_by_its_user_only(tmp_path, monkeypatch):
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir(mode=0o755)
    token.write_text("secret")
    token.chmod(0o644)  # as Ray writes it
    monkeypatch.setattr(ray_files, "TOKEN", token)
    ray_files.private_token()
    assert (mode(token), mode(token.parent)) == (0o600, 0o700)


def test_the_embedded_ray_is_started_in_the_private_folder(tmp_path, monkeypatch):
    """What ``ray_backend`` asks ``ray.init`` for when it starts the embedded Ray (read from
    the call, without starting one: the test session's Ray may have been started by
    another fixture, in Ray's default folder)."""
    import ray

    from auditlib.engine import ray_backend

    folder = tmp_path / "ray"
    monkeypatch.setenv("AUDIT_RAY_TEMP_DIR", str(folder))
    monkeypatch.delenv("AUDIT_RAY_ADDRESS", raising=False)
    asked: dict = {}

    def init(**kwargs):
        asked.update(kwargs)
        raise RuntimeError("not started in this test")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray_backend, "_errors", [])
    ray_backend._keep_ray(None)  # returns at once: the call failed
    assert asked["_temp_dir"] == str(folder) and mode(folder) == 0o700
