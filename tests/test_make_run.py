"""`make run` serves the dashboard as a shared machine needs it (issue 21, items 8 and 12)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def make_run_command(*overrides: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    # -n prints the recipe without running it; the setup prerequisites print too.
    done = subprocess.run(
        ["make", "-n", "run", *overrides], cwd=ROOT, capture_output=True, text=True, check=True
    )
    text = done.stdout.replace("\\\n", " ")
    return next(line for line in text.splitlines() if "streamlit run app.py" in line)


def test_the_dashboard_listens_on_this_machine_only_unless_asked():
    assert "--server.address 127.0.0.1" in make_run_command()
    assert "--server.address 0.0.0.0" in make_run_command("ADDRESS=0.0.0.0")


def test_the_dashboard_does_not_watch_the_tree():
    # Streamlit's watcher over the whole tree (.venv included) overflowed inotify and kept
    # the server near a full core; the app does not reload itself in production. The
    # setting is the config file's, so `make run` and a plain `streamlit run` share it.
    import tomllib

    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["fileWatcherType"] == "none"
    assert "fileWatcherType" not in make_run_command()  # nothing overrides it


def test_the_first_start_creates_the_first_admin_before_the_server():
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    done = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True)
    lines = done.stdout.replace("\\\n", " ").splitlines()
    init = next(i for i, line in enumerate(lines) if "-m auditlib users init" in line)
    serve = next(i for i, line in enumerate(lines) if "streamlit run app.py" in line)
    assert init < serve


def test_the_embedded_ray_binds_to_this_machine_only():
    # Ray's single-machine mode keeps its servers on 127.0.0.1; a cluster (AUDIT_RAY_ADDRESS)
    # is joined as it is.
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in make_run_command()
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in make_run_command("AUDIT_RAY_ADDRESS=h:1")


def test_every_file_the_server_writes_is_its_users_alone():
    # Issue 51, item 8: Ray's session folders are 0777 and its logs world-readable unless
    # the process's umask says otherwise; the Docker image's service user's home is 0700.
    assert make_run_command().lstrip().startswith("umask 077 &&")
    assert "\numask 077\n" in (ROOT / "scripts" / "serve.sh").read_text()
    assert "chmod 0700 /home/auditor" in (ROOT / "Dockerfile").read_text()
