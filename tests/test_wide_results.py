"""Results that must stay readable however many images or points they hold (issue 52): a
grid of 16 images wraps into blocks that fit the page, each original above its
reconstruction; a chart's point labels are placed where they cover no other label or point;
the words under a run say counts and settings plainly."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from auditlib.engine.stream import png_bytes
from auditlib.grids import comparison_grid, split_grid, wrapped_grid
from auditlib.report.charts import CHAR_W, LABEL_H, label_positions


def _grid(count: int, side: int = 8) -> tuple[bytes, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(52)
    originals, reconstruction = rng.random((2, count, side, side, 3))
    return png_bytes(comparison_grid(originals, reconstruction)), originals, reconstruction


def test_sixteen_images_wrap_into_blocks_each_original_above_its_reconstruction():
    png, _, _ = _grid(16)  # cells of 32 px: one row of 16 is 530 px wide
    wrapped = wrapped_grid(png, 2, max_width=5 * 34 + 2)  # room for 5 cells a row
    with Image.open(io.BytesIO(wrapped)) as image:
        assert image.width <= 5 * 34 + 2
        canvas = np.asarray(image.convert("RGB"))
    # 16 in blocks of at most 5 is 4 blocks of 4 (not 5 + 5 + 5 + 1), a gap more between.
    assert canvas.shape == (4 * (2 * 34 + 2), 4 * 34 + 2, 3)
    cells = split_grid(png, 2, 16)
    for i in range(16):
        block, column = divmod(i, 4)
        left = 2 + column * 34
        for row in range(2):
            top = 2 + block * 70 + row * 34
            np.testing.assert_array_equal(canvas[top : top + 32, left : left + 32], cells[row][i])


def test_a_grid_that_fits_is_kept_and_a_count_is_read_from_square_cells():
    png, _, _ = _grid(3)
    assert wrapped_grid(png, 2, max_width=10_000) == png
    wide, _, _ = _grid(9)
    assert wrapped_grid(wide, 2, max_width=3 * 34 + 2) == wrapped_grid(
        wide, 2, max_width=3 * 34 + 2, count=9
    )
    with pytest.raises(ValueError, match="not a grid"):
        wrapped_grid(wide, 2, max_width=50, count=7)


def _box(x: float, y: float, text: str, position: str) -> tuple[float, float, float, float]:
    vertical, side = position.split()
    width = CHAR_W * len(text)
    left = x if side == "right" else x - width
    low = y if vertical == "top" else y - LABEL_H
    return left, low, left + width, low + LABEL_H


def _overlap(a, b) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


def test_a_label_is_never_drawn_over_the_point_beside_it():
    """Issue 52: the comparison PDF put dp-gaussian's "(ε=1.98e5)" label on the prune point
    beside it. Points in the plot's units: x scaled to the points' span, y an accuracy."""
    points = [
        (10.0, 0.50, "none"),
        (20.0, 0.52, "sigma=0.1 (ε=1.98e5)"),
        (21.0, 0.53, "ratio=0.9"),
        (40.0, 0.20, "clip=1"),
    ]
    positions = label_positions(points)
    lo, hi = 10.0, 40.0
    scaled = [((x - lo) / (hi - lo), y / 1.05, t) for x, y, t in points]
    boxes = [_box(x, y, t, p) for (x, y, t), p in zip(scaled, positions, strict=True)]
    for k, box in enumerate(boxes):
        for j, (x, y, _) in enumerate(scaled):
            if j != k:
                assert not _overlap(box, (x - 0.01, y - 0.01, x + 0.01, y + 0.01)), (k, j)
        for other in boxes[k + 1 :]:
            assert not _overlap(box, other), positions
    # A lone point keeps its place leaning into the plot.
    assert label_positions([(1.0, 0.5, "a"), (9.0, 0.5, "b")]) == ["top right", "top left"]


def test_the_progress_line_says_an_attacks_counts_in_words():
    """Issue 52: the progress line read "images_not_read_back 4", an internal key."""
    from dashboard.run_live import _loss_words

    assert _loss_words("images_not_read_back", 4.0) == "4 images not read back"
    assert _loss_words("images_not_read_back", 1.0) == "1 image not read back"
    assert _loss_words("evaluations", 1.0) == "1 evaluation"
    assert _loss_words("gradient_distance", 0.0123) == "gradient distance 0.0123"


def test_a_run_just_queued_is_polled_four_times_a_second_and_then_once():
    """Issue 52: the worker's first word showed up to a second after it came; a run that
    waits long (behind others) or has started goes back to once a second, an ended one to
    none."""
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    from dashboard.run_live import QUEUED_FAST_S, QUEUED_REFRESH_S, REFRESH_S, poll_interval

    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    def run(status: str, waited_s: float, finished: bool = False) -> SimpleNamespace:
        created = now - timedelta(seconds=waited_s)
        return SimpleNamespace(status=status, created_at=created, finished=finished)

    assert poll_interval(run("queued", 0.5), now) == QUEUED_REFRESH_S < REFRESH_S
    assert poll_interval(run("queued", QUEUED_FAST_S + 1), now) == REFRESH_S
    assert poll_interval(run("running", 0.5), now) == REFRESH_S
    assert poll_interval(run("completed", 0.5, finished=True), now) is None


def test_the_pass_that_first_sees_a_run_started_keeps_its_bar_and_the_next_reruns_the_page(
    monkeypatch,
):
    """A bar drawn by a fragment's pass that then reruns the page showed only once the page
    had drawn it again (0.12-0.23 s later, idle): the page reruns to its new interval at the
    next pass, for each run and each interval once."""
    import dashboard.run_live as run_live

    monkeypatch.setattr(run_live.st, "session_state", {})
    due = run_live._rerun_due
    assert not due("a", 0.25)  # the first stale pass: its bar stays
    assert due("a", 0.25)  # the next: the page reruns at the new interval
    assert not due("b", 0.25)  # another run's first stale pass
    assert not due("a", 1.0)  # the same run's next change of interval
    assert due("a", 1.0)
