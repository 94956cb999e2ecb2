"""The flame graph in character cells (kvprof.export.icicle) and `kvprof report --flame` (no root).

The layout is the one `kvprof top`'s Flame view draws; the golden text files
pin what `report --flame` prints for the profiles kept in tests/ (regenerate
with KVPROF_REGEN_GOLDEN=1, and say why).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from support import kvprof

from kvprof.export.frames import APP, HOTSPOT
from kvprof.export.icicle import (
    EDGE,
    Icicle,
    hotspot_note,
    label,
    layout,
    matched,
    row_pieces,
    text_rows,
)
from kvprof.export.tree import Flame
from kvprof.model.profile import Profile
from kvprof.views.flame import render_text

TESTS = Path(__file__).resolve().parent
GOLDEN = TESTS / "golden" / "report"
BASELINE = TESTS / "fixtures" / "top-baseline.json"

FOLDED = {
    ("start_thread", "worker_main", "process_commands", "update_topkeys"): 30,
    ("start_thread", "worker_main", "process_commands", "items_get", "lookup_locked"): 50,
    ("start_thread", "worker_main", "process_commands"): 10,
    ("start_thread", "worker_main", "epoll_wait"): 10,
}


def plain(name: str, depth: int) -> str:
    return HOTSPOT if name == "update_topkeys" else APP


def widths(ic: Icicle) -> dict[str, int]:
    return {s.name: s.width for s in ic.spans()}


def test_frames_are_as_wide_as_their_share() -> None:
    """At 100 columns a frame of 30 % of the samples is 30 columns, its callers above it, root at the top."""
    ic = layout(Flame(FOLDED), 100)
    assert [[s.name for s in row] for row in ic.rows] == [
        ["all"],
        ["start_thread"],
        ["worker_main"],
        ["epoll_wait", "process_commands"],
        ["items_get", "update_topkeys"],
        ["lookup_locked"],
    ]
    assert widths(ic) == {
        "all": 100, "start_thread": 100, "worker_main": 100, "process_commands": 90, "epoll_wait": 10,
        "items_get": 50, "update_topkeys": 30, "lookup_locked": 50,
    }  # fmt: skip
    # a frame's own samples come first, then its callees in name order (as in the SVG)
    assert {s.name: s.col for s in ic.rows[4]} == {"items_get": 20, "update_topkeys": 70}


def test_callees_stay_inside_their_caller() -> None:
    """Rounded column edges never let a callee spill out of its caller, at any width."""
    flame = Flame({("a", f"f{i}", "g"): 1 + i % 7 for i in range(50)})
    for width in (7, 13, 80, 131):
        ic = layout(flame, width)
        for r in range(1, len(ic.rows)):
            for s in ic.rows[r]:
                parent = next(p for p in ic.rows[r - 1] if p.path == s.path[:-1])
                assert parent.col <= s.col and s.col + s.width <= parent.col + parent.width
            cols = [(s.col, s.col + s.width) for s in ic.rows[r]]
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(cols))  # no overlap


def test_zoom_fills_the_width_and_keeps_the_callers_above() -> None:
    """Zoomed into process_commands: it spans every column, its callers are full-width rows above it."""
    ic = layout(Flame(FOLDED), 100, ("start_thread", "worker_main", "process_commands"))
    assert [(s.name, s.col, s.width, s.caller) for s in ic.rows[3]] == [("process_commands", 0, 100, False)]
    assert [s.caller for r in ic.rows[:3] for s in r] == [True, True, True]
    assert ic.focus == 90
    assert {s.name: s.width for s in ic.rows[4]} == {"items_get": 56, "update_topkeys": 33}
    gone = layout(Flame(FOLDED), 100, ("start_thread", "nothing"))
    assert [s.name for r in gone.rows for s in r] == ["all", "start_thread"] and gone.focus == 0


def test_narrow_frames_are_pruned_and_counted() -> None:
    """A frame under half a column is not drawn, nor its callees; how many and their value is kept."""
    flame = Flame({("a", "big"): 1000, ("a", "tiny", "deeper"): 1})
    ic = layout(flame, 50)
    assert "tiny" not in widths(ic) and "deeper" not in widths(ic)
    assert (ic.pruned, ic.pruned_value) == (2, 1)


def test_labels_fit_their_columns() -> None:
    """Each piece is exactly its frame's width: an edge, the name (★ for a hotspot), cut with …."""
    ic = layout(Flame(FOLDED), 23)
    for row in ic.rows:
        pieces = row_pieces(row, 23, plain)
        assert sum(len(t) for t, _ in pieces) == 23
        for text, span in pieces:
            if span is not None:
                assert text.startswith(EDGE) and len(text) == span.width
    topkeys = next(s for s in ic.spans() if s.name == "update_topkeys")
    assert label(topkeys, plain) == EDGE + "★upda…"
    assert text_rows(ic, plain)[3] == EDGE + "─" + EDGE + "process_commands────"


def test_hotspot_line_names_the_marked_frames_too_narrow_to_read() -> None:
    """Under the graph: every drawn hotspot with its share, however few columns it has."""
    flame = Flame(FOLDED)
    ic = layout(flame, 12)
    assert label(next(s for s in ic.spans() if s.name == "update_topkeys"), plain) == EDGE + "★u…"
    assert hotspot_note(flame, ic, plain) == "★ update_topkeys 30.0%"
    assert hotspot_note(Flame({("a", "b"): 1}), layout(Flame({("a", "b"): 1}), 12), plain) == ""


def test_match_share_counts_a_stack_once() -> None:
    """`/`'s share: the value under any matching frame, a stack with two matches counted once."""
    flame = Flame({**FOLDED, ("start_thread", "worker_main", "topkeys_a", "topkeys_b"): 20})
    assert matched(flame, "TOPKEYS") == 50
    assert matched(flame, "") == 0


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("top-baseline.flame", ("--width", "100")),
        ("top-baseline.flame-locks", ("--kind", "locks", "--width", "80")),
    ],
)
def test_report_flame_output_is_unchanged(name: str, args: tuple[str, ...]) -> None:
    """`kvprof report FILE --flame` prints byte for byte the golden icicle."""
    r = kvprof("report", str(BASELINE), "--flame", *args)
    assert r.returncode == 0, r.stderr
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("KVPROF_REGEN_GOLDEN"):
        path.write_text(r.stdout)
    assert r.stdout == path.read_text()


def test_report_flame_is_the_layout_the_tui_draws() -> None:
    """The text's rows are text_rows() of the same layout at the same width: one layout, two renderers."""
    profile = Profile.load(BASELINE)
    out = render_text(profile, "cpu", 90).splitlines()
    from kvprof.export.frames import Classifier
    from kvprof.export.icicle import flame_of

    rows = text_rows(layout(flame_of(profile, "cpu"), 90), Classifier(profile))
    assert out[3 : 3 + len(rows)] == rows
    assert all(len(line) <= 90 for line in rows)


def test_report_flame_width_defaults_to_the_terminal() -> None:
    """Without --width the text is as wide as COLUMNS says the terminal is."""
    r = kvprof("report", str(BASELINE), "--flame", env={**os.environ, "COLUMNS": "64"})
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith(EDGE) or line.startswith(" ")]
    assert rows and max(len(line) for line in rows) == 64


def test_report_flame_bad_kind() -> None:
    """An unknown --kind is one line on stderr and exit 2."""
    r = kvprof("report", str(BASELINE), "--flame", "--kind", "heap")
    assert r.returncode == 2
    assert r.stderr.strip() == "kvprof report: unknown kind 'heap': choose cpu, offcpu or locks"
