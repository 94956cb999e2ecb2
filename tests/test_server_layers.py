"""kvcached's include layering (docs/server.md), checked by
scripts/check-includes.py: no include cycle between the server's modules,
and nothing under server/core/ reaching server/protocol/. Run on the real
source tree, and on copies of it with one include added, so the check is
seen to fail on the regressions it is there for."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SERVER = REPO / "server"
CHECK = REPO / "scripts" / "check-includes.py"


def check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), str(root)], capture_output=True, text=True, timeout=60)


def copy_with_include(tmp_path: Path, file: str, header: str) -> Path:
    """A copy of server/'s sources with `#include "header"` added to `file`."""
    root = tmp_path / "server"
    shutil.copytree(SERVER, root, ignore=shutil.ignore_patterns("build*"))
    path = root / file
    path.write_text(f'#include "{header}"\n' + path.read_text())
    return root


def test_the_server_source_passes() -> None:
    result = check(SERVER)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_the_graph_names_the_core_and_the_protocol() -> None:
    result = subprocess.run(
        [sys.executable, str(CHECK), "--graph", str(SERVER)], capture_output=True, text=True, timeout=60
    )
    edges = dict(line.split(" -> ") for line in result.stdout.splitlines())
    assert "protocol/process" in edges and "core/conn" in edges
    assert "core/conn" in edges["protocol/process"].split()  # the protocol knows the core
    assert not [
        m
        for deps in (edges[k] for k in edges if k.startswith("core/"))
        for m in deps.split()
        if m.startswith("protocol/")
    ]


@pytest.mark.parametrize(
    ("file", "header", "says"),
    [
        # core -> protocol directly
        ("core/worker.c", "protocol/process.h", "includes protocol/: core/worker.c -> protocol/process.h"),
        # core -> protocol through a header of another layer
        ("stats/stats.h", "protocol/opcodes.h", "core/conn.c -> stats/stats.h -> protocol/opcodes.h"),
        # a cycle with no core in it: stats/sites -> storage/items -> stats/sites
        ("stats/sites.h", "storage/items.h", "include cycle: stats/sites <-> storage/items"),
    ],
)
def test_a_regression_fails_the_check(tmp_path: Path, file: str, header: str, says: str) -> None:
    result = check(copy_with_include(tmp_path, file, header))
    assert result.returncode == 1
    assert says in result.stderr


def test_a_missing_tree_is_one_line(tmp_path: Path) -> None:
    result = check(tmp_path / "nowhere")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "is not a directory" in result.stderr
