"""The verdict over a sample: each batch of the set one update, judged on its own; the share
of images recovered with its Clopper-Pearson interval, each update's figures, the worst case."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from auditlib.data.labels import assign_labels
from auditlib.engine.sample import update_specs
from auditlib.errors import AuditInputError
from auditlib.metrics.sample import (
    SampleVerdict,
    UpdateOutcome,
    clopper_pearson,
    updates_interval,
)
from auditlib.metrics.scores import ImageScore
from tests.test_attacks import lenet_spec
from tests.test_report import needs_poppler


def test_the_interval_is_clopper_pearsons_exact_binomial_interval():
    # The closed forms at the ends: 0 of n and n of n.
    low, high = clopper_pearson(0, 17)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 17))
    low, high = clopper_pearson(17, 17)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 17))
    # A tabulated value (5 of 10: 0.187 to 0.813).
    low, high = clopper_pearson(5, 10)
    assert (round(low, 3), round(high, 3)) == (0.187, 0.813)
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)


def _update(index, names, outcome, recovered, worst):
    return UpdateOutcome(
        index, names, outcome, outcome, recovered, worst - 1, worst, names[0], None, recovered > 0
    )


def test_the_sample_verdict_counts_what_the_updates_found_and_names_the_worst_case():
    sample = SampleVerdict(
        (
            _update(0, ("a", "b"), "leaks", 2, 40.0),
            _update(1, ("c", "d"), "inconclusive", 0, 9.0),
            _update(2, ("e", "f"), "leaks", 1, 55.0),
        )
    )
    assert (sample.images, sample.images_recovered) == (6, 3)
    assert sample.share == 0.5 and sample.interval == clopper_pearson(1.5, 3)  # 3 updates
    assert sample.interval_if_independent == clopper_pearson(3, 6)
    assert sample.worst.index == 2 and sample.worst.worst_image == "e"
    assert sample.headline.startswith("3 of 6 images recovered beyond the best guess (50%")
    assert "2 leaked, 1 inconclusive" in sample.sentence
    assert "not evidence that they are safe" in sample.sentence
    assert "not 6 independent draws (taken as independent, 12% to 88%)" in sample.sentence
    again = SampleVerdict.from_json(json.loads(json.dumps(sample.to_json())))
    assert again == sample


def _verdict(outcome: str) -> SimpleNamespace:
    """What ``UpdateOutcome.of`` reads of an update's verdict (its outcome and headline)."""
    return SimpleNamespace(outcome=outcome, headline=outcome, finding=None)


def _score(name: str, psnr: float, beyond_guess: bool | None) -> ImageScore:
    return ImageScore(name, 0, 10 ** (-psnr / 10), psnr, 0, beyond_guess=beyond_guess)


def test_the_worst_case_is_an_image_recovered_not_one_a_guess_matches_as_well():
    # A flat photograph a flat guess matches at 31 dB outscores, in PSNR alone, one the
    # attack rebuilt at 24 dB beyond its guess: the worst case is the one rebuilt.
    flat = UpdateOutcome.of(0, _verdict("inconclusive"), [_score("flat", 31.0, False)])
    rebuilt = UpdateOutcome.of(1, _verdict("leaks"), [_score("rebuilt", 24.0, True)])
    sample = SampleVerdict((flat, rebuilt))
    assert sample.worst is rebuilt and "Worst case: rebuilt (update 2), recovered at" in (
        sample.sentence
    )
    # Where nothing came back, the best reconstruction is named as that, not as a case.
    nothing = SampleVerdict((flat,))
    assert nothing.worst is flat
    assert "Best reconstruction: flat (update 1) at 31.00 dB, not beyond its best guess" in (
        nothing.sentence
    )
    assert "Worst case" not in nothing.sentence
    # A result scored before the guesses existed says neither.
    unknown = UpdateOutcome.of(0, _verdict("leaks"), [_score("old", 28.0, None)])
    assert unknown.worst_recovered is None
    assert "Worst case: old (update 1) at 28.00 dB." in SampleVerdict((unknown,)).sentence


