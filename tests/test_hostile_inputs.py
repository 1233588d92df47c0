"""Hostile uploads of issue 51 refused before they cost memory or time: zips that lie about
their size (item 2), safetensors files and bundles whose refusal came after the work
(item 6), training.json values no client could have used and markup in its text (item 7),
and a labels.csv the CSV reader cannot read (item 3)."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path

import pytest
import safetensors.torch
from hostile import TRAINING, empty_tensors, lying_zip, png

from auditlib.data import ImageLimits, load_image_folder, load_image_uploads, load_zip
from auditlib.data.labels import parse_labels_csv
from auditlib.errors import AuditInputError
from auditlib.models import ModelSpec, build_model, load_weights
from auditlib.observed import TrainingRecord, bundle_from_files, bundle_from_upload

MB = 10**6
ROOT = Path(__file__).resolve().parents[1]
INFLATED = 64 * 2**20  # what the lying member's stream holds
DECLARED = 1_000  # what its directory says


def _lying(members: dict[str, bytes], liar: str) -> bytes:
    return lying_zip(members, liar, INFLATED, DECLARED)


def _refusal(call) -> str:
    with pytest.raises(AuditInputError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def _peak_bytes(call) -> int:
    """Python's peak allocation (zlib's output, parsed JSON) while ``call`` runs."""
    tracemalloc.start()
    try:
        call()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


# --- Item 2: zips that lie about their size ---------------------------------------------------


def test_an_image_zip_member_inflating_past_its_declared_size_is_refused_in_bounded_memory():
    lying = _lying({}, "a.png")
    assert len(lying) < MB  # a 64 MiB stream in a zip of a few tens of kB

    def load() -> None:
        message = _refusal(lambda: load_zip(lying))
        assert message == (
            "a.png in the zip upload does not inflate to the 1,000 bytes and checksum its "
            "directory declares; refused as a corrupt or hostile archive"
        )

    assert _peak_bytes(load) < DECLARED + 16 * MB  # was 128 MB: the stream inflated, then cut


def test_a_bundle_zip_member_inflating_past_its_declared_size_is_refused_in_bounded_memory():
    lying = _lying({"training.json": json.dumps(TRAINING).encode()}, "global.safetensors")

    def load() -> None:
        message = _refusal(lambda: bundle_from_upload([("b.zip", lying)]))
        assert message == (
            "global.safetensors in b.zip does not inflate to the 1,000 bytes and checksum its "
            "directory declares; refused as a corrupt or hostile archive"
        )

    assert _peak_bytes(load) < DECLARED + 16 * MB


def test_a_zip_member_shorter_than_its_directory_declares_is_refused():
    """A stored image whose sizes say 100 bytes more than it holds (its checksum right):
    zipfile returns the short bytes without complaint; the count against the declared
    size refuses them."""
    image = png()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("a.png", image)
        info = archive.getinfo("a.png")
    data = bytearray(buffer.getvalue())
    struct.pack_into("<I", data, info.header_offset + 22, len(image) + 100)
    struct.pack_into("<I", data, data.rfind(b"PK\x01\x02") + 24, len(image) + 100)
    assert f"a.png in the zip upload inflates to {len(image):,} bytes, not the " in _refusal(
        lambda: load_zip(bytes(data))
    )


# --- Item 6: work before refusal --------------------------------------------------------------


@pytest.fixture
def loads(monkeypatch) -> list[int]:
    """Every call of safetensors' loader, which a file refused from its header never sees."""
    calls: list[int] = []
    load = safetensors.torch.load

    def counted(data: bytes):
        calls.append(len(data))
        return load(data)

    monkeypatch.setattr(safetensors.torch, "load", counted)
    return calls


def test_a_safetensors_file_of_300000_empty_tensors_is_refused_from_its_header(loads):
    many = empty_tensors(300_000)  # 17.6 MB, as the 20 MB file
    lenet = build_model(ModelSpec("lenet"))
    start = time.perf_counter()
    peak = _peak_bytes(
        lambda: _refusal(lambda: load_weights(lenet, many, filename="many.safetensors"))
    )
    assert "'many.safetensors' declares a safetensors header of 17.6 MB; expected at most 1 MB" in (
        _refusal(lambda: load_weights(lenet, many, filename="many.safetensors"))
    )
    files = {"global.safetensors": many, "training.json": json.dumps(TRAINING).encode()}
    files["client.safetensors"] = safetensors.torch.save(lenet.state_dict())
    assert "global.safetensors declares a safetensors header of 17.6 MB" in _refusal(
        lambda: bundle_from_files(files, "upload")
    )
    assert time.perf_counter() - start < 2  # was 7 s each
    assert peak < 4 * MB  # was 400 MB
    assert loads == []


