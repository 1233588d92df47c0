"""The PDF audit report: a small comparison rendered to PDF, then to PNG pages (poppler),
with its pages, tables and images checked; a 64-image run laid out on A4; names escaped;
charts replaced by a stated reason when Chromium cannot draw them; the CLI's report."""

from __future__ import annotations

import shutil
import subprocess
import warnings
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import plotly.graph_objects as go
import pytest
from PIL import Image

import auditlib
from auditlib.cli import main
from auditlib.engine.audit import run_audit
from auditlib.engine.batches import SweepCurve, comparison_members, record_batch, sweep_members
from auditlib.engine.stream import png_bytes
from auditlib.fl.federated import FederationSpec
from auditlib.models import ModelSpec
from auditlib.report import pdf
from auditlib.report.export import figures_to_png
from auditlib.report.images import comparison_grid, image_grid, split_grid
from auditlib.report.pdf import build_report, render_report, report_bytes
from auditlib.report.subject import batch_subject, run_subject, summary_rows
from auditlib.spec import (
    Budget,
    ComponentSpec,
    DataSpec,
    ModelRef,
    RunSpec,
    ScenarioSpec,
    UtilitySpec,
)
from auditlib.store import Store

POPPLER = ("pdftoppm", "pdftotext", "pdfimages")
needs_poppler = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in POPPLER),
    reason="poppler-utils (pdftoppm, pdftotext, pdfimages) is not installed",
)
TITLE = 'Defenses <b>&"x"'  # Paragraph markup in a user's title must print as typed
UPLOAD_NAME = "<img src=x>&"  # ... and in an uploaded image's name
RUN_TITLE = 'Upload <i>"unclosed & <b>'
DPI = 40


# ------------------------------------------------------------------------------ helpers


def store_run(store: Store, spec: RunSpec, result, title: str = "") -> str:
    run_id = store.create_run(spec.to_dict(), spec.identity(), title)
    store.mark_running(run_id)
    grid = png_bytes(comparison_grid(result.originals, result.reconstruction))
    store.add_image(run_id, 0, "reconstruction", grid)
    store.finish(run_id, "completed", summary=result.summary)
    return run_id


def pdf_text(path: Path) -> str:
    done = subprocess.run(
        ["pdftotext", "-layout", str(path), "-"], capture_output=True, text=True, check=True
    )
    return done.stdout


def pdf_images(path: Path) -> list[tuple[int, int, int]]:
    """(page, width, height) of each image embedded in the PDF (soft masks left out)."""
    done = subprocess.run(
        ["pdfimages", "-list", str(path)], capture_output=True, text=True, check=True
    )
    images = []
    for line in done.stdout.splitlines()[2:]:
        fields = line.split()
        if len(fields) > 4 and fields[2] == "image":
            images.append((int(fields[0]), int(fields[3]), int(fields[4])))
    return images


def png_pages(path: Path, folder: Path) -> list[np.ndarray]:
    """The PDF's pages rendered by pdftoppm, as greyscale arrays."""
    folder.mkdir(exist_ok=True)
    subprocess.run(
        ["pdftoppm", "-r", str(DPI), "-png", str(path), str(folder / "page")], check=True
    )
    files = sorted(folder.glob("page-*.png"), key=lambda p: int(p.stem.split("-")[-1]))
    return [np.asarray(Image.open(p).convert("L")) for p in files]


def check_pages(pages: list[np.ndarray], count: int) -> None:
    """As many A4 pages as reported, none blank, nothing spilling into the side margins."""
    assert len(pages) == count
    for number, page in enumerate(pages, 1):
        height, width = page.shape
        assert abs(width - 8.27 * DPI) <= 2 and abs(height - 11.69 * DPI) <= 2, number
        assert (page < 200).mean() > 0.002, f"page {number} is blank"
        strip = round(0.9 / 2.54 * DPI)  # the margins are 1.8 cm; their outer half stays white
        assert page[:, :strip].min() > 235 and page[:, -strip:].min() > 235, number


# ------------------------------------------------------------------------------ fixtures


def small_spec() -> RunSpec:
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (1, 16, 16), init="uniform")),
        data=DataSpec("samples", "digits", batch_size=2),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(iterations=5),
        utility=UtilitySpec(
            dataset="digits", train=200, test=100, federation=FederationSpec(clients=2, rounds=1)
        ),
    )


