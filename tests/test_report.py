"""The PDF audit report: a small comparison rendered to PDF, then to PNG pages (poppler),
with its pages, tables and images checked; a 64-image run laid out on A4; names escaped;
charts replaced by a stated reason when Chromium cannot draw them; the CLI's report; the
verdict (inconclusive, a defense that held beside a leaking control, a timed-out batch
summarised by its worst point, the threat-model card and the guesses).

Why one file over 400 lines: it is the specification of one package or page set, read
from top to bottom; its tests share fixtures and helpers defined here.
"""

from __future__ import annotations

import dataclasses
import json
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
from auditlib.grids import comparison_grid, image_grid, split_grid
from auditlib.metrics.catalogue import EPSILON_NOTE, MEANINGFUL_EPSILON
from auditlib.models import ModelSpec
from auditlib.report import layout
from auditlib.report.charts import comparison_figure, tradeoff_figure
from auditlib.report.export import figures_to_png
from auditlib.report.pdf import build_report, render_report, report_bytes
from auditlib.report.subject import RunRow, batch_subject, run_rows, run_subject
from auditlib.report.text import metric_text
from auditlib.report.verdict_section import SOK_CITATION
from auditlib.result import AuditSummary
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


def store_run(
    store: Store, spec: RunSpec, result, title: str = "", status: str = "completed"
) -> str:
    run_id = store.create_run(spec.to_dict(), spec.identity(), title)
    store.mark_running(run_id)
    grid = png_bytes(comparison_grid(result.originals, result.reconstruction))
    store.add_image(run_id, 0, "reconstruction", grid)
    store.finish(run_id, status, summary=result.summary)
    return run_id


def flat(text: str) -> str:
    """The text with every run of whitespace as one space (pdftotext wraps lines)."""
    return " ".join(text.split())


def between(text: str, start: str, end: str) -> str:
    """The flattened text from the first ``start`` to the next ``end`` after it."""
    text = flat(text)
    begin = text.index(start)
    return text[begin : text.index(end, begin)]


def attack_table_row(text: str, label: str) -> str:
    """The row of the attack-success table (section 4) of the run ``label``."""
    results = text[text.index("Attack success") :]
    return next(line for line in results.splitlines() if line.strip().startswith(label))


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


ARTIFACTS = Path(__file__).parent / "artifacts"


def keep_pages(pdf_file: Path, name: str) -> None:
    """The PDF's pages as PNGs in tests/artifacts (report_<name>-<page>.png), to look at."""
    ARTIFACTS.mkdir(exist_ok=True)
    for old in ARTIFACTS.glob(f"report_{name}-*.png"):
        old.unlink()
    subprocess.run(
        ["pdftoppm", "-r", "80", "-png", str(pdf_file), str(ARTIFACTS / f"report_{name}")],
        check=True,
    )


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
    summary = result.summary
    data = summary.victim.data
    named = dataclasses.replace(data, names=(UPLOAD_NAME, *data.names[1:]))
    first = dataclasses.replace(summary.metrics.per_image[0], name=UPLOAD_NAME)
    summary = dataclasses.replace(
        summary,
        victim=dataclasses.replace(summary.victim, data=named),
        metrics=dataclasses.replace(
            summary.metrics, per_image=(first, *summary.metrics.per_image[1:])
        ),
    )
    result = dataclasses.replace(result, summary=summary)
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
    heads = ("PSNR", "SSIM", "LPIPS", "Label", "Recovered", "Verdict", "Accuracy", "Macro F1")
    for head in (*heads, "Undefended"):
        assert head in text
    assert "dp-gaussian (clip=1," in text and "sigma=0.01)" in text
    for row in run_rows(subject.entries):
        assert row.status == "completed" and row.has_result and row.level in text
        assert f"{row.psnr:.2f}" in text
        assert metric_text("mse", row.mse) in attack_table_row(text, row.label[:12])  # unbroken
    # The utility's starting point as recorded, and no Python dict printed raw.
    assert "Training starts from DLG's uniform initialisation" in flat(text)  # sigmoid LeNet
    assert "{'" not in text and "'}" not in text
    # Limits: LPIPS was not computed, and 5 steps are fewer than DLG's paper ran.
    assert "LPIPS (AlexNet) unavailable" in text and "its paper 300" in text
    # What the dp-gaussian run's epsilon is about: its neighbours, and no amplification.
    assert "one example replaced (sensitivity 2 x clip)" in flat(text)
    assert "no amplification by subsampling" in flat(text)
    # Reproducibility: the spec hashes of both runs; where the data lives and how long.
    for entry in subject.entries:
        assert entry.run.spec_id in text
    assert "Where the data lives" in text
    assert "kept until its owner or an admin deletes it" in flat(text)
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
def test_the_plain_attack_and_the_one_that_knows_the_defense_are_side_by_side(comparison):
    subject = batch_subject(comparison.store, comparison.batch_id)
    undefended, noised = run_rows(subject.entries)
    # No twin without a defense; under the noise both figures. The verdict's PSNR is their
    # per-image combination (``worst_case``: per image the pick that shows the most, one
    # between the lines before a higher PSNR that shows nothing; tests/test_engine.py), so
    # it may fall below the higher of their own means (6.33 dB beside the twin's 7.15).
    assert undefended.plain_psnr is None and undefended.adaptive_psnr is None
    plain, adaptive = noised.plain_psnr, noised.adaptive_psnr
    assert plain is not None and adaptive is not None and plain != adaptive
    # The Compare page's table shows the two columns.
    from dashboard.batch_table import ADAPTIVE_PSNR, PLAIN_PSNR, display_rows

    shown = {r["defense"]: r for r in display_rows([undefended, noised])}
    assert shown[noised.label][PLAIN_PSNR] == f"{plain:.2f}"
    assert shown[noised.label][ADAPTIVE_PSNR] == f"{adaptive:.2f}"
    data, _ = render_report(subject, charts=False)
    path = Path(comparison.url.removeprefix("sqlite:///")).with_name("twins.pdf")
    path.write_bytes(data)
    section = between(pdf_text(path), "The attacker that knows the defense", "Beside each")
    assert f"{plain:.2f}" in section and f"{adaptive:.2f}" in section
    assert "dp-gaussian" in section and "none" not in section.split("stronger", 1)[1]


