"""What happened between two cumulative snapshots of one session.

`delta(new, old)` is a Profile holding only what was counted after `old`
was taken: the session uses it to start the recording window once every
collector is attached (collectors attach one after another, a second or so
each), and the live views use it for per-interval numbers. Counts subtract;
maxima cannot, so the newer maximum is kept; means are recomputed from
sums.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

from kvprof.model.histogram import hist_minus, hist_percentile
from kvprof.model.profile import (
    AddressSample,
    CacheLineStat,
    CpuStack,
    FutexWait,
    LineThread,
    LockCpuSample,
    LockHold,
    LockStack,
    LockStat,
    OffCpu,
    Profile,
    RequestStat,
    SampledAddresses,
    ThreadHolds,
    ThreadInfo,
    ThreadWaits,
)


def _threads(new: dict[str, ThreadInfo], old: dict[str, ThreadInfo]) -> dict[str, ThreadInfo]:
    out = {}
    for tid, t in new.items():
        o = old.get(tid, ThreadInfo())
        sockets = {s: n - o.sockets.get(s, 0) for s, n in t.sockets.items() if n - o.sockets.get(s, 0)}
        out[tid] = replace(
            t,
            cpu_samples=t.cpu_samples - o.cpu_samples,
            sockets=sockets,
            offcpu_ns=t.offcpu_ns - o.offcpu_ns,
            lock_wait_ns=t.lock_wait_ns - o.lock_wait_ns,
            runnable_ns=t.runnable_ns - o.runnable_ns,
        )
    return out


# The stack lists hold every stack since the session began, most unchanged in
# the last interval: an entry is copied only when it changed (a live view takes
# two deltas each interval).


def _oncpu(new: list[CpuStack], old: list[CpuStack]) -> list[CpuStack]:
    before = {(s.tid, tuple(s.frames)): s.count for s in old}
    out = []
    for s in new:
        n = s.count - before.get((s.tid, tuple(s.frames)), 0)
        if n > 0:
            out.append(replace(s, count=n))
    return out


def _offcpu(new: OffCpu, old: OffCpu) -> OffCpu:
    ns = {(s.tid, tuple(s.frames)): s.ns for s in old.stacks}
    fx = {(f.tid, f.uaddr, tuple(f.frames)): f for f in old.futex}
    stacks = []
    for s in new.stacks:
        d = s.ns - ns.get((s.tid, tuple(s.frames)), 0)
        if d > 0:
            stacks.append(replace(s, ns=d))
    futex: list[FutexWait] = []
    for f in new.futex:
        o = fx.get((f.tid, f.uaddr, tuple(f.frames)))
        waits, wait_ns = f.waits - (o.waits if o else 0), f.ns - (o.ns if o else 0)
        if waits > 0 or wait_ns > 0:
            samples = max(0, f.samples - (o.samples if o else 0))
            # the sampling variance of a difference of running estimates: what came since
            sd = round(math.sqrt(max(0, f.sd_ns**2 - (o.sd_ns**2 if o else 0))))
            futex.append(replace(f, waits=waits, ns=wait_ns, samples=samples, sd_ns=sd))
    return OffCpu(stacks=stacks, futex=futex)


def _locks(new: list[LockStat], old: list[LockStat]) -> list[LockStat]:
    before = {lk.name: lk for lk in old}
    out = []
    for lk in new:
        o = before.get(lk.name)
        if o is None:
            out.append(copy.deepcopy(lk))
            continue
        by_thread = {}
        for tid, w in lk.by_thread.items():
            ow = o.by_thread.get(tid, ThreadWaits())
            if w.waits - ow.waits:
                by_thread[tid] = ThreadWaits(w.waits - ow.waits, w.wait_ns - ow.wait_ns)
        ostacks = {tuple(s.frames): s for s in o.stacks}
        stacks = []
        for s in lk.stacks:
            os_ = ostacks.get(tuple(s.frames), LockStack([], 0, 0))
            if s.waits - os_.waits:
                stacks.append(LockStack(s.frames, s.waits - os_.waits, s.wait_ns - os_.wait_ns))
        out.append(
            replace(
                lk,
                waits=lk.waits - o.waits,
                wait_ns=lk.wait_ns - o.wait_ns,
                hist_log2_ns=hist_minus(lk.hist_log2_ns, o.hist_log2_ns),
                by_thread=by_thread,
                stacks=stacks,
            )
        )
    return out


def _cachelines(new: list[CacheLineStat], old: list[CacheLineStat]) -> list[CacheLineStat]:
    before = {(c.site, c.line): c for c in old}
    out = []
    for c in new:
        o = before.get((c.site, c.line))
        if o is None:
            out.append(copy.deepcopy(c))
            continue
        samples = c.samples - o.samples
        if samples <= 0:
            continue
        cycles = c.cycles_mean * c.samples - o.cycles_mean * o.samples
        by_thread = {}
        for tid, t in c.by_thread.items():
            ot = o.by_thread.get(tid, LineThread())
            n = t.samples - ot.samples
            if n > 0:
                mean = (t.cycles_mean * t.samples - ot.cycles_mean * ot.samples) / n
                by_thread[tid] = LineThread(n, t.transfers - ot.transfers, mean)
        matrix = [hist_minus(row, o.socket_matrix[i] if i < len(o.socket_matrix) else []) for i, row in
                  enumerate(c.socket_matrix)]  # fmt: skip
        out.append(
            replace(
                c,
                samples=samples,
                transfers=c.transfers - o.transfers,
                cross_socket_transfers=c.cross_socket_transfers - o.cross_socket_transfers,
                cycles_mean=cycles / samples,
                hist_log2_cycles=hist_minus(c.hist_log2_cycles, o.hist_log2_cycles),
                socket_matrix=matrix,
                by_thread=by_thread,
            )
        )
    return out


def _holds(new: list[LockHold], old: list[LockHold]) -> list[LockHold]:
    """Each lock's holds since `old` (a minimum cannot subtract: the newer one is kept)."""
    before = {(h.name, h.address): h for h in old}
    out = []
    for h in new:
        o = before.get((h.name, h.address), LockHold(h.name, h.address))
        if h.samples > o.samples:
            mine = {t: ThreadHolds(v.acquisitions, v.hold_ns) for t, v in h.by_thread.items()}
            for tid, t in o.by_thread.items():
                mine[tid].acquisitions -= t.acquisitions
                mine[tid].hold_ns -= t.hold_ns
            out.append(replace(h, acquisitions=h.acquisitions - o.acquisitions, hold_ns=h.hold_ns - o.hold_ns,
                               samples=h.samples - o.samples, window_s=round(h.window_s - o.window_s, 3),
                               interrupted=h.interrupted - o.interrupted,
                               interrupted_ns=h.interrupted_ns - o.interrupted_ns,
                               by_thread={t: v for t, v in mine.items() if v.acquisitions > 0}))  # fmt: skip
    return out