def _draws(rng, updates: int, batch: int, share: float, together: bool) -> SampleVerdict:
    """One seeded sample: each update's images come back all or none (``together``) or each
    on its own, with probability ``share``."""
    if together:
        recovered = [batch * int(rng.random() < share) for _ in range(updates)]
    else:
        recovered = [int((rng.random(batch) < share).sum()) for _ in range(updates)]
    names = tuple(str(i) for i in range(batch))
    return SampleVerdict(
        tuple(_update(i, names, "leaks", r, 30.0) for i, r in enumerate(recovered))
    )


TRIALS = 1000


def _coverage(interval: str, together: bool, share: float = 0.3) -> float:
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(TRIALS):
        low, high = getattr(_draws(rng, 8, 8, share, together), interval)
        hits += low <= share <= high
    return hits / TRIALS


def test_with_one_image_an_update_the_interval_is_the_images_own():
    sample = SampleVerdict(
        tuple(_update(i, (f"{i}",), "leaks", int(i < 5), 30.0) for i in range(17))
    )
    assert sample.interval == sample.interval_if_independent == clopper_pearson(5, 17)
    assert "independent draws" not in sample.sentence


def test_the_interval_counts_updates_so_images_that_come_back_together_are_not_overcounted():
    # Eight updates of eight images, each update recovered whole or not at all (a batch the
    # attack converged on, or not), 30 % of them: counted as 64 independent images, the 95 %
    # interval misses the true share far more often than 5 % of samples; counted by updates
    # it holds its confidence, and it still does where the images come back one by one.
    assert _coverage("interval_if_independent", together=True) < 0.85
    assert _coverage("interval", together=True) >= 0.95
    assert _coverage("interval", together=False) >= 0.95
    all_or_none = SampleVerdict(
        tuple(_update(i, ("a", "b", "c", "d"), "leaks", 4 * (i < 2), 30.0) for i in range(4))
    )
    assert all_or_none.interval == clopper_pearson(2, 4)  # 2 of 4 updates, exactly


def test_the_set_is_cut_into_updates_in_order_and_too_many_are_refused():
    spec = lenet_spec(batch=2, offset=1)
    specs = update_specs(spec, 3)
    assert [s.data.offset for s in specs] == [1, 3, 5]
    assert all(s.data.batch_size == 2 for s in specs)
    assert len(update_specs(spec, "all")) == 8  # 16 photographs from offset 1, 2 at a time
    with pytest.raises(AuditInputError, match="holds 16 images from offset 1: 8 updates of 2"):
        update_specs(spec, 9)
    with pytest.raises(AuditInputError, match="a whole number >= 1 or 'all'"):
        update_specs(spec, 0)


def test_the_command_line_audits_the_sample_and_writes_its_verdict(tmp_path, capsys):
    from auditlib.cli import main

    out = tmp_path / "sample"
    code = main(
        [
            "audit",
            "--model",
            "lenet",
            "--num-classes",
            "100",
            "--samples",
            "photographs",
            "--attack",
            "dlg",
            "--preset",
            "paper",
            "--iterations",
            "3",
            "--updates",
            "2",
            "--lpips-nets",
            "none",
            "--out",
            str(out),
        ]
    )
    stdout = capsys.readouterr().out
    assert code == 0
    assert "update 1 of 2 (astronaut)" in stdout and "update 2 of 2 (chelsea)" in stdout
    assert "sample verdict:" in stdout and "95% interval" in stdout
    data = json.loads((out / "result.json").read_text())
    assert data["kind"] == "sample" and data["updates"] == 2
    sample = data["sample"]
    assert sample["images"] == 2 and len(sample["updates"]) == 2
    assert [u["names"] for u in sample["updates"]] == [["astronaut"], ["chelsea"]]
    low, high = sample["interval"]
    assert 0.0 <= low <= sample["share"] <= high <= 1.0
    for folder in ("update-001", "update-002"):
        one = json.loads((out / folder / "result.json").read_text())
        assert one["config"]["data"]["batch_size"] == 1
        assert (out / folder / "reconstruction.png").exists()
    # Bad input: one line, exit code 2.
    with pytest.raises(SystemExit) as stopped:
        main(["audit", "--model", "lenet", "--samples", "photographs", "--updates", "zero"])
    assert stopped.value.code == 2
    assert "expected a whole number or 'all', got 'zero'" in capsys.readouterr().err


