"""How long `kvprof top`'s Flame view takes to lay out a big profile.

    .venv/bin/python bench/flame_layout.py [--samples 1000000] [--stacks 100000] [--width 132] [--repeat 5]

The synthetic on-CPU profile of bench/flamegraph_speed.py (the SVG
benchmark's: seeded, `--stacks` distinct stacks 4 to 40 frames deep,
`--samples` samples with a Zipf-like skew). It times, `--repeat` times each,
the steps of kvprof.export.icicle that the view runs:

- prepare: the window's stacks folded and sorted into a Flame, once per new
  window (or kind, or thread);
- layout: the icicle at `--width` columns, when the data, the width or the
  zoom changed (a refresh with none of them changed does not lay out);
- zoomed layout: the same, zoomed into the widest frame three calls deep;
- rows: the characters of the rows a 40-line terminal shows (row_pieces),
  what the widget styles for the compositor.

It prints each median; the target is a layout under 200 ms (docs/top.md
states what this machine measured). The machines are noisy: read the
median, and run it again when in doubt.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flamegraph_speed import announced

from kvprof.export.frames import Classifier
from kvprof.export.icicle import flame_of, layout, row_pieces

VISIBLE_ROWS = 32  # of a 132x40 terminal, the rest is tabs, head and status lines


def timed(what: str, repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    runs = ", ".join(f"{x * 1e3:.0f}" for x in times)
    print(f"  {what:<16} median {median * 1e3:7.1f} ms  (runs: {runs} ms)")
    return median


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--stacks", type=int, default=100_000)
    ap.add_argument("--width", type=int, default=132, help="columns (default: 132)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    profile = announced(args.samples, args.stacks)
    prepare = timed("prepare", args.repeat, lambda: flame_of(profile, "cpu"))
    flame = flame_of(profile, "cpu")
    lay = timed("layout", args.repeat, lambda: layout(flame, args.width))
    ic = layout(flame, args.width)
    deep = max((s for s in ic.spans() if len(s.path) == 3), key=lambda s: s.value)
    zoomed = timed("zoomed layout", args.repeat, lambda: layout(flame, args.width, deep.path))
    kind = Classifier(profile)
    shown = ic.rows[:VISIBLE_ROWS]
    timed("rows", args.repeat, lambda: [row_pieces(r, ic.width, kind) for r in shown])
    print(
        f"  {sum(len(r) for r in ic.rows):,} frames drawn in {len(ic.rows)} rows at {args.width} columns, "
        f"{ic.pruned:,} pruned (under half a column)"
    )
    worst = max(lay, zoomed)
    print(
        f"  target: layout < 200 ms {'met' if worst < 0.2 else 'NOT met'} ({worst * 1e3:.0f} ms); "
        f"prepare (once per new window) {prepare * 1e3:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