def _cost_row(label: str, series: str, psnr: float, accuracy: float, **more) -> RunRow:
    values = {f.name: None for f in dataclasses.fields(RunRow)}
    values |= {"label": label, "series": series, "status": "completed", "has_result": True}
    values |= {"finding": False, "psnr": psnr, "utility_accuracy": accuracy}
    values |= {"utility_chance": 0.117, "utility_undefended": 0.767, **more}
    return RunRow(**values)


def test_the_charts_name_their_lines_and_keep_their_labels_whole():
    """Issue 35: the dotted band lines had no legend (Compare) or labels that ran into each
    other ("Medium ≥ 10 dBHigh ≥ 15 dB", the PDF's scatter); the trade-off's point labels
    were cut at the plot's edge ("igma=0.1 (ε=1.98e+05)"); chance and the undefended
    accuracy were not on the utility charts."""
    rows = [
        _cost_row("none", "none", 50.0, 0.767),
        _cost_row("sigma=0.1", "dp-gaussian", 5.0, 0.7, knob="sigma", value=0.1, epsilon=1.98e5),
        _cost_row("sigma=1", "dp-gaussian", 4.5, 0.098, knob="sigma", value=1.0, epsilon=2090.0),
    ]
    lines = {"Very High ≥ 20 dB", "High ≥ 15 dB", "Medium ≥ 10 dB"}
    utility = {"chance 11.7%", "no defense 76.7%"}

    trade = tradeoff_figure(rows)
    (curve,) = [t for t in trade.data if t.name == "dp-gaussian"]
    (alone,) = [t for t in trade.data if t.name == "none"]
    assert curve.text == ("sigma=0.1 (ε=1.98e5)", "sigma=1 (ε=2.09e3)")  # the catalogue's ε
    assert curve.cliponaxis is False and alone.cliponaxis is False
    # Labels lean into the plot: right of the points on its left half, left on its right.
    assert curve.textposition == ("top right", "top right") and alone.textposition == ("top left",)
    assert lines | utility <= {t.name for t in trade.data}
    assert not trade.layout.annotations  # named in the legend, not written over each other
    accuracy_lines = {s.y0 for s in trade.layout.shapes if s.y0 == s.y1}
    assert accuracy_lines == {0.117, 0.767}
    assert {s.x0 for s in trade.layout.shapes if s.x0 == s.x1} == {10.0, 15.0, 20.0}

    compare = comparison_figure(rows)
    assert lines | utility <= {t.name for t in compare.data if t.showlegend is not False}
    on_utility = {s.y0 for s in compare.layout.shapes if s.yref == "y2"}
    on_psnr = {s.y0 for s in compare.layout.shapes if s.yref == "y"}
    assert on_utility == {0.117, 0.767} and on_psnr == {10.0, 15.0, 20.0}


