"""`kvprof report FILE`: findings first, then the top tables; `--json` for scripts."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from typing import TYPE_CHECKING

from kvprof.commands import command, fail, malformed, number, read_profile

if TYPE_CHECKING:
    from kvprof.model.profile import Profile

HELP = "summarise a recorded profile: findings first, then top tables"

DESCRIPTION = """\
Read a profile written by `kvprof record` (JSON, gzip'd when it ends in .gz)
and print what costs the target its throughput: findings ranked by estimated
cost (what, how much, why, what to do), then the top functions by self and
total samples, contended locks, bouncing cache lines, threads and requests.
With --flame, the flame graph instead: the icicle `kvprof top` draws in its
Flame view (root at the top, a frame as wide as its share), as plain text at
the terminal's width. Exit status 2 when the file cannot be read as a profile."""

EXAMPLES = """\
examples:
  kvprof report kvcached.prof.gz           # findings, then top functions, locks, cache lines
  kvprof report kvcached.prof.gz --top 30  # longer tables
  kvprof report kvcached.prof.gz --json | jq '.findings[] | {severity, title}'
  kvprof report kvcached.prof.gz --flame --kind locks  # lock waits by call site, as text
"""


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = command(commands, "report", HELP, DESCRIPTION, EXAMPLES)
    p.add_argument("file", metavar="FILE", help="the profile (.json or .json.gz)")
    p.add_argument("--json", action="store_true", help="print findings and tables as one JSON object")
    p.add_argument(
        "--top", type=number(int, lo=1), default=15, metavar="N", help="rows per table (default: %(default)s)"
    )
    p.add_argument("--flame", action="store_true", help="print the flame graph as text instead")
    # the kind is checked by kvprof.export, whose message is one line
    p.add_argument(
        "--kind", default="cpu", metavar="K", help="with --flame: cpu, offcpu or locks (default: cpu)"
    )
    p.add_argument(
        "--width",
        type=number(int, lo=20),
        metavar="COLS",
        help="with --flame: columns (default: the terminal's)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvprof.export.stacks import ExportError
    from kvprof.views import report

    profile = read_profile("report", args.file)
    if profile is None:
        return 2
    try:
        if args.flame:
            text = _flame(profile, args)
        elif args.json:
            text = json.dumps(report.to_json(profile, args.top), indent=2) + "\n"
        else:
            text = report.render_text(profile, args.top)
    except ExportError as e:
        return fail("report", str(e))
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError) as e:
        return malformed("report", args.file, e)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # `kvprof report FILE | head`: the reader left, which is fine
        sys.stderr.close()
    return 0


def _flame(profile: Profile, args: argparse.Namespace) -> str:
    from kvprof.views.flame import render_text

    return render_text(profile, args.kind, args.width or shutil.get_terminal_size().columns)
