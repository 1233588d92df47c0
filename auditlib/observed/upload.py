"""An observed-update bundle brought in as an upload: its files, or one zip of them.

The dashboard takes a bundle as the files of its folder (``global.safetensors``,
``client.safetensors`` or ``delta.safetensors``, ``training.json``) or as one zip of that
folder, checks it as :func:`~auditlib.observed.bundle.load_bundle` checks a folder, and
stores it as one archive (:func:`bundle_archive`): a zip of exactly the bundle's files,
written the same way every time, so the same bundle is the same stored asset. A run reads
it back with :func:`bundle_from_archive`. Nothing is unpickled; every size is checked
before anything is read, and a zip's members are inflated in bounded pieces
(``data.archives.read_member``).

A bundle whose training.json names a model class of the client's own code
(``path/to/file.py:ClassName``) is taken only where an admin allows trusted code on the
server (``access.trusted_code``); its ``.py`` file then comes as an upload of its own, checked
by ``models.own_code.check_own_file``, and is run only in the audit's isolated process.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from auditlib.access.trusted_code import HOW_TO_ALLOW
from auditlib.data.archives import read_member
from auditlib.errors import AuditInputError
from auditlib.models import own_code
from auditlib.models.loading import DEFAULT_MAX_BYTES
from auditlib.observed.bundle import (
    BUNDLE_FILES,
    CLIENT_FILE,
    DELTA_FILE,
    GLOBAL_FILE,
    MAX_TRAINING_BYTES,
    ObservedBundle,
    bundle_from_files,
)
from auditlib.observed.record import FILE as TRAINING_FILE
from auditlib.words import size_text

_EXPECTED = f"{GLOBAL_FILE}, {CLIENT_FILE} (or {DELTA_FILE}) and {TRAINING_FILE}"
_MAX_MEMBERS = 16  # a bundle has three files; a zip of its folder may add a few entries
_STORED_AT = (2020, 1, 1, 0, 0, 0)  # one timestamp, so one bundle gives one archive


def max_archive_bytes(max_bytes: int = DEFAULT_MAX_BYTES) -> int:
    """The largest upload a bundle can be: two weights files and training.json."""
    return 2 * max_bytes + MAX_TRAINING_BYTES


def bundle_from_upload(
    files: Sequence[tuple[str, bytes]],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    trusted_code: bool = False,
) -> tuple[ObservedBundle, bytes]:
    """The checked bundle of an upload (file name and bytes of each uploaded file: the
    bundle's files, or one zip of them) and its archive for the store; refused in one line
    where it is not a bundle, or where it names a model class of the client's own code and
    ``trusted_code`` (the server's admin setting) is off."""
    if not files:
        raise AuditInputError(f"no files were uploaded; expected {_EXPECTED}, or one zip of them")
    zips = [name for name, _ in files if name.lower().endswith(".zip")]
    if zips:
        if len(files) > 1:
            raise AuditInputError(
                f"upload either one zip of the bundle or its files ({_EXPECTED}), not both"
            )
        contents = _zip_members(files[0][1], files[0][0], max_bytes)
        location = f"upload {files[0][0]}"
    else:
        contents = {}
        for name, data in files:
            base = PurePosixPath(name.replace("\\", "/")).name
            if base in contents:
                raise AuditInputError(f"{base} was uploaded twice; expected each file once")
            contents[base] = data
        location = "the uploaded files"
    bundle = bundle_from_files(contents, location, max_bytes=max_bytes)
    if bundle.model_spec.info.source == own_code.SOURCE and not trusted_code:
        raise AuditInputError(own_class_refusal(bundle.training.model))
    used = {name: data for name, data in contents.items() if name in BUNDLE_FILES}
    return bundle, bundle_archive(used)


def own_class_refusal(model: str) -> str:
    """Why a model class of the client's own code is not built here: the admin setting is
    off; with how an admin allows it, and the command line that needs no setting."""
    return (
        f"{TRAINING_FILE} names {model}, a model class of the client's own code: building it "
        "runs that code on this server, and an admin has not allowed trusted code on this "
        f"server ({HOW_TO_ALLOW}); or audit the bundle from the command line, where the file "
        "is: python -m auditlib audit --observed DIR --i-trust-this-file (docs/FLOWER.md)"
    )


def bundle_archive(files: Mapping[str, bytes]) -> bytes:
    """The stored form of a bundle: a zip of its files in name order, one fixed timestamp."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(files):
            archive.writestr(zipfile.ZipInfo(name, date_time=_STORED_AT), files[name])
    return buffer.getvalue()


def bundle_from_archive(
    data: bytes, location: str, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> ObservedBundle:
    """The bundle a stored archive holds (:func:`bundle_archive`), checked again."""
    return bundle_from_files(_zip_members(data, location, max_bytes), location, max_bytes=max_bytes)


def _zip_members(data: bytes, name: str, max_bytes: int) -> dict[str, bytes]:
    """The bundle's files in a zip: at its top level or in one folder; other entries
    (folders, hidden files, a macOS resource fork) are skipped, names of no bundle file
    refused. Each entry's declared size is checked before it is read, and its stream is
    inflated no further than that size."""
    if len(data) > max_archive_bytes(max_bytes):
        raise AuditInputError(
            f"{name} is {size_text(len(data))}; a bundle's zip is at most "
            f"{size_text(max_archive_bytes(max_bytes))}"
        )
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise AuditInputError(f"{name} is not a readable zip archive; expected a .zip") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > _MAX_MEMBERS:
            raise AuditInputError(
                f"{name} has {len(infos)} entries; a bundle's zip holds {_EXPECTED}"
            )
        members: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            parts = PurePosixPath(info.filename.replace("\\", "/")).parts
            if info.is_dir() or any(p.startswith(".") or p == "__MACOSX" for p in parts):
                continue
            if len(parts) > 2 or ".." in parts:
                raise AuditInputError(
                    f"{name} holds {info.filename}; expected {_EXPECTED} at its top level or "
                    "in one folder"
                )
            base = parts[-1]
            if base in members:
                raise AuditInputError(f"{name} holds {base} twice; expected one bundle")
            members[base] = info
        contents = {}
        for base, info in members.items():
            if base not in BUNDLE_FILES:
                raise AuditInputError(
                    f"{name} holds {info.filename}, which is not a bundle's file; expected "
                    f"{_EXPECTED}"
                )
            limit = MAX_TRAINING_BYTES if base == TRAINING_FILE else max_bytes
            # Refused on its declared size before inflating, then read in bounded pieces:
            # never more than the declared size or the limit in memory.
            contents[base] = read_member(archive, info, name, limit)
    return contents
