"""Replay issues 33's and 51's attacks against a running dashboard on 127.0.0.1 and print
what held.

``python -m benchmarks.security_probe`` starts its own dashboard (``streamlit run app.py``
on a free port, with a data folder and a users file of its own, as ``make walk`` does) and
drives it with Chromium, as an attacker with a browser, curl and an account on the same
machine would: sign-in and sign-out, a copied session, a changed password, password
guessing, Markdown in links, private images by URL, another user's upload by its hash, a
decompression bomb, a removed user's click, the files' modes, hosts the page reaches; and
issue 51's: uploads without a sign-in, the metrics route, zips that lie about their size
(images and bundles), 300,000 empty tensors, a tiny bundle naming a huge model, hostile
training.json values, a labels.csv the CSV reader cannot read, broken link parameters on
every page, one auditor's seven Starts beside another's one, Ray's files.
Each probe is bounded (Playwright waits at most 30 to 60 s, guesses at most
``FREE_FAILURES + 1``) and the whole run stops starting probes after ``--max-seconds``
(default 900). Prints one line per probe, ``held`` or ``FAILED`` with what was seen, writes
them to ``benchmarks/results/security_probe.json`` and exits 1 when any failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import stat
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests.test_browser reads the tests' conftest

from auditlib.access.throttle import FREE_FAILURES  # noqa: E402
from auditlib.access.users import add_user, remove_user, set_password  # noqa: E402
from benchmarks.common import machine, replace_section  # noqa: E402
from benchmarks.security_common import (  # noqa: E402
    FORM,
    PASSWORDS,
    Finding,
    Probe,
    form_shown,
    no_trace,
    peak_rss_mb,
)
from benchmarks.security_uploads import (  # noqa: E402
    hostile_labels_csv,
    hostile_training,
    lying_bundle_zip,
    lying_image_zip,
    many_tensors,
    metrics_closed,
    tiny_bundle_huge_model,
    unsigned_uploads,
)
from tests.test_browser import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    EXAMPLES,
    Server,
    _set_number,
    page_path,
    sign_in,
    upload_images,
)

RESULTS = ROOT / "benchmarks" / "results" / "security_probe.json"
WAIT_S = 5.0  # the server's first sign-in wait (AUDIT_SIGN_IN_WAIT_S), short for the probe


def sign_in_required(probe: Probe) -> tuple[bool, str]:
    page = probe.page()
    page.goto(f"{probe.url}/history")
    held = form_shown(page) and page.get_by_role("heading", name="History").count() == 0
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
    stolen = not form_shown(thief)
    page.reload()
    reloaded = form_shown(page)
    sign_in(page, "victor", PASSWORDS["victor"])
    page.get_by_role("button", name="Sign out").click()
    page.get_by_text(FORM).wait_for()
    page.reload()
    after_sign_out = form_shown(page)
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
    return form_shown(page), "the open session's next click after `users passwd`"


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
    before = peak_rss_mb(server)
    upload_images(page, sorted(folder.iterdir()))
    page.get_by_text("pixels together").wait_for(timeout=60_000)  # the headers' check
    after = peak_rss_mb(server)
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


BROKEN_LINKS = (
    "run=not-a-run",
    "images=zzzz&weights=zzzz",
    "observed=zzzz",
    "comparison=zzzz",
    "sweep=zzzz",
    "arch=../../etc/passwd",
    "source=upload&images=" + "0" * 64,
)


def broken_inputs_on_every_page(probe: Probe) -> tuple[bool, str]:
    """Every page opened with broken link parameters: a refusal in words, no trace."""
    from dashboard.navigation import PAGES

    page = probe.page()
    traced: dict[str, list[str]] = {}
    for ref in PAGES:
        for link in BROKEN_LINKS:
            page.goto(f"{probe.url}/{page_path(ref)}?{link}")
            sign_in(page, "mallory", PASSWORDS["mallory"])
            page.wait_for_timeout(800)
            if trace := no_trace(page):
                traced[f"{ref.title} ?{link}"] = trace
    return not traced, (
        f"{len(PAGES)} pages x {len(BROKEN_LINKS)} broken links; pages with a trace or a "
        f"server path: {traced or 'none'}"
    )


def fair_share(probe: Probe) -> tuple[bool, str]:
    """mallory clicks Start seven times (long runs); victor then starts one: his waits only
    until one of her running runs ends, not behind her queue."""
    limits = "AUDIT_USER_MAX_RUNNING=2"
    page = probe.page()
    page.goto(f"{probe.url}/lab")
    sign_in(page, "mallory", PASSWORDS["mallory"])
    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("Iterations", exact=True).wait_for()
    _set_number(sidebar, "Iterations", 100_000, page)
    runs: list[str] = []
    refusal = ""
    for _ in range(7):
        page.get_by_role("button", name="Start the attack").click()
        page.wait_for_timeout(2500)
        if page.get_by_text("Not started:").count():
            refusal = page.get_by_text("Not started:").first.inner_text()
            break
        runs.append(page.url.split("run=")[1].split("&")[0])
    sixth = page.get_by_text(re.compile(r"^waiting")).first.inner_text() if runs else ""
    other = probe.page()
    other.goto(f"{probe.url}/lab")
    sign_in(other, "victor", PASSWORDS["victor"])
    other.locator('[data-testid="stSidebar"]').get_by_text("Iterations", exact=True).wait_for()
    other.get_by_role("button", name="Start the attack").click()
    other.get_by_text("waiting for a free worker").first.wait_for()
    waiting = other.get_by_text("waiting for a free worker").first.inner_text()
    page.goto(f"{probe.url}/lab?run={runs[0]}")
    sign_in(page, "mallory", PASSWORDS["mallory"])
    cancelled = time.monotonic()
    page.get_by_role("button", name="Cancel run").click()
    other.get_by_text("waiting for a free worker").first.wait_for(state="detached", timeout=60_000)
    moved = time.monotonic() - cancelled
    # Her last queued run still waits, and says why.
    page.goto(f"{probe.url}/lab?run={runs[-1]}")
    sign_in(page, "mallory", PASSWORDS["mallory"])
    hers = page.get_by_text(re.compile(r"^waiting")).first
    hers.wait_for()
    hers_waiting = hers.inner_text()
    for run_id in runs[1:]:  # end hers, so the probes after this one have the workers
        page.goto(f"{probe.url}/lab?run={run_id}")
        sign_in(page, "mallory", PASSWORDS["mallory"])
        with contextlib.suppress(Exception):
            page.get_by_role("button", name="Cancel run").click(timeout=5_000)
    held = len(runs) == 6 and "AUDIT_USER_MAX_QUEUED=4" in refusal
    return held, (
        f"mallory's {len(runs)} Starts admitted ({limits}, 4 queued), her 6th read "
        f"'{sixth}', the 7th: '{refusal}'; "
        f"victor's run read '{waiting}' and started {moved:.1f} s after one of hers was "
        f"cancelled, ahead of her 4 queued; her last then read '{hers_waiting}'"
    )


def ray_files(probe: Probe) -> tuple[bool, str]:
    import stat as stat_module

    from auditlib.engine.ray_files import TOKEN, private_temp_dir

    folder = Path(private_temp_dir())
    sessions = sorted(folder.glob("session_2*"))
    modes = {str(folder): oct(stat_module.S_IMODE(folder.stat().st_mode))}
    token = TOKEN.expanduser()
    if token.exists():
        modes[str(token)] = oct(stat_module.S_IMODE(token.stat().st_mode))
    held = modes[str(folder)] == "0o700" and all(
        mode == "0o600" for path, mode in modes.items() if path != str(folder)
    )
    return held, f"{modes}; the server's Ray sessions under it: {len(sessions)}"


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
    parser.add_argument("--max-seconds", type=float, default=900.0)
    parser.add_argument(
        "--only", nargs="*", help="run only the probes whose item starts with one of these"
    )
    parser.add_argument(
        "--no-docs", action="store_true", help="print only: keep the JSON and the docs' table"
    )
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    data_root = Path(tempfile.mkdtemp(prefix="probe-"))
    users = data_root / "users.yaml"
    for name, password in PASSWORDS.items():
        add_user(name, password, "auditor", path=users)
    os.environ["AUDIT_USERS_FILE"] = str(users)
    os.environ["AUDIT_SIGN_IN_WAIT_S"] = str(WAIT_S)
    os.environ["AUDIT_RAY_NUM_CPUS"] = "2"  # two workers, as on this 2-core machine
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
        (
            "51.1 unsigned upload",
            "PUT 6 x 50 MB to the upload route without signing in",
            lambda p: unsigned_uploads(p, server),
        ),
        ("51.5 metrics", "read /_stcore/metrics without signing in", metrics_closed),
        (
            "51.2 lying zip",
            "images: a 1 MB zip that inflates to 1 GiB",
            lambda p: lying_image_zip(p, server),
        ),
        (
            "51.2 lying bundle",
            "observed bundle: a zip whose global.safetensors inflates to 1 GiB",
            lambda p: lying_bundle_zip(p, server),
        ),
        (
            "51.6 many tensors",
            "weights: 300,000 empty tensors",
            lambda p: many_tensors(p, server),
        ),
        (
            "51.6 huge model",
            "a tiny bundle naming an mlp of 100,000 classes at 512 px",
            lambda p: tiny_bundle_huge_model(p, server),
        ),
        (
            "51.7 training.json",
            "lr 1e308, batch 1e9, markup in source",
            lambda p: hostile_training(p, server),
        ),
        (
            "51.3 labels.csv",
            "a 200 KB field in labels.csv",
            lambda p: hostile_labels_csv(p, server),
        ),
        (
            "51.3 broken links",
            "every page with broken link parameters",
            broken_inputs_on_every_page,
        ),
        ("51.4 fair share", "one auditor starts 7 long runs, another starts one", fair_share),
        ("51.8 Ray files", "read Ray's session files as another local user", ray_files),
    ]
    if args.only:
        probes = [p for p in probes if p[0].startswith(tuple(args.only))]
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
                    for n, context in enumerate(browser.contexts):
                        for m, open_page in enumerate(context.pages):
                            with contextlib.suppress(Exception):
                                open_page.screenshot(
                                    path=str(
                                        ROOT / "tests" / "artifacts" / f"probe_failure_{n}_{m}.png"
                                    )
                                )
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
    held = sum(f.held for f in findings)
    if args.no_docs:
        return 0 if held == len(findings) else 1
    RESULTS.write_text(json.dumps([asdict(f) for f in findings], indent=2) + "\n")
    replace_section(ROOT / "docs" / "SECURITY.md", "security-probe", _table(findings))
    print(f"\n{held} of {len(findings)} held; written to {RESULTS.relative_to(ROOT)}")
    return 0 if held == len(findings) else 1


if __name__ == "__main__":
    sys.exit(main())