@needs_poppler
def test_the_pdf_says_a_setting_whose_model_learns_nothing_is_no_usable_defense(
    comparison, tmp_path
):
    """Issue 35: a sweep point left 9.8% accuracy, below chance, and its verdict stood
    alone. Here the comparison's measured runs, with the utility figures of the issue set on
    them (the undefended model 76.7%, the noised one 9.8%, chance 11.7%), in a report."""
    figures = {"none": 0.767, "dp-gaussian": 0.098}
    with Store(f"sqlite:///{tmp_path}/dead.db") as store:
        members = comparison_members(small_spec(), DEFENSES)
        source = batch_subject(comparison.store, comparison.batch_id).entries
        for member, entry in zip(members, source, strict=True):
            summary = entry.result
            utility = dataclasses.replace(
                summary.measured_utility,
                accuracy=figures[member.series],
                chance_accuracy=0.117,
                learned=member.series == "none",
            )
            run_id = store.create_run(member.spec.to_dict(), member.spec.identity(), member.label)
            store.mark_running(run_id)
            store.finish(run_id, "completed", summary=dataclasses.replace(summary, utility=utility))
        subject = batch_subject(store, record_batch(store, "comparison", "dead", members))
        out = tmp_path / "dead.pdf"
        build_report(subject, out, charts=False)
    text = flat(pdf_text(out))
    dead = (
        "learns nothing (accuracy 9.8%, chance 11.7%, 76.7% without the defense): this "
        "setting is not a usable defense"
    )
    summary = between(text, "Executive summary", "A verdict is a bound")
    assert f"The defended model {dead}" in summary  # beside the run's verdict
    assert f"Not usable: the defended model {dead}" in text  # in its verdict block
    cost = between(text, "Defense cost", "Reconstructions")
    assert "Attack s" in cost and "Training s" in cost
    assert f"the defended model {dead}" in cost
    assert "e+0" not in text and "e+1" not in text  # ε in the catalogue's one form
    epsilon = run_rows(subject.entries)[1].epsilon
    if epsilon > MEANINGFUL_EPSILON:  # DP noise of sigma 0.01: a bound that says nothing
        assert EPSILON_NOTE in text


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
    names = big_run.entries[0].result.victim.data.names
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
    statuses = [r.status for r in run_rows(subject.entries)]
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
    monkeypatch.setattr(layout, "FONT_DIRS", ())
    layout.fonts.cache_clear()
    try:
        data, info = render_report(
            batch_subject(comparison.store, comparison.batch_id), charts=False
        )
    finally:
        monkeypatch.undo()
        layout.fonts.cache_clear()
    out = tmp_path / "latin.pdf"
    out.write_bytes(data)
    text = pdf_text(out)
    assert TITLE in text and "DejaVu fonts were not found" in text
    assert "eps" in text and "ε" not in text  # a stand-in, not a missing glyph
    check_pages(png_pages(out, tmp_path / "pages"), info.pages)


# ------------------------------------------------------------------------------ the verdict


def tiny_spec(iterations: int) -> RunSpec:
    """One 16 x 16 digit, LeNet, DLG's paper settings: 8 steps rebuild the image (about
    75 dB) without a defense and nothing under dp-gaussian sigma 1. One step of 2 L-BFGS
    evaluations recovers nothing (one step of the paper's 20 already shows the digit: SSIM
    0.63 against the mean image's 0.27)."""
    inner = {"lbfgs_max_iter": 2} if iterations == 1 else {}
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (1, 16, 16), init="uniform")),
        data=DataSpec("samples", "digits", batch_size=1),
        # The attacker that knows the defense too: "Low" needs it (docs/METRICS.md).
        scenario=ScenarioSpec(attacker_knows_defense=True),
        attack=ComponentSpec.of("dlg", inner, preset="paper"),
        defense=ComponentSpec.of("none"),
        budget=Budget(iterations=iterations),
    )


NOISE = [ComponentSpec.of("none"), ComponentSpec.of("dp-gaussian", {"sigma": 1})]


