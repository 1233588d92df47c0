"""What the tests of a Flower user's own app (tests/fixtures/flower_quickstart) share: the app
folder with its clients' images, commands run from that folder as a user runs them, and
several ``python -m auditlib`` commands run in one process.

The images are made once per test session (``python make_data.py``, the same four
photographs per client each time) and copied into each module's own app folder. Several CLI
commands of a module run one after the other in one Python process (:func:`run_commands`),
each with its own stdout, stderr and exit code, as ``python -m auditlib ...`` gives them:
the auditlib and torch imports of a command's process (seconds each) are paid once, and the
commands' own processes (an own class's audit runs in a spawned one) are started as before.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "tests" / "fixtures" / "flower_quickstart"
TIMEOUT_S = 300

# One process that runs the commands of jobs.json in turn and writes each one's exit code,
# stdout and stderr (its file descriptors 1 and 2, so the output of any process it starts
# is its own too) to results.json: ("cli", argv) as `python -m auditlib ARGV`, ("script",
# path) as `python PATH`. It ends without the interpreter's teardown (seconds with torch).
DRIVER = r"""
import json, os, runpy, sys, tempfile, traceback

def run(kind, value):
    if kind == "cli":
        sys.argv = ["auditlib", *value]
        from auditlib.cli import main
        return main(value)
    sys.argv = [value]
    runpy.run_path(value, run_name="__main__")
    return 0

def captured(kind, value):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush(); sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        try:
            code = run(kind, value)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(saved[0], 1); os.dup2(saved[1], 2)
            os.close(saved[0]); os.close(saved[1])
        out.seek(0); err.seek(0)
        return {"returncode": code, "stdout": out.read().decode("utf-8", "replace"),
                "stderr": err.read().decode("utf-8", "replace")}

if __name__ == "__main__":
    jobs_file, results_file = sys.argv[1:3]
    with open(jobs_file) as handle:
        jobs = json.load(handle)
    results = {name: captured(kind, value) for name, (kind, value) in jobs.items()}
    with open(results_file, "w") as handle:
        json.dump(results, handle)
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)
"""


def app_env(app: Path) -> dict[str, str]:
    """The environment of a command run from the app's folder: auditlib as ``pip install
    -e .`` puts it on the path, the app's own modules from its folder, one thread."""
    env = {k: v for k, v in os.environ.items() if k not in {"RAY_ADDRESS", "AUDIT_RAY_ADDRESS"}}
    env |= {"PYTHONPATH": f"{ROOT}{os.pathsep}{app}", "OMP_NUM_THREADS": "1"}
    env |= {"FLWR_TELEMETRY_ENABLED": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    return env


def run_in_app(app: Path, *command: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """``python COMMAND`` from the app's folder."""
    return subprocess.run(
        [sys.executable, *command],
        cwd=app,
        env=app_env(app),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def run_commands(
    app: Path, jobs: Mapping[str, tuple[str, Sequence[str] | str]], timeout: float
) -> dict[str, subprocess.CompletedProcess]:
    """Run ``jobs`` (name -> ("cli", argv) or ("script", path)) in turn in one process from
    the app's folder; each one's exit code, stdout and stderr by name."""
    jobs_file, results_file = app / ".jobs.json", app / ".results.json"
    jobs_file.write_text(json.dumps({name: list(job) for name, job in jobs.items()}))
    results_file.unlink(missing_ok=True)
    done = run_in_app(app, "-c", DRIVER, str(jobs_file), str(results_file), timeout=timeout)
    assert done.returncode == 0 and results_file.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(results_file.read_text())
    return {
        name: subprocess.CompletedProcess(
            ["python", "-m", "auditlib", *job[1]] if job[0] == "cli" else ["python", job[1]],
            results[name]["returncode"],
            results[name]["stdout"],
            results[name]["stderr"],
        )
        for name, job in jobs.items()
    }


_images: dict[Path, Path] = {}


def app_with_images(tmp_path_factory, name: str) -> Path:
    """A copy of the app (its own folder ``<tmp>/<name>/app``) with its clients' images in
    ``data/``, made by ``python make_data.py`` once per session and copied after that."""
    base = tmp_path_factory.getbasetemp()
    if base not in _images:
        first = tmp_path_factory.mktemp("quickstart-images") / "app"
        shutil.copytree(APP, first, ignore=shutil.ignore_patterns("__pycache__"))
        made = run_in_app(first, "make_data.py")
        assert made.returncode == 0, made.stderr[-3000:]
        _images[base] = first / "data"
    folder = tmp_path_factory.mktemp(name) / "app"
    shutil.copytree(APP, folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(_images[base], folder / "data")
    return folder
