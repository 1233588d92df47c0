"""Plotly figures of comparisons and sweeps: the same figures in the dashboard and the PDF.

Built from the rows of :func:`auditlib.report.subject.run_rows` (``RunRow``); points without
a value (a run not finished, a metric unavailable) are left out of a chart, never drawn as
zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from auditlib.metrics.catalogue import CATALOGUE, MetricInfo
from auditlib.metrics.risk import LEVELS
from auditlib.metrics.scores import SuccessPoint
from auditlib.report.subject import RunRow
from auditlib.store.convert import finite_number


def _axis(metric: MetricInfo) -> tuple[str, bool]:
    higher = metric.direction == "higher leaks"
    way = f"{'higher' if higher else 'lower'} = more leakage"
    notes = ", ".join(filter(None, (metric.unit, way)))
    if metric.label.endswith(")"):  # "LPIPS (AlexNet)": one pair of brackets
        return f"attack {metric.label[:-1]}, {notes})", higher
    return f"attack {metric.label} ({notes})", higher


# Privacy axis choices: catalogue key -> (axis title, higher means more leakage?)
PRIVACY_METRICS: dict[str, tuple[str, bool]] = {
    key: _axis(CATALOGUE[key]) for key in ("psnr", "ssim", "lpips")
}
UTILITY_TITLE = "utility: test accuracy after federated training"
CHANCE_LINE = "chance"  # the legend's names of the utility reference lines
UNDEFENDED_LINE = "no defense"
_LEVEL_COLOURS = {
    "Very High": "#d62728",
    "High": "#ff7f0e",
    "Medium": "#e6c229",
    "Low": "#2ca02c",
    "Labels": "#9467bd",  # the private labels leaked, no image
}


def tradeoff_figure(rows: Sequence[RunRow], privacy: str = "psnr") -> go.Figure:
    """Utility against the attack's success, one curve per defense (points in knob order).

    Each point is labelled with its knob value, and epsilon where the defense has one; a
    label leans into the plot (right of the points on the left half, left of those on the
    right), above or below it or on the other side where that covers no other label or
    point, and is never clipped at the plot's edge. Chance level and the undefended accuracy
    are drawn as lines, the leakage bands (PSNR) as dotted lines named in the legend.
    """
    if privacy not in PRIVACY_METRICS:
        raise ValueError(f"privacy metric {privacy!r}; expected {', '.join(PRIVACY_METRICS)}")
    axis_title, _ = PRIVACY_METRICS[privacy]
    figure = go.Figure()
    plotted = [
        r
        for r in rows
        if finite_number(r.metric(privacy)) is not None
        and finite_number(r.utility_accuracy) is not None
    ]
    series = {
        name: sorted(
            (r for r in plotted if r.series == name),
            key=lambda r: (r.value is None, r.value or 0.0),
        )
        for name in dict.fromkeys(r.series for r in plotted)
    }
    ordered = [r for points in series.values() for r in points]
    positions = dict(
        zip(
            map(id, ordered),
            label_positions(
                [
                    (float(r.metric(privacy)), float(r.utility_accuracy), point_label(r))
                    for r in ordered
                ]  # type: ignore[arg-type]
            ),
            strict=True,
        )
    )
    for name, points in series.items():
        figure.add_trace(
            go.Scatter(
                x=[r.metric(privacy) for r in points],
                y=[r.utility_accuracy for r in points],
                mode="lines+markers+text" if len(points) > 1 else "markers+text",
                name=name,
                text=[point_label(r) for r in points],
                textposition=[positions[id(r)] for r in points],
                cliponaxis=False,
                hovertemplate="%{text}<br>%{x:.3g}, accuracy %{y:.3f}<extra>" + name + "</extra>",
            )
        )
    utility_lines(figure, rows)
    if privacy == "psnr":
        band_lines(figure, vertical=True)
    figure.update_layout(
        xaxis_title=axis_title,
        yaxis_title=UTILITY_TITLE,
        yaxis_range=[0, 1.05],
        legend_title="defense",
        template="plotly_white",
        margin={"l": 60, "r": 40, "t": 40, "b": 50},
    )
    return figure


# A label's size in the plot's units (its width and height as shares of each axis): a
# character of the chart's 12 px font on a plot some 600 x 350 px wide, with a margin.
CHAR_W, LABEL_H, MARKER = 0.0125, 0.07, 0.015


def label_positions(points: Sequence[tuple[float, float, str]]) -> list[str]:
    """Where each point's label goes ("top right", "bottom left", ...): leaning into the
    plot (right of the points on the left half, left of those on the right), above the
    point where that covers no other label or point, else below, else on the other side;
    the first place that covers nothing, or the one that covers least (issue 52: dp-gaussian's
    "(ε=1.98e5)" was drawn over the prune point beside it). ``points``: (x, y, label), y an
    accuracy in [0, 1]."""
    if not points:
        return []
    xs = [x for x, _, _ in points]
    span = (max(xs) - min(xs)) or 1.0
    scaled = [((x - min(xs)) / span, y / 1.05) for x, y, _ in points]
    markers = [(x - MARKER, y - MARKER, x + MARKER, y + MARKER) for x, y in scaled]
    placed: list[Box] = []
    out = []
    for k, ((x, y), (_, _, text)) in enumerate(zip(scaled, points, strict=True)):
        width = CHAR_W * len(text)
        sides = ("right", "left") if x <= 0.5 else ("left", "right")
        options = [(v, h) for h in sides for v in ("top", "bottom")]
        others = placed + [m for j, m in enumerate(markers) if j != k]
        boxes = [_label_box(x, y, width, v, h) for v, h in options]
        best = min(range(len(options)), key=lambda i: _covered(boxes[i], others))
        placed.append(boxes[best])
        out.append(" ".join(options[best]))
    return out


Box = tuple[float, float, float, float]  # left, bottom, right, top


def _label_box(x: float, y: float, width: float, vertical: str, side: str) -> Box:
    left = x if side == "right" else x - width
    low = y if vertical == "top" else y - LABEL_H
    return (left, low, left + width, low + LABEL_H)


def _covered(box: Box, others: Sequence[Box]) -> float:
    """The area of ``box`` that ``others`` cover (overlaps counted each time)."""
    return sum(
        max(0.0, min(box[2], o[2]) - max(box[0], o[0]))
        * max(0.0, min(box[3], o[3]) - max(box[1], o[1]))
        for o in others
    )


def point_label(row: RunRow) -> str:
    """'sigma=0.1 (ε=1.98e5)': a trade-off point's knob value, and its ε in the catalogue's
    one format where the defense states one."""
    label = "" if row.value is None else f"{row.knob}={row.value:g}"
    if finite_number(row.epsilon) is not None:
        label += f" (ε={CATALOGUE['epsilon'].text(row.epsilon)})"
    return label.strip()


def utility_lines(
    figure: go.Figure, rows: Sequence[RunRow], row: int | None = None, col: int | None = None
) -> None:
    """Chance level and the undefended accuracy as horizontal lines, each named in the
    legend, where the rows know them (on subplot ``row``, ``col`` where given)."""
    chance = next(
        (r.utility_chance for r in rows if finite_number(r.utility_chance) is not None), None
    )
    ordered = sorted(rows, key=lambda r: r.series != "none")
    undefended = next(
        (r.utility_undefended for r in ordered if finite_number(r.utility_undefended) is not None),
        None,
    )
    for value, name, colour, dash in (
        (undefended, UNDEFENDED_LINE, "#1f77b4", "dash"),
        (chance, CHANCE_LINE, "#7f7f7f", "dashdot"),
    ):
        if value is None:
            continue
        figure.add_hline(y=value, line_dash=dash, line_color=colour, row=row, col=col)
        _legend_line(figure, f"{name} {CATALOGUE['accuracy'].text(value)}", colour, dash)


def band_lines(
    figure: go.Figure, *, vertical: bool, row: int | None = None, col: int | None = None
) -> None:
    """FedLeak's leakage bands (PSNR floors) as dotted lines, each named in the legend."""
    for name, floor in LEVELS[:-1]:
        colour = _LEVEL_COLOURS[name]
        if vertical:
            figure.add_vline(x=floor, line_dash="dot", line_color=colour)
        else:
            figure.add_hline(y=floor, line_dash="dot", line_color=colour, row=row, col=col)
        _legend_line(figure, f"{name} ≥ {floor:g} dB", colour, "dot")


