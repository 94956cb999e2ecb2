"""pprof export: a gzip'd `perftools.profiles.Profile` protobuf (pprof_schema.py).

The format `go tool pprof`, Pyroscope and Parca ingest. One file holds one
kind of stacks, taken by kvprof.export.stacks exactly as the folded export
takes them, so the two always agree on functions and totals:

- `cpu`: sample types `samples/count` and `cpu/nanoseconds` (samples times
  the sampling period, 1/hz), period type `cpu/nanoseconds`.
- `offcpu`: `wait/nanoseconds`.
- `locks`: `contentions/count` and `wait/nanoseconds` (as Go's mutex
  profile names them); the lock or futex is the leaf frame.

The default sample type is the time one. Every sample of one thread carries
the string labels `thread` (the TID), `thread_name` and `socket` (the
socket the thread ran on most); lock-probe stacks that several threads
waited at carry none. Frames become functions and locations: a py-spy frame
`name (file.py:12)` is function `name` in `file.py` at line 12; any other
frame (a symbol, `module+0xoffset`, a kernel frame ending in `_[k]`) is a
function of that name without a file. A frame inlined into the one before
it (`name [inlined]`) shares that frame's location, as pprof has it: one
location per address, its `Line`s the inlined functions innermost first and
the function they were inlined into last; pprof marks the inlined ones
itself, so their function names carry no `[inlined]`. One mapping, the target's executable,
is marked as symbolized: every location already has its function, so pprof
looks nothing up.
"""

from __future__ import annotations

import gzip
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvprof import __version__
from kvprof.export.pprof_schema import MESSAGES
from kvprof.export.stacks import TITLES, ExportError, check_kind, stacks, thread_name
from kvprof.export.written import Options, Written
from kvprof.model.profile import INLINED, Profile

ENDING = ".pb.gz"

# kind -> [(sample type, unit, kvprof's unit for stacks())]; the last one is the default
SAMPLE_TYPES: dict[str, list[tuple[str, str, str]]] = {
    "cpu": [("samples", "count", "samples"), ("cpu", "nanoseconds", "samples")],
    "offcpu": [("wait", "nanoseconds", "ns")],
    "locks": [("contentions", "count", "waits"), ("wait", "nanoseconds", "ns")],
}

# `name (path/file.py:123)` as py-spy writes a Python frame; `name (libc.so.6)` a native one
_SOURCE_FRAME = re.compile(r"^(?P<name>.+?) \((?P<file>[^\s():]+)(?::(?P<line>\d+))?\)$")


def split_frame(frame: str) -> tuple[str, str, int]:
    """(function name, file name, line) of a frame; "" and 0 where it has none."""
    m = _SOURCE_FRAME.match(frame)
    if m is None:
        return frame, "", 0
    return m["name"], m["file"], int(m["line"] or 0)


@dataclass
class _Builder:
    """Interns strings, functions and locations as the Profile message wants them."""

    strings: dict[str, int] = field(default_factory=lambda: {"": 0})
    functions: dict[tuple[str, str], int] = field(default_factory=dict)
    # (function id, line) of each Line, innermost first -> location id
    locations: dict[tuple[tuple[int, int], ...], int] = field(default_factory=dict)

    def s(self, text: str) -> int:
        return self.strings.setdefault(text, len(self.strings))

    def location(self, frames: list[str]) -> int:
        """The location of one address: its frames root first, the inlined ones last."""
        lines = []
        for frame in reversed(frames):
            name, filename, line = split_frame(frame.removesuffix(INLINED))
            lines.append((self.functions.setdefault((name, filename), len(self.functions) + 1), line))
        return self.locations.setdefault(tuple(lines), len(self.locations) + 1)


def by_address(frames: tuple[str, ...]) -> list[list[str]]:
    """A root..leaf stack cut into the frames of each address, leaf first: a frame
    and the `[inlined]` frames that follow it."""
    out: list[list[str]] = []
    for frame in frames:
        if out and frame.endswith(INLINED):
            out[-1].append(frame)
        else:
            out.append([frame])
    return out[::-1]


def _thread_socket(profile: Profile, tid: int) -> str:
    info = profile.threads.get(str(tid))
    if info is None or not info.sockets:
        return "unknown"
    return max(sorted(info.sockets), key=lambda s: info.sockets[s])


