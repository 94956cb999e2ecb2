"""A flame graph in character cells: an icicle (root at the top), one row per
call depth, each frame as many columns as its share of the value.

`layout` is the one layout both `kvprof top`'s Flame view and `kvprof report
--flame` draw; `row_pieces` is the one place a row's characters are chosen,
so the screen and the plain text show the same frames in the same columns
with the same labels. The TUI colours the pieces; the text prints them.

A frame starts with `▏` (a thin line between neighbours), then its name, `★`
first when the hotspot catalog knows it, cut with `…` when it does not fit.
Column edges are rounded from exact value units, so a callee never spills
out of its caller; a frame that rounds to no column is not drawn, nor
anything it called. Zoomed into a frame, its callers stay as full-width
rows above it, as in the SVG.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvprof.export.frames import HOTSPOT
from kvprof.export.stacks import check_kind, fold, stacks
from kvprof.export.tree import ROOT, Flame
from kvprof.model.profile import Profile

EDGE = "▏"
CUT = "…"
STAR = "★"


@dataclass(frozen=True, slots=True)
class Span:
    """One frame drawn on a row."""

    col: int  # first column
    width: int  # columns, at least 1
    name: str
    path: tuple[str, ...]  # the call path down to this frame, root first; () is the root
    value: int
    caller: bool = False  # a caller of the zoomed frame, drawn full width above it


@dataclass
class Icicle:
    rows: list[list[Span]]  # row r holds the frames at depth r, left to right
    width: int  # columns
    total: int  # the whole graph's value
    zoom: tuple[str, ...]  # the frame that fills the width; () for the root
    focus: int  # the zoomed frame's value
    pruned: int  # frames not drawn: narrower than half a column
    pruned_value: int

    def find(self, path: tuple[str, ...]) -> tuple[int, int] | None:
        """(row, index) of the frame at `path`, when it is drawn."""
        row = len(path)
        if row >= len(self.rows):
            return None
        for i, span in enumerate(self.rows[row]):
            if span.path == path:
                return row, i
        return None

    def spans(self) -> Iterator[Span]:
        for row in self.rows:
            yield from row


def flame_of(profile: Profile, kind: str, tid: int | None = None) -> Flame:
    """The stacks of `kind` (kvprof.export.stacks), of one thread or all, ready to lay out."""
    items = stacks(profile, kind, check_kind(kind))
    if tid is not None:
        items = [s for s in items if s.tid == tid]
    return Flame(fold(items))


def _edge(x: int, z0: int, focus: int, width: int) -> int:
    """Column of value offset `x`, rounded half up, in exact integers."""
    return ((x - z0) * width * 2 + focus) // (2 * focus)


def layout(flame: Flame, width: int, zoom: tuple[str, ...] = ()) -> Icicle:
    """The icicle of `flame` in `width` columns, zoomed into the frame at `zoom`."""
    width = max(width, 1)
    focus = flame.value_of(zoom)
    callers = [(d, flame.value_of(zoom[:d])) for d in range(len(zoom))]
    # nothing at `zoom` (any more): the callers that are left, as a path to it
    rows = [[Span(0, width, zoom[d - 1] if d else ROOT, zoom[:d], v, True)] for d, v in callers if v > 0]
    if focus <= 0:
        return Icicle(rows, width, flame.total, zoom, 0, 0, 0)
    boxes = flame.layout(focus / width / 2, zoom)
    z0 = boxes.boxes[0].start
    for box in boxes.boxes:  # depth first: each row comes out left to right
        c0 = _edge(box.start, z0, focus, width)
        c1 = _edge(box.start + box.value, z0, focus, width)
        if c1 <= c0:
            continue
        while len(rows) <= box.depth:
            rows.append([])
        rows[box.depth].append(Span(c0, c1 - c0, box.name, flame.path(box), box.value))
    while rows and not rows[-1]:
        rows.pop()
    for row in rows:
        row.sort(key=lambda s: s.col)
    return Icicle(rows, width, flame.total, zoom, focus, boxes.pruned, boxes.pruned_value)


Kind = Callable[[str, int], str]  # frame name, depth -> frame type (kvprof.export.frames)


def label(span: Span, kind: Kind, fill: str = " ") -> str:
    """The span's characters: exactly span.width of them."""
    name = (STAR if kind(span.name, len(span.path)) == HOTSPOT else "") + span.name
    room = span.width - 1
    if len(name) > room:
        name = name[: room - 1] + CUT if room >= 3 else ""
    return EDGE + name + fill * (room - len(name))


def row_pieces(row: list[Span], width: int, kind: Kind, fill: str = " ") -> list[tuple[str, Span | None]]:
    """A row as (text, span) pieces left to right, None for the gaps, `width` columns in all."""
    out: list[tuple[str, Span | None]] = []
    col = 0
    for span in row:
        if span.col > col:
            out.append((" " * (span.col - col), None))
        out.append((label(span, kind, fill), span))
        col = span.col + span.width
    if col < width:
        out.append((" " * (width - col), None))
    return out


def text_rows(icicle: Icicle, kind: Kind) -> list[str]:
    """The icicle as plain text, a line per row; a frame's extent is drawn with `─`."""
    return ["".join(t for t, _ in row_pieces(row, icicle.width, kind, "─")).rstrip() for row in icicle.rows]


def hotspots(flame: Flame, icicle: Icicle, kind: Kind) -> list[tuple[str, int]]:
    """The drawn frames the hotspot catalog knows, each with the value of the stacks
    that pass through it (a recursion counted once), the biggest first: what a frame
    too narrow for its name still tells."""
    names = {s.name for s in icicle.spans() if s.path and kind(s.name, len(s.path)) == HOTSPOT}
    cum, out = flame.cum, []
    for name in names:
        value = sum(cum[i + 1] - cum[i] for i, stack in enumerate(flame.stacks) if name in stack)
        out.append((name, value))
    return sorted(out, key=lambda nv: (-nv[1], nv[0]))


def hotspot_note(flame: Flame, icicle: Icicle, kind: Kind) -> str:
    """`★ update_topkeys 12.3% · collect_timings 2.1%`: the hotspots drawn, with their share."""
    marked = hotspots(flame, icicle, kind)
    if not marked or not flame.total:
        return ""
    return STAR + " " + " · ".join(f"{name} {value / flame.total:.1%}" for name, value in marked)


def matched(flame: Flame, needle: str) -> int:
    """The value under any frame whose name contains `needle` (case-insensitive),
    a match inside a match counted once."""
    n = needle.lower()
    if not n:
        return 0
    cum, total = flame.cum, 0
    for i, stack in enumerate(flame.stacks):
        if any(n in f.lower() for f in stack):
            total += cum[i + 1] - cum[i]
    return total
