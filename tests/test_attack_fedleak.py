"""Specifications of FedLeak (Fan et al., USENIX Security 2025), ``fedleak``.

Tiny real cases: LeNet on the bundled photographs (32x32) for the reconstruction, a small
LeNet with few classes for the label rules, unit checks of the top-R mask, the L1 + cosine
distance and the look-ahead blend. The paper-scale comparison with IG (ResNet-10, batch 16)
is a benchmark, not a test.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from auditlib.attacks import RunControl, build_attack_config, get_attack
from auditlib.attacks.fedleak import GradientModel, Objective
from auditlib.attacks.fedleak_step import median_filter
from auditlib.attacks.fedleak_terms import (
    activation_modules,
    blend_directions,
    masked_distance,
    top_ratio_masks,
)
from auditlib.attacks.objectives import cosine_distance
from auditlib.client.protocol import ClientProtocol
from auditlib.defenses import build_defense
from auditlib.engine.audit import prepare_victim
from auditlib.errors import AuditInputError
from auditlib.fl.scenario import release_update
from auditlib.metrics import evaluate, psnr, to_unit_range
from auditlib.models import ModelSpec, build_model
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec
from auditlib.threat import PrivateBatch

# The CPU-scaled setting (the ``cpu`` preset): lr 0.1 with cosine decay instead of 1e-4.
FAST = {"lr": 0.1, "schedule": "cosine"}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Double backprop on a shared 2-core machine is several times slower with 2 threads.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def spec_for(
    batch=1,
    classes=100,
    data="photographs",
    shape=(3, 32, 32),
    normalization="none",
    **model,
):
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", classes, shape, **model)),
        data=DataSpec("samples", data, batch_size=batch, normalization=normalization),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("fedleak"),
        defense=ComponentSpec.of("none"),
        budget=Budget(10),
        seed=0,
    )


def release_for(spec, protocol=None):
    victim = prepare_victim(spec)
    release = release_update(
        victim.model,
        victim.batch,
        protocol or spec.scenario.protocol,
        build_defense("none")[0],
        normalization=victim.normalization,
        num_classes=spec.model.spec.num_classes,
        labels_known=False,
        seed=0,
    )
    return victim, release


def run(release, steps, params=None, seed=0, preset=None, **control):
    config, _ = build_attack_config("fedleak", params, preset)
    control = RunControl(steps, **control)
    events = list(
        get_attack("fedleak").run(release.observation, release.knowledge, config, control, seed)
    )
    return events, events[-1].final


def scores(victim, final):
    truth = PrivateBatch(victim.batch.images.cpu(), victim.batch.labels.cpu(), victim.batch.names)
    return evaluate(final, truth, victim.normalization, lpips_nets=()).attacker_selected


# --- Partial gradient matching and the distance ------------------------------------------------


def _gradients(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=generator) for shape in [(7, 5), (11,), (3, 3, 4)])


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.9])
def test_global_mask_keeps_the_stated_fraction_of_the_largest_elements(ratio):
    gradients = _gradients()
    masks = top_ratio_masks(gradients, ratio, "global")
    flat = torch.cat([g.abs().flatten() for g in gradients])
    kept = torch.cat([m.flatten() for m in masks]).bool()
    assert int(kept.sum()) == math.ceil(ratio * flat.numel())
    assert flat[kept].min() >= flat[~kept].max()  # nothing kept is smaller than a dropped one


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.9])
def test_per_layer_mask_keeps_the_stated_fraction_of_every_tensor(ratio):
    gradients = _gradients()
    for gradient, mask in zip(
        gradients, top_ratio_masks(gradients, ratio, "per_layer"), strict=True
    ):
        kept = mask.bool()
        assert int(kept.sum()) == math.ceil(ratio * gradient.numel())
        assert gradient.abs()[kept].min() >= gradient.abs()[~kept].max()


@pytest.mark.parametrize("mode", ["sum", "mean", "per_layer"])
def test_l1_plus_cosine_distance_is_zero_for_identical_gradients(mode):
    gradients = _gradients()
    masks = top_ratio_masks(gradients, 0.5, "global")
    assert float(masked_distance(gradients, gradients, masks, mode)) == pytest.approx(0, abs=1e-6)
    other = tuple(g + 0.1 for g in gradients)
    assert float(masked_distance(gradients, other, masks, mode)) > 0.01


def test_distance_ignores_elements_outside_the_mask():
    gradients = _gradients()
    masks = top_ratio_masks(gradients, 0.5, "global")
    changed = tuple(g + 5 * (1 - m) for g, m in zip(gradients, masks, strict=True))
    assert float(masked_distance(changed, gradients, masks, "sum")) == pytest.approx(0, abs=1e-6)


@pytest.mark.parametrize("mode", ["sum", "mean", "per_layer"])
def test_masked_distance_of_stacked_restarts_is_each_restarts_own(mode):
    """R = 3 candidates and their masks stacked (how restarts together measure them) give
    one value each, that restart's alone; the masked cosine is the cosine of the masked
    vectors."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(6, 3, 3, 3), (6,), (10, 24)]
    target = [torch.randn(s, generator=generator) for s in shapes]
    stacked = [torch.randn((3, *s), generator=generator) for s in shapes]
    masks = [(torch.rand((3, *s), generator=generator) < 0.3).float() for s in shapes]
    together = masked_distance(stacked, target, masks, mode)
    assert together.shape == (3,)
    for r in range(3):
        own = [m[r] for m in masks]
        alone = masked_distance([s[r] for s in stacked], target, own, mode)
        assert float(together[r]) == pytest.approx(float(alone), rel=1e-5)
        chosen = [s[r] * m for s, m in zip(stacked, own, strict=True)]
        wanted = [t * m for t, m in zip(target, own, strict=True)]
        assert float(cosine_distance([s[r] for s in stacked], target, own)) == pytest.approx(
            float(cosine_distance(chosen, wanted)), rel=1e-6
        )


