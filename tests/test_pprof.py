"""pprof export: the schema, the message, and what `go tool pprof` reads from the file.

The reader is Go's own pprof (Debian's golang-go, installed by
scripts/provision.sh): its top functions and totals must be the folded
export's, for every kind, on the recorded fixture profiles.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from support import KVPROF

from kvprof.export import ExportError, export, format_of
from kvprof.export.folded import parse_folded
from kvprof.export.pprof import pprof_message, split_frame
from kvprof.export.pprof_schema import MESSAGES, PROTO, SchemaError, parse_proto
from kvprof.model.profile import Profile

HERE = Path(__file__).parent
PROFILES = [HERE / "fixtures" / "top-baseline.json", HERE / "golden" / "flame-small.json"]
GO = shutil.which("go")
needs_go = pytest.mark.skipif(GO is None, reason="no `go` (Debian golang-go): run scripts/provision.sh")

# `go tool pprof -top` rows: flat flat% sum% cum cum% name
_ROW = re.compile(r"^\s*(\S+)\s+\S+%\s+\S+%\s+(\S+)\s+\S+%\s+(.+)$")
_TOTAL = re.compile(r"of (\S+) total")


def pprof_top(path: Path, sample_index: str) -> tuple[dict[str, int], int]:
    """Function -> flat value, and the total, as `go tool pprof -top` prints them."""
    unit = [] if sample_index in ("samples", "contentions") else ["-unit=ns"]
    argv = [GO or "go", "tool", "pprof", "-top", "-nodefraction=0", "-nodecount=100000"]
    argv += [f"-sample_index={sample_index}", *unit, str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    flat: dict[str, int] = {}
    total = None
    for line in done.stdout.splitlines():
        if (m := _TOTAL.search(line)) is not None:
            total = _number(m.group(1))
        elif (m := _ROW.match(line)) is not None and m.group(1) != "flat":
            flat[m.group(3).strip()] = flat.get(m.group(3).strip(), 0) + _number(m.group(1))
    assert total is not None, done.stdout
    return flat, total


def _number(text: str) -> int:
    return round(float(re.sub(r"[a-z]+$", "", text)))


def folded_leaves(path: Path, kind: str, tmp_path: Path, value: str | None = None) -> Counter[str]:
    """Leaf function -> value, from the folded export (the reference)."""
    out = tmp_path / f"{kind}.{value or 'default'}.folded"
    args = ["--value", value] if value else []
    done = subprocess.run(
        [*KVPROF, "flamegraph", str(path), "--kind", kind, *args, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    leaves: Counter[str] = Counter()
    for frames, n in parse_folded(out.read_text()).items():
        leaves[split_frame(frames[-1])[0]] += n
    return leaves


def test_schema_compiles_to_pprofs_field_numbers() -> None:
    """The schema text compiles with the field numbers and types pprof's readers expect."""
    fdp = parse_proto(PROTO)
    assert fdp.package == "perftools.profiles" and fdp.syntax == "proto3"
    fields = {(m.name, f.name): (f.number, f.label) for m in fdp.message_type for f in m.field}
    repeated = 3
    assert fields[("Profile", "sample")] == (2, repeated)
    assert fields[("Profile", "string_table")] == (6, repeated)
    assert fields[("Profile", "default_sample_type")][0] == 14
    assert fields[("Sample", "location_id")] == (1, repeated)
    assert fields[("Label", "num_unit")][0] == 4
    assert fields[("Location", "line")] == (4, repeated)
    assert fields[("Function", "start_line")][0] == 5
    with pytest.raises(SchemaError):
        parse_proto('syntax = "proto2"; message A { int64 a = 1; }')


