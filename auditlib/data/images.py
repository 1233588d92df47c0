"""The private images an audit reconstructs, as a labelled collection: from a folder,
browser uploads or a zip, and back to a folder or a zip.

Every image goes through ``data.decode.decode_image``, which refuses anything it cannot
decode completely and safely with a one-line ``AuditInputError``. Nothing is skipped
silently: an auditor must know exactly which images were used.
"""

from __future__ import annotations

import dataclasses
import io
import re
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from auditlib.data.archives import read_member
from auditlib.data.decode import (
    DEFAULT_LIMITS,
    FORMATS_TEXT,
    ImageLimits,
    decode_image,
    header_pixels,
)
from auditlib.data.labels import parse_labels_csv
from auditlib.errors import AuditInputError
from auditlib.words import size_text

_LABELS_FILE = "labels.csv"
# Windows marks these hidden with a file attribute rather than a leading dot.
_OS_JUNK = {"thumbs.db", "desktop.ini", "__macosx"}


@dataclass(frozen=True)
class LabelledImages:
    """Decoded images with what is known about them."""

    images: tuple[np.ndarray, ...]  # each H x W x C uint8, C = 1 or 3, original size
    names: tuple[str, ...]  # file names (relative to the folder/zip) or sample ids
    labels: tuple[int, ...] | None  # None when no labels are known
    class_names: tuple[str, ...] | None
    source: str  # human-readable: "folder /x/y", "upload", "sample set 'faces'"

    def __post_init__(self) -> None:
        if len(self.images) != len(self.names):
            raise ValueError(f"{len(self.images)} images but {len(self.names)} names")
        if self.labels is not None and len(self.labels) != len(self.images):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.images)

    def window(self, start: int, stop: int) -> LabelledImages:
        """Images ``start`` to ``stop`` (exclusive) with their names and labels."""
        return dataclasses.replace(
            self,
            images=self.images[start:stop],
            names=self.names[start:stop],
            labels=None if self.labels is None else self.labels[start:stop],
        )


@dataclass(frozen=True)
class _Member:
    """One file of a folder or zip, named by its path parts relative to the root."""

    parts: tuple[str, ...]
    size: int
    read: Callable[[], bytes]

    @property
    def name(self) -> str:
        return "/".join(self.parts)


def _is_hidden(part: str) -> bool:
    return part.startswith(".") or part.lower() in _OS_JUNK


def _read_text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AuditInputError(f"{what} is not UTF-8 text; expected a UTF-8 CSV file") from exc


def _assemble(
    members: list[_Member],
    labels_csv_text: str | None,
    where: str,
    source: str,
    limits: ImageLimits,
) -> LabelledImages:
    """Decode members laid out flat or in one level of class subfolders."""
    is_csv = [len(m.parts) == 1 and m.parts[0].lower() == _LABELS_FILE for m in members]
    csv_members = [m for m, c in zip(members, is_csv, strict=True) if c]
    members = [m for m, c in zip(members, is_csv, strict=True) if not c]
    # The folder and zip walkers only produce depth 1 (flat) or 2 (class subfolders).
    flat = sorted((m for m in members if len(m.parts) == 1), key=lambda m: m.parts)
    nested = sorted((m for m in members if len(m.parts) == 2), key=lambda m: m.parts)
    if flat and nested:
        raise AuditInputError(
            f"{where} has both image files ({flat[0].name}) and subfolders ({nested[0].parts[0]}); "
            "expected either images directly inside it or only class subfolders"
        )
    chosen = flat or nested
    if not chosen:
        raise AuditInputError(
            f"no images found in {where}; expected {FORMATS_TEXT} files directly inside it or "
            "in one level of class subfolders"
        )
    if len(chosen) > limits.max_images:
        raise AuditInputError(
            f"{where} holds {len(chosen)} images; at most {limits.max_images} are accepted "
            "(the attacks handle batches up to that size)"
        )

    total = 0
    for member in chosen:  # every header first: the set's pixels are bounded before decoding
        if member.size > limits.max_file_bytes:  # refuse before reading it into memory
            raise AuditInputError(
                f"in {where}: {member.name} is {size_text(member.size)}; image files up to "
                f"{size_text(limits.max_file_bytes)} are accepted"
            )
        data = member.read()  # a read refusal names its file and where it is already
        try:
            total += header_pixels(data, member.name, limits)
        except AuditInputError as exc:
            raise AuditInputError(f"in {where}: {exc}") from exc
        if total > limits.max_total_pixels:
            raise AuditInputError(
                f"{where}: the images up to {member.name} hold {total:,} pixels together; at "
                f"most {limits.max_total_pixels:,} are accepted in one set (resize them first)"
            )
    images = []
    for member in chosen:  # read again: one file's bytes in memory at a time
        data = member.read()
        try:
            images.append(decode_image(data, member.name, limits))
        except AuditInputError as exc:
            raise AuditInputError(f"in {where}: {exc}") from exc
    names = tuple(m.name for m in chosen)

    labels: tuple[int, ...] | None = None
    class_names: tuple[str, ...] | None = None
    if nested:  # class subfolders: sorted folder names -> ids 0..K-1
        class_names = tuple(sorted({m.parts[0] for m in nested}))
        index = {c: i for i, c in enumerate(class_names)}
        labels = tuple(index[m.parts[0]] for m in nested)
    if labels_csv_text is None and csv_members:
        csv_member = csv_members[0]
        if csv_member.size > limits.max_file_bytes:
            raise AuditInputError(
                f"{_LABELS_FILE} in {where} is {size_text(csv_member.size)}; expected a small "
                "CSV with one row per image"
            )
        labels_csv_text = _read_text(csv_member.read(), f"{_LABELS_FILE} in {where}")
    if labels_csv_text is not None:  # a labels file wins over folder names
        labels, class_names = parse_labels_csv(labels_csv_text, names)
    return LabelledImages(tuple(images), names, labels, class_names, source)


