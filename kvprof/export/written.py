"""What an export is asked for and what it wrote: the output name's format,
the drawing options, and the one line that says what was written. Every
format's writer (svg, folded, speedscope here in kvprof.export, pprof.py)
returns a Written."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kvprof.export.stacks import ExportError
from kvprof.export.svg import MIN_WIDTH, WIDTH, format_value

# output name ending -> format; the longest ending is tried first
FORMATS = {".speedscope.json": "speedscope", ".folded": "folded", ".svg": "svg", ".pb.gz": "pprof"}


def format_of(out: str | os.PathLike[str]) -> str:
    """The format an output name asks for; ExportError for any other name."""
    name = Path(out).name.lower()
    for ending, fmt in FORMATS.items():
        if name.endswith(ending) and len(name) > len(ending):
            return fmt
    raise ExportError(f"{os.fspath(out)}: unknown output type; name it .svg, .folded or .speedscope.json")


@dataclass(frozen=True)
class Options:
    prefix: str | None = None  # "thread" or "socket": an extra root frame per stack
    value: str | None = None  # the kind's unit (samples, ns) unless "waits" for locks
    width: int = WIDTH  # px of the SVG
    min_width: float = MIN_WIDTH  # px: narrower SVG frames are pruned

    def check(self) -> None:
        if self.width < 200:
            raise ExportError(f"width {self.width} px is too narrow for a flame graph (200 or more)")
        if self.min_width < 0:
            raise ExportError(f"minimum frame width {self.min_width:g} px must be 0 or more")


@dataclass
class Written:
    """What an export wrote."""

    path: str
    kind: str
    format: str  # svg | folded | speedscope
    unit: str  # samples | ns | waits
    total: int
    stacks: int  # distinct stacks
    frames: int = 0  # SVG: frames drawn
    pruned: int = 0  # SVG: frames too narrow to draw
    profiles: int = 0  # speedscope: profiles (threads)

    @property
    def empty(self) -> bool:
        return self.total == 0

    def describe(self) -> str:
        amount = "no samples" if self.empty else format_value(self.total, self.unit)
        if self.format == "svg":
            return (
                f"wrote {self.path}: {self.kind}, {amount}, {self.frames:,} frames ({self.pruned:,} pruned)"
            )
        if self.format == "speedscope":
            many = "profile" if self.profiles == 1 else "profiles"
            return f"wrote {self.path}: {self.kind}, {amount}, {self.profiles} {many} (one per thread)"
        return f"wrote {self.path}: {self.kind}, {amount} in {self.stacks:,} stacks"
