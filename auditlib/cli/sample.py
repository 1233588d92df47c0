"""``audit --updates N|all``: the verdict over the sample.

Each update is a batch of ``--batch-size`` images of the set, from ``--offset`` on, audited
as one ``audit`` is (its control first under a defense), the updates' attacks advancing
together as one batched computation where they can (``engine.together``; the output says
which ran one after another and why), and written to
``OUT/update-NNN/`` (its result.json and reconstruction.png); ``OUT/result.json`` holds the
sample's verdict: the share of images recovered beyond the best guess with its 95 %
(Clopper-Pearson) interval, each update's figures, and the worst case; where the attacker did
not know the labels, the labels recovered over every update with their interval of the same
definition and their test against the labels relabelled at random (``metrics.sample``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from auditlib.errors import AuditInputError
from auditlib.spec import RunSpec

SAMPLE_SCHEMA = 1


def parse_updates(text: str) -> int | str:
    """``--updates``: a whole number >= 1, or ``all``."""
    from auditlib.engine.sample import ALL

    if text.strip().lower() == ALL:
        return ALL
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number or 'all', got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 update, got {value}")
    return value


def audit_sample(
    spec: RunSpec,
    specs: list[RunSpec],
    args: argparse.Namespace,
    run_one: Callable,
    run_together: Callable | None = None,
) -> int:
    """``specs``: the sample's updates (``engine.sample.update_specs`` of ``spec``);
    ``run_one(spec)``: one update's judged result; ``run_together(specs)``: every update's,
    their attacks advancing together, and how each attack ran, in words."""
    from auditlib.cli.audit import write_result_files
    from auditlib.engine.together import why_specs_apart
    from auditlib.metrics.sample import SampleVerdict, UpdateOutcome
    from auditlib.output_folder import publish
    from auditlib.result_json import summary_json

    out = Path(args.out)
    began = time.perf_counter()
    outcomes = []
    folders = []
    why = why_specs_apart(specs)
    if why is None and getattr(args, "updates_apart", False):
        why = "--updates-apart was given"
    if why is None and run_together is None:
        why = "this caller runs updates one at a time"
    together = None
    if why is None:
        together, notes = run_together(specs)
        for words in notes:  # per attack: together, or one after another and why
            print(f"updates: {words}")
    else:
        print(f"updates: one after another ({why})")
    for index, one in enumerate(specs):
        result = together[index] if together is not None else run_one(one)
        summary = result.summary
        if summary.metrics is None or summary.verdict is None:  # pragma: no cover - images given
            raise AuditInputError("a sample audit scores every update; this one has no scores")
        folders.append((f"update-{index + 1:03d}", result))
        outcome = UpdateOutcome.of(
            index, summary.verdict, summary.metrics.per_image, summary.timing.seconds
        )
        outcomes.append(outcome)
        labels = outcome.labels_recovered
        print(
            f"update {index + 1} of {len(specs)} ({', '.join(outcome.names)}): "
            f"{outcome.images_recovered} of {len(outcome.names)} recovered; "
            + ("" if labels is None else f"labels {labels} of {len(outcome.names)} right; ")
            + f"verdict {outcome.headline}"
        )
    sample = SampleVerdict(tuple(outcomes))
    document = {
        "kind": "sample",
        "schema": SAMPLE_SCHEMA,
        "spec": spec.to_dict(),
        "updates": len(specs),
        "batch_size": specs[0].data.batch_size,
        "seconds": time.perf_counter() - began,
        "folders": [name for name, _ in folders],
        "sample": sample.to_json(),
    }

    def write(folder: Path) -> None:  # every update's folder, then the sample's result.json
        for name, result in folders:
            write_result_files(result, folder / name)
        (folder / "result.json").write_text(summary_json(document))

    publish(out, write)  # the earlier complete result or this one, whenever stopped
    print(f"sample verdict: {sample.headline}\n  {sample.sentence}")
    print(f"wrote {out / 'result.json'} and {len(folders)} update folders")
    return 0


def read_sample(path: str | Path) -> dict:
    """A sample's result.json, as written by :func:`audit_sample`."""
    data = json.loads(Path(path).read_text())
    if data.get("kind") != "sample":
        raise AuditInputError(f"{path} is not a sample audit's result.json")
    return data
