"""The `kvprof` command line: the options the commands share, their defaults
against the options dataclasses the commands fill, and what building the
parser loads (no root)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from support import REPO, kvprof

from kvprof.cli import build_parser
from kvprof.collect import CollectOptions


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (["record", "-p", "1"], "kvprof.record:RecordOptions"),
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
    for name in ("hz", "stack_storage", "max_entries", "offcpu_sample"):
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
             "kvprof.record", "kvprof.collect.session", "bcc", "textual", "pyperf")  # fmt: skip
    loaded = [m for m in json.loads(done.stdout) if m.startswith(later)]
    assert not loaded, loaded
