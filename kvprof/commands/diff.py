"""`kvprof diff BASE NEW -o OUT.svg`: a differential flame graph of two profiles."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvprof.commands import command, fail, read_profile
from kvprof.commands.flamegraph import add_stack_options, profile_stem

HELP = "differential flame graph: what grew (red) and shrank (blue) from BASE to NEW"

DESCRIPTION = """\
Draw NEW's flame graph with every frame coloured by how its share of the
total changed since BASE: red grew, blue shrank, the deeper the more; the
tooltip gives both shares and values. Shares, not raw counts, so recordings of
different lengths compare. --negate draws BASE's shape instead, which shows
frames NEW no longer has (a removed lock wait is a blue tower)."""

EXAMPLES = """\
examples:
  kvprof diff baseline.json.gz fixed.json.gz -o diff.svg          # on-CPU, NEW's shape
  kvprof diff baseline.json.gz fixed.json.gz --negate -o gone.svg  # BASE's shape: what went away
  kvprof diff baseline.json.gz fixed.json.gz --kind locks --negate -o locks-diff.svg
"""


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = command(commands, "diff", HELP, DESCRIPTION, EXAMPLES)
    p.add_argument("base", metavar="BASE", help="the profile before (.json or .json.gz)")
    p.add_argument("new", metavar="NEW", help="the profile after")
    p.add_argument("-o", "--output", type=Path, metavar="OUT.svg", default=Path("diff.svg"),
                   help="the SVG to write (default: diff.svg)")  # fmt: skip
    p.add_argument("--negate", action="store_true", help="draw BASE's shape (what NEW lost) instead of NEW's")
    add_stack_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvprof.export import ExportError, format_of
    from kvprof.export.diff import diff
    from kvprof.export.stacks import check_kind

    try:
        check_kind(args.kind, args.value)
        if format_of(args.output) != "svg":
            raise ExportError(f"{args.output}: a differential flame graph is an SVG; name it .svg")
    except ExportError as e:
        return fail("diff", str(e))
    base = read_profile("diff", args.base)
    new = read_profile("diff", args.new) if base is not None else None
    if base is None or new is None:
        return 2
    labels = (profile_stem(args.base), profile_stem(args.new))
    if labels[0] == labels[1]:
        labels = ("BASE", "NEW")
    try:
        result = diff(
            base,
            new,
            args.kind,
            negate=args.negate,
            value=args.value,
            prefix=args.prefix,
            labels=labels,
            min_width=args.min_width,
        )
        args.output.write_text(result.svg, encoding="utf-8")
    except ExportError as e:
        return fail("diff", str(e))
    except OSError as e:
        return fail("diff", f"{args.output}: cannot write it ({e.strerror or e})")
    shape = "BASE" if args.negate else "NEW"
    if result.layout.total == 0:
        print(
            f"kvprof diff: warning: {shape} has no {args.kind} samples; {args.output} says so",
            file=sys.stderr,
        )
    print(
        f"wrote {args.output}: {args.kind} diff in {shape}'s shape, {len(result.layout.boxes):,} frames "
        f"({result.layout.pruned:,} pruned): {result.grew:,} grew, {result.shrank:,} shrank",
        file=sys.stderr,
    )
    return 0
