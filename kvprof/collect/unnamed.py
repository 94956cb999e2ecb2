"""The modules whose code a profile's frames name without a symbol: `module+0x...`.

Such a frame is the start of the function the module's unwind table (an FDE)
covers, or, where no FDE covers the code, the address itself
(kvprof.collect.debuginfo). The profile says which modules those were, where
their names came from (nothing, or only the exported functions), how many
functions were named by their start, and which frames lie outside any FDE; what
would give them names is added by the command that records (kvprof.system.debugpkg).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator

from kvprof.collect.debuginfo import ProcessSymbols
from kvprof.collect.procroot import mapped_file
from kvprof.collect.unwind import build_id, function_start
from kvprof.model.profile import INLINED, MissingSymbols, Profile

_UNNAMED = re.compile(r"^(?P<module>[^\s;]+)\+0x(?P<offset>[0-9a-f]+)$")


def _frames(profile: Profile) -> Iterator[str]:
    for s in profile.oncpu:
        yield from s.frames
    for o in profile.offcpu.stacks:
        yield from o.frames
    for w in profile.offcpu.futex:
        yield from w.frames
    for lk in profile.locks:
        for ls in lk.stacks:
            yield from ls.frames
    for a in profile.addresses.samples:
        yield a.function


def unnamed_offsets(profile: Profile) -> dict[str, set[int]]:
    """Module name -> the offsets of the frames that name it `module+0x...` (user code only)."""
    out: dict[str, set[int]] = defaultdict(set)
    for frame in set(_frames(profile)):
        m = _UNNAMED.match(frame.removesuffix(INLINED))
        if m is not None and not frame.endswith("_[k]"):
            out[m["module"]].add(int(m["offset"], 16))
    return out


def missing_symbols(pid: int, profile: Profile) -> list[MissingSymbols]:
    """The target's modules that had no symbol for some of the profile's frames, most
    such functions first ([] once the target is gone: its mappings cannot be read)."""
    wanted = unnamed_offsets(profile)
    proc = ProcessSymbols(pid)
    if not wanted or not proc.refresh():
        return []
    out = []
    for m in proc.maps:
        if m.name not in wanted or not m.path.startswith("/") or "x" not in m.perms:
            continue
        offsets = wanted.pop(m.name)
        syms, _ = proc.module(m)
        image = mapped_file(pid, m.path, m.start, m.end, m.inode)
        outside = sorted(off for off in offsets if function_start(image, off) is None)
        out.append(
            MissingSymbols(
                module=m.name,
                path=m.path.removesuffix(" (deleted)"),
                build_id=build_id(image) or "",
                names=syms.source,
                functions=len(offsets) - len(outside),
                outside_unwind=[f"{m.name}+0x{off:x}" for off in outside],
            )
        )
    return sorted(out, key=lambda x: -x.functions)