def test_sum_distance_is_l1_plus_one_minus_cosine():
    a = (torch.tensor([1.0, 0.0]),)
    b = (torch.tensor([0.0, 1.0]),)
    ones = (torch.ones(2),)
    assert float(masked_distance(a, b, ones, "sum")) == pytest.approx(2 + 1)
    assert float(masked_distance(a, b, ones, "mean")) == pytest.approx(1 + 1)


# --- Gradient regularisation ------------------------------------------------------------------


def test_blend_reproduces_the_appendix_d_example():
    # y = x^2 from x = 0.5 with step 1: gradient 1 here, -1 at the look-ahead point -0.5;
    # lambda' = 0.3 gives 0.7 * 1 + 0.3 * (-1) = 0.4, which damps the oscillation.
    assert float(blend_directions(torch.tensor(1.0), torch.tensor(-1.0), 0.3)) == pytest.approx(0.4)


def test_without_look_ahead_weight_the_step_is_a_plain_adam_step_on_the_objective():
    _, release = release_for(spec_for())
    params = {**FAST, "blend": 0.0}
    _, final = run(release, 3, params=params, seed=5)
    _, ascent = run(release, 3, params={**params, "lookahead": "ascent_normalized"}, seed=5)
    assert torch.equal(final.selected.images, ascent.selected.images)

    config, _ = build_attack_config("fedleak", params)
    knowledge = release.knowledge
    labels = final.selected.labels
    objective = Objective(
        GradientModel(release.observation, knowledge, False), knowledge, labels, config
    )
    x01 = torch.rand((1, 3, 32, 32), generator=torch.Generator().manual_seed(5))
    x01.requires_grad_(True)
    optimizer = torch.optim.Adam([x01], lr=config.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=3)
    for _ in range(3):
        x01.grad = objective.evaluate(x01)[0]
        optimizer.step()
        scheduler.step()
        with torch.no_grad():
            x01.clamp_(0, 1)
    expected = knowledge.normalization.normalize(x01.detach())
    assert torch.allclose(final.selected.images, expected, atol=1e-6)


def test_look_ahead_changes_the_step():
    _, release = release_for(spec_for())
    _, plain = run(release, 3, params={**FAST, "blend": 0.0})
    for lookahead in ("descent_step", "ascent_normalized"):
        _, ahead = run(release, 3, params={**FAST, "blend": 0.7, "lookahead": lookahead})
        assert not torch.allclose(plain.selected.images, ahead.selected.images)


# --- The attack -------------------------------------------------------------------------------