DEFENSES = [ComponentSpec.of("none"), ComponentSpec.of("dp-gaussian", {"sigma": 0.01, "clip": 1})]


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    """A comparison of two defenses, really run (5 attack steps, tiny utility training)."""
    folder = tmp_path_factory.mktemp("comparison")
    url = f"sqlite:///{folder}/runs.db"
    with Store(url) as store:
        members = comparison_members(small_spec(), DEFENSES)
        run_ids = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # opacus' accountant warns about its alpha range
            for member in members:
                result = run_audit(member.spec, lpips_nets=())
                run_ids.append(store_run(store, member.spec, result, member.label))
        batch_id = record_batch(store, "comparison", TITLE, members)
        yield SimpleNamespace(store=store, url=url, batch_id=batch_id, run_ids=run_ids)


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    """A stored run of 64 images (8 x 8 digits, 2 attack steps); one image's name carries
    markup, as an uploaded file's name can."""
    folder = tmp_path_factory.mktemp("big")
    spec = RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (1, 8, 8), init="uniform")),
        data=DataSpec("samples", "digits", batch_size=64),
        scenario=ScenarioSpec(),
        attack=ComponentSpec.of("dlg"),
        defense=ComponentSpec.of("none"),
        budget=Budget(iterations=2),
    )
    result = run_audit(spec, lpips_nets=())
    result.summary["victim"]["data"]["names"][0] = UPLOAD_NAME
    result.summary["metrics"]["per_image"][0]["name"] = UPLOAD_NAME
    with Store(f"sqlite:///{folder}/runs.db") as store:
        run_id = store_run(store, spec, result, RUN_TITLE)
        yield run_subject(store, run_id)


# ------------------------------------------------------------------------------ split_grid