def _merged(profile: Profile, kind: str) -> dict[tuple[tuple[str, ...], int | None], list[int]]:
    """(frames, tid) -> one value per sample type, in SAMPLE_TYPES order."""
    types = SAMPLE_TYPES[kind]
    by_unit: dict[tuple[tuple[str, ...], int | None], dict[str, int]] = {}
    for unit in dict.fromkeys(kv_unit for _, _, kv_unit in types):
        for st in stacks(profile, kind, unit):
            values = by_unit.setdefault((st.frames, st.tid), {})
            values[unit] = values.get(unit, 0) + st.value
    # cpu/nanoseconds: each sample stands for one sampling period of CPU time
    scale = [_period_ns(profile) if name == "cpu" else 1 for name, _, _ in types]
    return {
        key: [values.get(unit, 0) * k for (_, _, unit), k in zip(types, scale, strict=True)]
        for key, values in by_unit.items()
    }


def _period_ns(profile: Profile) -> int:
    return round(1e9 / profile.hz) if profile.hz > 0 else 0


def pprof_message(profile: Profile, kind: str) -> Any:
    """The `perftools.profiles.Profile` message of `kind` of `profile`."""
    check_kind(kind)
    msg = MESSAGES["Profile"]()
    b = _Builder()
    types = SAMPLE_TYPES[kind]
    if kind == "cpu" and profile.hz <= 0:
        types = types[:1]  # no rate, no time: samples only
    for name, unit, _ in types:
        msg.sample_type.add(type=b.s(name), unit=b.s(unit))
    msg.default_sample_type = b.s(types[-1][0])
    if kind == "cpu" and profile.hz > 0:
        msg.period_type.type = b.s("cpu")
        msg.period_type.unit = b.s("nanoseconds")
        msg.period = _period_ns(profile)
    labels: dict[int, list[tuple[int, int]]] = {}
    for (frames, tid), values in _merged(profile, kind).items():
        sample = msg.sample.add()
        sample.location_id.extend(b.location(group) for group in by_address(frames))  # leaf first
        sample.value.extend(values[: len(types)])
        if tid is not None:
            if tid not in labels:
                labels[tid] = [
                    (b.s("thread"), b.s(str(tid))),
                    (b.s("thread_name"), b.s(thread_name(profile, tid))),
                    (b.s("socket"), b.s(_thread_socket(profile, tid))),
                ]
            for key, value in labels[tid]:
                sample.label.add(key=key, str=value)
    for (name, filename), fid in b.functions.items():
        msg.function.add(id=fid, name=b.s(name), system_name=b.s(name), filename=b.s(filename))
    t = profile.target
    # One mapping, the target's executable, marked as symbolized: pprof names the file
    # in its header and looks nothing up.
    with_lines = any(line for lines in b.locations for _, line in lines)
    msg.mapping.add(
        id=1,
        filename=b.s(t.exe or t.comm),
        has_functions=True,
        has_filenames=with_lines,
        has_line_numbers=with_lines,
    )
    for lines, lid in b.locations.items():
        location = msg.location.add(id=lid, mapping_id=1)
        for fid, line in lines:
            location.line.add(function_id=fid, line=line)
    backend = profile.status.collectors.get("oncpu" if kind == "cpu" else "offcpu", "")
    note = f"kvprof {__version__}: {t.comm or 'process'} PID {t.pid}, {TITLES[kind]}"
    if backend.startswith("ok (") and backend.endswith(")"):  # another backend than BPF: say which
        note += f" from {backend[4:-1]}"
    msg.comment.append(b.s(note))
    msg.time_nanos = int(profile.window.start * 1e9)
    msg.duration_nanos = int(profile.window.duration_s * 1e9)
    msg.string_table.extend(b.strings)  # dicts keep insertion order: index i is string i
    return msg


def encode(profile: Profile, kind: str) -> bytes:
    """`kind` of `profile` as gzip'd pprof bytes (what a `.pb.gz` file holds)."""
    return gzip.compress(pprof_message(profile, kind).SerializeToString(), mtime=0)


def write_pprof(
    profile: Profile, kind: str, out: str | os.PathLike[str], options: Options | None = None
) -> Written:
    """Writes `kind` of `profile` to `out` (.pb.gz)."""
    if options is not None and options.value is not None:
        check_kind(kind, options.value)  # both values are in the file; a wrong one is still wrong
    msg = pprof_message(profile, kind)
    data = gzip.compress(msg.SerializeToString(), mtime=0)
    try:
        Path(out).write_bytes(data)
    except OSError as e:
        raise ExportError(f"{os.fspath(out)}: cannot write it ({e.strerror or e})") from None
    if kind == "cpu":
        total, unit = sum(s.value[0] for s in msg.sample), "samples"
    else:  # the default sample type: wait/nanoseconds
        total, unit = sum(s.value[-1] for s in msg.sample), "ns"
    return Written(os.fspath(out), kind, "pprof", unit, total=total, stacks=len(msg.sample))
