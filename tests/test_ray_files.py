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


def test_the_embedded_ray_keeps_its_session_under_the_private_folder(ray_session):
    import ray

    from auditlib.engine import ray_backend

    assert ray.get(ray_backend.warm_up.remote())  # a worker runs under it
    node = ray._private.worker.global_worker.node
    root = os.path.dirname(node.get_session_dir_path())
    assert root == ray_files.private_temp_dir()
    assert mode(root) == 0o700