@pytest.mark.parametrize(
    ("rows", "count", "size", "channels", "scale", "gap"),
    [(2, 3, 8, 3, 4, 2), (1, 1, 5, 1, 1, 0), (2, 64, 8, 1, 4, 2), (3, 5, 6, 3, 2, 5)],
)
def test_split_grid_inverts_image_grid(rows, count, size, channels, scale, gap):
    rng = np.random.default_rng(count)
    images = [rng.random((count, size, size + 1, channels)) for _ in range(rows)]
    png = png_bytes(image_grid(images, scale=scale, gap=gap))

    cells = split_grid(png, rows, count, gap, scale=scale)
    upscaled = split_grid(png, rows, count, gap)

    assert len(cells) == rows and all(len(row) == count for row in cells)
    for r in range(rows):
        for i in range(count):
            expected = np.rint(images[r][i] * 255).astype(np.uint8)
            expected = np.repeat(expected, 3 // channels, axis=-1)
            np.testing.assert_array_equal(cells[r][i], expected)
            assert upscaled[r][i].shape == (size * scale, (size + 1) * scale, 3)
            np.testing.assert_array_equal(upscaled[r][i][::scale, ::scale], expected)


def test_split_grid_refuses_a_png_of_another_layout():
    png = png_bytes(image_grid([np.zeros((3, 8, 8, 1))] * 2))  # 104 x 70 px
    for rows, count in ((2, 5), (3, 3)):
        with pytest.raises(ValueError, match="not a grid"):
            split_grid(png, rows, count)
    with pytest.raises(ValueError, match="multiple of scale"):
        split_grid(png, 2, 2, scale=4)  # 49 px cells


# ------------------------------------------------------------------------------ the PDF


@needs_poppler
def test_comparison_report_has_its_pages_tables_and_images(comparison, tmp_path):
    subject = batch_subject(comparison.store, comparison.batch_id)
    out = tmp_path / "comparison.pdf"

    info = build_report(subject, out)

    assert info.path == out and out.read_bytes().startswith(b"%PDF")
    assert 4 <= info.pages <= 12
    check_pages(png_pages(out, tmp_path / "pages"), info.pages)
    text = pdf_text(out)
    for section in (
        "Executive summary",
        "Threat model and FL scenario",
        "Attack and defense settings",
        "Reconstructions",
        "Metric definitions",
        "Limits",
        "Appendix: reproducibility",
    ):
        assert section in text
    assert TITLE in text  # printed as typed, not taken as markup
    assert f"auditlib {auditlib.__version__}" in text and f"page 1 of {info.pages}" in text
    # The metric tables: their heads, one row per defense, the risk levels of the rows.
    for head in ("PSNR", "SSIM", "LPIPS", "Labels", "Recovered", "Risk", "Accuracy", "Macro F1"):
        assert head in text
    assert "dp-gaussian (clip=1," in text and "sigma=0.01)" in text
    for row in summary_rows(subject.entries):
        assert row["status"] == "completed" and row["level"] in text
        assert f"{row['psnr']:.2f}" in text
    # Limits: LPIPS was not computed, and 5 steps are fewer than DLG's paper ran.
    assert "LPIPS-Alex unavailable" in text and "its paper 300" in text
    # Reproducibility: the spec hashes of both runs.
    for entry in subject.entries:
        assert entry.run.spec_id in text
    # Images: one original-over-reconstruction pair per private image per run (16 x 16 at
    # scale 4), and the charts where Chromium could draw them.
    images = pdf_images(out)
    pairs = [i for i in images if i[1:] == (64, 132)]
    assert len(pairs) == 4
    charts = [i for i in images if i[1] == 2000]
    if info.charts_drawn:
        assert info.charts_unavailable_reason is None
        assert len(charts) == 3  # comparison, trade-off, success rate
    else:
        assert not charts and "could not be drawn" in text
        assert info.charts_unavailable_reason.split(":")[0] in text


@needs_poppler
def test_charts_that_cannot_be_drawn_are_replaced_by_the_reason(comparison, tmp_path, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chromium"))
    out = tmp_path / "report.pdf"

    info = build_report(batch_subject(comparison.store, comparison.batch_id), out)

    assert not info.charts_drawn and "BROWSER_PATH" in info.charts_unavailable_reason
    text = pdf_text(out)
    assert "3 charts could not be drawn" in text and "no-chromium" in text
    assert "Charts could not be drawn" in text  # listed under Limits as well
    assert not [i for i in pdf_images(out) if i[1] == 2000]
    check_pages(png_pages(out, tmp_path / "pages"), info.pages)


@needs_poppler
def test_a_64_image_run_lays_out_on_a4(big_run, tmp_path):
    out = tmp_path / "big.pdf"

    info = build_report(big_run, out, charts=False)

    assert not info.charts_drawn and info.charts_unavailable_reason == "charts were not requested"
    assert 4 <= info.pages <= 9
    check_pages(png_pages(out, tmp_path / "pages"), info.pages)
    images = pdf_images(out)
    pairs = [i for i in images if i[1:] == (32, 66)]  # 8 x 8 at scale 4, 2 px apart
    assert len(pairs) == 64 == len(images)
    # Rows of 8 pairs, never split across pages; 64 pairs fit on at most 3 pages.
    per_page = Counter(page for page, *_ in pairs)
    assert len(per_page) <= 3 and all(count % 8 == 0 for count in per_page.values())
    text = pdf_text(out)
    assert RUN_TITLE in text and UPLOAD_NAME in text and "and 40 more" in text
    names = big_run.entries[0].run.summary["victim"]["data"]["names"]
    assert all(name in text for name in names[1:])


@needs_poppler
def test_members_not_run_or_failed_are_reported_not_dropped(comparison, tmp_path):
    store = comparison.store
    extra = [ComponentSpec.of("dp-gaussian", {"sigma": 0.1}), ComponentSpec.of("dp-laplace")]
    members = comparison_members(small_spec(), [*DEFENSES, *extra])
    failed = members[2].spec
    run_id = store.create_run(failed.to_dict(), failed.identity(), "failing")
    store.finish(run_id, "failed", error="boom <in> & out")
    subject = batch_subject(store, record_batch(store, "comparison", "partly run", members))

    data, info = render_report(subject, charts=False)

    assert data.startswith(b"%PDF") and info.path is None and info.pages >= 4
    assert report_bytes(subject, charts=False).startswith(b"%PDF")
    statuses = [r["status"] for r in summary_rows(subject.entries)]
    assert statuses == ["completed", "completed", "failed", "not run"]
    out = tmp_path / "partial.pdf"
    out.write_bytes(data)
    text = pdf_text(out)
    assert "boom <in> & out" in text and "not run yet" in text
    assert len([i for i in pdf_images(out) if i[1:] == (64, 132)]) == 4  # the completed two


@needs_poppler
def test_sweep_report_names_its_knob_and_rows(comparison, tmp_path):
    store = comparison.store
    members = sweep_members(small_spec(), [SweepCurve("dp-gaussian", (0.01, 0.1))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for member in members:
            store_run(store, member.spec, run_audit(member.spec, lpips_nets=()), member.label)
    subject = batch_subject(store, record_batch(store, "sweep", "noise sweep", members))
    out = tmp_path / "sweep.pdf"

    info = build_report(subject, out, charts=False)

    text = pdf_text(out)
    assert subject.kind == "sweep" and "a sweep of 2 runs over dp-gaussian sigma" in text
    assert "dp-gaussian sigma=0.01" in text and "dp-gaussian sigma=0.1" in text
    check_pages(png_pages(out, tmp_path / "pages"), info.pages)


def test_chart_export_reports_a_browser_that_will_not_start(tmp_path, monkeypatch):
    """Chromium dying at start ends in a reason, not in a report waiting forever."""
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(fake))

    images = figures_to_png([go.Figure(go.Bar(y=[1, 2]))], timeout_s=20)

    assert images.pngs == (None,) and not images.complete
    assert "could not start Chromium" in images.reason or "kaleido failed" in images.reason


@needs_poppler
def test_report_falls_back_to_the_base_fonts_without_dejavu(comparison, tmp_path, monkeypatch):
    monkeypatch.setattr(pdf, "FONT_DIRS", ())
    pdf._fonts.cache_clear()
    try:
        data, info = render_report(
            batch_subject(comparison.store, comparison.batch_id), charts=False
        )
    finally:
        monkeypatch.undo()
        pdf._fonts.cache_clear()
    out = tmp_path / "latin.pdf"
    out.write_bytes(data)
    text = pdf_text(out)
    assert TITLE in text and "DejaVu fonts were not found" in text
    assert "eps" in text and "ε" not in text  # a stand-in, not a missing glyph
    check_pages(png_pages(out, tmp_path / "pages"), info.pages)


# ------------------------------------------------------------------------------ CLI


def report(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["report", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_writes_the_report_of_a_batch_and_of_a_run(comparison, tmp_path, capsys, monkeypatch):
    out = tmp_path / "batch.pdf"
    code, stdout, _ = report(
        ["--batch", comparison.batch_id, "--db", comparison.url, "--out", str(out), "--no-charts"],
        capsys,
    )
    assert code == 0 and out.read_bytes().startswith(b"%PDF")
    assert str(out) in stdout and "pages" in stdout and "no charts" in stdout

    monkeypatch.setenv("AUDIT_DATABASE_URL", comparison.url)  # the default --db
    out = tmp_path / "run.pdf"
    code, stdout, _ = report(
        ["--run", comparison.run_ids[0], "--out", str(out), "--no-charts"], capsys
    )
    assert code == 0 and out.read_bytes().startswith(b"%PDF") and str(out) in stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run", "nope"], "no run 'nope'"),
        (["--batch", "nope"], "no comparison or sweep 'nope'"),
        (["--run", "nope", "--out", "{tmp}"], "is a folder"),
        (["--run", "nope", "--out", "{tmp}/missing/r.pdf"], "does not exist"),
        (["--run", "nope", "--db", "sqlite:///{tmp}/none.db"], "no database at"),
    ],
)
def test_cli_refuses_bad_input_with_one_line(comparison, tmp_path, capsys, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--db" not in args:
        args += ["--db", comparison.url]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "r.pdf")]

    code, stdout, stderr = report(args, capsys)

    assert code == 2 and stdout == ""
    assert stderr.startswith("error: ") and message in stderr and stderr.count("\n") == 1
    assert not (tmp_path / "r.pdf").exists() and not (tmp_path / "none.db").exists()


def test_cli_needs_exactly_one_of_run_and_batch(capsys):
    for args in (["--out", "r.pdf"], ["--run", "a", "--batch", "b", "--out", "r.pdf"]):
        with pytest.raises(SystemExit) as stop:
            main(["report", *args])
        assert stop.value.code == 2
        assert capsys.readouterr().err.startswith("error: ")
