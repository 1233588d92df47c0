"""The prose figures of docs/REPRODUCTION.md come from the JSON they describe.

The tables between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` are written by the
benchmark scripts from ``benchmarks/results/*.json``; the prose around them is written by
hand and drifts when a table is rerun. Every figure the prose quotes as ``NN.NN dB``,
``SSIM 0.NNN`` or a pair ``NN.NN / NN.NN`` (PSNR / SSIM, or plain / twin) must appear,
rounded the same way, among the results JSON's PSNR figures (SSIM figures for SSIM; either
for a pair's second number) or among the numbers of the doc's generated tables. A figure
under 1 dB is a difference between runs, not a measurement, and is not checked. Figures
quoted from papers are not ours to measure: they pass only through ``PAPER_FIGURES``.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "REPRODUCTION.md"
RESULTS = ROOT / "benchmarks" / "results"

# The papers' figures the prose quotes (our JSON cannot hold them): which paper figure each
# group is, and the figures as written.
PAPER_FIGURES: dict[str, tuple[str, ...]] = {
    # GRNN thesis Table 3.4: DLG on LeNet (CIFAR-100, LFW, MNIST), GRNN on ResNet-18.
    "GRNN thesis Table 3.4": ("49.05", "41.97", "53.67", "29.57"),
    # DLM Table 1: mean PSNR of DLG, DLM and DLM+ on LeNet, CIFAR-100.
    "DLM Table 1": ("39.99", "41.98", "46.96"),
    # FedLeak Table 3: FedLeak on CIFAR-10 at batch 16, ResNet-10.
    "FedLeak Table 3": ("23.06",),
    # Shadow paper Table 1 (CXR): PSNR / F1 per defense, quoted in its own column.
    "Shadow Table 1": (
        *("15.09", "0.978", "14.95", "0.860", "14.43", "0.968", "14.44", "0.848"),
        *("15.05", "0.973", "15.16", "0.972", "11.36", "0.967"),
    ),
}
PAPER = {figure for figures in PAPER_FIGURES.values() for figure in figures}

FIGURE = re.compile(
    r"(?P<psnr>-?\d+\.\d+)\s*/\s*(?P<pair>-?\d+\.\d+)"  # 13.89 / 0.510, 8.20 / 19.87
    r"|(?P<db>-?\d+\.\d+)\s*dB"  # 13.89 dB
    r"|SSIM\s+(?P<ssim>-?\d+\.\d+)"  # SSIM 0.199
)
MARKER = re.compile(r"<!--\s*([\w-]+):(start|end)\s*-->")


def split_doc(text: str) -> tuple[list[tuple[int, str]], str]:
    """(the prose lines with their numbers, the generated tables' text); fenced code is
    neither."""
    prose: list[tuple[int, str]] = []
    generated: list[str] = []
    inside: str | None = None
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        marker = MARKER.search(line)
        if marker:
            name, edge = marker.groups()
            assert (edge == "start") == (inside is None), f"line {number}: unbalanced marker"
            inside = name if edge == "start" else None
            continue
        if fenced:
            continue
        if inside is not None:
            generated.append(line)
        else:
            prose.append((number, line))
    assert inside is None and not fenced, "a generated table or code fence is not closed"
    return prose, "\n".join(generated)


def prose_figures(prose: list[tuple[int, str]]) -> list[tuple[int, str, str]]:
    """(line, the figure as written, what it measures: "psnr", "ssim" or "either") for each
    figure in the prose."""
    found = []
    for number, line in prose:
        for match in FIGURE.finditer(line):
            if match["psnr"] is not None:
                found.append((number, match["psnr"], "psnr"))
                found.append((number, match["pair"], "either"))
            elif match["db"] is not None:
                found.append((number, match["db"], "psnr"))
            else:
                found.append((number, match["ssim"], "ssim"))
    return found


def _collect(value, key: str, out: dict[str, set[float]]) -> None:
    if isinstance(value, dict):
        for name, item in value.items():
            _collect(item, str(name), out)
    elif isinstance(value, list):
        for item in value:
            _collect(item, key, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        for metric in ("psnr", "ssim"):
            if metric in key.lower():
                out[metric].add(float(value))


@functools.cache
def result_figures() -> dict[str, frozenset[float]]:
    """Every number the results JSON holds under a key naming PSNR, and under one naming
    SSIM (``psnr``, ``psnr_mean``, ``guess_ssim``...), at any depth."""
    out: dict[str, set[float]] = {"psnr": set(), "ssim": set()}
    for path in sorted(RESULTS.glob("*.json")):
        _collect(json.loads(path.read_text()), "", out)
    return {metric: frozenset(values) for metric, values in out.items()}


@functools.cache
def rounded(metric: str, decimals: int) -> frozenset[str]:
    metrics = ("psnr", "ssim") if metric == "either" else (metric,)
    return frozenset(
        f"{x:.{decimals}f}".replace("-0.000", "0.000") for m in metrics for x in result_figures()[m]
    )


def is_sourced(figure: str, metric: str, generated_numbers: set[str]) -> bool:
    decimals = len(figure.split(".")[1])
    written = "0.000" if figure == "-0.000" else figure
    return written in rounded(metric, decimals) or figure in generated_numbers


def test_the_doc_splits_into_prose_and_generated_tables():
    prose, generated = split_doc(DOC.read_text())
    assert "| defense |" in generated and "<!--" not in generated
    assert any("Beside the papers" in line for _, line in prose)
    line = "GRNN 13.89 dB, SSIM 0.510; 10.01 / 0.199 and 1.5 dB"
    figures = prose_figures([(1, line)])
    assert [(f, m) for _, f, m in figures] == [
        ("13.89", "psnr"),
        ("0.510", "ssim"),
        ("10.01", "psnr"),
        ("0.199", "either"),
        ("1.5", "psnr"),
    ]


def test_every_prose_figure_is_in_the_results_json_or_a_generated_table():
    prose, generated = split_doc(DOC.read_text())
    generated_numbers = set(re.findall(r"-?\d+\.\d+", generated))
    unsourced = []
    quoted_papers = set()
    for number, figure, metric in prose_figures(prose):
        if figure in PAPER:
            quoted_papers.add(figure)
        elif metric == "psnr" and abs(float(figure)) < 1:
            continue  # a difference between runs
        elif not is_sourced(figure, metric, generated_numbers):
            unsourced.append(f"line {number}: {figure} ({metric})")
    assert not unsourced, "figures no results JSON or generated table holds:\n" + "\n".join(
        unsourced
    )
    # The allow-list holds no figure the doc no longer quotes.
    assert quoted_papers == PAPER, sorted(PAPER - quoted_papers)


def test_the_figures_issue_30_found_drifted_are_now_the_tables_own():
    prose, _ = split_doc(DOC.read_text())
    quoted = {f for _, f, _ in prose_figures(prose)}
    assert not quoted & {"13.90", "6.81", "19.88", "26.37", "0.198"}
    assert {"13.89", "6.82", "19.87", "26.36", "0.199"} <= quoted
