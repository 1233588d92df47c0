"""The Text page in a real browser: sign in, run a tiny text audit (gpt2-tiny, 2 sequences
of 10 tokens, DAGER), read the recovered text beside the private one and the verdict, and
download the PDF. A ``streamlit run app.py`` of its own and headless Chromium (Playwright),
as in ``tests/test_browser.py``, whose server and helpers this reuses."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from test_browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    Server,
    _choose,
    _serving,
    _set_number,
    sign_in,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


@pytest.fixture
def text_server(tmp_path, users_path):
    running = Server(tmp_path / "data", log="browser_text.log")
    running.env["AUDIT_USERS_FILE"] = str(users_path)
    with _serving(running):
        yield running.url


def test_a_tiny_text_audit_in_a_browser_shows_the_recovered_text_verdict_and_pdf(
    text_server, tmp_path
):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.set_default_timeout(30_000)
            page.goto(text_server)
            sign_in(page, "alice")
            page.get_by_role("link", name="Text models").first.click()
            page.get_by_role("heading", name="New text audit").first.wait_for()
            _choose(page, "Preset", "gpt2-tiny", page)
            _set_number(page, "Sequences (batch)", 2, page)
            _set_number(page, "Tokens a sequence", 10, page)
            page.get_by_role("button", name="Start text audit").click()
            # DAGER is exact on gpt2-tiny: the verdict says both sequences came back.
            page.get_by_text("2 sequences of 2 recovered").first.wait_for(timeout=240_000)
            assert "text_run=" in page.url
            table = page.locator("table", has_text="beyond the guess").last
            table.locator("tbody tr").first.wait_for()
            rows = table.locator("tbody tr")
            assert rows.count() == 2, table.inner_html()
            for i in range(2):
                cells = rows.nth(i).locator("td")
                private, recovered = cells.nth(0).inner_text(), cells.nth(1).inner_text()
                assert len(private.split()) >= 3 and recovered == private
            page.screenshot(path=str(ARTIFACTS / "browser_text.png"), full_page=True)
            with page.expect_download() as download:
                page.get_by_role("button", name="Download the PDF").click()
            pdf = tmp_path / "text.pdf"
            pdf.write_bytes(Path(download.value.path()).read_bytes())
            assert pdf.read_bytes().startswith(b"%PDF")
            if shutil.which("pdftotext"):
                raw = subprocess.run(
                    ["pdftotext", "-raw", str(pdf), "-"], capture_output=True, check=True
                ).stdout.decode()
                assert private in " ".join(raw.split())
        finally:
            browser.close()
