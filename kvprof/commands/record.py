"""`kvprof record -p PID`: attach the collectors, write a profile."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvprof.commands import number

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


def _pid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a PID: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"not a PID: {text!r}")
    return value


def _collectors(text: str) -> tuple[str, ...]:
    from kvprof.collect.session import ALL_COLLECTORS

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for n in names:
        if n not in ALL_COLLECTORS:
            raise argparse.ArgumentTypeError(
                f"unknown collector {n!r} (choose from {', '.join(ALL_COLLECTORS)})"
            )
    return names


def add_parser(commands: Any) -> None:
    p = commands.add_parser(
        "record",
        help="attach to a process and write a profile",
        description=(
            "Attach kvprof's eBPF collectors to a running process (on-CPU stacks, off-CPU\n"
            "and futex waits; on kvcached also lock waits, cache-line transfers and request\n"
            "latency from its kvs probes), collect for a while, and write a profile file.\n"
            "Needs root. Everything is detached at the end, on Ctrl-C or when the target dies."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-p", "--pid", type=_pid, required=True, help="the process to profile")
    p.add_argument(
        "-d",
        "--duration",
        type=number(float, above=0),
        default=10.0,
        metavar="SEC",
        help="seconds (default: 10)",
    )
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="profile file (.json or .json.gz)")
    p.add_argument("--hz", type=number(int, 1, 10000), default=99, help="on-CPU sampling rate (default: 99)")
    p.add_argument("--collectors", type=_collectors, default=(), metavar="A,B", help="subset of collectors")
    p.add_argument(
        "--stack-storage",
        type=number(int, 1024, 1 << 20),
        default=16384,
        metavar="N",
        help="stack ids per stack map (default: 16384; raise it when the report says stack ids were lost)",
    )
    p.add_argument(
        "--max-entries",
        type=number(int, 1024, 1 << 22),
        default=10240,
        metavar="N",
        help="entries per aggregation map (default: 10240; raise it when a map was full)",
    )
    p.add_argument(
        "--offcpu-sample",
        type=number(int, 1, 1 << 16),
        default=64,
        metavar="N",
        help="off-CPU stacks for a random 1 in N context switches, scaled by N; per-thread "
        "off-CPU totals stay exact (default: 64; 1 = every switch: a stack pair costs ~5-12 µs here)",
    )
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

    return main(
        RecordOptions(
            pid=args.pid,
            duration=args.duration,
            output=args.output,
            hz=args.hz,
            collectors=args.collectors,
            backend=args.backend,
            stack_storage=args.stack_storage,
            max_entries=args.max_entries,
            offcpu_sample=args.offcpu_sample,
            quiet=args.quiet,
            flamegraph=args.flamegraph,
            python=args.python,
            native=args.native,
        )
    )
