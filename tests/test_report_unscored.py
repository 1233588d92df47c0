"""The PDF of an observed update audited without the client's images: the reconstructions
and the attacks' own losses, the verdict "Unavailable" and why, never a score."""

from __future__ import annotations

import subprocess

from auditlib.engine.audit import run_audit
from auditlib.engine.stream import png_bytes
from auditlib.grids import image_grid
from auditlib.observed import load_bundle
from auditlib.report.pdf import build_report
from auditlib.report.subject import run_subject
from auditlib.spec import (
    Budget,
    ComponentSpec,
    DataSpec,
    ModelRef,
    ObservedRef,
    RunSpec,
    ScenarioSpec,
)
from auditlib.store import Store
from tests.test_observed import _plain_pytorch_client
from tests.test_report import needs_poppler


def unscored_subject(tmp_path, bundle_folder=None):
    """The report subject of a stored run of an observed update audited without images."""
    folder = bundle_folder or _plain_pytorch_client(tmp_path)[0]
    bundle = load_bundle(folder)
    spec = RunSpec(
        model=ModelRef(bundle.model_spec),
        data=DataSpec("none", "", normalization=bundle.normalization),
        scenario=ScenarioSpec(
            protocol=bundle.protocol,
            observed=ObservedRef(str(folder), bundle.content_sha256),
        ),
        attack=ComponentSpec.of("ig"),
        defense=ComponentSpec("none"),
        budget=Budget(3),
    )
    result = run_audit(spec, lpips_nets=())
    assert result.summary.metrics is None
    store = Store(f"sqlite:///{tmp_path / 'audit.db'}")
    run_id = store.create_run(spec.to_dict(), spec.identity(), "observed, no images")
    store.mark_running(run_id)
    rows = [images for _, images in result.by_attack]
    store.add_image(run_id, 0, "reconstruction", png_bytes(image_grid(rows)))
    store.finish(run_id, "completed", summary=result.summary)
    return run_subject(store, run_id)


@needs_poppler
def test_the_report_of_an_unscored_observed_update_shows_what_came_back_and_no_score(tmp_path):
    folder, _, _ = _plain_pytorch_client(tmp_path)
    bundle = load_bundle(folder)
    out = tmp_path / "report.pdf"
    build_report(unscored_subject(tmp_path, folder), out, charts=False)
    text = " ".join(
        subprocess.run(
            ["pdftotext", "-layout", str(out), "-"], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert "Unavailable: no private images to compare with" in text
    assert "observed" in text and bundle.content_sha256[:12] in text
    assert "its own loss" in text
    assert "PSNR mean" not in text and "dB" not in text.split("Metric definitions")[0]
