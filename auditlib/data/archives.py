"""Reading one member of an uploaded zip with memory bounded by what the caller allows.

``ZipFile.read`` inflates a member's whole stream in one call before it checks the size and
checksum, so a 1 MB zip whose directory declares 1 MB but whose stream inflates to 1 GB
holds that gigabyte (twice, as it is cut) before it is refused. :func:`read_member` inflates
1 MiB at a time and counts what comes out against the member's declared size and the
caller's limit: at most the smaller of the two, plus one chunk, is ever held. Every path
that inflates an upload (the images zip, the observed bundle's zip) reads through it.
"""

from __future__ import annotations

import io
import zipfile
import zlib

from auditlib.errors import AuditInputError
from auditlib.words import size_text

CHUNK_BYTES = 2**20  # inflated per read: what a lying member can add to memory at most
_ENCRYPTED = 0x1  # general purpose flag bit 0


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str, limit: int) -> bytes:
    """The inflated bytes of ``info`` in ``archive`` (``where`` names the archive in
    messages), refused in one line where it is encrypted, declares more than ``limit``
    bytes, uses a method zipfile cannot inflate, or does not inflate to exactly the size and
    checksum its directory declares."""
    name = info.filename
    if info.flag_bits & _ENCRYPTED:
        raise AuditInputError(f"{name} in {where} is encrypted; expected an unencrypted zip")
    if info.file_size > limit:
        raise AuditInputError(
            f"{name} in {where} unpacks to {size_text(info.file_size)}, over the "
            f"{size_text(limit)} limit"
        )
    buffer = io.BytesIO()
    total = 0
    try:
        with archive.open(info) as member:
            while chunk := member.read(CHUNK_BYTES):
                total += len(chunk)
                # zipfile stops at the declared size itself; counted here all the same, so
                # the bound holds whatever the zip module does with a lying directory.
                if total > info.file_size or total > limit:
                    raise AuditInputError(
                        f"{name} in {where} inflates past the {size_text(info.file_size)} its "
                        "directory declares; refused as a corrupt or hostile archive"
                    )
                buffer.write(chunk)
    except NotImplementedError:
        raise AuditInputError(
            f"{name} in {where} uses an unsupported compression method; expected stored or "
            "deflated entries"
        ) from None
    except zipfile.BadZipFile:
        # Raised at the declared size when the checksum differs: the stream holds more than
        # its directory declares (cut there), or other bytes.
        raise AuditInputError(
            f"{name} in {where} does not inflate to the {size_text(info.file_size)} and "
            "checksum its directory declares; refused as a corrupt or hostile archive"
        ) from None
    except (OSError, zlib.error, EOFError):
        raise AuditInputError(f"{name} in {where} is corrupt; expected an intact zip") from None
    if total != info.file_size:
        raise AuditInputError(
            f"{name} in {where} inflates to {size_text(total)}, not the "
            f"{size_text(info.file_size)} its directory declares; refused as a corrupt or "
            "hostile archive"
        )
    return buffer.getvalue()
