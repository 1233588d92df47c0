"""Issue 51's hostile uploads replayed against a running dashboard (``security_probe`` runs
them): uploads without a sign-in, the closed metrics route, zips that lie about their size
(images and bundles), 300,000 empty tensors, a tiny bundle naming a huge model, hostile
training.json values and a labels.csv the CSV reader cannot read. Each is held when the
server refuses it in one line without a trace and its peak memory grows by under 100 MB."""

from __future__ import annotations

import json
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchmarks.security_common import FORM, PASSWORDS, Probe, no_trace, peak_rss_mb
from tests.hostile import TRAINING, empty_tensors, lying_zip, png
from tests.test_browser import Server, raw_upload, session_ids, sign_in, upload_images


def unsigned_uploads(probe: Probe, server: Server) -> tuple[bool, str]:
    """A visitor reads their session id from the websocket and the XSRF cookie from their
    own browser, and PUTs six 50 MB files to Streamlit's upload route."""
    page = probe.page()
    sessions = session_ids(page)
    page.goto(probe.url)
    page.get_by_text(FORM).wait_for()
    xsrf = next(c["value"] for c in page.context.cookies() if c["name"] == "_streamlit_xsrf")
    before = peak_rss_mb(server)
    answers = [raw_upload(probe.url, sessions[-1], xsrf, 50 * 10**6) for _ in range(6)]
    after = peak_rss_mb(server)
    grown = None if before is None or after is None else round(after - before, 1)
    statuses = [status for status, _ in answers]
    sent_mb = round(sum(sent for _, sent in answers) / 1e6, 1)
    held = all(status == 403 for status in statuses) and (grown is None or grown < 100)
    return held, (
        f"6 x 50 MB PUT with the visitor's session {sessions[-1][:8]}... and XSRF cookie: "
        f"answers {statuses}, {sent_mb} MB of the 300 MB sent before the answer; the server's "
        f"peak {after} MB, {grown} MB above its peak before"
    )


def metrics_closed(probe: Probe) -> tuple[bool, str]:
    answers = {}
    for route in ("/_stcore/metrics", "/_stcore/agent/openapi.json"):
        try:
            with urllib.request.urlopen(f"{probe.url}{route}", timeout=10) as response:
                answers[route] = response.status
        except urllib.error.HTTPError as exc:
            answers[route] = exc.code
    return all(code == 404 for code in answers.values()), f"without a sign-in: {answers}"


def _signed_in_setup(probe: Probe):
    page = probe.page()
    page.goto(probe.url)
    sign_in(page, "mallory", PASSWORDS["mallory"])
    page.get_by_role("heading", name="Setup").first.wait_for()
    return page


def _refused_upload(probe: Probe, server: Server, upload, words: str) -> tuple[bool, str]:
    """Upload through the Setup page as mallory; held when the page says ``words`` without
    a trace and the server's peak memory grew by under 100 MB."""
    page = _signed_in_setup(probe)
    before = peak_rss_mb(server)
    started = time.monotonic()
    upload(page)
    page.get_by_text(words).first.wait_for(timeout=60_000)
    seconds = time.monotonic() - started
    after = peak_rss_mb(server)
    grown = None if before is None or after is None else round(after - before, 1)
    trace = no_trace(page)
    held = not trace and (grown is None or grown < 100)
    return held, (
        f"refused in {seconds:.1f} s with '{words}...'; the server's peak {after} MB, {grown} MB "
        f"above its peak before; traces shown: {trace}"
    )


def _files(*named: tuple[str, bytes]) -> list[Path]:
    folder = Path(tempfile.mkdtemp(prefix="hostile-"))
    for name, data in named:
        (folder / name).write_bytes(data)
    return [folder / name for name, _ in named]


def _upload_bundle(page, files: list[Path]) -> None:
    page.get_by_text("Audit an update a client actually sent").click()
    uploader = page.locator('[data-testid="stFileUploader"]').filter(
        has_text="The bundle's files, or one zip of its folder"
    )
    uploader.locator('input[type="file"]').set_input_files([str(f) for f in files])