@needs_poppler
def test_the_report_of_a_sample_gives_its_share_interval_and_one_row_per_update(tmp_path):
    import dataclasses

    from auditlib.engine.audit import run_audit
    from auditlib.engine.batches import record_batch, sample_members
    from auditlib.report.pdf import build_report
    from auditlib.report.subject import batch_subject
    from auditlib.spec import Budget, ComponentSpec
    from auditlib.store import Store
    from tests.test_report import flat, pdf_text

    base = dataclasses.replace(
        lenet_spec("dlg"), attack=ComponentSpec.of("dlg", preset="paper"), budget=Budget(5)
    )
    members = sample_members(base, 2)
    assert [m.label for m in members] == ["update 1 (image 1)", "update 2 (image 2)"]
    with Store(f"sqlite:///{tmp_path}/sample.db") as store:
        for member in members:
            result = run_audit(member.spec, lpips_nets=())
            run_id = store.create_run(member.spec.to_dict(), member.spec.identity(), member.label)
            store.mark_running(run_id)
            store.finish(run_id, "completed", summary=result.summary)
        subject = batch_subject(store, record_batch(store, "sample", "two updates", members))
        assert subject.kind == "sample"
        out = tmp_path / "sample.pdf"
        build_report(subject, out, charts=False)
    text = flat(pdf_text(out))
    assert "an audit of the sample: 2 updates" in text
    assert "The sample" in text and "of 2 images recovered beyond the best guess" in text
    assert "95% interval" in text and "Clopper-Pearson" in text
    assert "astronaut" in text and "chelsea" in text


def _labelled(index: int, truth: tuple[int, ...], guess: tuple[int, ...], classes: int = 10):
    return UpdateOutcome(
        index,
        tuple(f"image{index}-{i}" for i in range(len(truth))),
        "inconclusive",
        "Inconclusive",
        0,
        9.0,
        9.5,
        f"image{index}-0",
        None,
        False,
        true_labels=truth,
        recovered_labels=guess,
        classes=classes,
    )


def test_labels_are_pooled_over_the_updates_with_the_images_interval():
    """iDLG on 17 updates of one image each: p = 1/C per update, not reportable alone; over
    the sample, 17 of 17 with its interval (the images' definition) and one test."""
    truths = [(t,) for t in assign_labels(17, 10, seed=0)]
    sample = SampleVerdict(tuple(_labelled(u, t, t) for u, t in enumerate(truths)))
    assert (sample.labels, sample.labels_recovered) == (17, 17)
    # One label an update: the updates' interval is the labels' own, as for the images.
    assert sample.label_interval == updates_interval(17, 17, 17) == clopper_pearson(17, 17)
    assert sample.label_test.p_value < 0.01 and sample.labels_leak
    assert "labels 17 of 17 recovered (100%; 95% interval 80% to 100%), leaked" in sample.headline
    assert "Labels: 17 of 17 recovered" in sample.sentence
    again = SampleVerdict.from_json(json.loads(json.dumps(sample.to_json())))
    assert again == sample and again.to_json()["labels_leak"] is True


def test_the_same_label_in_every_update_is_one_fact_not_seventeen():
    same = SampleVerdict(tuple(_labelled(u, (3,), (3,)) for u in range(17)))
    assert same.labels_recovered == 17 and not same.labels_leak
    assert "not beyond chance" in same.headline


def test_labels_of_several_images_an_update_count_the_updates():
    sample = SampleVerdict(
        (_labelled(0, (1, 2, 3, 4), (1, 2, 3, 4)), _labelled(1, (5, 6, 7, 8), (0, 0, 0, 0)))
    )
    assert (sample.labels, sample.labels_recovered) == (8, 4)
    assert sample.label_interval == clopper_pearson(1.0, 2)  # 2 updates, half of each right


def test_a_sample_recorded_before_labels_were_pooled_still_reads():
    old = _update(0, ("a",), "leaks", 1, 30.0).to_json()
    for key in ("true_labels", "recovered_labels", "classes", "label_exact"):
        del old[key]
    read = UpdateOutcome.from_json(old)
    assert read.true_labels is None and read.labels_recovered is None
    sample = SampleVerdict((read,))
    assert sample.labelled == () and "labels" not in sample.headline
    assert "labels" not in sample.to_json()
