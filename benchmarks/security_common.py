"""What every security probe shares: the probe's users, a finding, one dashboard with its
browser (``Probe``), and what a probe reads off a page or the server (the sign-in form, a
trace on the page, the server's peak memory). Used by ``security_probe`` (the probes of
issue 33 and the service's) and ``security_uploads`` (issue 51's hostile uploads)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks.common import ROOT, status_kib
from tests.test_browser import Server

FORM = "Sign in to see your runs"
PASSWORDS = {"mallory": "mallory-password", "victor": "victor-password"}


@dataclass(frozen=True)
class Finding:
    probe: str
    attack: str
    held: bool
    seen: str
    seconds: float


class Probe:
    """One dashboard, one browser, the users file: what every probe needs."""

    def __init__(self, url: str, data: Path, users: Path, browser) -> None:
        self.url, self.data, self.users, self.browser = url, data, users, browser
        self.media: list[str] = []
        self.hosts: set[str] = set()
        self.victor_upload: str | None = None  # the image probe's upload, for the next one

    def page(self):
        context = self.browser.new_context(viewport={"width": 1400, "height": 1400})
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.on("request", self._seen)
        return page

    def _seen(self, request) -> None:
        parts = urlsplit(request.url)
        if parts.scheme in ("http", "https", "ws", "wss"):
            self.hosts.add(parts.hostname or "")
        if parts.path.startswith("/media/"):
            self.media.append(request.url)


def form_shown(page) -> bool:
    page.get_by_text(FORM).wait_for()
    return page.get_by_text("Signed in as").count() == 0


TRACE_MARKS = ("Traceback", 'File "', "site-packages", str(ROOT))


def no_trace(page) -> list[str]:
    """What of a traceback or a server path the page's main area shows (none expected)."""
    text = page.locator('[data-testid="stMain"]').inner_text()
    return [mark for mark in TRACE_MARKS if mark in text]


def peak_rss_mb(server: Server) -> float | None:
    """The peak resident memory of the server process (VmHWM), where /proc says it."""
    if server.process is None:
        return None
    peak = status_kib(server.process.pid, "VmHWM")
    return None if peak is None else round(peak / 1024, 1)