@pytest.fixture(scope="module")
def tiny_results():
    """Real runs, once per module: {steps: [(member, result), ...]} for 1 and 8 steps, each
    a comparison of no defense (the control) and dp-gaussian."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for steps in (1, 8):
            members = comparison_members(tiny_spec(steps), NOISE)
            out[steps] = [(m, run_audit(m.spec, lpips_nets=())) for m in members]
    return out


def verdict_report(folder: Path, results, status: str = "completed"):
    """The results stored with ``status`` as a comparison, its subject, and its PDF's text."""
    with Store(f"sqlite:///{folder}/runs.db") as store:
        for member, result in results:
            store_run(store, member.spec, result, member.label, status)
        members = [m for m, _ in results]
        subject = batch_subject(store, record_batch(store, "comparison", "verdicts", members))
    out = folder / "verdicts.pdf"
    build_report(subject, out, charts=False)
    return subject, pdf_text(out)


@needs_poppler
def test_a_defended_run_whose_control_did_not_leak_reads_inconclusive_not_low(
    tiny_results, tmp_path
):
    subject, text = verdict_report(tmp_path, tiny_results[1])

    control, defended = subject.entries
    assert not control.verdict.finding.leaked and not defended.verdict.finding.leaked
    assert defended.verdict.outcome == "inconclusive" and defended.verdict.control is not None
    summary = between(text, "1 Executive summary", "2 Threat model")
    assert (
        "dp-gaussian (sigma=1): Inconclusive: the attack did not break even the undefended "
        "update at this budget" in summary
    )
    assert "0 of the 2 runs have a finding and 2 are inconclusive" in summary
    assert "no run of this report has a finding" in summary
    assert "so nothing is known about the defense" in summary  # the run's own block says why
    for entry in subject.entries:  # neither row of the table shows a level
        row = attack_table_row(text, entry.label[:12])
        assert row.rstrip().endswith("Inconclusive")
        assert not any(level in row for level in ("Very High", "High", "Medium", "Low"))
    assert "Low:" not in text and "Defense held" not in text and "Risk:" not in text
    assert "1 image from" in text and "1 images" not in text  # issue 21, item 15
    keep_pages(tmp_path / "verdicts.pdf", "verdict_inconclusive")


@needs_poppler
def test_a_defended_run_whose_control_leaked_is_a_finding_about_the_defense(tiny_results, tmp_path):
    subject, text = verdict_report(tmp_path, tiny_results[8])

    control, defended = subject.entries
    verdict = defended.verdict
    assert control.verdict.outcome == "leaks" and verdict.control.leaked
    assert verdict.outcome == "defense_held" and verdict.is_finding
    words = flat(text)
    assert (
        "Low: the defense stopped dlg (paper preset) and dlg (paper preset, knows the defense) "
        "at this budget" in words
    )
    assert "a stronger attack may still succeed" in words  # never a guarantee
    assert "Outcome Defense held against these attacks" in words
    assert "ran: dlg's twin ran" in words
    assert "auditor's view" in words  # the combined scores say what they are
    # The control's figures beside the run's, and its run named.
    assert f"Control: no defense {verdict.control.psnr_mean:.2f}" in words
    assert "1 of 1 image, Very High" in words and f"control run {control.run.id[:8]}" in words
    assert attack_table_row(text, "dp-gaussian").rstrip().endswith("Low")
    assert attack_table_row(text, "none").rstrip().endswith("Very High")
    keep_pages(tmp_path / "verdicts.pdf", "verdict_defense_held")


@needs_poppler
def test_a_timed_out_comparison_is_summarised_by_its_worst_measured_point(tiny_results, tmp_path):
    subject, text = verdict_report(tmp_path, tiny_results[8], status="timed_out")

    assert all(e.run.status == "timed_out" and e.verdict is not None for e in subject.entries)
    summary = between(text, "1 Executive summary", "1.1 Verdict")
    assert (
        "Worst measured point: none: Very High: dlg (paper preset) rebuilt the client's images"
        in summary
    )
    assert "2 of the 2 runs have a finding and 0 are inconclusive" in summary
    assert "no verdict yet" not in text and "no result" not in summary
    assert "2 with results of 2 (2 of them timed out)" in flat(text)
    row = attack_table_row(text, "none")
    assert "timed out" in row and row.rstrip().endswith("Very High")
    assert "the run timed out; its numbers are what it had measured by then" in flat(text)


