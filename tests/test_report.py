"""`kvprof report`: the text and JSON rendering, and bad input (no root).

The profiles are the hand-made kvcached-shaped ones of tests/support.py.
Bad-input cases run the real command in a subprocess and assert one line on
stderr, exit status 2 and no traceback.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from support import W0, W1, baseline_profile, fixed_profile, kvprof

from kvprof import __version__
from kvprof.model.profile import CacheLineStat, Finding, LineThread, Profile, Target
from kvprof.views.report import render_text, to_json

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"


def assert_one_line_error(r: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2, nothing on stdout, one `kvprof report:` line on stderr naming `words`."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("kvprof report: "), lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    assert r.stdout == ""


# ---- text ---------------------------------------------------------------------


def test_text_lists_findings_first_and_fits_80_columns() -> None:
    """The findings come before every table, the worst first, and no line exceeds 80 columns."""
    text = render_text(baseline_profile())
    for line in text.splitlines():
        assert len(line) <= 80, line
    order = [
        text.index(h) for h in ("FINDINGS", "TOP FUNCTIONS", "LOCKS", "CACHE LINES", "THREADS", "REQUESTS")
    ]
    assert order == sorted(order)
    findings = text[text.index("FINDINGS") : text.index("TOP FUNCTIONS")]
    marks = list(re.findall(r"\b(CRITICAL|WARNING|INFO)\b", findings))
    order = {"CRITICAL": 0, "WARNING": 1, "INFO": 2}
    assert marks and [order[m] for m in marks] == sorted(order[m] for m in marks), marks
    for name in ("update_topkeys", "on_create_item", "collect_timings", "account_memory"):
        assert name in findings
    assert "kv-worker-0 (4101)" in findings and "kv-worker-1 (4102)" in findings
    assert "Why: " in findings and "What to do: " in findings
    assert "info findings are shown short" in findings  # the counters: their explanation in --json


def test_text_header_says_what_did_not_apply() -> None:
    """Collectors that did not apply are listed with their reason; partial profiles and lost data warn."""
    p = baseline_profile()
    p.target.kvs_probes = False
    p.status.collectors["locks"] = "not applicable: the target has no kvs probes"
    p.status.partial = True
    p.status.reason = "the target exited after 3.2 s"
    p.status.counters = {"oncpu.stack_errors": 12, "locks.map_full": 3, "oncpu.lost": 0}
    text = render_text(p)
    head = text[: text.index("FINDINGS")]
    assert "not used: locks: not applicable: the target has no kvs probes" in head
    assert "WARNING: partial profile: the target exited after 3.2 s" in head
    assert "oncpu.stack_errors = 12: raise --stack-storage" in head
    assert "locks.map_full = 3: raise --max-entries" in head
    assert "oncpu.lost" not in head


def test_fixed_text_has_no_critical() -> None:
    """The fixed-shaped profile reports nothing critical and says no lock was contended."""
    text = render_text(fixed_profile())
    assert "CRITICAL" not in text
    assert "0 critical" in text
    assert "no contended lock" in text


def test_socket_matrix_shown_with_two_sockets() -> None:
    """With two sockets the cache-line section shows the socket x socket transfer matrix."""
    p = baseline_profile()
    p.host.topology = {"0": {"core": 0, "socket": 0, "node": 0}, "1": {"core": 0, "socket": 1, "node": 1}}
    p.cachelines.append(
        CacheLineStat(
            site="account_memory",
            line=0x9000,
            samples=1000,
            transfers=600,
            cross_socket_transfers=400,
            cycles_mean=700.0,
            socket_matrix=[[100, 200], [200, 100]],
            by_thread={W0: LineThread(500, 300, 700.0), W1: LineThread(500, 300, 700.0)},
        )
    )
    text = render_text(p)
    assert "from socket (row) to socket (column)" in text
    assert "Per socket:" in text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_stored_findings_are_used_and_missing_ones_computed() -> None:
    """A profile with findings is shown as recorded; one without gets them computed."""
    p = baseline_profile()
    p.findings = [Finding(id="x", title="recorded finding", category="cpu", severity="info", where="f")]
    assert "recorded finding" in render_text(p)
    assert "cache line bouncing at account_memory" in render_text(baseline_profile())


def test_empty_profile_renders() -> None:
    """A profile with nothing in it still renders, saying there is nothing."""
    text = render_text(Profile(target=Target(pid=7, comm="idle")))
    assert "No contention found" in text
    assert "no on-CPU samples" in text


def test_golden_baseline_report() -> None:
    """The baseline report's text is stable (regenerate with KVPROF_REGEN_GOLDEN=1)."""
    path = GOLDEN / "report-baseline.txt"
    text = render_text(baseline_profile())
    if os.environ.get("KVPROF_REGEN_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


# ---- JSON ---------------------------------------------------------------------


def test_json_has_findings_and_tables() -> None:
    """to_json is JSON-serialisable and carries the findings, their summary and every table."""
    data = json.loads(json.dumps(to_json(baseline_profile(), top=5)))
    assert data["format"] == "kvprof-report"
    ids = [f["id"] for f in data["findings"]]
    assert "lock:topkeys" in ids and "cacheline:on_create_item" in ids
    lock = data["findings"][ids.index("lock:topkeys")]
    assert set(lock["per_thread"]) == {W0, W1} and lock["thread_names"][W0] == "kv-worker-0"
    assert lock["summary"].startswith("The topkeys lock")
    assert set(data["tables"]) == {
        "functions", "locks", "cachelines", "socket_matrix", "threads", "requests",
        "sampled_lines", "sampled_unattributed",
    }  # fmt: skip
    assert len(data["tables"]["functions"]) >= 5
    assert data["tables"]["locks"][0]["name"] == "topkeys"


# ---- the command --------------------------------------------------------------


@pytest.fixture
def baseline_file(tmp_path: Path) -> Path:
    """The baseline profile saved gzip'd, without findings (report computes them)."""
    path = tmp_path / "base.prof.json.gz"
    baseline_profile().save(path)
    return path


def test_command_text_and_json(baseline_file: Path) -> None:
    """`kvprof report FILE` prints the report; `--json` prints one parseable object."""
    r = kvprof("report", str(baseline_file), "--top", "5")
    assert r.returncode == 0, r.stderr
    assert r.stdout.lstrip().startswith("kvprof report: kvcached PID")
    assert "update_topkeys" in r.stdout
    r = kvprof("report", str(baseline_file), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    # the topkeys mutex: a small gain now, but today's throughput uses over half its ceiling
    assert data["findings"][0]["id"] == "lock:topkeys" and data["findings"][0]["severity"] == "critical"
    assert data["ceilings"][0]["finding"] == "lock:topkeys"


def test_command_missing_file(tmp_path: Path) -> None:
    """A file that does not exist: one line, exit 2."""
    assert_one_line_error(kvprof("report", str(tmp_path / "nope.json")), "no such file")


@pytest.mark.parametrize("name", ["cut.json", "cut.json.gz"])
def test_command_truncated_profile(tmp_path: Path, name: str) -> None:
    """A JSON or gzip profile cut in half: one line naming the file, exit 2."""
    path = tmp_path / name
    baseline_profile().save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert_one_line_error(kvprof("report", str(path)), name)


def test_command_corrupt_gzip(tmp_path: Path) -> None:
    """A .gz file that is not gzip at all: one line, exit 2."""
    path = tmp_path / "bad.json.gz"
    path.write_bytes(b"this is not gzip data at all\n")
    assert_one_line_error(kvprof("report", str(path)), "bad.json.gz")


def test_command_wrong_version(tmp_path: Path) -> None:
    """A profile of another version: one line naming the version, exit 2."""
    path = tmp_path / "v9.json"
    d = baseline_profile().to_dict()
    d["version"] = 9
    path.write_text(json.dumps(d))
    assert_one_line_error(kvprof("report", str(path)), "version")


def test_command_wrong_format(tmp_path: Path) -> None:
    """Some other JSON document: one line, exit 2."""
    path = tmp_path / "other.json.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"hello": "world"}))
    assert_one_line_error(kvprof("report", str(path)), "not a kvprof profile")


def test_command_wrong_field_types(tmp_path: Path) -> None:
    """A profile whose fields have the wrong types: one line, exit 2."""
    path = tmp_path / "types.json"
    d = baseline_profile().to_dict()
    d["oncpu"]["stacks"][0]["count"] = "many"
    path.write_text(json.dumps(d))
    assert_one_line_error(kvprof("report", str(path)), "malformed")


def test_command_directory(tmp_path: Path) -> None:
    """A directory instead of a file: one line, exit 2."""
    assert_one_line_error(kvprof("report", str(tmp_path)), "directory")


# ---- the command's text on the profiles kept in tests/, pinned byte for byte

PROFILES = {
    "flame-small": REPO / "tests" / "golden" / "flame-small.json",
    "top-baseline": REPO / "tests" / "fixtures" / "top-baseline.json",
    "false-share": REPO / "tests" / "fixtures" / "false-share.json",
}
OPTIONS = {"": (), "top30": ("--top", "30"), "json": ("--json",), "top3": ("--top", "3")}


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_report_command_output_is_unchanged(name: str, option: str) -> None:
    """`kvprof report FILE [OPTION]` prints byte for byte what it printed when the
    golden files were made (regenerate with KVPROF_REGEN_GOLDEN=1, and say why)."""
    r = kvprof("report", str(PROFILES[name]), *OPTIONS[option])
    assert r.returncode == 0, r.stderr
    path = GOLDEN / "report" / f"{name}{'.' + option if option else ''}.txt"
    if os.environ.get("KVPROF_REGEN_GOLDEN"):
        path.write_text(r.stdout)
    assert r.stdout == path.read_text()


def test_the_kvprof_version_is_recorded_and_shown(tmp_path: Path) -> None:
    """A profile carries the version of kvprof that wrote it, and report says it; one from
    before the field loads, with no such line and `kvprof_version: null` in --json."""
    path = tmp_path / "new.json"
    Profile(target=Target(pid=1, comm="x")).save(path)
    assert json.loads(path.read_text())["kvprof_version"] == __version__
    new = Profile.load(path)
    assert f"  recorded by: kvprof {__version__}" in render_text(new).splitlines()
    assert to_json(new)["kvprof_version"] == __version__
    body = json.loads(path.read_text())
    del body["kvprof_version"]
    path.write_text(json.dumps(body))
    old = Profile.load(path)
    assert old.kvprof_version == "" and to_json(old)["kvprof_version"] is None
    assert "recorded by" not in render_text(old)
