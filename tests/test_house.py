"""The house rules of the code: no module of ``auditlib`` over 600 lines, and no import
cycle among the modules of ``auditlib.attacks``.

A long module mixes jobs that read better apart; a cycle means neither module can be read,
tested or moved without the other. grimp reads the import statements, those under
``TYPE_CHECKING`` included, so a cycle hidden from the interpreter still counts.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600
PACKAGE = "auditlib.attacks"


def test_no_module_of_auditlib_is_over_600_lines():
    too_long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "auditlib").rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not too_long, f"modules over {MAX_LINES} lines (split them by job): {too_long}"


def _cycles(graph: grimp.ImportGraph, package: str) -> list[str]:
    """Each pair of modules under ``package`` that import each other, directly or not."""
    modules = sorted(m for m in graph.modules if m.startswith(package + "."))
    cycles = []
    for a, b in itertools.combinations(modules, 2):
        there, back = graph.find_shortest_chain(a, b), graph.find_shortest_chain(b, a)
        if there and back:
            cycles.append(" -> ".join(there) + " -> " + " -> ".join(back[1:]))
    return cycles


def test_no_import_cycle_among_the_attack_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # grimp finds the package on the path, as Python does
    # No cache: the graph is built in well under a second, and the tree stays clean.
    graph = grimp.build_graph("auditlib", cache_dir=None)
    assert graph.find_shortest_chain(f"{PACKAGE}.loop", f"{PACKAGE}.base")  # the graph is real
    cycles = _cycles(graph, PACKAGE)
    assert not cycles, "import cycles among the attack modules:\n" + "\n".join(cycles)


def test_the_cycle_check_sees_type_checking_imports(tmp_path, monkeypatch):
    """A cycle closed only under ``TYPE_CHECKING`` (how base and loop once imported each
    other) is found: the check relies on grimp's default of counting those imports."""
    package = tmp_path / "house_cycle_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from house_cycle_probe import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        "    from house_cycle_probe import a\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("house_cycle_probe", cache_dir=None)
    assert _cycles(graph, "house_cycle_probe") == [
        "house_cycle_probe.a -> house_cycle_probe.b -> house_cycle_probe.a"
    ]
