"""Ray's files on this machine kept to the service's user.

Ray makes its session folders under ``/tmp/ray`` 0777 without the sticky bit, its logs
readable by everyone, and writes its auth token (``~/.ray/auth_token``) 0644. The embedded
Ray gets a temp folder of the user's own, 0700 (``AUDIT_RAY_TEMP_DIR``, default
``/tmp/ray-<uid>``: short, because Ray's unix sockets live under it and a socket path is
limited to 107 bytes), so nothing under it is reachable by another local user whatever
modes Ray gives; the token file and its folder are made 0600 / 0700 wherever Ray is used.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

TOKEN = Path("~/.ray/auth_token")


def private_temp_dir() -> str:
    """The embedded Ray's temp folder: made 0700 if absent, refused if someone else owns it
    or it is a link (another user could have made it first to read Ray's files)."""
    path = Path(os.environ.get("AUDIT_RAY_TEMP_DIR") or f"/tmp/ray-{os.getuid()}")
    if not path.is_absolute():
        raise RuntimeError(f"AUDIT_RAY_TEMP_DIR must be an absolute path, got {str(path)!r}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise RuntimeError(f"Ray's temp folder {path} is not a plain folder; remove it")
    if info.st_uid != os.getuid():
        raise RuntimeError(
            f"Ray's temp folder {path} belongs to user id {info.st_uid}, not this service's "
            f"({os.getuid()}); remove it or set AUDIT_RAY_TEMP_DIR"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        path.chmod(0o700)
    return str(path)


def private_token() -> None:
    """Ray's auth token file 0600 and its folder 0700, where this user has one."""
    token = TOKEN.expanduser()
    if token.is_file() and not token.is_symlink():
        token.parent.chmod(0o700)
        token.chmod(0o600)