def test_message_has_types_labels_and_a_clean_string_table() -> None:
    """cpu: samples/count + cpu/nanoseconds (samples x 1/hz), per-thread labels, string 0 empty."""
    p = Profile.load(PROFILES[1])
    data = gzip.decompress(gzip.compress(pprof_message(p, "cpu").SerializeToString()))
    msg = MESSAGES["Profile"].FromString(data)
    st = list(msg.string_table)
    assert st[0] == ""
    assert [(st[t.type], st[t.unit]) for t in msg.sample_type] == [
        ("samples", "count"),
        ("cpu", "nanoseconds"),
    ]
    assert st[msg.default_sample_type] == "cpu" and msg.period == round(1e9 / p.hz)
    assert sum(s.value[0] for s in msg.sample) == sum(s.count for s in p.oncpu)
    for s in msg.sample:
        assert s.value[1] == s.value[0] * msg.period
    labelled = {tuple(sorted((st[lb.key], st[lb.str]) for lb in s.label)) for s in msg.sample if s.label}
    assert (("socket", "0"), ("thread", "101"), ("thread_name", "kv-worker-0")) in labelled
    assert (("socket", "1"), ("thread", "102"), ("thread_name", "kv-worker-1")) in labelled
    locks = MESSAGES["Profile"].FromString(pprof_message(p, "locks").SerializeToString())
    lst = list(locks.string_table)
    assert [lst[t.type] for t in locks.sample_type] == ["contentions", "wait"]
    assert lst[locks.default_sample_type] == "wait"


def test_python_frames_become_function_file_and_line() -> None:
    """A py-spy frame `name (file:line)` is function `name` in `file` at `line`; others stay whole."""
    assert split_frame("hammer (pyclient.py:38)") == ("hammer", "pyclient.py", 38)
    assert split_frame("Client.get_many (pymemcache/client/base.py:706)") == (
        "Client.get_many",
        "pymemcache/client/base.py",
        706,
    )
    assert split_frame("clock_nanosleep (libc.so.6)") == ("clock_nanosleep", "libc.so.6", 0)
    assert split_frame("update_topkeys") == ("update_topkeys", "", 0)
    assert split_frame("libc.so.6+0x1234") == ("libc.so.6+0x1234", "", 0)
    assert split_frame("do_syscall_64_[k]") == ("do_syscall_64_[k]", "", 0)


def test_output_name_picks_pprof() -> None:
    """`.pb.gz` is the pprof format; the dispatch of kvprof.export knows it."""
    assert format_of("out.pb.gz") == "pprof"
    with pytest.raises(ExportError):
        format_of(".pb.gz")


@needs_go
@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_go_pprof_top_matches_folded(path: Path, tmp_path: Path) -> None:
    """`go tool pprof -top`, every kind: each function's flat value and the total are the folded export's."""
    p = Profile.load(path)
    checks = [("cpu", "samples", None), ("cpu", "cpu", None), ("offcpu", "wait", None)]
    checks += [("locks", "wait", None), ("locks", "contentions", "waits")]
    for kind, index, value in checks:
        out = tmp_path / f"{kind}.pb.gz"
        said = export(p, kind, out)
        assert said.startswith(f"wrote {out}: {kind}")
        reference = folded_leaves(path, kind, tmp_path, value)
        if index == "cpu":  # the same samples, in ns of CPU: one period each
            reference = Counter({f: n * round(1e9 / p.hz) for f, n in reference.items()})
        flat, total = pprof_top(out, index)
        assert total == sum(reference.values()), (kind, index)
        top = [f for f, _ in reference.most_common(5)]
        assert [(f, flat.get(f)) for f in top] == [(f, reference[f]) for f in top], (kind, index)
        assert {f: n for f, n in flat.items() if n} == dict(+reference), (kind, index)


@needs_go
def test_flamegraph_command_writes_pprof(tmp_path: Path) -> None:
    """`kvprof flamegraph FILE -o out.pb.gz` writes a file pprof reads, with the thread labels."""
    out = tmp_path / "cpu.pb.gz"
    done = subprocess.run(
        [*KVPROF, "flamegraph", str(PROFILES[0]), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and "wrote" in done.stderr, done.stderr
    tags = subprocess.run(
        [GO or "go", "tool", "pprof", "-tags", str(out)], capture_output=True, text=True, timeout=120
    )
    assert tags.returncode == 0, tags.stderr
    assert "thread_name:" in tags.stdout and "kv-worker-0" in tags.stdout
    assert "socket:" in tags.stdout and "thread:" in tags.stdout
