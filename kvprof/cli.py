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

# kvprof/commands/<name>.py, in the order `kvprof --help` lists them
COMMANDS: tuple[str, ...] = (
    "demo", "top", "record", "report", "flamegraph", "diff", "exporter", "bench", "doctor", "probes",
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
    for name in COMMANDS:
        importlib.import_module(f"kvprof.commands.{name}").add_parser(commands)
    return parser


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