@needs_poppler
def test_a_run_report_shows_the_threat_model_card_and_the_guesses(tiny_results, tmp_path):
    with Store(f"sqlite:///{tmp_path}/runs.db") as store:
        run_ids = [store_run(store, m.spec, r, m.label) for m, r in tiny_results[8]]
        subject = run_subject(store, run_ids[1])  # the defended run: its control is found
    out = tmp_path / "run.pdf"

    info = build_report(subject, out, charts=False)

    words = flat(pdf_text(out))
    verdict = subject.entries[0].verdict
    assert verdict.outcome == "defense_held" and words.count(verdict.headline) >= 2
    # The SoK's threat model, cited, and what the attacker had and had not.
    assert "Threat model C: Parameter-Aware Eavesdropper" in words and SOK_CITATION in words
    assert "labels not known inferred or optimised by the attack" in words
    assert "model architecture and weights known the server sent them" in words
    # The scope and every guess's figures beside the attack's.
    assert (
        "Attacks tried dlg (paper preset)" in words and "Restart schedule dlg: one start" in words
    )
    for guess in subject.entries[0].result.metrics.guesses:
        assert f"Guess: {guess.name} {guess.psnr_mean:.2f} {guess.ssim_mean:.3f}" in words
    assert f"Best guess, per image {verdict.finding.guess_psnr_mean:.2f}" in words
    assert "digits-0360" in words and "not beyond guess" in words  # the per-image level
    check_pages(png_pages(out, tmp_path / "pages"), info.pages)


@needs_poppler
def test_a_run_recorded_before_verdicts_says_so(tiny_results, tmp_path):
    (member, result), _ = tiny_results[1]
    old = dataclasses.replace(result, summary=dataclasses.replace(result.summary, verdict=None))
    with Store(f"sqlite:///{tmp_path}/runs.db") as store:
        subject = run_subject(store, store_run(store, member.spec, old, "old run"))
    out = tmp_path / "old.pdf"

    build_report(subject, out, charts=False)

    text = pdf_text(out)
    assert subject.entries[0].verdict is None
    assert "No verdict (recorded before verdicts)" in text
    assert attack_table_row(text, "old run").rstrip().endswith("no verdict")


# ------------------------------------------------------------------------------ malicious server


def malicious_spec(attack: str = "rtf", clients: int | None = None) -> RunSpec:
    """8 fashion-mnist images, LeNet at 32 px, the malicious server (closed forms: a second)."""
    return RunSpec(
        model=ModelRef(ModelSpec("lenet", 10, (1, 32, 32), init="uniform")),
        data=DataSpec("samples", "fashion-mnist", batch_size=8),
        scenario=ScenarioSpec(server="malicious", secure_aggregation=clients),
        attack=ComponentSpec.of(attack, preset="audit"),
        defense=ComponentSpec.of("none"),
        budget=Budget(iterations=1),
    )


AGAINST_RTF = [
    ComponentSpec.of(name) for name in ("none", "model-check", "dp-gaussian", "clip", "prune")
]


@needs_poppler
def test_a_comparison_against_the_malicious_server_says_what_it_changed_and_recovered(tmp_path):
    members = comparison_members(malicious_spec(), AGAINST_RTF)
    results = [(m, run_audit(m.spec, lpips_nets=())) for m in members]
    subject, text = verdict_report(tmp_path, results)

    words = flat(text)
    section = between(text, "What a server that changes the model recovers", "5 Reconstructions")
    card = {k.item: k.detail for k in subject.entries[0].verdict.scope.threat.knowledge}
    assert flat(card["active manipulation of the model or clients"])[:60] in flat(section)
    assert "What the server changed" in section and "Could the client have noticed" in section
    # The check refused rtf's model; the servers built to pass it stood in for it (issue 54).
    assert "What the model check saw" in section and "flagged 1 of 3 models" in flat(section)
    assert "Attributed" not in section  # rtf does not attribute
    checked = subject.entries[1].verdict
    assert checked.scope.evading == ("rtf-evading", "seer-disguised")
    assert "the model check was tried against 3 servers: rtf refused; rtf-evading passed" in words
    assert checked.outcome == "leaks" and "rtf-evading" in checked.headline
    for entry in subject.entries:
        finding = entry.verdict.finding
        assert f"{finding.images_recovered} of 8 images recovered" in flat(section), entry.label
    assert subject.entries[0].verdict.finding.images_recovered > 0  # the server's attack leaks
    # The threat model in the scenario, the card and the summary.
    assert "Threat model F-H: Active server (modifies the model it sends)" in words
    assert "Server malicious: it changes the model it sends" in words
    assert "The server changed the model it sent, then ran rtf against the update of one" in words
    keep_pages(tmp_path / "verdicts.pdf", "malicious_server_comparison")