def _file_member(path: Path, parts: tuple[str, ...]) -> _Member:
    def read() -> bytes:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise AuditInputError(
                f"cannot read {path} ({exc.strerror or exc}); expected a readable file"
            ) from exc

    return _Member(parts, path.stat().st_size, read)


def load_image_folder(
    path: str | Path,
    limits: ImageLimits = DEFAULT_LIMITS,
    labels_csv: str | Path | None = None,
) -> LabelledImages:
    """Load the images directly in a folder, or in one level of class subfolders.

    Files are taken sorted by name; hidden files and ``labels.csv`` are skipped, and any other
    file that is not an image is refused by name. With class subfolders, the sorted folder
    names are the classes (ids 0..K-1). A ``labels.csv`` in the folder, or the one given as
    ``labels_csv``, wins over folder names (see ``parse_labels_csv``).
    """
    root = Path(path)
    if not root.exists():
        raise AuditInputError(f"folder {root} does not exist; expected a folder of images")
    if not root.is_dir():
        raise AuditInputError(
            f"{root} is a file, not a folder; expected a folder of images (upload single files "
            "or a zip instead)"
        )
    where = f"folder {root}"
    members: list[_Member] = []
    try:
        for entry in sorted(root.iterdir()):
            if _is_hidden(entry.name):
                continue
            if entry.is_dir():
                for sub in sorted(entry.iterdir()):
                    if _is_hidden(sub.name):
                        continue
                    if sub.is_dir():
                        raise AuditInputError(
                            f"{where} has nested subfolders ({entry.name}/{sub.name}); expected "
                            "images directly inside it or in one level of class subfolders"
                        )
                    members.append(_file_member(sub, (entry.name, sub.name)))
            else:
                members.append(_file_member(entry, (entry.name,)))
    except OSError as exc:
        raise AuditInputError(
            f"cannot list {where} ({exc.strerror or exc}); expected a readable folder"
        ) from exc

    labels_text = None
    if labels_csv is not None:
        csv_path = Path(labels_csv)
        try:
            if csv_path.stat().st_size > limits.max_file_bytes:  # refused before it is read
                raise AuditInputError(
                    f"labels file {csv_path} is {size_text(csv_path.stat().st_size)}; expected "
                    "a small CSV with one 'filename,label' row per image"
                )
            labels_text = _read_text(csv_path.read_bytes(), f"labels file {csv_path}")
        except OSError as exc:
            raise AuditInputError(
                f"cannot read labels file {csv_path} ({exc.strerror or exc}); expected a "
                "readable CSV file"
            ) from exc
    return _assemble(members, labels_text, where, where, limits)


def load_image_uploads(
    files: Sequence[tuple[str, bytes]],
    limits: ImageLimits = DEFAULT_LIMITS,
    labels_csv_text: str | None = None,
) -> LabelledImages:
    """Load images uploaded as ``(file name, bytes)`` pairs, in name order.

    Every uploaded file must be an image, except one named ``labels.csv``, which is used for
    the labels unless ``labels_csv_text`` is given.
    """
    if not files:
        raise AuditInputError(f"no images uploaded; expected one or more {FORMATS_TEXT} files")
    members: list[_Member] = []
    seen: set[str] = set()
    for raw_name, data in files:
        # Browsers send bare names; keep only the last path part of anything else.
        name = re.split(r"[\\/]", raw_name)[-1].strip() or "unnamed upload"
        if name in seen:
            raise AuditInputError(
                f"two uploaded files are named {name}; expected distinct file names"
            )
        seen.add(name)
        members.append(_Member((name,), len(data), lambda data=data: data))
    return _assemble(members, labels_csv_text, "the uploaded files", "upload", limits)


