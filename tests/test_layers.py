"""The layering rules of DESIGN.md, checked on the source: bcc is imported only
in kvprof/collect/, textual only in kvprof/views/tui/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KVPROF = Path(__file__).resolve().parent.parent / "kvprof"


def imported_roots(path: Path) -> set[str]:
    """Top-level module names a file imports (anywhere in it, lazily or not)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize(("module", "home"), [("bcc", "collect"), ("textual", "views/tui")])
def test_module_is_imported_only_in_its_package(module: str, home: str) -> None:
    outside = [
        str(p.relative_to(KVPROF.parent))
        for p in sorted(KVPROF.rglob("*.py"))
        if not p.relative_to(KVPROF).as_posix().startswith(home + "/") and module in imported_roots(p)
    ]
    assert not outside, f"{module} imported outside kvprof/{home}/: {outside}"
