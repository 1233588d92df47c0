"""A result folder replaced whole: the CLI's ``--out`` holds either the earlier complete
result or the new complete one, whenever the command is stopped (Ctrl-C, kill -9, a full
disk).

Why a folder swap and not file by file: a result is several files (result.json and its
pictures, a sample's update folders). Replaced one at a time, a stop between two leaves a
result beside another run's picture, or none. The new result is written into a hidden
sibling folder, then exchanged with ``--out`` in one ``renameat2(RENAME_EXCHANGE)`` (Linux);
the earlier result, now in the sibling, is deleted after. Where the file system cannot
exchange, two renames with the earlier result kept aside, put back by the next command if a
stop fell between them.

The swap would carry away anything else in the folder, so a folder holding files this tool
did not write is refused before the run (:func:`check_output_folder`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

from auditlib.errors import AuditInputError

# What a result folder may hold: what the audit and sample commands write.
OURS = re.compile(r"^(result\.json|reconstruction(_\d+)?\.png|update-\d{3,})$")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def check_output_folder(out: Path) -> None:
    """Refuse, before any work, an ``--out`` its result could not replace whole."""
    if out.exists() and not out.is_dir():
        raise AuditInputError(f"--out {out} exists and is not a folder")
    if out.resolve() == Path.cwd().resolve():
        raise AuditInputError(
            f"--out {out} is the current folder; give a folder of its own for the result"
        )
    if out.is_dir():
        foreign = sorted(name for name in os.listdir(out) if not OURS.match(name))
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise AuditInputError(
                f"--out {out} holds files this tool did not write ({shown}); a result replaces "
                "its folder whole, so give an empty folder, a new one, or an earlier result's"
            )


def replace_file(path: Path, data: bytes) -> None:
    """Write one file whole: into a temporary file beside it, flushed, then renamed over it
    (a stop leaves the earlier file or the new one)."""
    staging = path.parent / f".{path.name}.new-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(staging, "xb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step; False where the system or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _sync_tree(folder: Path) -> None:
    """Flush every file and folder under ``folder`` to disk (a swap must not publish
    files whose bytes are still only in memory)."""
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as file:
                os.fsync(file.fileno())
        _sync_folder(Path(root))


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pid_of(sibling: Path) -> int | None:
    match = re.search(r"\.(new|old)-(\d+)-", sibling.name)
    return int(match.group(2)) if match else None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover(out: Path) -> None:
    """Tidy what a stopped command left beside ``out``: put an earlier result kept aside
    back where the swap did not finish; delete unfinished new results. A sibling of a
    command still running is left alone."""
    parent, name = out.parent, out.name
    if not parent.is_dir():
        return
    for sibling in sorted(parent.glob(f".{name}.old-*")):
        if _alive(_pid_of(sibling)):
            continue
        if not out.exists():
            os.rename(sibling, out)
        else:
            shutil.rmtree(sibling, ignore_errors=True)
    for sibling in parent.glob(f".{name}.new-*"):
        if not _alive(_pid_of(sibling)):
            shutil.rmtree(sibling, ignore_errors=True)


def publish(out: Path, write: Callable[[Path], None]) -> None:
    """Write a result with ``write(folder)`` into a hidden sibling of ``out``, then put it
    in ``out``'s place in one step."""
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    recover(out)
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    staging = out.parent / f".{out.name}.new-{tag}"
    staging.mkdir(mode=0o777)
    try:
        write(staging)
        _sync_tree(staging)
        if not out.exists():
            os.rename(staging, out)
        elif _exchange(staging, out):
            shutil.rmtree(staging)  # the earlier result, now here
        else:
            aside = out.parent / f".{out.name}.old-{tag}"
            os.rename(out, aside)
            try:
                os.rename(staging, out)
            finally:  # a stop between the renames: the earlier result back in its place
                if not out.exists():
                    os.rename(aside, out)
            shutil.rmtree(aside)
        _sync_folder(out.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            if staging.exists() and staging.name.startswith(f".{out.name}.new-"):
                shutil.rmtree(staging)
