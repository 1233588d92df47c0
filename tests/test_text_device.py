"""Text audits on a device: the spec names where it ran, a device this machine (or Ray) lacks
is refused before anything runs, the attacks keep their best state on the device, and on
CUDA (skipped without one; ``benchmarks/device/issue55.sh text`` runs them on a lent GPU)
every text attack recovers from the same update what it recovers on the CPU."""

from __future__ import annotations

import ast
import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

import auditlib.attacks.text as text_attacks
from auditlib.attacks.text import TEXT_ATTACKS, run_text_attack
from auditlib.attacks.text.base import TextTarget
from auditlib.attacks.text.lamp import lamp_config
from auditlib.attacks.text.opt_embeddings import LowestLoss
from auditlib.attacks.text.tag import tag_config
from auditlib.cli import main
from auditlib.client.text_update import text_update
from auditlib.data.text_samples import demo_batch
from auditlib.engine.device import check_device_name, full_float32
from auditlib.engine.text_audit import TextAuditSpec, run_text_audit
from auditlib.errors import AuditInputError
from auditlib.models.text import build_text_model, with_lora

NO_CUDA = not torch.cuda.is_available()
CUDA = pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device (issue55.sh text runs it)")
TINY = dict(model="gpt2-tiny", batch_size=2, length=8, attacks=("dager",))


def test_a_device_is_named_cpu_cuda_or_cuda_n():
    for name in ("cpu", "cuda", "cuda:0", "cuda:12"):
        check_device_name(name)
    for name in ("gpu", "CPU", "cuda:", "cuda:x", "cuda:-1", "cuda0", "tpu", ""):
        with pytest.raises(AuditInputError, match="expected cpu, cuda or cuda:N"):
            check_device_name(name)


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
def test_a_text_audit_on_a_gpu_this_machine_lacks_is_refused_before_it_runs(tmp_path, capsys):
    with pytest.raises(AuditInputError, match="no CUDA device is available here"):
        run_text_audit(TextAuditSpec(**TINY, device="cuda"))
    # The command line's --device reaches a text audit (it was ignored before): refused...
    args = ["audit", "--text-model", "gpt2-tiny", "--batch-size", "2", "--tokens", "8"]
    assert main([*args, "--device", "cuda", "--out", str(tmp_path / "gpu")]) == 2
    assert "no CUDA device is available here" in capsys.readouterr().err
    assert not (tmp_path / "gpu").exists()
    # ... and auto is the CPU here, said, and named in the result.
    assert main([*args, "--out", str(tmp_path / "auto")]) == 0
    assert "device: cpu (--device auto: no CUDA device here)" in capsys.readouterr().out
    saved = json.loads((tmp_path / "auto" / "result.json").read_text())
    assert saved["spec"]["device"] == "cpu"


def test_a_text_run_is_checked_for_its_device_and_an_old_one_reads_as_the_cpus():
    from auditlib.engine.text_runs import TextUploads, check_text_spec, stored_text_spec

    with pytest.raises(AuditInputError, match="unknown device 'tpu'"):
        check_text_spec(TextAuditSpec(**TINY, device="tpu"), TextUploads())
    check_text_spec(TextAuditSpec(**TINY, device="cuda:1"), TextUploads())  # Ray decides
    stored = {**asdict(TextAuditSpec(**TINY)), "attacks": ["dager"]}
    del stored["device"]  # a run stored before text audits named their device
    assert stored_text_spec(stored).device == "cpu"


def test_a_cuda_text_run_is_refused_where_ray_offers_no_gpu(tmp_path, ray_session):
    import ray

    from auditlib.engine.text_runs import TextRunManager, TextUploads
    from auditlib.store import Store

    if ray.cluster_resources().get("GPU", 0) >= 1:
        pytest.skip("this machine's Ray offers a GPU")
    with Store(f"sqlite:///{tmp_path / 'audit.db'}") as store:
        manager = TextRunManager(store, instance="d" * 32)
        with pytest.raises(AuditInputError, match=r"needs a GPU.*choose cpu"):
            manager.start(TextAuditSpec(**TINY, device="cuda"), TextUploads(), owner="alice")
        assert manager.runs.unfinished() == []  # nothing recorded, nothing queued


# torch's functions that make a tensor where no device is named (the default: the CPU)
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "full", "empty", "eye", "arange",
             "linspace", "rand", "randn", "randint", "randperm"}  # fmt: skip


