"""One module per `kvprof` command, each with:

    def add_parser(commands: argparse._SubParsersAction) -> None
        # adds the subcommand with `command()` (its help, description and
        # `examples:` epilog), and set_defaults(run=<function taking the
        # Namespace, returning the exit status>)

The options several commands take (--pid, --hz, --collectors, --interval,
--duration) are defined here once; the collectors' defaults come from
kvprof.collect.CollectOptions, where they live (docs/design.md, "Where each
default lives").

Modules here import only the standard library, kvprof.model and
kvprof.collect's package (its options, no bcc) at import time; anything heavy
(bcc, textual, pyperf) and every later stage is imported inside the run
function, so `kvprof --help` and the commands that do not need BPF or the TUI
never load them (tests/test_layers.py checks it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

from kvprof.collect import CollectOptions
from kvprof.model.profile import Profile, ProfileError

T = TypeVar("T")


def number(kind: type[int] | type[float], lo: float | None = None, hi: float | None = None,
           *, above: float | None = None) -> Callable[[str], float]:  # fmt: skip
    """An argparse `type=` that parses `kind` and checks its range (`above`: strictly greater)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not {'an integer' if kind is int else 'a number'}: {text!r}"
            ) from None
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"must be > {above:g}: {text!r}")
        if lo is not None and hi is not None and not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be {lo:g}..{hi:g}: {text!r}")
        if lo is not None and value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo:g}: {text!r}")
        if hi is not None and value > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi:g}: {text!r}")
        return value

    return parse


def command(commands: Any, name: str, help: str, description: str, examples: str) -> argparse.ArgumentParser:
    """The subcommand `name`: its one-line help, its description and its `examples:`
    epilog, printed as written."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=help,
        description=description,
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


# ---- the options several commands share -----------------------------------------------


def pid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a PID: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"not a PID: {text!r}")
    return value


def collectors(text: str) -> tuple[str, ...]:
    from kvprof.collect.session import ALL_COLLECTORS

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for n in names:
        if n not in ALL_COLLECTORS:
            raise argparse.ArgumentTypeError(
                f"unknown collector {n!r} (choose from {', '.join(ALL_COLLECTORS)})"
            )
    return names


def add_pid(p: Any, help: str, required: bool = True) -> None:
    """-p/--pid; `p` may be a mutually exclusive group (then not required itself)."""
    p.add_argument("-p", "--pid", type=pid, required=required, help=help)


def add_hz(p: argparse.ArgumentParser) -> None:
    """--hz, the on-CPU sampling rate (CollectOptions.hz)."""
    p.add_argument("--hz", type=number(int, 1, 10000), default=CollectOptions.hz,
                   help="on-CPU samples a second per CPU (default: %(default)s)")  # fmt: skip


def add_inline(p: argparse.ArgumentParser) -> None:
    """--no-inline: no `name [inlined]` frames (CollectOptions.inline)."""
    p.add_argument("--no-inline", dest="inline", action="store_false", default=CollectOptions.inline,
                   help="no `name [inlined]` frames from the target's DWARF (each function "
                   "sampled is read once: docs/record.md gives the cost)")  # fmt: skip


def add_collectors(p: argparse.ArgumentParser) -> None:
    p.add_argument("--collectors", type=collectors, default=(), metavar="A,B", help="subset of collectors")


def add_seconds(p: argparse.ArgumentParser, *flags: str, help: str, **kw: Any) -> None:
    """A SEC option (--duration, --interval...): a number of seconds, > 0 unless
    `type` says otherwise; help gets the default appended when there is one."""
    kw.setdefault("type", number(float, above=0))
    if kw.get("default") is not None:
        help += " (default: %(default)s)"
    p.add_argument(*flags, metavar="SEC", help=help, **kw)


def options(cls: type[T], args: object) -> T:
    """The run function's options dataclass, each field from the argument (or attribute:
    another options object) of that name (fields without one keep their default)."""
    given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}  # type: ignore[arg-type]
    return cls(**given)


# ---- what a command says when it cannot go on -------------------------------------------


def fail(name: str, message: str, status: int = 2) -> int:
    """Say `kvprof NAME: MESSAGE` on stderr (one line); the exit status."""
    print(f"kvprof {name}: {message}", file=sys.stderr)
    return status


def read_profile(name: str, path: str) -> Profile | None:
    """The profile at `path`, or None once `kvprof NAME: why` is said."""
    try:
        return Profile.load(path)
    except ProfileError as e:
        fail(name, str(e))
        return None


def malformed(name: str, path: str, e: Exception) -> int:
    """Fields of the wrong type pass the loader's checks but not the arithmetic."""
    return fail(name, f"{path}: malformed kvprof profile ({type(e).__name__}: {e})")
