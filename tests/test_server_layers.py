"""kvcached's include layering (docs/server.md), checked by
scripts/check-includes.py: no include cycle between the server's modules
(a function declared in one module's header and defined in another's .c
counts as an include of the other), and no layer including a higher one
(core/ < stats/ < storage/ < protocol/: nothing under server/core/ or
server/stats/ reaches server/protocol/). Run on the real source tree, and on
copies of it with one include or declaration added, so the check is seen to
fail on the regressions it is there for."""

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


def copy_with(tmp_path: Path, added: dict[str, str]) -> Path:
    """A copy of server/'s sources with each file's text of `added` put at its end."""
    root = tmp_path / "server"
    shutil.copytree(SERVER, root, ignore=shutil.ignore_patterns("build*"))
    for file, text in added.items():
        path = root / file
        path.write_text(path.read_text() + text)
    return root


def copy_with_include(tmp_path: Path, file: str, header: str) -> Path:
    """A copy of server/'s sources with `#include "header"` added to `file`."""
    return copy_with(tmp_path, {file: f'#include "{header}"\n'})


def test_the_server_source_passes() -> None:
    """The tree as it is: no cycle, no include against the layers, nothing printed."""
    result = check(SERVER)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_the_graph_names_the_core_and_the_protocol() -> None:
    """--graph prints the module edges: the protocol uses the core, neither core/ nor stats/ protocol/."""
    result = subprocess.run(
        [sys.executable, str(CHECK), "--graph", str(SERVER)], capture_output=True, text=True, timeout=60
    )
    edges = dict(line.split(" -> ") for line in result.stdout.splitlines())
    assert "protocol/process" in edges and "core/conn" in edges
    assert "core/conn" in edges["protocol/process"].split()  # the protocol knows the core
    assert not [
        m
        for deps in (edges[k] for k in edges if k.startswith(("core/", "stats/")))
        for m in deps.split()
        if m.startswith("protocol/")
    ]


@pytest.mark.parametrize(
    ("file", "header", "says"),
    [
        # core -> protocol directly
        ("core/worker.c", "protocol/process.h", "includes protocol/: core/worker.c -> protocol/process.h"),
        # stats -> protocol through a header
        ("stats/stats.h", "protocol/parse.h", "stats/stats.c -> stats/stats.h -> protocol/parse.h"),
        # core -> stats (core knows no layer above it) through a header of its own
        ("core/lock.h", "stats/stats.h", "core/ includes stats/: core/lock.c -> core/lock.h"),
        # storage -> protocol
        ("storage/slabs.c", "protocol/process.h", "storage/ includes protocol/: storage/slabs.c"),
        # a cycle with no core in it: stats/sites -> storage/life -> stats/sites
        ("stats/sites.h", "storage/life.h", "include cycle: stats/sites <-> storage/life"),
    ],
)
def test_a_regression_fails_the_check(tmp_path: Path, file: str, header: str, says: str) -> None:
    """One include added against the rules: exit 1 and a line that names the chain."""
    result = check(copy_with_include(tmp_path, file, header))
    assert result.returncode == 1
    assert says in result.stderr


def test_a_declaration_away_from_its_definition_is_a_cycle(tmp_path: Path) -> None:
    """A function declared in opcodes.h but defined in protocol/process.c (what `opcode_name` was):
    stats/sites includes opcodes.h, so it depends on protocol/process, which includes stats/sites."""
    root = copy_with(
        tmp_path,
        {"opcodes.h": "\nvoid kv_decl(void);\n", "protocol/process.c": "\nvoid kv_decl(void) {}\n"},
    )
    result = check(root)
    assert result.returncode == 1
    cycle = next(line for line in result.stderr.splitlines() if "include cycle" in line)
    assert {"protocol/process", "stats/sites"} <= set(cycle.split(": ", 2)[2].split(" <-> "))


def test_a_declaration_beside_its_definition_is_no_edge(tmp_path: Path) -> None:
    """The same declaration with its definition in a .c of its own module adds no edge."""
    root = copy_with(
        tmp_path,
        {"stats/stats.h": "\nvoid kv_decl(void);\n", "stats/stats.c": "\nvoid kv_decl(void) {}\n"},
    )
    assert check(root).returncode == 0


def test_a_missing_tree_is_one_line(tmp_path: Path) -> None:
    """A root that is not a directory: exit 2 with one line."""
    result = check(tmp_path / "nowhere")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "is not a directory" in result.stderr
