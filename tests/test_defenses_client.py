"""Specification of the defenses that need more than the update (Soteria, OUTPOST, the DLM
paper's weight defenses) and of the update-only baselines added with them (clipping,
quantisation). Every case is a small real model or update with a fixed seed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from auditlib.client.protocol import ClientProtocol
from auditlib.client.update import trainable_parameters
from auditlib.defenses import ClientContext, build_defense
from auditlib.defenses.soteria import feature_scores, representation_layer
from auditlib.errors import AuditInputError
from auditlib.fl.scenario import defended_update

torch.set_num_threads(1)

FEDSGD = ClientProtocol()
FEDAVG = ClientProtocol("fedavg", local_steps=2, local_lr=0.1)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.Sigmoid(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 20),
        nn.Sigmoid(),
        nn.Linear(20, 5),
    )


def client(protocol=FEDSGD, batch: int = 3, seed: int = 0, round: int = 0):
    """A model, its client context and the undefended update on a random batch."""
    model = small_model(seed)
    g = gen(seed)
    images = torch.randn(batch, 1, 6, 6, generator=g)
    labels = torch.randint(0, 5, (batch,), generator=g)
    parameters = trainable_parameters(model)
    none, _ = build_defense("none")
    update, _ = defended_update(model, parameters, images, labels, protocol, none, gen())
    context = ClientContext(
        model, {n: p.detach() for n, p in parameters.items()}, images, labels, protocol, round
    )
    return model, context, update


def flat(update) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in update])


# --- clipping ---------------------------------------------------------------------------------


def test_norm_clipping_bounds_the_whole_update_and_keeps_its_direction():
    update = (torch.tensor([30.0, 0.0]), torch.tensor([[40.0]]))  # norm 50
    out = build_defense("clip", {"bound": 4})[0].apply(update, gen())
    assert float(flat(out).norm()) == pytest.approx(4.0)
    torch.testing.assert_close(flat(out) / 4.0, flat(update) / 50.0)


def test_value_clipping_clamps_each_entry():
    update = (torch.tensor([-9.0, 0.5, 3.0]),)
    out = build_defense("clip", {"bound": 1, "mode": "value"})[0].apply(update, gen())
    assert out[0].tolist() == [-1.0, 0.5, 1.0]


# --- quantisation -----------------------------------------------------------------------------


def test_32_bits_is_the_update_and_16_bits_is_half_precision():
    update = (torch.randn(100, generator=gen()),)
    assert torch.equal(
        build_defense("quantize", {"bits": 32})[0].apply(update, gen())[0], update[0]
    )
    half = build_defense("quantize", {"bits": 16})[0].apply(update, gen())[0]
    assert torch.equal(half, update[0].half().float())
    assert not torch.equal(half, update[0])


def test_qsgd_values_lie_on_the_levels_of_the_bit_width():
    t = torch.randn(1000, generator=gen())
    out = build_defense("quantize", {"bits": 4, "bucket_size": 0})[0].apply((t,), gen(1))[0]
    levels = out.abs() / t.norm() * 7  # 4 bits: sign + 7 magnitude levels
    torch.testing.assert_close(levels, levels.round(), rtol=0, atol=1e-4)
    assert set(torch.sign(out[out != 0]).tolist()) <= {-1.0, 1.0}
    assert bool((torch.sign(out) * torch.sign(t) >= 0).all())  # signs never flip


def test_stochastic_qsgd_is_unbiased():
    t = torch.randn(50, generator=gen())
    defense = build_defense("quantize", {"bits": 2, "bucket_size": 16})[0]
    mean = torch.stack([defense.apply((t,), gen(s))[0] for s in range(4000)]).mean(0)
    # Ternary levels {0, +-||bucket||}: per entry std <= ||t|| / 2; 4000 draws pin the mean.
    assert float((mean - t).abs().max()) < 4 * float(t.norm()) / 2 / 4000**0.5


def test_fewer_bits_lose_more_of_the_update():
    t = torch.randn(5000, generator=gen())
    errors = []
    for bits in (16, 8, 4, 2):
        out = build_defense("quantize", {"bits": bits})[0].apply((t,), gen(2))[0]
        errors.append(float((out - t).norm()))
    assert errors == sorted(errors)
    # Buckets keep QSGD's variance down: one bucket for the whole tensor loses more.
    whole = build_defense("quantize", {"bits": 4, "bucket_size": 0})[0].apply((t,), gen(2))[0]
    assert float((whole - t).norm()) > errors[2]
    one_bit = build_defense("quantize", {"bits": 1})[0].apply((t,), gen())[0]
    torch.testing.assert_close(one_bit, torch.sign(t) * t.abs().mean())


def test_quantisation_refuses_unsupported_widths():
    with pytest.raises(AuditInputError, match="bits must be 1-8, 16 or 32"):
        build_defense("quantize", {"bits": 12})


# --- Soteria ----------------------------------------------------------------------------------


def test_soteria_zeroes_the_stated_share_of_the_chosen_layer_only():
    _model, context, update = client()
    out = build_defense("soteria", {"ratio": 0.3})[0].apply(update, gen(), context)
    names = list(context.parameters)
    index = names.index("5.weight")  # the last nn.Linear (20 -> 5): 20 input features
    zero_columns = (out[index] == 0).all(dim=0)
    assert int(zero_columns.sum()) == 6  # 30 % of 20
    for i, (o, u) in enumerate(zip(out, update, strict=True)):
        if i == index:
            torch.testing.assert_close(o[:, ~zero_columns], u[:, ~zero_columns])
        else:
            assert torch.equal(o, u)


def test_soteria_prunes_the_features_with_the_lowest_scores():
    model, context, update = client()
    _name, layer = representation_layer(model, "3")
    scores = feature_scores(model, layer, context).abs()
    out = build_defense("soteria", {"ratio": 0.5, "layer": "3"})[0].apply(update, gen(), context)
    pruned = (out[list(context.parameters).index("3.weight")] == 0).all(dim=0)
    assert int(pruned.sum()) == 72  # half of the 144 flattened conv features
    assert float(scores[pruned].max()) <= float(scores[~pruned].min())


def test_soteria_scores_match_one_backward_pass_per_feature():
    """The batched computation equals the public code's loop over features."""
    model, context, _ = client(batch=2)
    _, layer = representation_layer(model, None)
    batched = feature_scores(model, layer, context)
    images = context.images.clone().requires_grad_()
    r = model[:5](images)  # input of the last linear layer
    expected = torch.zeros(r.shape[1])
    for f in range(r.shape[1]):
        onehot = torch.zeros_like(r)
        onehot[:, f] = 1
        (grad,) = torch.autograd.grad(r, images, onehot, retain_graph=True)
        expected[f] = (grad.flatten(1).norm(dim=1) / (r[:, f].detach() + 0.1)).sum()
    torch.testing.assert_close(batched, expected, rtol=1e-4, atol=1e-6)


