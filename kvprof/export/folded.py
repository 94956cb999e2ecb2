"""Folded stacks: the interchange format of flame-graph tools.

One line per distinct stack, `root;caller;...;leaf VALUE`, as `flamegraph.pl`,
inferno and speedscope read it: frames joined by `;`, one space, the value
(samples, ns or waits) as an integer. Kernel frames keep their `_[k]`
suffix. Lines are sorted by stack, so the same profile always gives the same
text and two files can be compared with `diff`.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvprof.export.stacks import ExportError

Folded = Mapping[tuple[str, ...], int]


def format_folded(folded: Folded) -> str:
    """The folded text of `folded` (stack -> value), one line per stack."""
    return "".join(f"{';'.join(frames)} {value}\n" for frames, value in sorted(folded.items()) if value > 0)


def parse_folded(text: str) -> dict[tuple[str, ...], int]:
    """Folded text back into stack -> value; the same stack on several lines is summed."""
    out: dict[tuple[str, ...], int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.rstrip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            raise ExportError(f"folded line {n} is not `frame;frame;... COUNT`: {line[:80]!r}")
        frames = tuple(stack.split(";"))
        out[frames] = out.get(frames, 0) + int(count)
    return out