def test_a_safetensors_file_of_more_tensors_than_any_model_is_refused_by_its_count(loads):
    many = empty_tensors(15_000)  # a header under 1 MB
    lenet = build_model(ModelSpec("lenet"))
    assert (
        "'many.safetensors' declares 15,000 tensors; expected a model's state_dict (at most "
        "10,000 tensors)"
    ) in _refusal(lambda: load_weights(lenet, many, filename="many.safetensors"))
    assert loads == []


def test_weights_that_do_not_fit_are_refused_from_the_header_before_any_tensor_loads(loads):
    """The refusal of a real file of another model is the same line as before, from the
    header: names, shapes and the hints."""
    convnet = safetensors.torch.save(build_model(ModelSpec("convnet")).state_dict())
    message = _refusal(
        lambda: load_weights(build_model(ModelSpec("lenet")), convnet, filename="c.safetensors")
    )
    assert "weights in 'c.safetensors' do not fit lenet (num_classes=10, input 3x32x32)" in message
    resnet = build_model(ModelSpec("resnet18", num_classes=10, input_shape=(3, 32, 32)))
    wide = safetensors.torch.save(
        build_model(ModelSpec("resnet18", num_classes=100, input_shape=(3, 32, 32))).state_dict()
    )
    assert "it was saved for 100 classes" in _refusal(lambda: load_weights(resnet, wide))
    assert loads == []


