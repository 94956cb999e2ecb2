"""Flame graphs and stack exports of a recorded profile (docs/design.md, "Views and exports").

    from kvprof.export import export
    export(profile, "cpu", "flame.svg")
    # -> "wrote flame.svg: cpu, 12,345 samples, 812 frames (31 pruned)"

The output's name chooses the format: `.svg` an interactive flame graph
(`svg.py`), `.folded` folded stacks (`folded.py`), `.speedscope.json`
speedscope's JSON (`speedscope.py`). The kind chooses the stacks
(`stacks.py`): `cpu` on-CPU samples, `offcpu` off-CPU time, `locks` lock
wait time by call site. `diff.py` draws how one profile changed from another.
Nothing here imports bcc or textual.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvprof.export.folded import format_folded
from kvprof.export.speedscope import format_speedscope, speedscope
from kvprof.export.stacks import KINDS, ExportError, check_kind, fold, stacks, with_prefix
from kvprof.export.svg import frame_style, min_value, profile_chart, render
from kvprof.export.tree import Flame, Layout
from kvprof.export.written import FORMATS, Options, Written, format_of
from kvprof.model.profile import Profile

__all__ = ["FORMATS", "KINDS", "ExportError", "Options", "Written", "export", "format_of", "write"]


def write(
    profile: Profile, kind: str, out: str | os.PathLike[str], options: Options | None = None
) -> Written:
    """Writes `kind` of `profile` to `out` in the format its name asks for."""
    opts = options or Options()
    fmt = format_of(out)
    if fmt == "pprof":  # kvprof/export/pprof.py
        from kvprof.export.pprof import write_pprof

        return write_pprof(profile, kind, out, opts)
    unit = check_kind(kind, opts.value)
    opts.check()
    items = stacks(profile, kind, unit)
    written = Written(os.fspath(out), kind, fmt, unit, total=sum(s.value for s in items), stacks=0)
    if fmt == "speedscope":
        doc = speedscope(profile, kind, unit, items)
        written.stacks = sum(len(p["samples"]) for p in doc["profiles"])
        written.profiles = len(doc["profiles"])
        text = format_speedscope(doc)
    else:
        folded = fold(with_prefix(profile, items, opts.prefix))
        written.stacks = len(folded)
        if fmt == "folded":
            text = format_folded(folded)
        else:
            text, drawn = flame_svg(profile, kind, unit, folded, opts)
            written.frames, written.pruned = len(drawn.boxes), drawn.pruned
    try:
        Path(out).write_text(text, encoding="utf-8")
    except OSError as e:
        raise ExportError(f"{os.fspath(out)}: cannot write it ({e.strerror or e})") from None
    return written


def flame_svg(
    profile: Profile, kind: str, unit: str, folded: dict[tuple[str, ...], int], opts: Options
) -> tuple[str, Layout]:
    """The SVG flame graph of folded stacks of `kind`, and what was drawn."""
    flame = Flame(folded)
    drawn = flame.layout(min_value(flame.total, opts.width, opts.min_width))
    chart = profile_chart(profile, kind, unit, flame.total, opts.prefix, opts.width, opts.min_width)
    return render(drawn, chart, frame_style(profile, unit, flame.total, opts.prefix)), drawn


def export(profile: Profile, kind: str, out: str | os.PathLike[str]) -> str:
    """Writes `kind` ("cpu", "offcpu" or "locks") of `profile` to `out`, the format
    chosen by its name (.svg, .folded, .speedscope.json); returns one line saying
    what was written. ExportError (a one-line message) for a bad kind or name."""
    return write(profile, kind, out).describe()
