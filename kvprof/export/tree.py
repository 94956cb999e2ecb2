"""Folded stacks laid out as flame-graph boxes, without building a call tree.

The stacks are sorted, as `flamegraph.pl` sorts its input: then every frame
of the graph is a run of consecutive stacks sharing a prefix, its value a
difference of two prefix sums, and its children the runs that go on sharing
one more frame. The layout walks only the frames it draws; a frame narrower
than the minimum is skipped whole, and the frames below it are counted from
prefix sums too. A profile of 100,000 distinct stacks has millions of call
tree nodes, almost all of them too thin to draw: building them as objects
took seconds, skipping them takes none.

Positions are kept in value units (`start`, `value`), exact integers;
pixels are computed from them only when drawing. Within a frame its own
value (stacks that end there) comes first, then its callees in name order,
so the same call path sits at the same place in two profiles.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass

ROOT = "all"


@dataclass(slots=True)
class Box:
    name: str
    depth: int  # 0 = the root `all`
    start: int  # value units from the left edge
    value: int
    first: int  # index of the first stack under this frame (its call path is that stack's prefix)


@dataclass
class Layout:
    boxes: list[Box]  # depth first, callers before their callees
    total: int
    depth: int  # rows drawn
    pruned: int  # frames (call tree nodes) not drawn because they were too narrow
    pruned_value: int  # the value under them


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Flame:
    """Folded stacks, sorted, with the prefix sums the layout and lookups use."""

    def __init__(self, folded: Mapping[tuple[str, ...], int]) -> None:
        # Joined with NUL, which sorts below every character a frame name has,
        # the strings sort as the tuples would, and much faster
        items = sorted(((k, v) for k, v in folded.items() if v > 0), key=lambda kv: "\0".join(kv[0]))
        self.stacks = [k for k, _ in items]
        n = len(items)
        self.cum = [0] * (n + 1)  # cum[i]: value of stacks[:i]
        self.lcp = [0] * (n + 1)  # lcp[i]: frames stacks[i] shares with stacks[i - 1]
        self.fresh = [0] * (n + 1)  # fresh[i]: call tree nodes that stacks[:i] add
        prev: tuple[str, ...] = ()
        for i, (k, v) in enumerate(items):
            common = _common(prev, k)
            self.cum[i + 1] = self.cum[i] + v
            self.lcp[i] = common
            self.fresh[i + 1] = self.fresh[i] + len(k) - common
            prev = k
        self.total = self.cum[n]

    def span(self, path: tuple[str, ...]) -> tuple[int, int]:
        """The stacks under the frame at `path` (root first): indexes [lo, hi)."""
        if not path:
            return 0, len(self.stacks)
        lo = bisect_left(self.stacks, path)
        # every stack that starts with `path` sorts before this one
        hi = bisect_left(self.stacks, (*path[:-1], path[-1] + "\0"), lo)
        return lo, hi

    def value_of(self, path: tuple[str, ...]) -> int:
        """The value under the frame at `path` (root first); 0 when no stack passes there."""
        lo, hi = self.span(path)
        return self.cum[hi] - self.cum[lo]

    def own_value(self, path: tuple[str, ...]) -> int:
        """The value of the stacks that end at `path`: the frame's self value."""
        lo, hi = self.span(path)
        # a stack equal to `path` sorts first among those under it
        return self.cum[lo + 1] - self.cum[lo] if lo < hi and len(self.stacks[lo]) == len(path) else 0

    def path(self, box: Box) -> tuple[str, ...]:
        return self.stacks[box.first][: box.depth]

    def layout(self, min_value: float, under: tuple[str, ...] = ()) -> Layout:
        """Boxes of every frame at least `min_value` wide; the narrower ones and
        every frame they called are pruned and counted. With `under` (a call
        path), only that frame and what it called: a zoom."""
        stacks, cum, lcp, fresh = self.stacks, self.cum, self.lcp, self.fresh
        lo, hi = self.span(under)
        if cum[hi] - cum[lo] <= 0:
            return Layout([], self.total, 0, 0, 0)
        boxes: list[Box] = []
        pruned = pruned_value = depth = 0
        top = Box(under[-1] if under else ROOT, len(under), cum[lo], cum[hi] - cum[lo], lo)
        todo = [(top, hi)]
        while todo:
            box, end = todo.pop()
            boxes.append(box)
            d = box.depth
            depth = max(depth, d + 1)
            a = box.first
            while a < end and len(stacks[a]) == d:  # stacks that end here: this frame's own value
                a += 1
            children = []
            while a < end:
                b = a + 1
                while b < end and lcp[b] > d:  # still the same frame at depth d + 1
                    b += 1
                value = cum[b] - cum[a]
                if value < min_value:
                    pruned += len(stacks[a]) - d + fresh[b] - fresh[a + 1]
                    pruned_value += value
                else:
                    start = box.start + cum[a] - cum[box.first]
                    children.append((Box(stacks[a][d], d + 1, start, value, a), b))
                a = b
            todo.extend(reversed(children))  # the leftmost callee is drawn first
        return Layout(boxes, self.total, depth, pruned, pruned_value)