def _safe_parts(raw_name: str) -> tuple[str, ...]:
    name = raw_name.replace("\\", "/")
    parts = tuple(p for p in name.split("/") if p not in {"", "."})
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or ".." in parts:
        raise AuditInputError(
            f"the zip contains an unsafe entry name {raw_name!r} (absolute or going up with "
            "'..'); expected names relative to the archive root"
        )
    return parts


def load_zip(data: bytes, limits: ImageLimits = DEFAULT_LIMITS) -> LabelledImages:
    """Load an uploaded zip of images, laid out like a folder (see ``load_image_folder``).

    A single top-level folder that wraps everything (what "compress folder" produces) is looked
    through. Zip bombs are refused from the directory, before anything is inflated: too many
    entries, too large a total uncompressed size, or a too-large member. Entries with absolute
    or ``..`` names refuse the whole archive (nothing is written to disk, but such an archive
    was not made by a normal tool).
    """
    where = "the zip upload"
    if len(data) > limits.max_archive_bytes:
        raise AuditInputError(
            f"the zip upload is {size_text(len(data))}; zips up to "
            f"{size_text(limits.max_archive_bytes)} are accepted"
        )
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise AuditInputError(
            "the upload is not a readable zip archive; expected a .zip file"
        ) from exc
    with archive:
        infos = archive.infolist()
        if len(infos) > limits.max_archive_members:
            raise AuditInputError(
                f"the zip upload has {len(infos)} entries; at most "
                f"{limits.max_archive_members} are accepted"
            )
        entries = [(_safe_parts(info.filename), info) for info in infos]
        entries = [
            (parts, info)
            for parts, info in entries
            if parts and not info.is_dir() and not any(_is_hidden(p) for p in parts)
        ]
        total = sum(info.file_size for _, info in entries)
        if total > limits.max_archive_bytes:
            raise AuditInputError(
                f"the zip upload unpacks to {size_text(total)}; at most "
                f"{size_text(limits.max_archive_bytes)} in total are accepted"
            )
        tops = {parts[0] for parts, _ in entries}
        if len(tops) == 1 and all(len(parts) > 1 for parts, _ in entries):
            entries = [(parts[1:], info) for parts, info in entries]
        deep = next((parts for parts, _ in entries if len(parts) > 2), None)
        if deep is not None:
            raise AuditInputError(
                f"the zip upload has nested subfolders ({'/'.join(deep)}); expected images at "
                "its top level or in one level of class subfolders"
            )

        def reader(info: zipfile.ZipInfo) -> Callable[[], bytes]:
            # In bounded pieces, never past the declared size (checked above) or the limit.
            return lambda: read_member(archive, info, where, limits.max_file_bytes)

        members = [_Member(parts, info.file_size, reader(info)) for parts, info in entries]
        return _assemble(members, None, where, "zip upload", limits)


def safe_stem(name: str) -> str:
    stem = name.rsplit(".", 1)[0] if "." in name.rsplit("/", 1)[-1] else name
    return re.sub(r"[^A-Za-z0-9_-]+", "_", stem).strip("_")[:60] or "image"


def _image_files(images: LabelledImages) -> list[tuple[str, bytes]]:
    """Validated images as lossless PNG files (plus labels.csv with class ids when labelled).

    Names keep the upload order (a numeric prefix) and a readable form of the original name;
    labels are written as class ids, so they mean exactly what the upload said.
    """
    width = len(str(max(len(images) - 1, 0)))
    files: list[tuple[str, bytes]] = []
    for index, (array, name) in enumerate(zip(images.images, images.names, strict=True)):
        buffer = io.BytesIO()
        pixels = array[..., 0] if array.shape[-1] == 1 else array
        Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="PNG")
        files.append((f"{index:0{width}d}-{safe_stem(name)}.png", buffer.getvalue()))
    if images.labels is not None:
        rows = [f"{f},{label}" for (f, _), label in zip(files, images.labels, strict=True)]
        files.append(("labels.csv", ("filename,label\n" + "\n".join(rows) + "\n").encode()))
    return files


def write_image_folder(images: LabelledImages, folder: Path) -> None:
    """Write validated images (and labels.csv) to ``folder``, for ``DataSpec(source="folder")``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in _image_files(images):
        (folder / name).write_bytes(data)


def images_zip(images: LabelledImages) -> bytes:
    """Validated images (and labels.csv) as one zip: the content-addressed upload asset that
    ``DataSpec(source="asset")`` names and :func:`load_zip` reads back in the worker."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in _image_files(images):
            # A fixed timestamp keeps the bytes, and so the content hash, reproducible.
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return buffer.getvalue()
