"""The data's mean image (``Victim.prior``: RDLV and the mean-image guess) leaves the
audited batch out: it is made from the data source's other images only, so the guess that
"uses no update" never sees the private images it is scored against."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from auditlib.data import Normalization, load_sample_set, to_model_batch
from auditlib.engine.audit import prepare_victim, run_audit
from auditlib.engine.victim import PRIOR_IMAGES
from auditlib.errors import AuditInputError
from auditlib.metrics import to_unit_range
from auditlib.models import ModelSpec
from auditlib.server.bins import AuditedPixels, public_images, public_prior
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

SHAPE = (3, 32, 32)
NONE = Normalization.parse("none", 3)


def _spec(data: DataSpec, seed: int = 7) -> RunSpec:
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, SHAPE, init="uniform")),
        data=data,
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(1),
        seed=seed,
    )


def _mean(images) -> np.ndarray:
    return to_unit_range(to_model_batch(list(images), SHAPE, NONE), NONE).mean(axis=0)


def _write_folder(folder, values: dict[str, int]) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, value in values.items():
        pixels = np.clip(value + rng.integers(-20, 20, (16, 16, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{name}.png")


@pytest.mark.parametrize("offset", [0, 3, 100])
def test_a_sample_set_prior_is_the_mean_of_other_images_of_the_set(offset):
    victim = prepare_victim(_spec(DataSpec("samples", "digits", batch_size=4, offset=offset)))
    # Seeded order: the images before the batch, then those after it, PRIOR_IMAGES in all.
    before = min(offset, PRIOR_IMAGES)
    after = PRIOR_IMAGES - before
    others = load_sample_set("digits", before, seed=7).images if before else ()
    if after:
        others += load_sample_set("digits", after, seed=7, offset=offset + 4).images
    assert len(others) == PRIOR_IMAGES
    np.testing.assert_allclose(victim.prior, _mean(others), atol=1e-6)
    batch_names = set(victim.batch.names)
    assert batch_names == set(load_sample_set("digits", 4, seed=7, offset=offset).names)
    assert victim.records["data"]["rdlv_prior"] == (
        f"mean of {PRIOR_IMAGES} images of the data source outside the audited batch"
    )


def test_the_photographs_prior_leaves_the_audited_photographs_out():
    victim = prepare_victim(_spec(DataSpec("samples", "photographs", batch_size=2, offset=1)))
    everything = load_sample_set("photographs", 17)
    others = everything.images[:1] + everything.images[3:]
    np.testing.assert_allclose(victim.prior, _mean(others), atol=1e-6)
    assert victim.records["data"]["rdlv_prior"].startswith("mean of 15 images")


def test_a_folder_prior_does_not_depend_on_the_audited_pixels(tmp_path):
    _write_folder(tmp_path, {"a": 30, "b": 90, "c": 160, "d": 220})
    spec = _spec(DataSpec("folder", str(tmp_path), batch_size=2, offset=1))  # b and c
    victim = prepare_victim(spec)
    assert victim.batch.names == ("b.png", "c.png")
    from PIL import Image

    others = [np.asarray(Image.open(tmp_path / f"{n}.png")) for n in ("a", "d")]
    np.testing.assert_allclose(victim.prior, _mean(others), atol=1e-6)

    # Change an audited image's pixels: the batch changes, the prior does not.
    Image.fromarray(np.full((16, 16, 3), 255, np.uint8)).save(tmp_path / "b.png")
    changed = prepare_victim(spec)
    assert not np.allclose(changed.batch.images.cpu().numpy(), victim.batch.images.cpu().numpy())
    np.testing.assert_array_equal(changed.prior, victim.prior)


def test_a_folder_that_is_all_batch_gives_no_prior_and_says_why(tmp_path):
    _write_folder(tmp_path, {"a": 60, "b": 200})
    victim = prepare_victim(_spec(DataSpec("folder", str(tmp_path))))
    assert victim.prior is None
    reason = victim.prior_unavailable_reason
    assert "2 image(s), no more than the audited batch" in reason
    assert "audited images left out" in reason
    assert victim.records["data"]["rdlv_prior"] == reason


# --- The public prior is refused on any set that holds an audited image (issue 50, item 6)


def _photographs_folder(folder, count: int = 3, size: int | None = None) -> None:
    """The first ``count`` bundled photographs written as a folder of PNG files, as a user
    would upload them; ``size``: first cropped and resized to size x size the way the audit
    does (then the audit's own resize leaves them as they are)."""
    from auditlib.data import LabelledImages, write_image_folder
    from auditlib.data.model_input import _resize

    photos = load_sample_set("photographs", count)
    images = photos.images
    if size is not None:
        images = tuple(np.ascontiguousarray(_resize(i, size, size)) for i in images)
    write_image_folder(LabelledImages(images, photos.names, None, None, "upload"), folder)


def _pixels(victim) -> AuditedPixels:
    return AuditedPixels(*SHAPE[1:], victim.image_hashes)


@pytest.mark.parametrize("size", [None, 32])
def test_the_bundled_photographs_uploaded_as_a_folder_are_refused_as_the_public_prior(
    tmp_path, size
):
    _photographs_folder(tmp_path, size=size)
    victim = prepare_victim(_spec(DataSpec("folder", str(tmp_path))))
    assert len(victim.image_hashes) == 3
    # By name the folder is no sample set; by content it is three of the photographs.
    expected = "3 of the audited images are images of sample set 'photographs'"
    with pytest.raises(AuditInputError, match=expected):
        public_prior("photographs", None, _pixels(victim))
    with pytest.raises(AuditInputError, match="expected a public set that holds none"):
        public_images("photographs", SHAPE, None, _pixels(victim))
    # A public set that holds none of them is the server's to use.
    assert public_prior("faces", None, _pixels(victim)).mean > 0


def test_the_malicious_servers_run_refuses_the_photographs_folder_as_its_prior(tmp_path):
    _photographs_folder(tmp_path, count=2)
    spec = dataclasses.replace(
        _spec(DataSpec("folder", str(tmp_path))),
        scenario=ScenarioSpec(server="malicious"),
        attack=ComponentSpec.of("rtf", {"prior": "photographs"}, "audit"),
    )
    with pytest.raises(AuditInputError, match="2 of the audited images are images of sample"):
        run_audit(spec, lpips_nets=())


def test_other_photographs_are_not_refused_and_the_data_prior_drops_copies(tmp_path):
    # Photographs the prior's set does not hold pass; a copy of an audited photograph under
    # another name in the same folder is left out of the data's mean image.
    from PIL import Image

    _write_folder(tmp_path, {"a": 30, "b": 90, "c": 160})
    (tmp_path / "z-copy-of-a.png").write_bytes((tmp_path / "a.png").read_bytes())
    victim = prepare_victim(_spec(DataSpec("folder", str(tmp_path), batch_size=1)))  # a
    assert victim.batch.names == ("a.png",)
    public_prior("photographs", None, _pixels(victim))  # no photograph among them
    others = [np.asarray(Image.open(tmp_path / f"{n}.png")) for n in ("b", "c")]
    np.testing.assert_allclose(victim.prior, _mean(others), atol=1e-6)
    assert "1 copies of audited images left out" in victim.records["data"]["rdlv_prior"]
