"""`kvprof report --flame`: a profile's flame graph as plain text, the icicle
`kvprof top`'s Flame view draws (kvprof.export.icicle), at a given width."""

from __future__ import annotations

from kvprof.export.frames import Classifier
from kvprof.export.icicle import STAR, flame_of, hotspot_note, layout, text_rows
from kvprof.export.stacks import check_kind
from kvprof.export.svg import MIN_WIDTH, WIDTH, profile_chart
from kvprof.model.profile import Profile


def render_text(profile: Profile, kind: str = "cpu", width: int = 80, tid: int | None = None) -> str:
    """Title, subtitle, one line per call depth (root first), then what is marked and left out."""
    unit = check_kind(kind)
    flame = flame_of(profile, kind, tid)
    chart = profile_chart(profile, kind, unit, flame.total, None, WIDTH, MIN_WIDTH)
    lines = [chart.title, chart.subtitle + (f" · thread {tid}" if tid is not None else ""), ""]
    if not flame.total:
        return "\n".join([*lines, chart.empty_text]) + "\n"
    icicle = layout(flame, width)
    kind_of = Classifier(profile)
    lines += text_rows(icicle, kind_of)
    lines += ["", f"{STAR} known hotspot (kvprof catalog); a frame is as wide as its share of the total"]
    note = hotspot_note(flame, icicle, kind_of)
    if note:
        lines.append(note)
    if icicle.pruned:
        share = icicle.pruned_value / flame.total
        lines.append(f"{icicle.pruned:,} frames under half a column not drawn ({share:.1%} of the total)")
    return "\n".join(lines) + "\n"
