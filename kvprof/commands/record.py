"""`kvprof record -p PID`: attach the collectors, write a profile."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvprof.collect import CollectOptions
from kvprof.commands import add_collectors, add_hz, add_pid, add_seconds, command, number, options

HELP = "attach to a process and write a profile"

DESCRIPTION = """\
Attach kvprof's eBPF collectors to a running process (on-CPU stacks, off-CPU
and futex waits; on kvcached also lock waits, cache-line transfers and request
latency from its kvs probes), collect for a while, and write a profile file.
Needs root. Everything is detached at the end, on Ctrl-C or when the target dies."""

EXAMPLES = """\
examples:
  kvprof record -p 1234                 # 10 s, every collector, kvprof-1234.json.gz
  kvprof record -p 1234 -d 5 -o base.json.gz
  kvprof record -p 1234 --hz 999 --collectors oncpu,locks
  kvprof record -p $(pgrep -x kvcached) -d 30   # then: kvprof report kvprof-<pid>.json.gz
  kvprof record -p 1234 --backend perf  # no BPF: perf's dwarf unwinding, stacks through libc
  kvprof record -p 1234 -o base.json.gz --flamegraph base.svg   # the profile and its flame graph
  kvprof record -p $(pgrep -f app.py)   # a CPython process: Python stacks from py-spy, waits from BPF
  kvprof record -p 1234 --python --native --collectors oncpu   # py-spy alone (no root for your own)
"""


def add_parser(commands: Any) -> None:
    p = command(commands, "record", HELP, DESCRIPTION, EXAMPLES)
    add_pid(p, "the process to profile")
    add_seconds(p, "-d", "--duration", default=10.0, help="seconds")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="profile file (.json or .json.gz)")
    add_hz(p)
    add_collectors(p)
    p.add_argument("--stack-storage", type=number(int, 1024, 1 << 20), default=CollectOptions.stack_storage,
                   metavar="N", help="stack ids per stack map (default: %(default)s; raise it when the "
                   "report says stack ids were lost)")  # fmt: skip
    p.add_argument("--max-entries", type=number(int, 1024, 1 << 22), default=CollectOptions.max_entries,
                   metavar="N", help="entries per aggregation map (default: %(default)s; raise it when "
                   "a map was full)")  # fmt: skip
    p.add_argument("--offcpu-sample", type=number(int, 1, 1 << 16), default=CollectOptions.offcpu_sample,
                   metavar="N", help="off-CPU stacks for a random 1 in N context switches, scaled by N; "
                   "per-thread off-CPU totals stay exact (default: %(default)s; 1 = every switch: "
                   "docs/record.md gives a stack pair's cost)")  # fmt: skip
    p.add_argument(
        "--backend",
        choices=("bpf", "perf"),
        default="bpf",
        help="bpf (default): every collector; perf: on-CPU stacks only, from `perf record "
        "--call-graph dwarf` (no BPF needed; full stacks through libc)",
    )
    p.add_argument(
        "--flamegraph",
        type=_flamegraph_output,
        metavar="OUT.svg",
        help="also write the on-CPU flame graph (.svg, .folded or .speedscope.json) after recording",
    )
    p.add_argument(
        "--python",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="on-CPU stacks from py-spy, as Python functions with file:line (default: when the "
        "target is CPython); --no-python: BPF's native stacks even then",
    )
    p.add_argument(
        "--native", action="store_true", help="with py-spy: merge C/C++ extension frames into the stacks"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no banner or progress")
    p.set_defaults(run=_run)


def _flamegraph_output(text: str) -> Path:
    """Checked before recording starts, not after."""
    from kvprof.export import ExportError, format_of

    try:
        format_of(text)
    except ExportError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return Path(text)


def _run(args: argparse.Namespace) -> int:
    from kvprof.record import RecordOptions, main

    return main(options(RecordOptions, args))
