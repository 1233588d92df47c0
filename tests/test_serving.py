"""How the dashboard is served, however it is started: the settings live in
.streamlit/config.toml (a plain `streamlit run app.py` reads them), scripts/serve.sh is
`make run` without make, and the Docker image runs it with a private data volume."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_config_file_keeps_the_server_local_quiet_and_sized_for_weights():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    server, browser, client = config["server"], config["browser"], config["client"]
    assert server["address"] == "127.0.0.1" and server["headless"] is True
    assert server["maxUploadSize"] == 512  # the weights uploader's 500 MB, decimal
    assert server["fileWatcherType"] == "none" and server["enableXsrfProtection"] is True
    assert browser["gatherUsageStats"] is False
    assert client["toolbarMode"] == "minimal"  # no Deploy button


def test_the_server_does_not_collect_every_object_after_each_script_run(monkeypatch):
    """Streamlit's default full collection after each rerun took 0.3-0.4 s in this process
    (torch, Ray, plotly), once a second while a run is watched: the config turns it off, as
    Streamlit reads it (a misspelt option would be ignored)."""
    from streamlit import config

    monkeypatch.chdir(ROOT)
    config.get_config_options(force_reparse=True)
    assert config.get_option("runner.postScriptGC") is False
    assert config.get_option("server.fileWatcherType") == "none"


def test_the_page_icon_is_a_file_of_the_project():
    from dashboard.entry import ICON

    assert Path(ICON).is_file() and Path(ICON).read_bytes().startswith(b"\x89PNG")


def test_make_run_the_serve_script_and_the_image_start_it_alike():
    makefile = (ROOT / "Makefile").read_text()
    serve = (ROOT / "scripts" / "serve.sh").read_text()
    docker = (ROOT / "Dockerfile").read_text()
    for text in (makefile, serve):
        assert "users init" in text and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" in text
        assert "gatherUsageStats" not in text.split("streamlit run")[-1]  # the config's
    assert 'CMD ["sh", "scripts/serve.sh"]' in docker
    assert "USER auditor" in docker and "AUDIT_DATA_DIR=/data" in docker
    assert "chmod 0700 /data" in docker and 'VOLUME ["/data"]' in docker
    app = (ROOT / "app.py").read_text()
    assert app.index("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") < app.index("from dashboard.entry")
