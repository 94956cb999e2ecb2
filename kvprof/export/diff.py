"""The differential flame graph: how a profile changed from BASE to NEW.

Drawn in NEW's shape (BASE's with `negate`, which shows what NEW no longer
has), every frame coloured by how its share of the total changed: red where
it grew, blue where it shrank, the deeper the more, grey where it stayed.
Shares, not raw values, because two recordings seldom have the same length
or rate: `update_topkeys` at 12 % of BASE's samples and 1 % of NEW's shrank
by 11 points whatever the totals. A frame is matched by its whole call path;
one that only one of the two profiles has counts as 0 % in the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvprof.export.stacks import TITLES, check_kind, fold, stacks, with_prefix
from kvprof.export.svg import MIN_WIDTH, WIDTH, Chart, format_value, min_value, render
from kvprof.export.tree import Box, Flame, Layout
from kvprof.model.profile import Profile

GREW, SHRANK, SAME = "#d7301f", "#2166ac", "#e4e4e4"
_PALE = (0xF2, 0xF2, 0xF2)
SAME_BELOW = 0.0001  # a change under 0.01 points of share counts as none


@dataclass
class DiffResult:
    svg: str
    layout: Layout
    base_total: int
    new_total: int
    grew: int  # frames drawn red
    shrank: int  # frames drawn blue


def _mix(colour: str, t: float) -> str:
    """`colour` at strength t (0..1) over a pale grey."""
    rgb = (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))
    c = [round(p + (q - p) * t) for p, q in zip(_PALE, rgb, strict=True)]
    return f"#{c[0]:02x}{c[1]:02x}{c[2]:02x}"


def change_colour(before: float, after: float, biggest: float) -> tuple[str, str]:
    """(colour, "up" | "down" | "same") of a frame whose share went from `before` to
    `after`, the colour the deeper the nearer the change is to `biggest` (> 0)."""
    delta = after - before
    if abs(delta) < SAME_BELOW:
        return SAME, "same"
    strength = 0.25 + 0.75 * abs(delta) / biggest
    return (_mix(GREW, strength), "up") if delta > 0 else (_mix(SHRANK, strength), "down")


def diff(
    base: Profile,
    new: Profile,
    kind: str,
    *,
    negate: bool = False,
    value: str | None = None,
    prefix: str | None = None,
    labels: tuple[str, str] = ("BASE", "NEW"),
    width: int = WIDTH,
    min_width: float = MIN_WIDTH,
) -> DiffResult:
    """The differential SVG of `kind` from `base` to `new`."""
    unit = check_kind(kind, value)
    folded_base = fold(with_prefix(base, stacks(base, kind, unit), prefix))
    folded_new = fold(with_prefix(new, stacks(new, kind, unit), prefix))
    flame_base, flame_new = Flame(folded_base), Flame(folded_new)
    shape, other = (flame_base, flame_new) if negate else (flame_new, flame_base)
    drawn = shape.layout(min_value(shape.total, width, min_width))
    twins = {id(box): other.value_of(shape.path(box)) for box in drawn.boxes}
    tb, tn = flame_base.total, flame_new.total

    def shares(box: Box) -> tuple[float, float, int, int]:
        v, o = box.value, twins[id(box)]
        b, n = (v, o) if negate else (o, v)
        return (b / tb if tb else 0.0), (n / tn if tn else 0.0), b, n

    deltas = [abs(n - b) for b, n, _, _ in map(shares, drawn.boxes)]
    biggest = max(deltas, default=0.0) or 1.0
    counts = {"up": 0, "down": 0}

    def style(box: Box) -> tuple[str, str, str]:
        sb, sn, b, n = shares(box)
        tip = (
            f"{sb:.2%} -> {sn:.2%} of the total ({(sn - sb) * 100:+.2f} points); "
            f"{format_value(b, unit)} -> {format_value(n, unit)}"
        )
        colour, cls = change_colour(sb, sn, biggest)
        if cls in counts:
            counts[cls] += 1
        return colour, tip, cls

    shape_label = labels[0] if negate else labels[1]
    chart = Chart(
        title=f"Differential {TITLES[kind]} flame graph: {labels[0]} -> {labels[1]}",
        subtitle=(
            f"{kind} · shape of {shape_label} · colour: change in share of the total · "
            f"{labels[0]}: {format_value(tb, unit)} · {labels[1]}: {format_value(tn, unit)}"
        ),
        kind=kind,
        unit=unit,
        legend=[
            (GREW, f"grew in {labels[1]}"),
            (SHRANK, f"shrank in {labels[1]}"),
            (SAME, "unchanged"),
        ],
        width=width,
        min_width=min_width,
        empty_text=f"no samples: {shape_label} has no {kind} stacks",
    )
    svg = render(drawn, chart, style)
    return DiffResult(svg, drawn, tb, tn, counts["up"], counts["down"])
