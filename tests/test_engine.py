"""The execution engine: the message stream a worker sends, assets, and run status."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
from PIL import Image

from auditlib.data import images_zip, load_image_folder
from auditlib.engine.messages import (
    ErrorMessage,
    EventMessage,
    FrameMessage,
    ResultMessage,
    from_wire,
    to_wire,
)
from auditlib.engine.stream import audit_messages
from auditlib.models import ModelSpec
from auditlib.spec import Budget, ComponentSpec, DataSpec, ModelRef, RunSpec, ScenarioSpec

EXAMPLES = "assets/example-images"


def spec_for(data: DataSpec, iterations: int = 12, attack: str = "dlg", **model) -> RunSpec:
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 32, 32), init="uniform"), **model),
        data=data,
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of(attack),
        defense=ComponentSpec.of("none"),
        budget=Budget(iterations),
    )


def test_the_stream_is_start_events_frames_then_result():
    spec = spec_for(DataSpec("samples", "photographs", batch_size=2))
    wire = list(audit_messages(spec, emit_every=2, image_every=4, lpips_nets=()))
    messages = [from_wire(m) for m in wire]
    kinds = [m.kind for m in messages]
    assert kinds[0] == "start" and kinds[-1] == "result"
    assert kinds.count("frame") >= 3  # step 0, 4, 8, 12 (and the final event)
    steps = [m.step for m in messages if isinstance(m, EventMessage)]
    assert steps == sorted(steps) and steps[-1] == 12
    start = messages[0]
    assert start.names == ("astronaut", "chelsea")
    assert Image.open(io.BytesIO(start.png)).size == (2 * 128 + 3 * 2, 128 + 2 * 2)
    frame = next(m for m in messages if isinstance(m, FrameMessage))
    assert 0 < frame.psnr_mean < 100
    result = messages[-1]
    assert isinstance(result, ResultMessage) and result.status == "completed"
    assert result.summary.metrics.per_image[0].name in {"astronaut", "chelsea"}
    Image.open(io.BytesIO(result.png)).verify()
    # The wire form is plain data: JSON values and PNG bytes, and reads back the same.
    assert all(to_wire(m) == w for m, w in zip(messages, wire, strict=True))
    json.dumps({k: v for k, v in wire[-1].items() if k != "png"}, allow_nan=True)


def test_uploaded_images_reach_the_worker_as_a_content_addressed_zip():
    data = images_zip(load_image_folder(EXAMPLES))
    sha = hashlib.sha256(data).hexdigest()
    spec = spec_for(DataSpec("asset", sha, batch_size=2), iterations=2)
    result = from_wire(list(audit_messages(spec, {sha: data}, lpips_nets=()))[-1])
    assert isinstance(result, ResultMessage)
    per_image = result.summary.metrics.per_image
    assert [p.true_label for p in per_image] == [0, 1]  # from the zip's labels.csv
    assert result.summary.victim.data.names == ("0-astronaut.png", "1-chelsea.png")


def test_a_missing_asset_is_an_input_error_not_a_crash():
    spec = spec_for(DataSpec("asset", "0" * 64, batch_size=1), iterations=2)
    messages = [from_wire(m) for m in audit_messages(spec, {}, lpips_nets=())]
    assert messages == [ErrorMessage(messages[0].message, input_error=True)]
    assert "not handed to this worker" in messages[0].message


def test_uploaded_weights_are_loaded_from_an_asset():
    from safetensors.torch import save

    from auditlib.models import build_model

    model = build_model(ModelSpec("lenet", 10, (3, 32, 32), init="uniform", seed=5))
    weights = save({k: v.contiguous() for k, v in model.state_dict().items()})
    sha = hashlib.sha256(weights).hexdigest()
    spec = spec_for(
        DataSpec("samples", "photographs", batch_size=1), iterations=1, weights_asset=sha
    )
    result = from_wire(list(audit_messages(spec, {sha: weights}, lpips_nets=()))[-1])
    assert isinstance(result, ResultMessage)
    bad = from_wire(list(audit_messages(spec, {sha: b"not weights at all"}, lpips_nets=()))[-1])
    assert isinstance(bad, ErrorMessage) and bad.input_error


def test_cancellation_gives_a_cancelled_result_with_metrics():
    spec = spec_for(
        DataSpec("samples", "photographs", batch_size=1), iterations=10_000, attack="ig"
    )
    seen = {"events": 0}

    def cancelled() -> bool:
        return seen["events"] >= 3

    messages = []
    for message in audit_messages(spec, is_cancelled=cancelled, emit_every=1, lpips_nets=()):
        seen["events"] += message["type"] == "event"
        messages.append(message)
    result = from_wire(messages[-1])
    assert result.status == "cancelled"
    assert result.summary.stop_reason == "cancelled"
    assert np.isfinite(result.summary.metrics.psnr_mean)


def test_a_run_cancelled_before_its_attack_started_ends_cancelled_not_failed():
    """Cancelled while queued (found by benchmarks/load.py: it used to end "failed" with "no
    attack could run"): the stream ends with an error message marked cancelled."""
    spec = spec_for(DataSpec("samples", "photographs", batch_size=1), iterations=50)
    last = from_wire(list(audit_messages(spec, is_cancelled=lambda: True, lpips_nets=()))[-1])
    assert isinstance(last, ErrorMessage) and last.cancelled and not last.input_error
    assert "cancelled before its attack started" in last.message


def test_a_time_budget_gives_a_timed_out_result():
    spec = RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (3, 32, 32), init="uniform")),
        data=DataSpec("samples", "photographs", batch_size=1),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("ig"),
        defense=ComponentSpec.of("none"),
        budget=Budget(1_000_000, max_seconds=0.5),
    )
    result = from_wire(list(audit_messages(spec, lpips_nets=()))[-1])
    assert result.status == "timed_out"
    assert result.summary.timing.seconds < 5
