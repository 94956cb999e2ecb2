"""The `kvprof` command line: the options the commands share, their defaults
against the options dataclasses the commands fill, and what building the
parser loads (no root)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, kvprof

from kvprof.cli import build_parser
from kvprof.collect import CollectOptions


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (["record", "-p", "1"], "kvprof.commands.record:RecordOptions"),
        (["top", "-p", "1"], "kvprof.tui.run:TopOptions"),
        (["exporter", "-p", "1"], "kvprof.commands.exporter:ExporterOptions"),
    ],
)
def test_command_defaults_are_the_options_defaults(argv: list[str], where: str) -> None:
    """What the command passes when nothing is given is what its options dataclass
    says by itself (the collectors' defaults come from CollectOptions)."""
    module, _, name = where.partition(":")
    cls = getattr(__import__(module, fromlist=[name]), name)
    args = vars(build_parser().parse_args(argv))
    compared = {
        f.name: (args[f.name], f.default)
        for f in dataclasses.fields(cls)
        if f.name in args and f.default is not dataclasses.MISSING and f.name != "pid"
    }
    assert compared, f"no option of {argv[0]} is a field of {name}"
    assert {k: a for k, (a, _) in compared.items()} == {k: d for k, (_, d) in compared.items()}


def test_flame_graph_options_are_the_exports_defaults() -> None:
    from kvprof.export.svg import MIN_WIDTH, WIDTH

    args = build_parser().parse_args(["flamegraph", "x.json"])
    assert (args.width, args.min_width) == (WIDTH, MIN_WIDTH)
    assert build_parser().parse_args(["diff", "a.json", "b.json"]).min_width == MIN_WIDTH


def test_record_takes_the_collectors_defaults() -> None:
    args = build_parser().parse_args(["record", "-p", "1"])
    defaults = CollectOptions.__dataclass_fields__
    for name in ("hz", "stack_storage", "max_entries", "offcpu_sample", "offcpu_hz"):
        assert getattr(args, name) == defaults[name].default, name


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["record", "-p", "x"], "argument -p/--pid: not a PID: 'x'"),
        (["top", "-p", "0"], "argument -p/--pid: not a PID: '0'"),
        (["exporter", "-p", "1", "--hz", "0"], "argument --hz: must be 1..10000: '0'"),
        (
            ["record", "-p", "1", "--collectors", "oncpu,nope"],
            "argument --collectors: unknown collector 'nope'",
        ),
        (["top", "-p", "1", "-i", "0.1"], "argument -i/--interval: must be >= 0.2: '0.1'"),
        (["demo", "-d", "0"], "argument -d/--duration: must be > 0: '0'"),
        (["bench", "--runs", "1"], "argument --runs: must be >= 2: '1'"),
    ],
)
def test_a_bad_shared_option_is_one_line(argv: list[str], message: str) -> None:
    done = kvprof(*argv, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert message in done.stderr.splitlines()[-1], done.stderr


def test_building_the_parser_loads_no_stage() -> None:
    """`kvprof --help` loads the commands and the collectors' options, nothing of
    a later stage, no bcc, no textual."""
    code = (
        "import json, sys\n"
        "from kvprof.cli import build_parser\n"
        "build_parser().format_help()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    later = ("kvprof.analysis", "kvprof.views", "kvprof.export", "kvprof.system", "kvprof.bench",
             "kvprof.collect.session", "bcc", "textual", "pyperf")  # fmt: skip
    loaded = [m for m in json.loads(done.stdout) if m.startswith(later)]
    assert not loaded, loaded


GONE = "999999999"  # no such process: above the kernel's pid_max
# Every command's bad input, as applicable: a PID that is not one or is no process, a
# file that is not there, a flag value out of range. Each is told in one line, exit 2.
BAD_INPUT: dict[str, list[list[str]]] = {
    "demo": [["-d", "0"], ["-t", "0"], ["--preset", "nope"]],
    "top": [["-p", "x"], ["-p", GONE], ["--replay", "no-such.json"], ["-p", "1", "-i", "0.1"]],
    "record": [["-p", "x"], ["-p", GONE, "-d", "1"], ["-p", "1", "--hz", "0"]],
    "report": [["no-such.json"], ["no-such.json", "--top", "0"]],
    "flamegraph": [["no-such.json"], ["no-such.json", "--kind", "nope"], ["x.json", "--width", "1"]],
    "diff": [["no-such.json", "no-such-either.json"], ["a.json", "b.json", "-o", "diff.png"]],
    "exporter": [["-p", "x"], ["-p", GONE], ["-p", "1", "--listen", "nope"], ["-p", "1", "--top", "0"]],
    "bench": [
        ["--compare", "no-such.json", "no-such-either.json"],
        ["--runs", "1"],
        ["--variants", "nope"],
        ["--scenario", "loadgen", "--variants", "baseline"],
        ["--scenario", "atomics", "--variants", "baseline"],
    ],
    "doctor": [["-p", "x"], ["-p", GONE]],
    "probes": [["-p", "x"], ["-p", GONE], ["-p", GONE, "-d", "-1"], []],
}


def test_bad_input_covers_every_command() -> None:
    from kvprof.cli import COMMANDS

    assert sorted(BAD_INPUT) == sorted(COMMANDS)


@pytest.mark.parametrize(
    "argv", [[name, *args] for name, cases in BAD_INPUT.items() for args in cases], ids=" ".join
)
def test_bad_input_is_one_line_and_status_2(argv: list[str], tmp_path: Path) -> None:
    """A bad PID, a missing file or a bad flag value: one line `kvprof CMD: why` (after
    argparse's usage for a flag; top adds the doctor hint when BPF cannot work here), no
    traceback, nothing on stdout, exit 2."""
    done = kvprof(*argv, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == "", done.stderr
    lines = done.stderr.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("kvprof")]
    assert len(said) == 1 and lines[said[0]].startswith(f"kvprof {argv[0]}: "), done.stderr
    before, after = lines[: said[0]], lines[said[0] + 1 :]
    assert not before or before[0].startswith("usage: "), done.stderr
    hint = argv[0] == "top" and len(after) == 1 and after[0].lstrip().startswith("`kvprof doctor`")
    assert not after or hint, done.stderr
