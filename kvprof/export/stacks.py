"""The stacks of one kind out of a profile: what every exporter draws.

- `cpu`: on-CPU samples (`oncpu.stacks`), valued in samples.
- `offcpu`: off-CPU time (`offcpu.stacks`), valued in ns.
- `locks`: lock wait time by call site, valued in ns (or in waits). The kvs
  lock probes (`locks[].stacks`) give the call path and the lock's name; each
  stack gets the lock as a leaf frame `[lock NAME]`. Futex waits on a lock's
  acquisition path (`offcpu.futex`, kvprof.analysis.tables.lock_waits: not a
  condition variable or a join) add the locks the probes do not see (any
  program's mutexes), with the leaf `[futex 0xADDR]`. A futex wait that the probes
  already timed is left out, or the same wait would count twice: its word
  is within 64 bytes of a probed lock (glibc's mutex word sits at its start),
  or its call path (lock plumbing removed) is that of a probed lock stack.

Stacks are root first. An empty stack (a lost stack id) becomes `[unknown]`
so that its samples still count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvprof.analysis.hotspots import is_wrapper
from kvprof.analysis.tables import lock_waits, offcpu_stacks
from kvprof.model.profile import Profile


class ExportError(Exception):
    """What was asked cannot be exported; the message is one line for the user."""


KINDS = ("cpu", "offcpu", "locks")
PREFIXES = ("thread", "socket")

# kind -> (values it can be measured in, the default first)
VALUES: dict[str, tuple[str, ...]] = {
    "cpu": ("samples",),
    "offcpu": ("ns",),
    "locks": ("ns", "waits"),
}

TITLES = {"cpu": "on-CPU", "offcpu": "off-CPU", "locks": "lock wait"}  # "<title> flame graph"

UNKNOWN = "[unknown]"
ALL_THREADS = "all threads"  # lock probe stacks carry no thread when several threads waited


@dataclass(slots=True)
class Stack:
    frames: tuple[str, ...]  # root first
    value: int
    tid: int | None = None  # None: the stack is not one thread's


def check_kind(kind: str, value: str | None = None) -> str:
    """The value unit for `kind` (its default when `value` is None); ExportError otherwise."""
    if kind not in KINDS:
        raise ExportError(f"unknown kind {kind!r}: choose cpu, offcpu or locks")
    units = VALUES[kind]
    if value is None:
        return units[0]
    if value not in units:
        raise ExportError(f"kind {kind} is measured in {' or '.join(units)}, not {value!r}")
    return value


def _clean(frames: list[str]) -> tuple[str, ...]:
    # `;` separates frames and a newline ends a line in the folded format;
    # checked on the joined stack first, as almost every stack is clean
    joined = "\0".join(frames)
    clean = frames and frames[0] and frames[-1] and "\0\0" not in joined
    if clean and ";" not in joined and "\n" not in joined and "\r" not in joined:
        return tuple(frames)
    out = tuple(f.replace(";", ":").replace("\n", " ").replace("\r", " ") or UNKNOWN for f in frames)
    return out or (UNKNOWN,)


def _site_path(frames: Iterable[str]) -> tuple[str, ...]:
    """The call path down to the call site: trailing lock plumbing removed."""
    path = list(frames)
    while path and is_wrapper(path[-1]):
        path.pop()
    return tuple(path)


def stacks(profile: Profile, kind: str, value: str | None = None) -> list[Stack]:
    """Every stack of `kind` with its value, in the profile's order."""
    unit = check_kind(kind, value)
    if kind == "cpu":
        return [Stack(_clean(s.frames), s.count, s.tid) for s in profile.oncpu if s.count > 0]
    if kind == "offcpu":
        # each thread's estimates capped at its exact total, as the findings value them
        return [Stack(_clean(s.frames), s.ns, s.tid) for s in offcpu_stacks(profile) if s.ns > 0]
    out: list[Stack] = []
    probed_sites: set[tuple[str, ...]] = set()
    for lk in profile.locks:
        threads = [int(t) for t, w in lk.by_thread.items() if w.waits > 0 and t.isdigit()]
        tid = threads[0] if len(threads) == 1 else None
        for ls in lk.stacks:
            probed_sites.add(_site_path(ls.frames))
            v = ls.wait_ns if unit == "ns" else ls.waits
            if v > 0:
                out.append(Stack(_clean([*ls.frames, f"[lock {lk.name}]"]), v, tid))
    addresses = [lk.address for lk in profile.locks if lk.address]
    for fw in lock_waits(profile):
        if any(0 <= fw.uaddr - a < 64 for a in addresses):
            continue
        site = _site_path(fw.frames)
        if site and site in probed_sites:
            continue
        v = fw.ns if unit == "ns" else fw.waits
        if v > 0:
            out.append(Stack(_clean([*fw.frames, f"[futex {fw.name or hex(fw.uaddr)}]"]), v, fw.tid))
    return out


def thread_name(profile: Profile, tid: int | None) -> str:
    if tid is None:
        return ALL_THREADS
    info = profile.threads.get(str(tid))
    return info.name if info is not None and info.name else f"tid {tid}"


def thread_socket(profile: Profile, tid: int | None) -> str:
    """The socket the thread ran on most: a stack in the profile carries no CPU of its own."""
    info = profile.threads.get(str(tid)) if tid is not None else None
    if info is None or not info.sockets:
        return "socket ?"
    socket = max(sorted(info.sockets), key=lambda s: info.sockets[s])
    return f"socket {socket}"


def with_prefix(profile: Profile, items: list[Stack], prefix: str | None) -> list[Stack]:
    """`items` with the thread name or the socket as an extra root frame."""
    if prefix is None:
        return items
    if prefix not in PREFIXES:
        raise ExportError(f"unknown prefix {prefix!r}: choose thread or socket")
    name = thread_name if prefix == "thread" else thread_socket
    return [Stack(_clean([name(profile, s.tid)]) + s.frames, s.value, s.tid) for s in items]


def fold(items: Iterable[Stack]) -> dict[tuple[str, ...], int]:
    """Identical stacks merged: frames -> summed value."""
    out: dict[tuple[str, ...], int] = {}
    for s in items:
        out[s.frames] = out.get(s.frames, 0) + s.value
    return out
