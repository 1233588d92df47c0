"""Replay issue 33's attacks against a running dashboard on 127.0.0.1 and print what held.

``python -m benchmarks.security_probe`` starts its own dashboard (``streamlit run app.py``
on a free port, with a data folder and a users file of its own, as ``make walk`` does) and
drives it with Chromium, as an attacker with a browser, curl and an account on the same
machine would: sign-in and sign-out, a copied session, a changed password, password
guessing, Markdown in links, private images by URL, another user's upload by its hash, a
decompression bomb, a removed user's click, the files' modes, hosts the page reaches.
Each probe is bounded (Playwright waits at most 30 s, guesses at most ``FREE_FAILURES + 1``)
and the whole run stops starting probes after ``--max-seconds`` (default 300). Prints one
line per probe, ``held`` or ``FAILED`` with what was seen, writes them to
``benchmarks/results/security_probe.json`` and exits 1 when any failed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import stat
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests.test_browser reads the tests' conftest

from auditlib.access.throttle import FREE_FAILURES  # noqa: E402
from auditlib.access.users import add_user, remove_user, set_password  # noqa: E402
from benchmarks.common import machine, replace_section, status_kib  # noqa: E402
from tests.test_browser import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    EXAMPLES,
    Server,
    sign_in,
    upload_images,
)

RESULTS = ROOT / "benchmarks" / "results" / "security_probe.json"
FORM = "Sign in to see your runs"
WAIT_S = 5.0  # the server's first sign-in wait (AUDIT_SIGN_IN_WAIT_S), short for the probe
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


def _form_shown(page) -> bool:
    page.get_by_text(FORM).wait_for()
    return page.get_by_text("Signed in as").count() == 0


def sign_in_required(probe: Probe) -> tuple[bool, str]:
    page = probe.page()
    page.goto(f"{probe.url}/history")
    held = _form_shown(page) and page.get_by_role("heading", name="History").count() == 0
    return held, "a visitor opening /history gets the sign-in form, no page"


def no_session_to_copy(probe: Probe) -> tuple[bool, str]:
    page = probe.page()
    page.goto(probe.url)
    sign_in(page, "victor", PASSWORDS["victor"])
    cookies = sorted(c["name"] for c in page.context.cookies())
    copied = probe.browser.new_context()
    copied.add_cookies(page.context.cookies())
    thief = copied.new_page()
    thief.set_default_timeout(30_000)
    thief.goto(f"{probe.url}/history")
    stolen = not _form_shown(thief)
    page.reload()
    reloaded = _form_shown(page)
    sign_in(page, "victor", PASSWORDS["victor"])
    page.get_by_role("button", name="Sign out").click()
    page.get_by_text(FORM).wait_for()
    page.reload()
    after_sign_out = _form_shown(page)
    return (not stolen and reloaded and after_sign_out), (
        f"cookies after sign-in {cookies}; a browser given them signed in: {stolen}; "
        f"a reload asks again: {reloaded}; a reload after sign-out asks again: {after_sign_out}"
    )


def password_change_ends_session(probe: Probe) -> tuple[bool, str]:
    page = probe.page()
    page.goto(probe.url)
    sign_in(page, "victor", PASSWORDS["victor"])
    PASSWORDS["victor"] = "victor-new-password"
    set_password("victor", PASSWORDS["victor"], path=probe.users)
    page.get_by_role("link", name="History").first.click()
    page.get_by_text("Your password was changed; sign in again.").wait_for()
    return _form_shown(page), "the open session's next click after `users passwd`"


def guessing_slowed(probe: Probe) -> tuple[bool, str]:
    page = probe.page()
    page.goto(probe.url)
    started = time.monotonic()
    for attempt in range(FREE_FAILURES + 1):
        page.get_by_label("User name").fill("victor")
        page.get_by_label("Password", exact=True).fill(f"guess-{attempt}")
        page.get_by_role("button", name="Sign in").click()
        page.get_by_text("Username or password is incorrect").wait_for()
        page.wait_for_timeout(1500)  # the same words stand from the last try: let this one end
    page.get_by_text("Too many failed sign-ins").wait_for()
    guessed_s = time.monotonic() - started
    page.reload()
    page.get_by_label("User name").fill("victor")
    page.get_by_label("Password", exact=True).fill(PASSWORDS["victor"])
    page.get_by_role("button", name="Sign in").click()
    page.get_by_text("Username or password is incorrect").wait_for()
    refused_while_waiting = page.get_by_text("Signed in as").count() == 0
    page.wait_for_timeout(int(WAIT_S * 1000) + 1000)
    page.reload()
    sign_in(page, "victor", PASSWORDS["victor"])
    return refused_while_waiting, (
        f"{FREE_FAILURES + 1} wrong passwords in {guessed_s:.1f} s, then the name waits "
        f"({WAIT_S:.0f} s here); the right password refused during the wait, accepted after"
    )


def markdown_in_links(probe: Probe) -> tuple[bool, str]:
    page = probe.page()
    link = "[Session expired, sign in](https://x.io)"
    page.goto(f"{probe.url}/lab?run={quote(link)}&arch={quote('**bold**')}")
    sign_in(page, "mallory", PASSWORDS["mallory"])
    page.wait_for_timeout(1500)
    anchors = page.eval_on_selector_all("a[href*='x.io']", "as => as.length")
    bold = page.eval_on_selector_all("strong", "ss => ss.map(s => s.textContent)")
    held = anchors == 0 and "bold" not in bold
    return held, f"links to x.io on the page: {anchors}; '**bold**' rendered bold: {'bold' in bold}"


def private_images_by_url(probe: Probe) -> tuple[bool, str]:
    page = probe.page()
    page.goto(probe.url)
    sign_in(page, "victor", PASSWORDS["victor"])
    upload_images(page)
    page.get_by_text("Using uploaded images").wait_for()
    page.wait_for_timeout(1500)
    sources = page.eval_on_selector_all(
        '[data-testid="stImage"] img, [data-testid="stImageContainer"] img',
        "images => images.map(i => i.src)",
    )
    icon = (ROOT / "assets" / "icon.png").read_bytes()
    served = {u: urllib.request.urlopen(u, timeout=10).read() for u in set(probe.media)}
    private = [u for u, data in served.items() if data != icon]
    inline = bool(sources) and all(s.startswith("data:") for s in sources)
    probe.victor_upload = page.url.split("images=")[1].split("&")[0]
    return inline and not private, (
        f"{len(sources)} thumbnails, all data: URLs: {inline}; /media/ URLs fetched without a "
        f"sign-in: {len(served)}, of which not the app's icon: {len(private)}"
    )


def another_users_upload(probe: Probe) -> tuple[bool, str]:
    sha = probe.victor_upload
    if not sha:
        return False, "no upload of victor's to look for (the image probe did not run)"
    page = probe.page()
    page.goto(f"{probe.url}/?source=upload&images={sha}")
    sign_in(page, "mallory", PASSWORDS["mallory"])
    page.get_by_text("named in the link are not among your uploads").wait_for()
    text = page.inner_text("body")
    # victor's file names (labels.csv is named by the uploader's own caption too)
    shown = [n.name for n in EXAMPLES.glob("*.png") if n.name in text]
    page.goto(f"{probe.url}/?source=upload&images={'0' * 64}")
    sign_in(page, "mallory", PASSWORDS["mallory"])
    page.get_by_text("named in the link are not among your uploads").wait_for()
    held = not shown and "belongs to another user" not in text
    return (
        held,
        f"victor's upload by its sha256: 'not among your uploads' as for a made-up one; file names shown: {shown}",
    )


def decompression_bomb(probe: Probe, server: Server) -> tuple[bool, str]:
    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((6300, 6300), dtype=np.uint8)).save(buffer, format="PNG")
    folder = Path(tempfile.mkdtemp(prefix="bomb-"))
    for i in range(8):
        (folder / f"black-{i}.png").write_bytes(buffer.getvalue())
    page = probe.page()
    page.goto(probe.url)
    sign_in(page, "mallory", PASSWORDS["mallory"])
    before = _peak_rss_mb(server)
    upload_images(page, sorted(folder.iterdir()))
    page.get_by_text("pixels together").wait_for(timeout=60_000)  # the headers' check
    after = _peak_rss_mb(server)
    # One image decoded as RGB is 119 MB; all eight, 950 MB. The peak can only show growth
    # above the earlier peak, so the refusal's words (from the headers, before any decode)
    # are the evidence and the peak a bound.
    grown = None if before is None or after is None else round(after - before, 1)
    held = grown is None or grown < 119
    size = len(buffer.getvalue()) * 8 / 1e6
    return held, (
        f"8 black 6300x6300 PNGs ({size:.1f} MB, 318 MP) refused from their headers; the "
        f"server's peak memory {after} MB, {grown} MB above its peak before the upload"
    )


def _peak_rss_mb(server: Server) -> float | None:
    """The peak resident memory of the server process (VmHWM), where /proc says it."""
    if server.process is None:
        return None
    peak = status_kib(server.process.pid, "VmHWM")
    return None if peak is None else round(peak / 1024, 1)


def removed_users_click(probe: Probe) -> tuple[bool, str]:
    page = probe.page()
    page.goto(probe.url)
    sign_in(page, "mallory", PASSWORDS["mallory"])
    upload_images(page, [next(EXAMPLES.glob("*.png"))])
    page.get_by_text("Using uploaded images").wait_for()
    remove_user("mallory", path=probe.users)
    page.get_by_role("button", name="Remove", exact=True).click()
    page.get_by_text(FORM).wait_for()
    PASSWORDS["mallory"] = "mallory-again-1"
    add_user("mallory", PASSWORDS["mallory"], "auditor", path=probe.users)
    sign_in(page, "mallory", PASSWORDS["mallory"])
    page.get_by_text("Your uploads in the store (1)").wait_for()
    return True, "removed while her page was open, her click on Remove removed nothing"


def file_modes(probe: Probe) -> tuple[bool, str]:
    modes = {
        path.name: oct(stat.S_IMODE(path.stat().st_mode))
        for path in (probe.data, probe.data / "audit.db", probe.users)
        if path.exists()
    }
    held = modes.get(probe.data.name) == "0o700" and all(
        mode == "0o600" for name, mode in modes.items() if name != probe.data.name
    )
    return held, f"{modes}"


def hosts_reached(probe: Probe) -> tuple[bool, str]:
    others = sorted(h for h in probe.hosts if h not in ("127.0.0.1", "localhost"))
    return not others, f"hosts the pages asked: {sorted(probe.hosts)}"


def _table(findings: list[Finding]) -> str:
    lines = ["| issue item | attack | held | what the probe saw | s |", "|---|---|---|---|---|"]
    for f in findings:
        seen = f.seen.replace("|", "/")
        lines.append(
            f"| {f.probe} | {f.attack} | {'yes' if f.held else '**no**'} | {seen} | {f.seconds:.0f} |"
        )
    held = sum(f.held for f in findings)
    return "\n".join(lines) + f"\n\n{held} of {len(findings)} held. Measured on: {machine()}."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-seconds", type=float, default=300.0)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    data_root = Path(tempfile.mkdtemp(prefix="probe-"))
    users = data_root / "users.yaml"
    for name, password in PASSWORDS.items():
        add_user(name, password, "auditor", path=users)
    os.environ["AUDIT_USERS_FILE"] = str(users)
    os.environ["AUDIT_SIGN_IN_WAIT_S"] = str(WAIT_S)
    server = Server(data_root / "data")
    server.start()
    findings: list[Finding] = []
    deadline = time.monotonic() + args.max_seconds
    probes: list[tuple[str, str, Callable[[Probe], tuple[bool, str]]]] = [
        ("1 sign-in", "open a page without signing in", sign_in_required),
        ("1 sign-out", "copy the cookies, reload, sign out and reload", no_session_to_copy),
        (
            "1 new password",
            "keep a session open across a password change",
            password_change_ends_session,
        ),
        ("2 guessing", "guess one user's password", guessing_slowed),
        ("7 markdown", "a link with Markdown in ?run= and ?arch=", markdown_in_links),
        ("9 media", "fetch private images by URL without signing in", private_images_by_url),
        ("8 shared bytes", "ask for another user's upload by its sha256", another_users_upload),
        ("5 bomb", "upload 318 MP of black PNGs", lambda p: decompression_bomb(p, server)),
        ("6 removed user", "click after being removed", removed_users_click),
        ("3 file modes", "read the data as another local user", file_modes),
        ("11 hosts", "the page calls home", hosts_reached),
    ]
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            probe = Probe(server.url, data_root / "data", users, browser)
            for name, attack, run in probes:
                if time.monotonic() > deadline:
                    findings.append(Finding(name, attack, False, "not run: out of time", 0.0))
                    continue
                started = time.monotonic()
                try:
                    held, seen = run(probe)
                except Exception as exc:  # a probe that could not finish did not show it held
                    held, seen = False, f"{type(exc).__name__}: {str(exc)[:300]}"
                findings.append(Finding(name, attack, held, seen, time.monotonic() - started))
                last = findings[-1]
                print(
                    f"{'held  ' if held else 'FAILED'} {name:15} {attack}: {seen} ({last.seconds:.1f} s)",
                    flush=True,
                )
            browser.close()
    finally:
        server.stop()
        server.log.close()
    RESULTS.write_text(json.dumps([asdict(f) for f in findings], indent=2) + "\n")
    held = sum(f.held for f in findings)
    replace_section(ROOT / "docs" / "SECURITY.md", "security-probe", _table(findings))
    print(f"\n{held} of {len(findings)} held; written to {RESULTS.relative_to(ROOT)}")
    return 0 if held == len(findings) else 1


if __name__ == "__main__":
    sys.exit(main())
