"""speedscope's JSON file format (https://www.speedscope.app/file-format-schema.json).

One `sampled` profile per thread, so speedscope's profile picker switches
between the workers; the frames are shared between them. Each distinct stack
is one sample (root first, indices into `shared.frames`) weighted by its
value: samples for `cpu` (unit `none`), nanoseconds for `offcpu` and
`locks`, waits (unit `none`) for `locks --value waits`. Lock-probe stacks
that several threads waited at are one profile of their own, `all threads`.
"""

from __future__ import annotations

import json
from typing import Any

from kvprof import __version__
from kvprof.export.stacks import TITLES, Stack, thread_name
from kvprof.model.profile import Profile

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def speedscope(profile: Profile, kind: str, unit: str, items: list[Stack]) -> dict[str, Any]:
    """The speedscope document of `items` (stacks of `kind`, valued in `unit`)."""
    frame_index: dict[str, int] = {}
    by_thread: dict[int | None, dict[tuple[int, ...], int]] = {}
    for s in items:
        key = tuple(frame_index.setdefault(f, len(frame_index)) for f in s.frames)
        stacks = by_thread.setdefault(s.tid, {})
        stacks[key] = stacks.get(key, 0) + s.value
    profiles: list[dict[str, Any]] = []
    for tid, stacks in by_thread.items():
        total = sum(stacks.values())
        name = thread_name(profile, tid) + (f" (tid {tid})" if tid is not None else "")
        profiles.append(
            {
                "type": "sampled",
                "name": name,
                "unit": "nanoseconds" if unit == "ns" else "none",
                "startValue": 0,
                "endValue": total,
                "samples": [list(k) for k in stacks],
                "weights": list(stacks.values()),
            }
        )
    profiles.sort(key=lambda p: (-p["endValue"], p["name"]))
    t = profile.target
    return {
        "$schema": SCHEMA,
        "shared": {"frames": [{"name": f} for f in frame_index]},
        "profiles": profiles,
        "name": f"{t.comm or 'process'} PID {t.pid}: {TITLES[kind]} ({unit})",
        "activeProfileIndex": 0,
        "exporter": f"kvprof {__version__}",
    }


def format_speedscope(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n"