def test_fedleak_lowers_its_distance_and_beats_its_random_start():
    # LeNet's sigmoid gradients shrink with depth, so a global top-50 % keeps almost only the
    # classifier layer; ranked per layer, every layer is matched (the released code's mask).
    victim, release = release_for(spec_for())
    params = {**FAST, "mask_scope": "per_layer"}
    events, final = run(release, 100, params=params, emit_every=1, image_every=1000)
    distances = [e.losses["gradient_distance"] for e in events[1:-1]]
    assert distances[-1] < distances[0] / 10
    originals = to_unit_range(victim.batch.images, victim.normalization)
    start_psnr = psnr(to_unit_range(events[0].images, victim.normalization)[0], originals[0])
    # Measured: 7.8 dB at the U(0, 1) start, 20.5 dB after 100 steps (seeds 0, 1, 2).
    assert scores(victim, final).psnr_mean > start_psnr + 8
    assert final.stop_reason == "completed" and final.steps == 100


def test_a_raced_runs_starts_together_end_where_they_end_one_after_another():
    """The audit preset's race: four starts together (the last one left alone, stepped
    through plain autograd without vmap) against one after another, from the same seeds.
    The L1 summed (``distance=sum``): with the default mean L1, this untrained LeNet's
    objective is mostly 1 - cos of nearly parallel gradients, about 3e-5, whose float32
    rounding (0.1 % of the objective, by summation order) can reorder starts at a rung on
    another CPU; summed, the arms agree to 1e-6 and the rungs' margins are 0.25 % or more."""
    from auditlib.attacks.race import PLAN

    _, release = release_for(spec_for())
    params = {"restarts": 4, "distance": "sum"}
    apart, together = (
        run(release, 24, {**params, "together": t}, emit_every=2, race=PLAN)[1]
        for t in (False, True)
    )
    steps = sorted(c.steps for c in together.candidates)
    assert steps[-1] == 24 and steps[-2] < 24  # one start ran alone
    for a, b in zip(apart.candidates, together.candidates, strict=True):
        assert (a.restart, a.steps, a.stop_reason) == (b.restart, b.steps, b.stop_reason)
        assert b.loss == pytest.approx(a.loss, rel=1e-4)
        # Adam's step (about lr times the sign of a pixel's gradient, lr 1e-4) turns a
        # rounding in a gradient near 0 into a step the other way: at most 1 % of the pixels
        # may be a few steps apart.
        apart_by = (b.images - a.images).abs()
        assert float((apart_by > 1e-4).float().mean()) < 0.01 and float(apart_by.max()) < 1e-3


def test_labels_are_inferred_when_the_batch_fits_in_the_classes():
    victim, release = release_for(spec_for(batch=4, classes=10, activation="relu"))
    _, final = run(release, 2)
    assert final.label_inference["rule"].startswith("distinct")
    assert sorted(final.selected.labels.tolist()) == sorted(victim.batch.labels.tolist())


def test_labels_are_counted_when_the_batch_exceeds_the_classes():
    victim, release = release_for(spec_for(batch=16, classes=5, activation="relu"))
    _, final = run(release, 2)
    assert final.label_inference["rule"].startswith("FedLeak count")
    assert scores(victim, final).label_accuracy == 1.0  # 16 images, 5 classes, 3-4 each


def test_activation_prior_reads_the_activation_modules_or_the_residual_stages():
    model = build_model(ModelSpec("resnet10", 10, (3, 16, 16)))
    activations = activation_modules(model, "activations")
    assert len(activations) == 9 and all(isinstance(m, torch.nn.ReLU) for m in activations)
    assert activation_modules(model, "stages") == [
        model.layer1,
        model.layer2,
        model.layer3,
        model.layer4,
    ]
    lenet = build_model(ModelSpec("lenet", 10, (3, 32, 32)))
    assert len(activation_modules(lenet, "stages")) == 3  # no stages: the sigmoids


def test_the_attack_leaves_no_hooks_on_the_servers_model():
    _, release = release_for(spec_for())
    run(release, 2, params={"activation": 1e-2})
    modules = list(release.knowledge.model.modules())
    assert not any(m._forward_hooks for m in modules)


def test_candidates_stay_valid_pixels_under_a_normalisation():
    spec = spec_for(batch=2, normalization="0.5,0.4,0.3/0.2,0.25,0.3")
    victim, release = release_for(spec)
    events, final = run(release, 5, params={**FAST, "lr": 1.0}, emit_every=1, image_every=1)
    for images in [e.images for e in events if e.images is not None]:
        pixels = victim.normalization.denormalize(images)
        assert pixels.min() >= -1e-6 and pixels.max() <= 1 + 1e-6
    assert final.selected.images.device.type == "cpu"


def test_a_seed_gives_the_same_run():
    _, release = release_for(spec_for())
    _, first = run(release, 3, params=FAST, seed=11)
    _, again = run(release, 3, params=FAST, seed=11)
    _, other = run(release, 3, params=FAST, seed=12)
    assert torch.equal(first.selected.images, again.selected.images)
    assert not torch.equal(first.selected.images, other.selected.images)


