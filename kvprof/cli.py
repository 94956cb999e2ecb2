"""The `kvprof` command line.

Each command imports its module only when it runs, so `kvprof --help` and the
commands that need neither BPF nor the TUI never load bcc or textual.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from kvprof import __version__
from kvprof.commands import add_seconds, command, number

DESCRIPTION = """\
kvprof finds where a multi-threaded cache server loses its throughput: the hot
stacks, the lock waits, and the shared counters whose cache line bounces
between threads and sockets."""

EXAMPLES = """\
examples:
  kvprof demo                  # kvcached (baseline preset) under load, live stats until Ctrl-C
  kvprof demo --duration 10    # the same for 10 seconds, then a summary line
  kvprof demo --preset fixed   # the per-thread design: no contended topkeys waits
"""

DEMO_EXAMPLES = """\
examples:
  kvprof demo                  # run until Ctrl-C
  kvprof demo -d 30            # run for 30 seconds
  kvprof demo --preset fixed   # compare: the per-thread design of every site
"""


# kvprof/commands/<name>.py, in the order `kvprof --help` lists them
COMMANDS: tuple[str, ...] = (
    "top", "record", "report", "flamegraph", "diff", "exporter", "bench", "doctor", "probes",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvprof",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvprof {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    demo = command(
        commands,
        "demo",
        help="run kvcached under load and show its live stats",
        description=(
            "Start kvcached on a free loopback port, drive it with kvload (batched\n"
            "multi-gets, 5 % sets) and print ops/s, hit rate, items and the topkeys\n"
            "lock's contended waits once a second. Ctrl-C, SIGTERM or --duration stop both."
        ),
        examples=DEMO_EXAMPLES,
    )
    add_seconds(demo, "-d", "--duration", help="stop after SEC seconds (default: run until Ctrl-C)")
    demo.add_argument(
        "--preset",
        choices=("baseline", "fixed"),
        default="baseline",
        help="kvcached's contention sites: baseline = shared (the study's start), "
        "fixed = per-thread (default: %(default)s)",
    )
    demo.add_argument(
        "-t",
        "--threads",
        type=number(int, lo=1),
        default=2,
        metavar="N",
        help="kvcached worker threads (default: %(default)s)",
    )
    add_seconds(demo, "-i", "--interval", default=1.0, help="seconds between lines")
    demo.set_defaults(run=_run_demo)
    for name in COMMANDS:
        importlib.import_module(f"kvprof.commands.{name}").add_parser(commands)
    return parser


def _run_demo(args: argparse.Namespace) -> int:
    from kvprof import demo

    return demo.run(
        duration=args.duration,
        preset=args.preset,
        threads=args.threads,
        interval=args.interval,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        status: int = args.run(args)
    except BrokenPipeError:
        # `kvprof ... | head`: the reader left; say nothing, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return status


if __name__ == "__main__":
    raise SystemExit(main())
