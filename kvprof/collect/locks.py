"""The `locks` collector: contended lock waits from kvcached's
`kvs:lock__wait__done` probe, and how long each named lock is held, contended
or not, from its sampled `kvs:lock__hold` (probes/locks.bpf.c).

The probe fires for every long contended wait and 1 short one in the
server's `--lock-sample` (random gaps, per thread), after the lock was
released, and says how many waits it stands for: the program counts it that many times, so the waits
here are estimates of the server's own `stats locks` numbers, seen per
thread and per call site.

One `LockStat` per lock *name*, not per address: `item_lock` is 1024 stripes,
and a performance engineer asks "how much do we wait on item locks", not
"on stripe 517". `address` is the lock of that name waited on longest (for a
single lock like `topkeys`, the lock); `by_thread` and `stacks` cover every
address of the name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from kvprof.collect import HIST_SLOTS, CollectOptions
from kvprof.collect.bpf import (
    KvsCollector,
    ThreadNames,
    cstr,
    map_items,
    named_thread,
    percpu_counters,
    put_counters,
)
from kvprof.collect.symbols import Symbolizer
from kvprof.collect.unwind import Unwinder
from kvprof.model.profile import (
    LockHold,
    LockStack,
    LockStat,
    Profile,
    ThreadHolds,
    ThreadWaits,
)

COUNTERS = ("events", "map_full", "stack_errors")  # the order of enum locks_counter


@dataclass
class LockMapEntry:
    """One BPF map entry: waits of one thread on one lock from one call site."""

    name: str
    lock: int
    tid: int
    stack_id: int
    waits: int
    wait_ns: int
    max_ns: int


@dataclass
class HoldMapEntry:
    """One BPF map entry: the sampled holds of one lock by one thread."""

    name: str
    lock: int
    tid: int
    acquisitions: int
    hold_ns: int
    samples: int
    min_ns: int
    interrupted: int = 0
    interrupted_ns: int = 0


@dataclass
class _Snapshot:
    rows: list[LockMapEntry] = field(default_factory=list)
    holds: list[HoldMapEntry] = field(default_factory=list)
    hist: dict[str, list[int]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    frames: dict[int, list[str]] = field(default_factory=dict)  # stack id -> frames


class LocksCollector(KvsCollector):
    name = "locks"
    empty = _Snapshot
    probes: ClassVar[dict[str, str]] = {
        "lock__wait__done": "locks_on_wait_done",
        "lock__hold": "locks_on_hold",
    }
    instead = "lock waits come from the futex collector"

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        super().__init__(pid, opts)
        self._symbols = Symbolizer(pid, Unwinder(pid, tables=False), opts.inline)
        self._names = ThreadNames(pid)
        self._frames: dict[int, list[str]] = {}

    def _read(self) -> _Snapshot:
        snap = _Snapshot()
        stacks = self.table("stacks")
        for k, v in map_items(self.table("waits")):
            row = LockMapEntry(cstr(k.name), k.lock, k.tid, k.stack_id, v.waits, v.wait_ns, v.max_ns)
            snap.rows.append(row)
            if row.stack_id not in snap.frames:
                frames = self._frames.get(row.stack_id)
                if frames is None:  # a stack id's frames never change: each is walked once
                    frames = self._frames[row.stack_id] = self._symbols.stack(stacks, row.stack_id)
                snap.frames[row.stack_id] = frames
            self._names.first_seen(row.tid)
        for k, v in map_items(self.table("holds")):
            snap.holds.append(
                HoldMapEntry(
                    cstr(k.name),
                    k.lock,
                    k.tid,
                    v.acquisitions,
                    v.hold_ns,
                    v.samples,
                    v.min_ns,
                    v.interrupted,
                    v.interrupted_ns,
                )
            )
        for k, n in map_items(self.table("hist")):
            h = snap.hist.setdefault(cstr(k.name), [0] * HIST_SLOTS)
            h[min(k.slot, HIST_SLOTS - 1)] += n
        snap.counters = percpu_counters(self.table("counters"), COUNTERS)
        return snap

    def contribute(self, profile: Profile) -> None:
        snap = self.latest()
        stats = aggregate(snap.rows, snap.hist, snap.frames)
        ours = {s.name for s in stats}
        profile.locks[:] = [lk for lk in profile.locks if lk.name not in ours] + stats
        timed = [h for h in profile.holds if h.window_s]  # the hold collector's (record --hold)
        profile.holds[:] = timed + aggregate_holds(snap.holds)
        per_tid: dict[int, int] = {}
        for r in snap.rows:
            per_tid[r.tid] = per_tid.get(r.tid, 0) + r.wait_ns
        for tid, ns in per_tid.items():
            named_thread(profile, tid, self._names).lock_wait_ns = ns
        put_counters(profile, "locks", snap.counters, "waits")
        if snap.counters.get("stack_errors"):
            profile.status.warnings.append(
                f"locks: {snap.counters['stack_errors']} call-site stacks lost: raise --stack-storage"
            )


def aggregate(
    rows: list[LockMapEntry], hist: dict[str, list[int]], frames: dict[int, list[str]]
) -> list[LockStat]:
    """Fold map rows into one LockStat per lock name, most waited first."""
    by_name: dict[str, LockStat] = {}
    per_addr: dict[tuple[str, int], int] = {}
    per_stack: dict[tuple[str, tuple[str, ...]], LockStack] = {}
    for r in rows:
        st = by_name.get(r.name)
        if st is None:
            st = by_name[r.name] = LockStat(
                name=r.name, address=r.lock, hist_log2_ns=list(hist.get(r.name, [0] * HIST_SLOTS))
            )
        st.waits += r.waits
        st.wait_ns += r.wait_ns
        st.max_ns = max(st.max_ns, r.max_ns)
        tw = st.by_thread.setdefault(str(r.tid), ThreadWaits())
        tw.waits += r.waits
        tw.wait_ns += r.wait_ns
        per_addr[(r.name, r.lock)] = per_addr.get((r.name, r.lock), 0) + r.wait_ns
        fr = tuple(frames.get(r.stack_id, []))
        ls = per_stack.get((r.name, fr))
        if ls is None:
            ls = per_stack[(r.name, fr)] = LockStack(frames=list(fr), waits=0, wait_ns=0)
            st.stacks.append(ls)
        ls.waits += r.waits
        ls.wait_ns += r.wait_ns
    for st in by_name.values():
        st.address = max((a for n, a in per_addr if n == st.name), key=lambda a: per_addr[(st.name, a)])
        st.stacks.sort(key=lambda s: -s.wait_ns)
    return sorted(by_name.values(), key=lambda s: -s.wait_ns)


def aggregate_holds(rows: list[HoldMapEntry]) -> list[LockHold]:
    """One LockHold per lock, longest held in all first."""
    by_lock: dict[tuple[str, int], LockHold] = {}
    for r in rows:
        h = by_lock.setdefault((r.name, r.lock), LockHold(name=r.name, address=r.lock))
        h.acquisitions += r.acquisitions
        h.hold_ns += r.hold_ns
        h.samples += r.samples
        h.min_ns = r.min_ns if h.min_ns == 0 else min(h.min_ns, r.min_ns)
        h.interrupted += r.interrupted
        h.interrupted_ns += r.interrupted_ns
        t = h.by_thread.setdefault(str(r.tid), ThreadHolds())
        t.acquisitions += r.acquisitions
        t.hold_ns += r.hold_ns
    return sorted(by_lock.values(), key=lambda h: -h.hold_ns)
