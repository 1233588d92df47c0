"""Specification: no twin is the plain attack renamed (issue 30, item 2).

For every attack and every defense that offers an adaptive attacker: either the twin is
skipped and says why (the attack cannot match through the defense, or knowing it leaves the
objective the plain one), or, run from the same start, its objective differs from the plain
attack's on that same candidate. A twin that only post-processes (Shadow's) reuses the
plain attack's result and is not rerun.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest
import torch

from auditlib.attacks.base import ATTACKS, RunControl, build_attack_config
from auditlib.attacks.objectives import UpdateMatcher
from auditlib.client.protocol import ClientProtocol
from auditlib.engine.attack_phase import TWIN_SAME_AS_PLAIN, plan_attacks, run_attacks
from auditlib.engine.audit import run_audit
from auditlib.spec import ComponentSpec, ScenarioSpec
from tests.test_attacks import lenet_spec, release_for

torch.set_num_threads(1)

# Each defense that offers an adaptive attacker, at a strength where it acts on LeNet's
# update (the privacy table's settings where they apply).
DEFENSES = {
    "dp-gaussian": {"sigma": 0.01, "clip": None},
    "dp-laplace": {"scale": 0.01},
    "prune": {"ratio": 0.8},
    "clip": {"bound": 4.0},
    "quantize": {"bits": 4},
    "soteria": {"ratio": 0.5},
    "outpost": {},
    "fedkl": {},
    "shadow": {},
}


# What each shared release observed when it was built, to check that no case changed it.
_AS_BUILT: dict[str, tuple[torch.Tensor, ...]] = {}


@functools.cache
def defended_release(defense: str):
    """The release under ``defense`` at its table setting, built once for the module: the
    cases of every attack read it (a Shadow release alone takes seconds); the module's end
    checks that none changed it."""
    release = release_for(lenet_spec(), defense=defense, defense_params=DEFENSES[defense])[2]
    _AS_BUILT[defense] = tuple(t.detach().clone() for t in release.observation.tensors)
    return release


@pytest.fixture(autouse=True, scope="module")
def _shared_releases_unchanged():
    yield
    for defense, built in _AS_BUILT.items():
        now = defended_release(defense).observation.tensors
        assert all(torch.equal(a, b) for a, b in zip(now, built, strict=True)), defense


def first_objective(name: str, release, known) -> float:
    """The attack's objective on its first candidate (one step from the run's seed)."""
    knowledge = release.knowledge
    if known is not None:
        knowledge = dataclasses.replace(knowledge, defense=known)
    config, _ = build_attack_config(name, {"restarts": 1} if _has_restarts(name) else None)
    events = ATTACKS[name].run(
        release.observation, knowledge, config, RunControl(1, emit_every=1), 0
    )
    first = next(e for e in events if e.losses)
    return float(next(iter(first.losses.values())))


def _has_restarts(name: str) -> bool:
    fields = {f.name for f in dataclasses.fields(ATTACKS[name].config_type)}
    return "restarts" in fields


@pytest.mark.parametrize(
    "attack, defense", list(itertools.product(sorted(ATTACKS), sorted(DEFENSES)))
)
def test_a_twin_that_runs_has_an_objective_of_its_own(attack, defense):
    release = defended_release(defense)
    known, info = release.known_defense, ATTACKS[attack]
    assert known is not None
    config, _ = build_attack_config(attack)
    if info.why_not_adaptive(known) is not None:
        return  # skipped, with its reason (test_adaptive)
    if info.twin_adds_nothing(known, config):
        needs = known.needs() & info.adapts
        assert needs <= {"distance"} or (needs == {"transform"} and known.rescales)
        return
    if known.needs() & info.adapts == {"postprocess"}:
        return  # the plain result, undone (test below)
    if info.server_twin is not None:
        # A malicious server's twin differs by the model it builds and its reading of the
        # noise, not by an objective (tests/test_malicious_server.py).
        return
    if "unknowns" in known.needs():
        # The twin fits the model parameters the defense hides, from the server's own
        # guess: at the first candidate it equals the plain objective by construction, and
        # differs as soon as the parameters move (test_adaptive, FedKL's lock).
        knows = dataclasses.replace(release.knowledge, defense=known)
        assert UpdateMatcher(release.observation, knows, "l2").unknowns
        return
    plain = first_objective(attack, release, None)
    twin = first_objective(attack, release, known)
    assert twin != pytest.approx(plain, rel=1e-6), (attack, defense, plain, twin)


def test_dlm_under_gaussian_noise_is_skipped_as_the_plain_attack_renamed():
    # DLM weighs no image prior, and Gaussian noise's likelihood is its own squared distance.
    protocol_free = release_for(
        lenet_spec(), defense="dp-gaussian", defense_params={"sigma": 0.01, "clip": None}
    )[2]
    known = protocol_free.known_defense
    config, _ = build_attack_config("dlm")
    assert ATTACKS["dlm"].twin_adds_nothing(known, config)
    # Laplace noise changes its distance: that twin runs.
    laplace = defended_release("dp-laplace")
    assert not ATTACKS["dlm"].twin_adds_nothing(laplace.known_defense, config)
    # Nor does GRNN, whose generator is its prior.
    assert ATTACKS["grnn"].twin_adds_nothing(known, build_attack_config("grnn")[0])
    # The attacks that weigh an image prior have a posterior-mode twin under either noise.
    assert not ATTACKS["dlg"].twin_adds_nothing(known, build_attack_config("dlg")[0])


def test_under_norm_clipping_a_cosine_attack_is_skipped_as_the_plain_attack_renamed():
    """Norm clipping multiplies the whole update by one positive number, and the cosine of
    two updates is that of any positive multiples of them: IG's twin would be its plain
    objective (equal to float rounding, measured below), where DLG's squared L2 distance and
    value clipping (each entry clamped) change it."""
    release = defended_release("clip")  # norm mode, bound 4
    known = release.known_defense
    assert known.rescales
    ig, _ = build_attack_config("ig", {"restarts": 1})
    assert ATTACKS["ig"].twin_adds_nothing(known, ig)
    plain = first_objective("ig", release, None)
    assert first_objective("ig", release, known) == pytest.approx(plain, rel=1e-5)
    assert not ATTACKS["dlg"].twin_adds_nothing(known, build_attack_config("dlg")[0])
    l2, _ = build_attack_config("ig", {"distance": "l2"})
    assert not ATTACKS["ig"].twin_adds_nothing(known, l2)
    value = release_for(
        lenet_spec(), defense="clip", defense_params={"bound": 0.01, "mode": "value"}
    )[2]
    assert not value.known_defense.rescales
    assert not ATTACKS["ig"].twin_adds_nothing(value.known_defense, ig)


def test_the_engine_skips_a_twin_that_adds_nothing_and_reuses_the_plain_run_for_shadow():
    _, _, release = release_for(
        lenet_spec(),
        protocol=ClientProtocol("fedavg", local_lr=0.01, shared="weights"),
        defense="dp-gaussian",
        defense_params={"sigma": 0.01, "clip": None},
    )
    planned = plan_attacks(ComponentSpec.of("dlm"), 2)
    planned = [planned[0], dataclasses.replace(planned[0], adaptive=True)]
    runs = []
    list(run_attacks(planned, lambda _: release, RunControl(2), 0, runs))
    assert runs[0].final is not None and runs[1].final is None
    assert runs[1].skipped == TWIN_SAME_AS_PLAIN

    shadow = defended_release("shadow")
    planned = plan_attacks(ComponentSpec.of("dlg"), 2)
    planned = [planned[0], dataclasses.replace(planned[0], adaptive=True)]
    runs = []
    list(run_attacks(planned, lambda _: shadow, RunControl(2), 0, runs))
    plain, twin = runs
    assert twin.final.steps == 0 and twin.skipped is None  # not rerun
    undone = shadow.known_defense.postprocess(
        plain.final.selected.images, plain.final.selected.labels, shadow.knowledge
    )
    assert torch.equal(twin.final.selected.images, undone)


def test_where_knowing_the_defense_changes_nothing_the_card_says_the_plain_attack_knows_it():
    spec = lenet_spec(
        "dlm", 2, defense=ComponentSpec.of("dp-gaussian", {"sigma": 0.01, "clip": None})
    )
    protocol = ClientProtocol("fedavg", local_lr=0.01, shared="weights")
    spec = dataclasses.replace(spec, scenario=ScenarioSpec(protocol=protocol))
    summary = run_audit(spec, lpips_nets=()).summary
    assert [a.skipped for a in summary.attacks] == [None, TWIN_SAME_AS_PLAIN]
    card = {k.item: k for k in summary.verdict.scope.threat.knowledge}
    line = card["the defense's mechanism and public parameters"]
    assert line.known and "the plain attacks are the attacker that knows it" in line.detail
    assert summary.verdict.scope.twins == "ran"  # covered: a "Low" may stand on it


def test_noise_of_scale_zero_leaves_nothing_to_weigh():
    for defense, params in (
        ("dp-gaussian", {"sigma": 0.0, "clip": None}),
        ("dp-laplace", {"scale": 0.0}),
    ):
        known = release_for(lenet_spec(), defense=defense, defense_params=params)[2].known_defense
        assert known.noise is None and known.needs() == frozenset()
        assert ATTACKS["dlg"].twin_adds_nothing(known, build_attack_config("dlg")[0])


def test_the_qsgd_twin_reads_a_buckets_step_when_its_levels_share_a_factor():
    # Issue 50, item 6: one dominant entry, 3 levels. The release is (n, 0, ..., 0), n the
    # bucket's norm: level 3 at step n/3, which the largest whole step (n, level 1) misread.
    from auditlib.defenses.quantization import _qsgd
    from auditlib.likelihoods import QsgdLikelihood, _buckets, _step_of

    update = torch.full((16,), 0.005)
    update[0] = 1.0
    released = _qsgd(update, 3, 512, True, torch.Generator().manual_seed(0))
    assert released[0] > 0 and bool((released[1:] == 0).all())
    read = QsgdLikelihood.read((released,), 3, 512)
    step = float(torch.linalg.vector_norm(update)) / 3
    assert float(read.steps[0]) == pytest.approx(step, rel=1e-5)
    assert read.released[0].abs().max().item() == 3
    # Over many buckets of gradient-like entries (dense, sparse, one dominant), nearly every
    # step is read as the client's n / s; the levels' norm decides where a factor is shared.
    generator = torch.Generator().manual_seed(1)
    misread = total = 0
    for levels, size in ((3, 4), (3, 16), (7, 4), (127, 16)):
        for kind in range(3):
            v = torch.randn(4096, generator=generator)
            if kind == 1:
                v = v * (torch.rand(4096, generator=generator) < 0.05)
            if kind == 2:
                v = torch.randn(4096, generator=generator) * 1e-3
                v[::size] = 1.0
            rows = _buckets(_qsgd(v, levels, size, True, generator), size)[0]
            truth = torch.linalg.vector_norm(_buckets(v, size)[0], dim=1, keepdim=True) / levels
            sent = (rows != 0).any(dim=1)
            wrong = ((_step_of(rows, levels) - truth).abs() > 1e-3 * truth).squeeze(1) & sent
            misread += int(wrong.sum())
            total += int(sent.sum())
    assert total > 5_000 and misread / total < 0.01, (misread, total)


@pytest.mark.parametrize(
    ("defense", "params"),
    [("quantize", {"bits": 4}), ("outpost", {}), ("dp-gaussian", {"sigma": 0.01, "clip": None})],
)
def test_a_release_likelihood_of_stacked_candidates_is_each_candidates_own(defense, params):
    """A release likelihood takes R candidates stacked along a leading dimension (the twin's
    starts then advance together): one value per candidate, each what it is alone, and each
    candidate's gradient its own (OUTPOST's release is modelled from the candidate itself)."""
    release = release_for(lenet_spec(), defense=defense, defense_params=params)[2]
    noise = release.known_defense.noise
    assert noise.stacked
    generator = torch.Generator().manual_seed(0)
    target = tuple(t.detach() for t in release.observation.tensors)
    stacked = tuple(
        (t + 0.01 * torch.randn((3, *t.shape), generator=generator)).requires_grad_()
        for t in target
    )
    together = noise.nll(stacked, target, 0.5)
    assert together.shape == (3,)
    batched = torch.autograd.grad(together.sum(), stacked)
    for r in range(3):
        one = tuple(s[r].detach().clone().requires_grad_() for s in stacked)
        alone = noise.nll(one, target, 0.5)
        assert alone.dim() == 0
        assert float(together[r].detach()) == pytest.approx(float(alone.detach()), rel=1e-5)
        for b, a in zip(batched, torch.autograd.grad(alone, one), strict=True):
            torch.testing.assert_close(b[r], a, rtol=1e-4, atol=1e-6 * float(a.abs().max()))


def test_the_qsgd_twins_starts_advance_together_and_end_where_they_end_apart():
    """QSGD's likelihood is smooth in the candidate (its buckets and levels are the
    release's), so three steps together end where they end apart to float order. OUTPOST's
    is not compared so: its masks are ranked from each candidate's own values, and float
    order on an entry at the cut (another CPU's kernels) moves it between noised and exact;
    its likelihood is checked row by row on the same candidates above."""
    from auditlib.attacks.objectives import why_not_together
    from tests.test_attacks import run_attack

    release = release_for(lenet_spec(), defense="quantize", defense_params={"bits": 4})[2]
    knowledge = dataclasses.replace(release.knowledge, defense=release.known_defense)
    assert knowledge.defense.noise is not None and why_not_together(knowledge) is None
    twin = dataclasses.replace(release, knowledge=knowledge)
    params = {"restarts": 3, "signed": False}
    finals = [run_attack("ig", twin, 3, params={**params, "together": t})[1] for t in (False, True)]
    for apart, together in zip(*(f.candidates for f in finals), strict=True):
        assert together.restart == apart.restart and together.steps == apart.steps == 3
        assert together.loss == pytest.approx(apart.loss, rel=1e-4)
        torch.testing.assert_close(together.images, apart.images, rtol=0, atol=1e-4)