def test_every_tensor_a_text_attack_makes_is_on_the_models_device_or_said_to_be_on_the_host():
    """This CPU cannot run the CUDA path, so the rule that keeps it whole is read from the
    source: a tensor a text attack makes names its device, is drawn from a (CPU) generator
    to be moved, or its line says it is made on the host on purpose."""
    found = []
    for path in sorted(Path(text_attacks.__file__).parent.glob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            if not (call and node.func.attr in FACTORIES and isinstance(node.func.value, ast.Name)):
                continue
            named = {k.arg for k in node.keywords} & {"device", "generator"}
            if (
                node.func.value.id == "torch"
                and not named
                and "on the host" not in (lines[node.lineno - 1].lower())
            ):
                found.append(f"{path.name}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not found, "\n".join(found)


def test_the_lowest_loss_is_kept_on_its_device_from_the_start_on():
    start = torch.zeros(1, 2, 3)
    best = LowestLoss(start, None)
    start += 9  # the optimiser moves the variables in place: the kept start must not move
    assert best.embeds.abs().max() == 0 and float(best.loss) == float("inf")
    for value, fill in ((3.0, 1), (float("nan"), 2), (5.0, 3), (2.0, 4), (2.0, 5), (4.0, 6)):
        best.keep(torch.tensor(value), torch.full((1, 2, 3), float(fill)), None)
    assert float(best.loss) == 2.0 and best.embeds.unique().tolist() == [4.0]  # the first 2
    # LAMP's rule: a later state of the same loss replaces the kept one; labels move with it.
    ties = LowestLoss(torch.zeros(2), torch.zeros(3), or_equal=True)
    ties.keep(torch.tensor(1.0), torch.ones(2), torch.ones(3))
    ties.keep(torch.tensor(1.0), torch.full((2,), 7.0), torch.full((3,), 7.0))
    ties.keep(torch.tensor(1.5), torch.full((2,), 8.0), torch.full((3,), 8.0))
    assert ties.embeds.tolist() == [7.0, 7.0] and ties.labels.tolist() == [7.0, 7.0, 7.0]


def test_a_batch_moves_to_the_models_device_whole():
    model = build_text_model("bert-tiny", seed=0)
    batch = demo_batch(model.tokenizer, 2, 8, 0)
    moved = batch.to(torch.device("meta"))
    assert {moved.input_ids.device.type, moved.attention_mask.device.type} == {"meta"}
    assert moved.labels.device.type == "meta" and moved.texts == batch.texts
    assert model.device == torch.device("cpu")


# ---------------------------------------------------------------------- on CUDA


def _recovered(preset: str, device: str, lora: int | None = None) -> dict[str, list[list[int]]]:
    """Each applicable attack's tokens on ``preset``'s update of one demo batch, the model
    built (seeded) on the CPU and moved to ``device``, few steps: where float order has not
    yet moved a projection."""
    torch.manual_seed(0)
    model = build_text_model(preset, 0)
    model = with_lora(model, lora) if lora else model
    model.module.to(device)
    batch = demo_batch(model.tokenizer, 2, 8, 0).to(torch.device(device))
    target = TextTarget(model, text_update(model, batch), 2, 8, batch.labels)
    configs = (
        {"utr": TEXT_ATTACKS["utr"].config(refine_iterations=2)}
        if lora
        else {
            "dager": TEXT_ATTACKS["dager"].config(),
            "tiger": TEXT_ATTACKS["tiger"].config(steps=20),
            "tag": tag_config(steps=5, restarts=2),
            "lamp": lamp_config(steps=5, init_candidates=4, swap_candidates=4, swap_every=2),
        }
    )
    return {
        n: [list(s) for s in run_text_attack(n, target, c).token_ids] for n, c in configs.items()
    }


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for s, t in zip(a, b, strict=True) for x, y in zip(s, t, strict=True)]
    return sum(x == y for x, y in pairs) / max(len(pairs), 1)


@CUDA
@pytest.mark.parametrize("preset", ["gpt2-tiny", "bert-tiny", "llama-tiny"])
def test_each_text_attack_on_cuda_recovers_what_it_recovers_on_the_cpu(preset):
    full_float32()
    cpu, cuda = _recovered(preset, "cpu"), _recovered(preset, "cuda")
    assert cuda["dager"] == cpu["dager"]  # exact: both the batch itself
    for name in ("tiger", "tag", "lamp"):  # the same starts, a few steps: the same projections
        assert _agreement(cuda[name], cpu[name]) >= 0.9, (name, cuda[name], cpu[name])


@CUDA
def test_utr_on_cuda_decodes_what_it_decodes_on_the_cpu():
    full_float32()
    cpu, cuda = _recovered("gpt2-tiny", "cpu", lora=4), _recovered("gpt2-tiny", "cuda", lora=4)
    assert _agreement(cuda["utr"], cpu["utr"]) >= 0.9, (cuda, cpu)


@CUDA
def test_a_text_audit_on_cuda_reaches_the_cpus_verdict():
    spec = TextAuditSpec(**{**TINY, "attacks": ("dager", "tiger")}, defense="dp-gaussian",
                         defense_params={"sigma": 1e-4, "clip": 30.0})  # fmt: skip
    notes: list[str] = []
    on_cuda = run_text_audit(replace(spec, device="cuda"), lambda e: notes.append(e.note))
    on_cpu = run_text_audit(spec)
    assert any("(cuda)" in n for n in notes)  # the model went there
    assert on_cuda.verdict.outcome == on_cpu.verdict.outcome
    assert [r.recovered.token_ids for r in on_cuda.controls] == [
        r.recovered.token_ids for r in on_cpu.controls
    ]
