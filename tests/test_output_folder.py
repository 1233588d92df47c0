"""The CLI's result folder is replaced whole (issue 57, item 6): stopped at any point of
writing, it holds the earlier complete result or the new complete one, never a mix, a
missing picture or an empty result.json."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from auditlib import output_folder
from auditlib.cli import main
from auditlib.errors import AuditInputError


def audit(image_dir: Path, out: Path, seed: int) -> int:
    return main(
        [
            "audit",
            "--model",
            "lenet",
            "--images",
            str(image_dir),
            "--attack",
            "dlg",
            "--preset",
            "paper",
            "--iterations",
            "2",
            "--lpips-nets",
            "none",
            "--seed",
            str(seed),
            "--out",
            str(out),
        ]
    )


@pytest.fixture
def two_results(image_dir, tmp_path, monkeypatch, capsys):
    """Two real results of the CLI (seeds 1 and 2) as it hands them to ``write_outputs``,
    each with the picture it writes."""
    from auditlib.cli import audit as audit_module

    made = {}
    real = audit_module.write_outputs

    def keep(result, out):
        made[result.summary.config.spec["seed"]] = result
        real(result, out)

    monkeypatch.setattr(audit_module, "write_outputs", keep)
    pictures = {}
    for seed in (1, 2):
        reference = tmp_path / f"reference-{seed}"
        assert audit(image_dir, reference, seed) == 0
        pictures[seed] = result_of(reference)[1]
    assert pictures[1] != pictures[2]
    return made, pictures


class Stop(BaseException):
    """Ctrl-C at one point of the writing (a BaseException, as KeyboardInterrupt is)."""


class Tripwire:
    """Counts the operations that write a result (each file's bytes, each flush to disk,
    each rename or swap, each deletion) and stops the command just before or just after
    the ``at``-th one."""

    def __init__(self, monkeypatch, at: int) -> None:
        self.at, self.seen = at, 0
        targets = [
            (Path, "write_text"),
            (Image.Image, "save"),
            (os, "fsync"),
            (os, "rename"),
            (output_folder, "_exchange"),
            (shutil, "rmtree"),
        ]
        for owner, name in targets:
            monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name)))

    def _wrap(self, real):
        def operation(*args, **kwargs):
            self._tick()  # stopped before it
            value = real(*args, **kwargs)
            self._tick()  # stopped after it
            return value

        return operation

    def _tick(self) -> None:
        self.seen += 1
        if self.seen == self.at:
            raise Stop


def result_of(out: Path) -> tuple[int, bytes]:
    """The seed the folder's result.json was made with and its picture's bytes; fails on a
    folder without a complete result."""
    return json.loads((out / "result.json").read_text())["config"]["seed"], (
        out / "reconstruction.png"
    ).read_bytes()


def test_a_stop_at_any_point_of_writing_leaves_the_old_or_the_new_result(
    two_results, tmp_path, monkeypatch
):
    from auditlib.cli.audit import write_outputs

    results, pictures = two_results
    out = tmp_path / "out"
    write_outputs(results[1], out)
    stops = 0
    for at in range(1, 200):
        with monkeypatch.context() as patch:
            wire = Tripwire(patch, at)
            try:
                write_outputs(results[2], out)
            except Stop:
                stops += 1
            else:
                break  # past the last operation: the new result is in place
            finally:
                seed, picture = result_of(out)  # a complete result, whichever
                assert picture == pictures[seed], f"a mixed result after a stop at {at}"
                assert sorted(os.listdir(out)) == ["reconstruction.png", "result.json"]
        write_outputs(results[1], out)  # back to the old one for the next stop
    assert stops >= 12 and wire.seen < at  # every operation stopped at, before and after
    assert result_of(out) == (2, pictures[2])
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []


def test_a_folder_holding_other_files_is_refused_before_the_run(image_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    assert main(["audit", "--model", "lenet", "--images", str(image_dir), "--out", str(out)]) == 2
    assert "holds files this tool did not write (notes.txt)" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "my notes"


def test_an_earlier_result_kept_aside_by_a_stopped_swap_is_put_back(tmp_path):
    """Where the file system cannot swap in one step, a stop between the two renames
    leaves the earlier result aside: the next command puts it back first."""
    out = tmp_path / "out"
    aside = tmp_path / ".out.old-999999999-abcd"
    aside.mkdir()
    (aside / "result.json").write_text("{}")
    output_folder.recover(out)
    assert (out / "result.json").read_text() == "{}" and not aside.exists()


def test_the_current_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AuditInputError, match="current folder"):
        output_folder.check_output_folder(Path("."))