def test_soteria_leaves_the_model_as_it_found_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(32, 3))
    images, labels = torch.randn(4, 1, 6, 6), torch.tensor([0, 1, 2, 0])
    parameters = trainable_parameters(model)
    before = {n: t.clone() for n, t in model.state_dict().items()}
    defense = build_defense("soteria")[0]
    defended_update(model, parameters, images, labels, FEDSGD, defense, gen())
    for n, t in model.state_dict().items():
        assert torch.equal(t, before[n]), n


def test_soteria_names_the_layers_it_can_defend():
    _model, context, update = client()
    with pytest.raises(AuditInputError, match="expected one of 3, 5"):
        build_defense("soteria", {"layer": "0"})[0].apply(update, gen(), context)
    with pytest.raises(AuditInputError, match="needs the client's model"):
        build_defense("soteria")[0].apply(update, gen())


# --- OUTPOST ----------------------------------------------------------------------------------


def test_outpost_prunes_per_layer_and_adds_noise_only_at_high_fisher_entries():
    _, context, update = client(batch=4)
    params = {"prune_base": 50, "phi": 10, "noise_base": 0.8}
    out = build_defense("outpost", params)[0].apply(update, gen(), context)
    at_risk = int(0.1 * flat(update).numel() + 0.5)  # half-up, as prune rounds
    threshold = float(torch.topk(flat(update) ** 2, at_risk).values.min())
    noised_total = 0
    for o, u, w in zip(out, update, context.parameters.values(), strict=True):
        noised = (o != u) & (o != 0)
        noised_total += int(noised.sum())
        assert bool((u[noised] ** 2 >= threshold).all())  # noise only at the top-phi Fisher
        # Elsewhere an entry is pruned (zero) or unchanged, the pruned ones the smaller ones.
        quiet_out, quiet_in = o[~noised], u[~noised]
        zeroed = quiet_out == 0
        assert bool((zeroed | (quiet_out == quiet_in)).all())
        if zeroed.any() and (~zeroed).any():
            assert float(quiet_in[zeroed].abs().max()) <= float(quiet_in[~zeroed].abs().min())
        assert int(zeroed.sum()) <= round(0.5 * u.numel())
        if float(w.var()) > 0:
            assert bool((o[u**2 > threshold] != u[u**2 > threshold]).all())
    assert 0 < noised_total <= at_risk


