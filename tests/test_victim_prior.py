"""The data's mean image (``Victim.prior``: RDLV and the mean-image guess) leaves the
audited batch out: it is made from the data source's other images only, so the guess that
"uses no update" never sees the private images it is scored against."""

from __future__ import annotations

import numpy as np
import pytest

from auditlib.data import Normalization, load_sample_set, to_model_batch
from auditlib.engine.audit import prepare_victim
from auditlib.engine.victim import PRIOR_IMAGES
from auditlib.metrics import to_unit_range
from auditlib.models import ModelSpec
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