def _requests(new: dict[str, RequestStat], old: dict[str, RequestStat]) -> dict[str, RequestStat]:
    out = {}
    for op, r in new.items():
        o = old.get(op, RequestStat())
        hist = hist_minus(r.hist_log2_ns, o.hist_log2_ns)
        if r.count - o.count > 0:
            out[op] = RequestStat(
                r.count - o.count, hist, hist_percentile(hist, 0.5), hist_percentile(hist, 0.99)
            )
    return out


def _addresses(new: SampledAddresses, old: SampledAddresses) -> SampledAddresses:
    def key(s: AddressSample) -> tuple[int, int, int, int]:
        return (s.tid, s.cpu, s.ip, s.address)

    def lock_key(s: LockCpuSample) -> tuple[int, int, str, str, tuple[str, ...], bool]:
        return (s.tid, s.address, s.function, s.leaf, tuple(s.callers), s.kernel)

    before = {key(s): s.count for s in old.samples}
    samples = [replace(s, count=s.count - before.get(key(s), 0)) for s in new.samples]
    locks_before = {lock_key(s): s.count for s in old.locks}
    locks = [replace(s, count=s.count - locks_before.get(lock_key(s), 0)) for s in new.locks]
    return SampledAddresses(
        samples=[s for s in samples if s.count > 0],
        thread_samples={
            t: n - old.thread_samples.get(t, 0)
            for t, n in new.thread_samples.items()
            if n - old.thread_samples.get(t, 0) > 0
        },
        user_samples=new.user_samples - old.user_samples,
        kernel_samples=new.kernel_samples - old.kernel_samples,
        unattributed={
            r: n - old.unattributed.get(r, 0)
            for r, n in new.unattributed.items()
            if n - old.unattributed.get(r, 0)
        },
        lost=new.lost - old.lost,
        locks=[s for s in locks if s.count > 0],
        lock_unattributed=new.lock_unattributed - old.lock_unattributed,
    )


def delta(new: Profile, old: Profile) -> Profile:
    """`new` minus `old`: both cumulative snapshots of the same session, `old` first."""
    counters = {k: v - old.status.counters.get(k, 0) for k, v in new.status.counters.items()}
    return replace(
        new,
        threads=_threads(new.threads, old.threads),
        oncpu=_oncpu(new.oncpu, old.oncpu),
        offcpu=_offcpu(new.offcpu, old.offcpu),
        locks=_locks(new.locks, old.locks),
        holds=_holds(new.holds, old.holds),
        cachelines=_cachelines(new.cachelines, old.cachelines),
        requests=_requests(new.requests, old.requests),
        addresses=_addresses(new.addresses, old.addresses),
        status=replace(new.status, counters=counters),
        findings=[],
    )