def test_outpost_protection_decays_with_the_round():
    _, _first, _update = client()
    defense = build_defense("outpost", {"beta": 1.0})[0]
    assert all(defense.perturbs(0, gen(s)) for s in range(50))  # probability 1 at round 0
    late = sum(defense.perturbs(99, gen(s)) for s in range(2000)) / 2000  # 1 / 100
    assert late == pytest.approx(0.01, abs=0.008)


def test_outpost_without_noise_only_prunes():
    _, context, update = client()
    out = build_defense("outpost", {"noise_base": 0.0, "prune_base": 80})[0].apply(
        update, gen(), context
    )
    for o, u in zip(out, update, strict=True):
        kept = o != 0
        torch.testing.assert_close(o[kept], u[kept])
        assert int(kept.sum()) == u.numel() - int(0.8 * u.numel() + 0.5)


# --- the DLM paper's weight defenses ----------------------------------------------------------


def weights_of(update, context):
    return [p + d for p, d in zip(context.parameters.values(), update, strict=True)]


def test_weight_sparsification_zeroes_the_stated_share_of_the_uploaded_weights():
    _, context, update = client(FEDAVG)
    out = build_defense("dlm-sparsify", {"ratio": 0.4})[0].apply(update, gen(), context)
    weights = flat(weights_of(out, context))
    original = flat(weights_of(update, context))
    assert int((weights == 0).sum()) == round(0.4 * weights.numel())
    kept = weights != 0
    torch.testing.assert_close(weights[kept], original[kept])
    assert float(original[~kept].abs().max()) <= float(original[kept].abs().min())


def test_weight_noise_has_the_stated_variance_on_the_weights():
    _, context, update = client(FEDAVG)
    for noise in ("gaussian", "laplace"):
        defense = build_defense("dlm-dp", {"variance": 1e-2, "noise": noise})[0]
        added = flat(weights_of(defense.apply(update, gen(1), context), context)) - flat(
            weights_of(update, context)
        )
        assert float(added.var()) == pytest.approx(1e-2, rel=0.1)


def test_weight_clipping_bounds_each_layer_and_the_group_divides():
    _, context, update = client(FEDAVG)
    defense = build_defense("dlm-dp", {"variance": 0, "clip": 0.5, "group_size": 2})[0]
    for w in weights_of(defense.apply(update, gen(), context), context):
        assert float(w.norm()) <= 0.25 + 1e-6


def test_weight_defenses_need_local_training():
    _, context, update = client(FEDSGD)
    for name in ("dlm-dp", "dlm-sparsify"):
        with pytest.raises(AuditInputError, match="FedAvg"):
            build_defense(name)[0].apply(update, gen(), context)


# --- every defense through the victim's path --------------------------------------------------


@pytest.mark.parametrize(
    "name, params",
    [
        ("clip", {"bound": 0.01}),
        ("quantize", {}),
        ("soteria", {}),
        ("outpost", {}),
        ("dlm-dp", {}),
        ("dlm-sparsify", {}),
        ("prune", {}),
    ],
)
def test_every_defense_changes_what_the_server_receives(name, params):
    model, context, update = client(FEDAVG, batch=4)
    parameters = trainable_parameters(model)
    clean, defended = defended_update(
        model,
        parameters,
        context.images,
        context.labels,
        FEDAVG,
        build_defense(name, params)[0],
        gen(),
    )
    assert [t.shape for t in defended] == [t.shape for t in clean]
    assert not torch.equal(flat(defended), flat(clean))
    for c, u in zip(clean, update, strict=True):
        assert torch.equal(c, u)  # the undefended update is the client's own


def test_soteria_scores_a_sample_of_a_large_client_and_all_of_a_small_batch():
    """A FedAvg client's whole data is scored on ``score_examples`` of its images (the
    utility training); an audited batch no larger than that is scored in full."""
    model, context, _ = client(batch=6)
    _, layer = representation_layer(model, None)
    full = feature_scores(model, layer, context)
    assert torch.equal(feature_scores(model, layer, context, 6, gen()), full)
    sampled = feature_scores(model, layer, context, 2, gen(1))
    picked = torch.randperm(6, generator=gen(1))[:2]
    on_them = feature_scores(model, layer, replace(context, images=context.images[picked]))
    torch.testing.assert_close(sampled, on_them)
    assert not torch.allclose(sampled, full)
    with pytest.raises(AuditInputError, match="score_examples"):
        build_defense("soteria", {"score_examples": "-1"})
