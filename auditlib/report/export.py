"""Plotly figures as PNG for the PDF report: kaleido, driving the system's Chromium.

One kaleido sync server per report (:func:`figures_to_png` starts it, draws every figure,
stops it), so Chromium starts once, not once per chart. Nothing here raises because a
chart cannot be drawn: kaleido missing, no browser, a browser that dies or hangs all end
in a :class:`ChartImages` whose ``reason`` says why, and the report says so in its text.

kaleido's sync server runs in a thread of its own; if Chromium fails to start, that thread
dies while a caller may wait on it forever. So each figure is drawn from a helper thread,
watched here: the server thread dying or a deadline passing ends the wait with a reason.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
_SERVER_LOCK = threading.Lock()  # kaleido's server is one per process: one report at a time


@dataclass(frozen=True)
class ChartImages:
    """PNGs of the figures, in order (None where not drawn), and why any were not drawn."""

    pngs: tuple[bytes | None, ...]
    reason: str | None = None

    @property
    def complete(self) -> bool:
        return self.reason is None and all(p is not None for p in self.pngs)


def browser_problem() -> str | None:
    """Why kaleido will find no browser (None: one is there); checked before starting it."""
    configured = os.environ.get("BROWSER_PATH")
    if configured:
        if Path(configured).is_file():
            return None
        return f"BROWSER_PATH={configured!r} is not a browser executable"
    found = None
    try:
        from choreographer.browsers.chromium import Chromium

        found = Chromium.find_browser(skip_local=False)
    except Exception:  # an internal of choreographer; PATH is searched below anyway
        found = None
    if found or any(shutil.which(name) for name in BROWSER_NAMES):
        return None
    return (
        "no Chromium or Chrome browser was found (kaleido draws the charts with one; "
        "install chromium, or set BROWSER_PATH to a Chrome executable)"
    )


def _error_text(error: BaseException | None) -> str:
    """``Type: message``; an error raised with several strings (choreographer's) joined."""
    if error is None:
        return "unknown error"
    parts = error.args if all(isinstance(a, str) for a in error.args) else ()
    message = " ".join(p.strip() for p in parts) if len(parts) > 1 else str(error)
    return f"{type(error).__name__}: {message}"


def _draw(
    kaleido: Any,
    figure: dict[str, Any],
    opts: dict[str, Any],
    wait_s: float,
    server_thread: threading.Thread | None,
    server_errors: list[str],
) -> tuple[bytes | None, str | None]:
    """One figure through the running server; (png, None) or (None, why not)."""
    box: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue(maxsize=1)

    def work() -> None:
        try:
            box.put((kaleido.calc_fig_sync(figure, opts=opts), None))
        except BaseException as exc:  # handed to the waiting thread
            box.put((None, exc))

    threading.Thread(target=work, name="auditlib-chart", daemon=True).start()
    deadline = time.monotonic() + wait_s
    while True:
        try:
            png, error = box.get(timeout=0.2)
        except queue.Empty:
            if server_thread is not None and not server_thread.is_alive():
                cause = server_errors[0] if server_errors else "its server thread ended"
                return None, f"kaleido could not start Chromium: {cause}"
            if time.monotonic() > deadline:
                return None, f"Chromium did not draw a chart within {wait_s:.0f} s"
            continue
        if error is not None:
            return None, f"kaleido failed: {_error_text(error)}"
        if not isinstance(png, bytes | bytearray) or not bytes(png).startswith(PNG_SIGNATURE):
            return None, "kaleido returned something other than a PNG"
        return bytes(png), None


def _stop(kaleido: Any, wait_s: float = 30.0) -> None:
    """Stop the server without ever hanging the report on a browser that does not quit."""
    stopper = threading.Thread(
        target=lambda: kaleido.stop_sync_server(silence_warnings=True),
        name="auditlib-chart-stop",
        daemon=True,
    )
    stopper.start()
    stopper.join(wait_s)


def figures_to_png(
    figures: Sequence[Any],
    *,
    width: int = 1000,
    height: int = 500,
    scale: float = 2.0,
    timeout_s: float = 60.0,
) -> ChartImages:
    """Each plotly figure as PNG bytes (``width`` x ``height`` layout pixels times ``scale``).

    Starts kaleido's sync server once for all of them (unless one is already running, which
    is then used and left running) and stops it at the end. Drawing stops at the first
    failure; the figures after it are None and ``reason`` says what went wrong.
    """
    if not figures:
        return ChartImages(())
    missing = tuple(None for _ in figures)
    try:
        import kaleido
    except ImportError as exc:
        return ChartImages(missing, f"kaleido is not installed ({exc})")
    problem = browser_problem()
    if problem is not None:
        return ChartImages(missing, problem)

    opts = {"format": "png", "width": width, "height": height, "scale": scale}
    server = getattr(kaleido, "_global_server", None)
    with _SERVER_LOCK:
        ours = server is None or not server.is_running()
        server_errors: list[str] = []
        previous_hook = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            # The server thread's death (Chromium would not start) becomes the reason.
            if server is not None and args.thread is getattr(server, "_thread", None):
                server_errors.append(_error_text(args.exc_value))
            else:
                previous_hook(args)

        threading.excepthook = hook
        pngs: list[bytes | None] = []
        reason = None
        try:
            if ours:
                # No MathJax: it would be fetched from a CDN, and the charts use no TeX.
                kaleido.start_sync_server(silence_warnings=True, timeout=timeout_s, mathjax=False)
            thread = getattr(server, "_thread", None)
            for figure in figures:
                spec = figure.to_dict() if hasattr(figure, "to_dict") else figure
                png, reason = _draw(kaleido, spec, opts, timeout_s + 15, thread, server_errors)
                if png is None:
                    break
                pngs.append(png)
        except Exception as exc:  # kaleido's start itself failing
            reason = f"kaleido failed: {_error_text(exc)}"
        finally:
            if ours:
                _stop(kaleido)
            if threading.excepthook is hook:
                threading.excepthook = previous_hook
    pngs.extend(None for _ in range(len(figures) - len(pngs)))
    return ChartImages(tuple(pngs), reason)