def _upload_weights(page, files: list[Path]) -> None:
    uploader = page.locator('[data-testid="stFileUploader"]').filter(
        has_text="Your trained weights (optional)"
    )
    uploader.locator('input[type="file"]').set_input_files([str(f) for f in files])


GIB = 2**30


def lying_image_zip(probe: Probe, server: Server) -> tuple[bool, str]:
    """A 1 MB zip whose directory says 1 MB and which inflates to 1 GiB, as images."""
    zipped = lying_zip({}, "a.png", inflated=GIB, declared=10**6)
    files = _files(("images.zip", zipped))
    held, seen = _refused_upload(
        probe, server, lambda page: upload_images(page, files), "does not inflate to the"
    )
    return held, f"{len(zipped) / 1e6:.2f} MB zip inflating to 1 GiB: {seen}"


def lying_bundle_zip(probe: Probe, server: Server) -> tuple[bool, str]:
    """The same through the observed-bundle path: a zip claiming to hold global.safetensors."""
    zipped = lying_zip(
        {"training.json": json.dumps(TRAINING).encode()},
        "global.safetensors",
        inflated=GIB,
        declared=10**6,
    )
    files = _files(("bundle.zip", zipped))
    held, seen = _refused_upload(
        probe, server, lambda page: _upload_bundle(page, files), "does not inflate to the"
    )
    return held, f"{len(zipped) / 1e6:.2f} MB bundle zip inflating to 1 GiB: {seen}"


def many_tensors(probe: Probe, server: Server) -> tuple[bool, str]:
    """A safetensors file of 300,000 empty tensors, as the model's weights."""
    data = empty_tensors(300_000)
    files = _files(("weights.safetensors", data))
    held, seen = _refused_upload(
        probe, server, lambda page: _upload_weights(page, files), "safetensors header of"
    )
    return held, f"{len(data) / 1e6:.1f} MB of 300,000 empty tensors: {seen}"


def tiny_bundle_huge_model(probe: Probe, server: Server) -> tuple[bool, str]:
    """A bundle of a few bytes whose training.json names an mlp of 100,000 classes at 512 px."""
    import safetensors.torch
    import torch

    tiny = safetensors.torch.save({"fc.0.bias": torch.zeros(2)})
    training = TRAINING | {"model": "mlp", "num_classes": 100_000, "input_size": 512}
    files = _files(
        ("global.safetensors", tiny),
        ("client.safetensors", tiny),
        ("training.json", json.dumps(training).encode()),
    )
    return _refused_upload(
        probe, server, lambda page: _upload_bundle(page, files), "does not fit mlp"
    )


def hostile_training(probe: Probe, server: Server) -> tuple[bool, str]:
    """training.json with a learning rate of 1e308 and markup in its source."""
    import safetensors.torch

    from auditlib.models import ModelSpec, build_model

    state = safetensors.torch.save(build_model(ModelSpec(architecture="lenet")).state_dict())
    seen = []
    held = True
    for field, value in (("lr", 1e308), ("local_batch_size", 10**9), ("source", "<b>x</b>")):
        files = _files(
            ("global.safetensors", state),
            ("client.safetensors", state),
            ("training.json", json.dumps(TRAINING | {field: value}).encode()),
        )
        ok, words = _refused_upload(
            probe, server, lambda page, f=files: _upload_bundle(page, f), f"training.json: {field}"
        )
        held &= ok
        seen.append(f"{field}={value!r}: {'refused' if ok else words}")
    return held, "; ".join(seen)


def hostile_labels_csv(probe: Probe, server: Server) -> tuple[bool, str]:
    """A labels.csv with a 200 KB field beside one image."""
    files = _files(
        ("a.png", png()), ("labels.csv", b"filename,label\na.png," + b"x" * 200_000 + b"\n")
    )
    return _refused_upload(
        probe, server, lambda page: upload_images(page, files), "cannot be read as CSV"
    )
