"""docs/results.md is what scripts/results_page.py makes of bench/results/*.json, and the
script shows each figure's latest value with its spread and the command that made it;
result files are what kvprof.bench.published writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kvprof.bench import published

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "results_page.py"


def page(results: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(SCRIPT), "--results", str(results), "--out", str(out), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_committed_page_is_what_the_data_gives() -> None:
    """The committed page equals what the script makes of the committed result files."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr + "\nrun `make results-page` and commit docs/results.md"


def test_every_committed_result_file_is_complete() -> None:
    """Each file in bench/results names its benchmark, command, machine, version and settings,
    and every figure has a value and a unit."""
    files = sorted((REPO / "bench" / "results").glob("*.json"))
    assert files
    for path in files:
        doc = json.loads(path.read_text())
        assert doc["format"] == published.FORMAT, path
        for key in ("bench", "title", "date", "command", "kvprof_version", "machine", "settings"):
            assert doc[key] != "", (path, key)
        assert doc["figures"], path
        for f in doc["figures"]:
            assert isinstance(f["value"], int | float) and f["unit"], (path, f)


def test_latest_value_wins_and_the_check_sees_a_stale_page(tmp_path: Path) -> None:
    """Of two files of one benchmark the newer's figure is shown with its spread and command,
    the older's only for a figure the newer lacks; --check fails once the data changes."""
    results = tmp_path / "results"
    old = published.document(
        "overhead-toggle-demo",
        "t",
        [
            published.Figure("record: throughput", 0.9, "x", 0.85, 0.95, "IQR of 10 pairs", 10),
            published.Figure("top: throughput", 0.8, "x"),
        ],
        {"pairs": 10},
        command="bench/overhead.py --pairs 10",
        date="2026-01-01T00:00:00Z",
    )
    new = published.document(
        "overhead-toggle-demo",
        "t",
        [published.Figure("record: throughput", 0.97, "x", 0.96, 0.99, "IQR of 99 pairs", 99)],
        {"pairs": 99},
        command="bench/overhead.py --pairs 99",
        date="2026-02-01T00:00:00Z",
    )
    results.mkdir()
    (results / "a.json").write_text(json.dumps(old))
    (results / "b.json").write_text(json.dumps(new))
    out = tmp_path / "results.md"
    assert page(results, out).returncode == 0
    text = out.read_text()
    assert "| record: throughput | 0.970x | 0.960-0.990 IQR of 99 pairs | 99 |" in text
    assert "0.900x" not in text  # the older value of a figure the newer file has
    assert "| top: throughput | 0.800x | - | - |" in text  # a figure only the older file has
    assert text.index("--pairs 99") < text.index("--pairs 10")
    assert page(results, out, "--check").returncode == 0
    (results / "b.json").unlink()
    assert page(results, out, "--check").returncode == 1


def test_writer_names_machine_version_and_command(tmp_path: Path) -> None:
    """published.write puts one file per call in the directory it is given, with the machine,
    the kvprof version and the command line."""
    path = published.write(
        published.document("x", "t", [published.Figure("f", 1.0, "s")], {"k": 1}, "cmd"), tmp_path
    )
    assert path is not None and path.parent == tmp_path
    doc = json.loads(path.read_text())
    assert doc["machine"]["cpu_count"] >= 1 and doc["kvprof_version"] and doc["command"] == "cmd"