def test_a_tiny_bundle_naming_a_huge_model_is_refused_before_the_model_is_built():
    """A bundle of a few bytes whose training.json names an mlp of 100,000 classes at 512
    pixels (227 million parameters, 0.9 GB) is refused from global.safetensors' header: the
    model's shapes come from the meta device. Measured in a fresh process: the peak memory
    is the high-water mark of the whole process."""
    script = """
import json, resource, sys, torch, safetensors.torch
from auditlib.errors import AuditInputError
from auditlib.observed import bundle_from_files
tiny = safetensors.torch.save({"fc.0.bias": torch.zeros(2)})
files = {"global.safetensors": tiny, "client.safetensors": tiny,
         "training.json": sys.argv[1].encode()}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    bundle_from_files(files, "upload")
    print("accepted")
except AuditInputError as exc:
    print(exc)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""
    training = TRAINING | {"model": "mlp", "num_classes": 100_000, "input_size": 512}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(training)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    message, grown_mb = done.stdout.strip().splitlines()
    assert message.startswith(
        "global.safetensors does not fit mlp (100000 classes, input 3x512x512) that "
        "training.json names: missing: body.0.weight"
    )
    assert int(grown_mb) < 50  # was 870 MB: the model built, then refused


# --- Item 7: training.json within a real client's ranges, its text plain ----------------------


def test_training_numbers_outside_a_real_clients_ranges_are_refused_naming_field_and_range():
    cases = {
        "local_batch_size": (
            10**9,
            "local_batch_size must be a whole number from 1 to 65,536, got 1000000000",
        ),
        "num_examples": (10**12, "num_examples must be a whole number from 1 to 100,000,000"),
        "lr": (1e308, "lr must be a learning rate from 1e-12 to 10, got 1e+308"),
        "weight_decay": (5, "weight_decay must be a number from 0 to 1, got 5"),
        "round": (10**12, "round must be a whole number from 0 to 10,000,000"),
    }
    for field, (value, words) in cases.items():
        record = TRAINING | {field: value}
        assert words in _refusal(lambda record=record: TrainingRecord.from_json(record)), field
    assert "lr must be a learning rate from 1e-12" in _refusal(
        lambda: TrainingRecord.from_json(TRAINING | {"lr": 1e-300})
    )
    # The counts of steps stay bounded by the simulated client (client.protocol).
    assert "local epochs must be between 1 and 100" in _refusal(
        lambda: TrainingRecord.from_json(TRAINING | {"local_epochs": 10**9})
    )


def test_markup_in_source_and_client_id_control_characters_and_long_text_are_refused():
    cases = {
        "source": ("<script>alert(1)</script>", "training.json: source holds '<'"),
        "client_id": ("[x](https://e.vil)", "training.json: client_id holds '['"),
        "extra": ({"note": "a\u202eb"}, "training.json: extra.note holds '\\u202e'"),
        "extra key": ({"a|b": 1}, "training.json: a key of extra holds '|'"),
        "control": ({"deep": ["ok", "\x1b[31mred"]}, "extra.deep[1] holds '\\x1b'"),
        "long": ("x" * 201, "source is 201 characters long ('xxxx"),
        "nested": ({"a": [[[[[[[[[1]]]]]]]]]}, "nests objects or lists more than 8 levels"),
        "many": ({str(i): i for i in range(2_000)}, "extra holds more than 1,000 keys and values"),
    }
    for name, (value, words) in cases.items():
        field = name if name in ("source", "client_id") else "extra"
        field = "source" if name == "long" else field
        message = _refusal(lambda f=field, v=value: TrainingRecord.from_json(TRAINING | {f: v}))
        assert words in message, name
        assert len(message) < 400, name
    # What the bundled Flower recorders write stays accepted: parentheses, dots and
    # underscores in the source, and notes in extra (never rendered as Markdown) that quote
    # shapes and byte counts.
    notes = {
        "unchecked": "shape: fc.0.weight is [10, 768] here but [100, 768]",
        "flower": {"node_id": 4711, "metrics": {"blob": "<12 bytes>"}},
    }
    record = TrainingRecord.from_json(
        TRAINING
        | {
            "source": "flower server (auditlib.flower.RecordingStrategy)",
            "client_id": "4711",
            "extra": notes,
        }
    )
    assert record.source == "flower server (auditlib.flower.RecordingStrategy)"
    assert record.extra == notes


def test_training_json_numbers_beyond_the_parser_are_one_line_refusals():
    """A 5,000-digit number and 100,000 nested lists: Python's JSON parser raises
    ValueError and RecursionError, which escaped as tracebacks."""
    lenet = safetensors.torch.save(build_model(ModelSpec("lenet")).state_dict())
    for text in ('{"lr": ' + "9" * 5_000 + "}", "[" * 100_000 + "]" * 100_000):
        files = {"global.safetensors": lenet, "client.safetensors": lenet}
        files["training.json"] = text.encode()
        assert "training.json is not valid JSON" in _refusal(
            lambda files=files: bundle_from_files(files, "upload")
        )


# --- Item 3: a labels.csv the CSV reader cannot read -----------------------------------------


def test_a_labels_csv_with_a_field_over_the_csv_limit_is_one_line_refusal():
    big_field = "filename,label\na.png," + "x" * 200_000 + "\n"
    assert _refusal(lambda: parse_labels_csv(big_field, ["a.png"])) == (
        "labels.csv cannot be read as CSV at line 2 (field larger than field limit (131072)); "
        "expected a header 'filename,label' and one row per image"
    )
    unterminated = 'filename,label\n"a.png,1\n' + "y" * 140_000
    assert "labels.csv cannot be read as CSV at line" in _refusal(
        lambda: parse_labels_csv(unterminated, ["a.png"])
    )
    # Through the uploads, as the dashboard hands them over.
    files = [("a.png", png()), ("labels.csv", big_field.encode())]
    assert "labels.csv cannot be read as CSV" in _refusal(lambda: load_image_uploads(files))


def test_a_labels_csv_larger_than_its_images_need_is_refused_before_it_is_read(tmp_path):
    padded = "filename,label\na.png,1\n" + "\n" * 500_000  # half a MB of blank lines
    assert (
        "labels.csv holds 500,023 characters; expected a header 'filename,label' and one row "
        "per image (at most 417,792 characters for 1 images)"
    ) in _refusal(lambda: parse_labels_csv(padded, ["a.png"]))
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a.png").write_bytes(png())
    labels = tmp_path / "labels.csv"
    labels.write_text("filename,label\na.png,1\n" + "\n" * 2_000)
    assert f"labels file {labels} is 2,023 bytes; expected a small CSV" in _refusal(
        lambda: load_image_folder(folder, ImageLimits(max_file_bytes=1_000), labels_csv=labels)
    )
