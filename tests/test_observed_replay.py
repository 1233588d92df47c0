"""The client's images checked against its update (``observed.replay``, docs/ALGORITHMS.md):
the client's training replayed on the given images reproduces the update only for the
images, labels and training the client had; from a larger folder the client's images are
found, and a wrong set is refused.

The client is tests/test_observed.py's plain PyTorch one (LeNet, torch.optim.SGD with
momentum 0.9 and weight decay, 2 epochs of 2 mini-batches of 2 photographs): an
implementation of its own, so a match is float rounding apart, never bit for bit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from auditlib.data import Normalization, load_image_folder, load_sample_set, to_model_batch
from auditlib.observed import load_bundle
from auditlib.observed.replay import TOLERANCE, check_images, replay
from tests.test_observed import FAST, _audit, _plain_pytorch_client


def _batch(folder: Path) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
    images = load_image_folder(folder)
    x = to_model_batch(list(images.images), (3, 32, 32), Normalization.identity(3))
    return x, torch.tensor(images.labels), images.names


def _other_client(folder: Path) -> Path:
    """Another client's four photographs (labels.csv beside them), named to sort first."""
    from PIL import Image

    others = load_sample_set("photographs", 4, seed=0, offset=4)
    pixels = to_model_batch(list(others.images), (3, 32, 32), Normalization.identity(3))
    as_bytes = (pixels * 255).round().clamp(0, 255).to(torch.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(4):
        Image.fromarray(as_bytes[i].permute(1, 2, 0).numpy()).save(folder / f"a_other{i}.png")
        rows.append(f"a_other{i}.png,{(i + 2) % 10}")
    (folder / "labels.csv").write_text("filename,label\n" + "\n".join(rows) + "\n")
    return folder


def _mixed(root: Path, client_images: Path) -> Path:
    """The other client's four images and this client's four in one folder."""
    mixed = _other_client(root / "mixed")
    own = (client_images / "labels.csv").read_text().splitlines()[1:]
    for name in (row.split(",")[0] for row in own):
        shutil.copy(client_images / name, mixed / name)
    with open(mixed / "labels.csv", "a") as handle:
        handle.write("\n".join(own) + "\n")
    return mixed


def test_the_replay_reproduces_the_update_only_from_the_clients_images_and_labels(tmp_path):
    folder, images, _ = _plain_pytorch_client(tmp_path)
    bundle = load_bundle(folder)
    model = bundle.build_model()
    x, y, _ = _batch(images)
    own = replay(bundle, model, x, y, range(4))
    assert own.matches and own.largest < TOLERANCE / 100  # float rounding only
    assert {name for name, _ in own.distances} == {n for n, _ in model.named_parameters()}
    swapped = replay(bundle, model, x, y, (2, 1, 0, 3))  # other mini-batches (0 and 1 are one)
    relabelled = replay(bundle, model, x, torch.tensor([3, 1, 4, 2]), range(4))
    others, other_labels, _ = _batch(_other_client(tmp_path / "other"))
    other = replay(bundle, model, others, other_labels, range(4))
    for wrong in (swapped, relabelled, other):
        assert not wrong.matches and wrong.largest > 100 * TOLERANCE


def test_the_clients_images_are_found_in_a_larger_folder(tmp_path):
    folder, images, _ = _plain_pytorch_client(tmp_path)
    bundle = load_bundle(folder)
    x, y, names = _batch(_mixed(tmp_path, images))
    check = check_images(bundle, bundle.build_model(), x, y)
    assert check.matches
    assert [names[i] for i in check.replay.picked] == [f"img{i}.png" for i in range(4)]
    assert check.tried == 70  # the last of C(8, 4) subsets in order: every one was tried


def test_the_audit_picks_the_clients_images_from_a_mixed_folder_and_refuses_a_wrong_set(
    tmp_path, capsys
):
    folder, images, _ = _plain_pytorch_client(tmp_path)
    out = tmp_path / "out"
    mixed = _mixed(tmp_path, images)
    code, _, stderr = _audit(
        ["--observed", str(folder), "--images", str(mixed), *FAST, "--out", str(out)], capsys
    )
    assert code == 0, stderr
    result = json.loads((out / "result.json").read_text())
    assert result["victim"]["data"]["names"] == [f"img{i}.png" for i in range(4)]
    check = result["victim"]["observed"]["image_check"]
    assert check["matches"] and check["picked"] == [4, 5, 6, 7]
    assert check["largest_relative_distance"] <= check["tolerance"] == TOLERANCE

    wrong = _other_client(tmp_path / "wrong")
    code, _, stderr = _audit(
        ["--observed", str(folder), "--images", str(wrong), *FAST, "--out", str(tmp_path / "w")],
        capsys,
    )
    assert code == 2
    assert "these images do not produce this update: replaying the client's training" in stderr
    assert "not the images this client trained on" in stderr
    assert not (tmp_path / "w" / "result.json").exists()


def test_a_training_record_that_misstates_the_training_refuses_even_the_right_images(
    tmp_path, capsys
):
    folder, images, _ = _plain_pytorch_client(tmp_path)
    training = json.loads((folder / "training.json").read_text())
    # The client ran momentum 0.9; a recorder that was not told assumed none.
    training |= {"momentum": 0.0, "extra": {"assumed": {"momentum": "0.0: not reported"}}}
    (folder / "training.json").write_text(json.dumps(training))
    code, _, stderr = _audit(
        ["--observed", str(folder), "--images", str(images), *FAST, "--out", str(tmp_path / "o")],
        capsys,
    )
    assert code == 2
    assert "or training.json's training is not the client's: momentum was assumed" in stderr


@pytest.mark.parametrize("extra_images", [0, 4])
def test_images_without_labels_are_not_replayed_and_must_be_exactly_the_clients(
    tmp_path, capsys, extra_images
):
    folder, images, _ = _plain_pytorch_client(tmp_path)
    given = _mixed(tmp_path, images) if extra_images else images
    (given / "labels.csv").unlink()
    out = tmp_path / "out"
    code, _, stderr = _audit(
        ["--observed", str(folder), "--images", str(given), *FAST, "--out", str(out)], capsys
    )
    if extra_images:
        assert code == 2 and "the update cannot tell which are its own" in stderr
    else:
        assert code == 0, stderr
        check = json.loads((out / "result.json").read_text())["victim"]["observed"]["image_check"]
        assert "carry no labels" in check["skipped"] and "matches" not in check


def test_a_sample_set_gives_the_clients_count_of_images_and_is_not_replayed(tmp_path, capsys):
    folder, _, _ = _plain_pytorch_client(tmp_path)
    out = tmp_path / "out"
    code, _, stderr = _audit(
        ["--observed", str(folder), "--samples", "photographs", *FAST, "--out", str(out)], capsys
    )
    assert code == 0, stderr
    result = json.loads((out / "result.json").read_text())
    assert len(result["victim"]["data"]["names"]) == 4  # num_examples, as the bundle says
    assert "carry no labels" in result["victim"]["observed"]["image_check"]["skipped"]
