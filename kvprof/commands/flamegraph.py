"""`kvprof flamegraph FILE --kind K -o OUT`: a flame graph or stack export of a profile."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvprof.commands import command, fail, malformed, number, read_profile

HELP = "write a flame graph (.svg), folded stacks or speedscope JSON of a profile"

DESCRIPTION = """\
Read a profile written by `kvprof record` and write the stacks of one kind:
cpu (on-CPU samples), offcpu (off-CPU time) or locks (lock wait time by call
site: the kvs lock probes, plus futex waits they do not cover). The output's
name chooses the format: .svg (interactive: click to zoom, search, tooltips;
hotspot-catalog frames in violet), .folded (flamegraph.pl's input), or
.speedscope.json. Exit status 2 when the profile or the request is bad."""

EXAMPLES = """\
examples:
  kvprof flamegraph base.json.gz -o cpu.svg               # on-CPU samples, interactive SVG
  kvprof flamegraph base.json.gz --kind locks -o locks.svg  # lock wait time by call site
  kvprof flamegraph base.json.gz --kind offcpu --prefix thread -o off.svg
  kvprof flamegraph base.json.gz -o cpu.folded            # for flamegraph.pl, inferno, speedscope
  kvprof flamegraph base.json.gz -o cpu.speedscope.json   # one profile per thread in speedscope
"""


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = command(commands, "flamegraph", HELP, DESCRIPTION, EXAMPLES)
    p.add_argument("file", metavar="FILE", help="the profile (.json or .json.gz)")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="OUT",
        help="OUT.svg, OUT.folded or OUT.speedscope.json (default: FILE's name + .KIND.svg)",
    )
    add_stack_options(p)
    p.add_argument("--width", type=number(int, 200, 100000), default=1200, metavar="PX",
                   help="SVG width (default: %(default)s)")  # fmt: skip
    p.set_defaults(run=run)


def add_stack_options(p: argparse.ArgumentParser) -> None:
    """--kind, --prefix, --value, --min-width: which stacks, and how they are drawn (diff too)."""
    # kind and value are checked by kvprof.export, whose message is one line
    p.add_argument("--kind", default="cpu", metavar="K", help="cpu, offcpu or locks (default: cpu)")
    p.add_argument(
        "--prefix",
        choices=("thread", "socket"),
        help="add each stack's thread name, or the socket its thread ran on most, as its root frame",
    )
    p.add_argument(
        "--value",
        metavar="UNIT",
        help="what a stack counts: samples (cpu), ns (offcpu, locks; the default) or waits (locks)",
    )
    p.add_argument(
        "--min-width",
        type=number(float, lo=0),
        default=0.1,
        metavar="PX",
        help="SVG: frames narrower than PX pixels are not drawn (default: %(default)s)",
    )


def profile_stem(path: str) -> str:
    """base.json.gz -> base."""
    name = Path(path).name
    for ending in (".json.gz", ".json", ".gz"):
        if name.endswith(ending) and len(name) > len(ending):
            return name[: -len(ending)]
    return name


def default_output(profile_path: str, kind: str) -> Path:
    """base.json.gz -> base.cpu.svg, in the current directory."""
    return Path(f"{profile_stem(profile_path)}.{kind}.svg")


def run(args: argparse.Namespace) -> int:
    from kvprof.export import ExportError, Options, format_of, write
    from kvprof.export.stacks import check_kind

    out = args.output or default_output(args.file, args.kind)
    try:  # a bad request is told before the profile is read
        check_kind(args.kind, args.value)
        format_of(out)
    except ExportError as e:
        return fail("flamegraph", str(e))
    profile = read_profile("flamegraph", args.file)
    if profile is None:
        return 2
    options = Options(prefix=args.prefix, value=args.value, width=args.width, min_width=args.min_width)
    try:
        written = write(profile, args.kind, out, options)
    except ExportError as e:
        return fail("flamegraph", str(e))
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        return malformed("flamegraph", args.file, e)
    if written.empty:
        print(
            f"kvprof flamegraph: warning: {args.file} has no {args.kind} samples; "
            f"{out} says so (collectors recorded: {', '.join(profile.collectors) or 'none'})",
            file=sys.stderr,
        )
    print(written.describe(), file=sys.stderr)
    return 0