def _legend_line(figure: go.Figure, name: str, colour: str, dash: str) -> None:
    """A legend entry for a reference line (shapes have none): a trace with no points."""
    figure.add_trace(
        go.Scatter(
            x=[None],
            y=[None],
            mode="lines",
            line={"color": colour, "dash": dash},
            name=name,
            hoverinfo="skip",
            legendgroup="reference",
            legendgrouptitle_text="reference lines",
        )
    )


def comparison_figure(rows: Sequence[RunRow]) -> go.Figure:
    """Attack PSNR (coloured by leakage level) and utility per defense, side by side."""
    figure = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(f"attack {CATALOGUE['psnr'].heading}", "utility: test accuracy"),
    )
    labels = [r.label for r in rows]
    psnr = [finite_number(r.psnr) for r in rows]
    colours = [_LEVEL_COLOURS.get(r.level or "", "#999999") for r in rows]
    figure.add_trace(
        go.Bar(x=labels, y=psnr, marker_color=colours, name="PSNR", showlegend=False), 1, 1
    )
    figure.add_trace(
        go.Bar(
            x=labels,
            y=[finite_number(r.utility_accuracy) for r in rows],
            marker_color="#1f77b4",
            name="accuracy",
            showlegend=False,
        ),
        1,
        2,
    )
    band_lines(figure, vertical=False, row=1, col=1)
    utility_lines(figure, rows, row=1, col=2)
    figure.update_yaxes(range=[0, 1], row=1, col=2)
    figure.update_layout(template="plotly_white", margin={"l": 50, "r": 20, "t": 40, "b": 80})
    return figure


def success_rate_figure(
    rows: Sequence[RunRow], curves: Sequence[Sequence[SuccessPoint]]
) -> go.Figure:
    """Share of images recovered at each PSNR threshold, one line per run (GRNN thesis's
    success-rate curve). ``curves[i]`` is run i's ``Risk.psnr_success_rate``
    (``subject.success_curves``)."""
    figure = go.Figure()
    for row, curve in zip(rows, curves, strict=True):
        if not curve:
            continue
        figure.add_trace(
            go.Scatter(
                x=[p.threshold for p in curve],
                y=[p.rate for p in curve],
                mode="lines+markers",
                name=row.label,
            )
        )
    figure.update_layout(
        xaxis_title="PSNR threshold (dB)",
        yaxis_title="share of images at or above it",
        yaxis_range=[-0.02, 1.02],
        template="plotly_white",
        margin={"l": 60, "r": 20, "t": 30, "b": 50},
    )
    return figure