@needs_poppler
def test_a_loki_run_under_secure_aggregation_reports_the_images_attributed(tmp_path):
    spec = malicious_spec("loki", clients=4)
    result = run_audit(spec, lpips_nets=())
    with Store(f"sqlite:///{tmp_path}/runs.db") as store:
        subject = run_subject(store, store_run(store, spec, result, "loki"))
    out = tmp_path / "loki.pdf"

    info = build_report(subject, out, charts=False)

    words = flat(pdf_text(out))
    attributed = result.summary.attacks[0].images_attributed
    section = between(pdf_text(out), "What a server that changes the model", "5 Reconstructions")
    assert f"{attributed} of 8 images attributed to the" in section  # its cell wraps
    assert "Attributed: images recovered and traced to the client that held them" in flat(section)
    assert "only the example-weighted sum of 4 clients' updates" in words
    assert "against the summed update of 4 clients holding, in all, 8 private images" in words
    assert "What the model check saw" not in words and "No run tried the client's model" in words
    check_pages(png_pages(out, tmp_path / "pages"), info.pages)


def test_column_widths_keep_each_number_whole():
    widths = layout.fit_widths([100, 30, 30], [40, 45, 20], total=160)
    assert widths[1] >= 45 and widths[2] >= 20 and sum(widths) == pytest.approx(160)


FIXTURES = Path(__file__).parent / "fixtures" / "results"


@needs_poppler
@pytest.mark.parametrize("name", ["result_766bdbe", "result_9555ea9_parent"])
def test_a_result_stored_by_an_earlier_version_still_renders(name, tmp_path):
    """A real result.json of an earlier version (no verdict; 766bdbe also no guesses and no
    RDLV) renders, its numbers as recorded, the parts it lacks said as not recorded."""
    summary = AuditSummary.from_json(json.loads((FIXTURES / f"{name}.json").read_text()))
    with Store(f"sqlite:///{tmp_path}/runs.db") as store:
        run_id = store.create_run(dict(summary.config.spec), summary.spec_id, name)
        store.mark_running(run_id)
        store.finish(run_id, "completed", summary=summary)
        subject = run_subject(store, run_id)
    out = tmp_path / "old.pdf"

    info = build_report(subject, out, charts=False)

    words = flat(pdf_text(out))
    check_pages(png_pages(out, tmp_path / "pages"), info.pages)
    assert "No verdict (recorded before verdicts)" in words
    row = attack_table_row(pdf_text(out), name[:12])
    assert f"{summary.metrics.psnr_mean:.2f}" in row and row.rstrip().endswith("no verdict")
    lacks = words.split("stored by an earlier version of auditlib; not recorded: ", 1)[1]
    lacks = lacks.split(".", 1)[0]
    assert lacks.startswith("the verdict")
    assert ("RDLV" in lacks) == (summary.metrics.rdlv_mean is None)  # 766bdbe had none yet
    assert "No reconstruction stored (run completed)" in words
    assert "client protocol (algorithm: fedsgd; local_steps: 1" in words  # no dict printed
    assert summary.victim.data.content_sha256 in words and run_id in words


# ------------------------------------------------------------------------------ CLI


def report(args: list[str], capsys, user: str | None = "root") -> tuple[int, str, str]:
    """The report command as ``user`` (the tests' admin by default: the fixtures' runs were
    stored without an owner, as before sign-in)."""
    code = main(["report", *args, *(["--user", user] if user else [])])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_reports_only_what_the_named_user_may_see(comparison, tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.pdf"
    args = ["--run", comparison.run_ids[0], "--db", comparison.url, "--out", str(out)]
    code, _, stderr = report([*args, "--no-charts"], capsys, user="alice")
    assert code == 2 and "belongs to no one (it was recorded before sign-in)" in stderr
    assert "signed in as 'alice'" in stderr and not out.exists()
    code, _, stderr = report(args, capsys, user="mallory")
    assert code == 2 and "--user mallory: no such user" in stderr
    code, _, stderr = report(args, capsys, user=None)
    assert code == 2 and "name the user the report is for" in stderr
    monkeypatch.setenv("AUDIT_USER", "root")  # the same as --user
    code, _, _ = report([*args, "--no-charts"], capsys, user=None)
    assert code == 0 and out.read_bytes().startswith(b"%PDF")


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
        (["--batch", "nope"], "no comparison, sweep or sample 'nope'"),
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
