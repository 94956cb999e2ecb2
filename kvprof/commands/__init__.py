"""One module per `kvprof` command, each with:

    def add_parser(commands: argparse._SubParsersAction) -> None
        # adds the subcommand, with an `examples:` epilog, and
        # set_defaults(run=<function taking the Namespace, returning the exit status>)

Modules here import only the standard library and kvprof.model at import
time; anything heavy (bcc, textual, pyperf) is imported inside the run
function, so `kvprof --help` and the commands that do not need BPF or the TUI
never load them (tests/test_cli.py checks it).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


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