def test_time_budget_stops_the_attack():
    _, release = release_for(spec_for())
    start = time.perf_counter()
    _, final = run(release, 100_000, max_seconds=1.0)
    assert final.stop_reason == "time budget"
    assert time.perf_counter() - start < 10
    assert 0 < final.steps < 100_000


def test_cancellation_stops_the_attack_and_keeps_what_it_has():
    _, release = release_for(spec_for())
    seen = []
    config, _ = build_attack_config("fedleak")
    control = RunControl(10_000, emit_every=1, is_cancelled=lambda: len(seen) >= 3)
    attack = get_attack("fedleak").run(release.observation, release.knowledge, config, control, 0)
    for event in attack:
        seen.append(event)
    final = seen[-1].final
    assert final.stop_reason == "cancelled"
    assert final.steps <= 3
    assert final.selected.images.shape == (1, 3, 32, 32)


@pytest.mark.parametrize(
    "params",
    [
        {"lr": 0},
        {"match_ratio": 0},
        {"match_ratio": 1.5},
        {"blend": 1.2},
        {"k": 0},
        {"median_filter": 4},
        {"restarts": 0},
        {"mask_scope": "random"},
        {"lookahead": "sideways"},
        {"distance": "l2"},
        {"tv": -1},
    ],
)
def test_bad_config_values_are_refused(params):
    with pytest.raises(AuditInputError):
        build_attack_config("fedleak", params)


def test_restarts_keep_the_lowest_gradient_distance():
    _, release = release_for(spec_for())
    _, final = run(release, 5, params={**FAST, "restarts": 3})
    assert len(final.candidates) == 3
    assert final.selected.loss == min(c.loss for c in final.candidates)


def test_batch_of_64_runs():
    spec = spec_for(batch=64, classes=10, data="fashion-mnist", shape=(1, 28, 28))
    _, release = release_for(spec)
    _, final = run(release, 2)
    assert final.selected.images.shape == (64, 1, 28, 28)
    assert final.selected.labels.shape == (64,)
    assert torch.isfinite(final.selected.images).all()


@pytest.mark.parametrize("shared", ["delta", "weights"])
def test_fedavg_update_is_read_as_one_gradient(shared):
    protocol = ClientProtocol(
        algorithm="fedavg", local_steps=2, local_lr=0.05, local_batch_size=1, shared=shared
    )
    victim, release = release_for(spec_for(batch=2, classes=10), protocol)
    assert release.observation.kind in ("weight_delta", "weights")
    events, final = run(release, 20, params=FAST)
    objectives = [e.losses["objective"] for e in events if "objective" in e.losses]
    assert objectives[-1] < objectives[0]
    assert sorted(final.selected.labels.tolist()) == sorted(victim.batch.labels.tolist())


def test_fedavg_local_steps_can_be_unrolled():
    protocol = ClientProtocol(algorithm="fedavg", local_steps=2, local_lr=0.05, local_batch_size=1)
    _, release = release_for(spec_for(batch=2, classes=10), protocol)
    # Every step's objective, the first step's included (with events every 10 steps the
    # comparison was of step 10 with step 20, where a cosine schedule's tail moves little).
    events, _ = run(release, 20, params={**FAST, "unroll": True}, emit_every=1)
    objectives = [e.losses["objective"] for e in events if "objective" in e.losses]
    assert objectives[-1] < objectives[0]


def test_presets_build():
    for preset in ("paper", "artifact", "cpu"):
        _, settings = build_attack_config("fedleak", preset=preset)
        assert settings["match_ratio"] == 0.5
    paper, _ = build_attack_config("fedleak", preset="paper")
    assert paper == build_attack_config("fedleak")[0]  # defaults are the paper's
    assert get_attack("fedleak").paper_iterations == 10_000


def test_artifact_preset_runs_and_median_filters_its_output():
    _, release = release_for(spec_for(batch=2))
    _, final = run(release, 2, preset="artifact")
    pixels = final.selected.images  # identity normalisation
    assert pixels.shape == (2, 3, 32, 32) and pixels.min() >= 0 and pixels.max() <= 1
    speck = torch.full((1, 1, 9, 9), 0.25)
    speck[0, 0, 4, 4] = 1.0
    assert torch.equal(median_filter(speck, 5), torch.full((1, 1, 9, 9), 0.25))
