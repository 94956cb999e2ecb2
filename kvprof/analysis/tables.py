"""The per-window tables every view draws from: functions, locks, cache lines, threads, requests.

Each function takes one Profile (a recording, or a window of a live session
cut by kvprof.model.delta) and returns plain dataclasses of counts, grouped
and ranked; kvprof.analysis.rows turns them into the rates `report` and
`top` show, the exporter serves the counts, and kvprof.analysis.findings
judges them. Data flows one way: model -> tables -> rows, findings -> views.

Sampled probes carry their weights: kvcached fires `kvs:atomic__sample`,
`kvs:cmd__done` and `kvs:lock__wait__done` for a sample of the events, each
with the number it stands for, and the programs count each that many times,
so a profile holds estimates. A profile recorded before the weights has the
rate of the first two in `profile.status.sample_rates` (1 in N, its
--probe-sample); it is scaled here and nowhere else: the tables' updates,
transfers and request counts are its samples times N. Off-CPU stacks are
sampled too (1 switch-out in --offcpu-sample), but the collector scales their
ns when it reads them, so nothing here scales them again. Percentiles come from
kvprof.model.histogram.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from kvprof.analysis.hotspots import call_site
from kvprof.analysis.waits import is_lock_wait
from kvprof.model.histogram import hist_add, hist_percentile
from kvprof.model.profile import CacheLineStat, FutexWait, OffCpuStack, Profile

LOCK_PROBE = "lock__wait__done"
LINE_PROBE = "atomic__sample"
REQUEST_PROBE = "cmd__done"
T = TypeVar("T")
# Rows of a per-thread table (report, top's Threads view) and threads named in a finding's
# text; the rest are summed in one "N more threads" line: a target may run thousands.
THREAD_ROWS = 40
THREADS_NAMED = 8
PERCENTILES = (0.5, 0.9, 0.99, 0.999)  # the request table's p50, p90, p99, p99.9
Z90 = 1.645  # a normal's two-sided 90 % quantile: sampled figures are shown ± this many standard errors
# The standard deviation, relative, of what the off-CPU looks' own timing adds to a sampled lock
# wait (a look takes a CPU: docs/record.md, "Lock waits"): bench/lockwait_accuracy.py measures it
# against an exact tracer where the sampling error is small; it is one error for the figure,
# not independent per row
LOOK_BIAS = 0.15
# ... and what remains beyond the stretches' own spread in a lock wait timed in stretches
# (kvprof.collect.offsample), relative, measured by the same benchmark: one error for the figure
STRETCH_BIAS = 0.06


def seconds(p: Profile) -> float:
    """The window's length, 1 s when it is unknown (so rates read as counts): the one
    window length of the findings, the report, top and the exporter. Not 0: a rate of
    0 would hide what was counted, and a window that lasted no time counted nothing."""
    return p.window.duration_s if p.window.duration_s > 0 else 1.0


def per_second(p: Profile, n: float) -> float:
    """A count of the window as a rate."""
    return n / seconds(p)


def sample_rate(p: Profile, probe: str) -> int:
    """1 in N for a sampled probe, 1 when no rate was recorded."""
    rates = p.status.sample_rates
    for key in (probe, f"kvs:{probe}", f"kvs__{probe}"):
        if rates.get(key, 0) > 0:
            return int(rates[key])
    return 1


def _grouped(items: Iterable[T], key: Callable[[T], str]) -> dict[str, list[T]]:
    """Items by key, keys and items in first-seen order."""
    out: dict[str, list[T]] = defaultdict(list)
    for item in items:
        out[key(item)].append(item)
    return out


# ---- functions --------------------------------------------------------------------


def _counts() -> dict[str, int]:
    return defaultdict(int)


@dataclass
class Functions:
    """On-CPU samples by function: as the leaf (self) and anywhere on the stack (total)."""

    samples: int = 0  # every sample counted, with or without frames
    self_samples: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    total_samples: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    thread_samples: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # function -> tid -> samples
    self_by_thread: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(_counts))
    total_by_thread: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(_counts))


def functions(p: Profile | None, tid: str | None = None) -> Functions:
    """Self and total samples per function, of one thread or all; empty for no profile."""
    out = Functions()
    if p is None:
        return out
    for s in p.oncpu:
        t = str(s.tid)
        if tid is not None and t != tid:
            continue
        out.samples += s.count
        out.thread_samples[t] += s.count
        if not s.frames:
            continue
        leaf = s.frames[-1]
        out.self_samples[leaf] += s.count
        out.self_by_thread[leaf][t] += s.count
        for f in set(s.frames):
            out.total_samples[f] += s.count
            out.total_by_thread[f][t] += s.count
    return out


# ---- locks ----------------------------------------------------------------------


@dataclass
class Waits:
    waits: int = 0
    wait_ns: int = 0


@dataclass
class Lock:
    """One lock name (kvs lock probes) or one futex word (any program's mutexes)."""

    name: str
    futex: int  # the futex word's address for a futex, 0 for a kvs lock
    waits: int  # contended acquisitions, scaled by the lock probe's rate
    wait_ns: int
    max_ns: int | None  # None for a futex: its waits are summed in the kernel, not kept one by one
    by_thread: dict[str, Waits]  # tid -> its waits, scaled
    sites: list[tuple[str, Waits]]  # call site -> its waits, most waiting first
    hist_log2_ns: list[int]  # the waits' lengths (kvs locks; empty for a futex)
    p99_ns: int | None  # from the histogram; None without one
    rate: int  # the lock probe's 1 in N
    err90_ns: int | None = None  # wait_ns is sampled: ± this at 90 % (sampling_error_ns); None: timed


def lock_waits(p: Profile) -> list[FutexWait]:
    """The futex waits entered from a lock's acquisition path (kvprof.analysis.waits: not
    a condition variable, a join, a semaphore), each thread's capped at its off-CPU
    total: a wait that began before the window is counted whole when it ends, and no
    thread waits longer than the window."""
    waits = [fw for fw in p.offcpu.futex if is_lock_wait(fw.frames)]
    by_tid: dict[int, int] = defaultdict(int)
    for fw in waits:
        by_tid[fw.tid] += fw.ns
    out = []
    for fw in waits:
        cap = thread_offcpu_ns(p, str(fw.tid))
        if cap and by_tid[fw.tid] > cap:
            fw = replace(fw, ns=fw.ns * cap // by_tid[fw.tid])
        out.append(fw)
    return out


def futex_groups(p: Profile) -> dict[int, list[FutexWait]]:
    """Lock waits on futexes by futex word, without the kvs-probed locks: those (glibc's
    mutex word sits at their start) are lock rows with better numbers."""
    lock_addrs = [lk.address for lk in p.locks if lk.address]
    out: dict[int, list[FutexWait]] = defaultdict(list)
    for fw in lock_waits(p):
        if not any(0 <= fw.uaddr - a < 64 for a in lock_addrs):
            out[fw.uaddr].append(fw)
    return out


def sampling_error_ns(waits: Iterable[FutexWait]) -> int | None:
    """The half-width of the 90 % interval of these waits' summed ns when they were
    sampled (None: every wait was timed). Each (thread, word, stack)'s ns come with
    their standard deviation (FutexWait.sd_ns), or else from the n looks that found the
    wait, counted as a Poisson count (relative error 1/sqrt(n)); rows are independent.
    Rows estimated from looks with a standard deviation add the looks' own bias,
    LOOK_BIAS of their sum; rows timed in stretches (FutexWait.timed_share), STRETCH_BIAS
    of theirs."""
    var = 0.0
    sampled = False
    looked = timed = 0
    for fw in waits:
        if fw.samples > 0 or fw.timed_share:
            sampled = True
            var += fw.sd_ns * fw.sd_ns if fw.sd_ns or fw.timed_share else fw.ns * fw.ns / fw.samples
            timed += fw.ns if fw.timed_share else 0
            looked += fw.ns if fw.sd_ns and not fw.timed_share else 0
    bias = (LOOK_BIAS * looked) ** 2 + (STRETCH_BIAS * timed) ** 2
    return round(Z90 * math.sqrt(var + bias)) if sampled else None


def futex_label(waits: list[FutexWait]) -> str:
    """What to call the futex of these waits: its data symbol or region, else its address."""
    for w in waits:
        if w.name:
            return w.name
    return f"futex {waits[0].uaddr:#x}" if waits else "futex"


def _ranked(sites: dict[str, Waits]) -> list[tuple[str, Waits]]:
    return sorted(sites.items(), key=lambda kv: -kv[1].wait_ns)


def locks(p: Profile) -> list[Lock]:
    """The kvs locks by name, then the other futexes, each list in first-seen order."""
    rate = sample_rate(p, LOCK_PROBE)
    out = []
    for name, group in _grouped(p.locks, lambda lk: lk.name).items():
        threads: dict[str, Waits] = {}
        sites: dict[str, Waits] = defaultdict(Waits)
        hist: list[int] = []
        for lk in group:
            hist = hist_add(hist, lk.hist_log2_ns)
            for tid, tw in lk.by_thread.items():
                w = threads.setdefault(tid, Waits())
                w.waits += tw.waits * rate
                w.wait_ns += tw.wait_ns * rate
            for st in lk.stacks:
                w = sites[call_site(st.frames)]
                w.waits += st.waits * rate
                w.wait_ns += st.wait_ns * rate
        out.append(
            Lock(
                name=name,
                futex=0,
                waits=sum(lk.waits for lk in group) * rate,
                wait_ns=sum(lk.wait_ns for lk in group) * rate,
                max_ns=max(lk.max_ns for lk in group),
                by_thread=threads,
                sites=_ranked(sites),
                hist_log2_ns=hist,
                p99_ns=hist_percentile(hist, 0.99) if sum(hist) else None,
                rate=rate,
            )
        )
    for uaddr, fws in futex_groups(p).items():
        fthreads: dict[str, Waits] = {}
        fsites: dict[str, Waits] = defaultdict(Waits)
        for fw in fws:
            for w in (fthreads.setdefault(str(fw.tid), Waits()), fsites[call_site(fw.frames)]):
                w.waits += fw.waits
                w.wait_ns += fw.ns
        out.append(
            Lock(
                name=futex_label(fws),
                futex=uaddr,
                waits=sum(w.waits for w in fws),
                wait_ns=sum(w.ns for w in fws),
                max_ns=None,
                by_thread=fthreads,
                sites=_ranked(fsites),
                hist_log2_ns=[],
                p99_ns=None,
                rate=1,
                err90_ns=sampling_error_ns(fws),
            )
        )
    return out


def by_wait(rows: list[Lock]) -> list[Lock]:
    """Locks most waiting first."""
    return sorted(rows, key=lambda r: (-r.wait_ns, r.name))


# ---- cache lines (kvs atomic probe) ------------------------------------------------


@dataclass
class Line:
    """One cache line one kvs site updated; counts scaled by the probe's rate."""

    site: str
    line: int
    samples: int  # as sampled
    updates: int  # scaled
    transfers: int
    cross_socket: int
    cycles_mean: float
    writers: int  # threads that updated it


@dataclass
class LineThread:
    """One thread's updates of a site's lines."""

    samples: int = 0  # as sampled
    updates: int = 0  # scaled
    transfers: int = 0
    cycles: float = 0.0  # summed over the samples

    @property
    def cycles_mean(self) -> float:
        return self.cycles / self.samples if self.samples else 0.0


@dataclass
class Site:
    """One kvs site's cache lines together; counts scaled by the probe's rate."""

    site: str
    lines: list[Line]
    samples: int  # as sampled
    updates: int
    transfers: int
    cross_socket: int
    cycles_mean: float
    cycles_max: int
    cycles_p99: int
    writers: int  # most threads that updated one of its lines
    by_thread: dict[str, LineThread]
    socket_matrix: list[list[int]]  # transfers [from socket][to socket], scaled
    rate: int


def transfers_matrix(lines: Iterable[CacheLineStat], scale: int = 1) -> list[list[int]]:
    """The lines' transfers [from socket][to socket] summed, times `scale` (a sample rate)."""
    lines = list(lines)
    size = max((len(cl.socket_matrix) for cl in lines), default=0)
    m = [[0] * size for _ in range(size)]
    for cl in lines:
        for i, row in enumerate(cl.socket_matrix):
            for j, v in enumerate(row):
                m[i][j] += v * scale
    return m


def _writers(by_thread: dict) -> int:  # type: ignore[type-arg]
    return len([1 for v in by_thread.values() if v.samples > 0])


def cachelines(p: Profile) -> list[Line]:
    """Every (site, line) the kvs atomic probe sampled, in the profile's order."""
    rate = sample_rate(p, LINE_PROBE)
    return [
        Line(
            site=cl.site,
            line=cl.line,
            samples=cl.samples,
            updates=cl.samples * rate,
            transfers=cl.transfers * rate,
            cross_socket=cl.cross_socket_transfers * rate,
            cycles_mean=cl.cycles_mean,
            writers=_writers(cl.by_thread),
        )
        for cl in p.cachelines
    ]


def by_transfers(rows: list[Line]) -> list[Line]:
    """Lines most transfers first."""
    return sorted(rows, key=lambda r: (-r.transfers, r.site, r.line))


def sites(p: Profile) -> list[Site]:
    """Per kvs site with samples, in first-seen order."""
    rate = sample_rate(p, LINE_PROBE)
    lines = _grouped(cachelines(p), lambda cl: cl.site)
    out = []
    for site, group in _grouped(p.cachelines, lambda cl: cl.site).items():
        samples = sum(cl.samples for cl in group)
        if samples <= 0:
            continue
        hist: list[int] = []
        threads: dict[str, LineThread] = {}
        for cl in group:
            hist = hist_add(hist, cl.hist_log2_cycles)
            for tid, lt in cl.by_thread.items():
                t = threads.setdefault(tid, LineThread())
                t.samples += lt.samples
                t.updates += lt.samples * rate
                t.transfers += lt.transfers * rate
                t.cycles += lt.cycles_mean * lt.samples
        out.append(
            Site(
                site=site,
                lines=lines[site],
                samples=samples,
                updates=samples * rate,
                transfers=sum(cl.transfers for cl in group) * rate,
                cross_socket=sum(cl.cross_socket_transfers for cl in group) * rate,
                cycles_mean=sum(cl.cycles_mean * cl.samples for cl in group) / samples,
                cycles_max=max(cl.cycles_max for cl in group),
                cycles_p99=hist_percentile(hist, 0.99),
                writers=max(_writers(cl.by_thread) for cl in group),
                by_thread=threads,
                socket_matrix=transfers_matrix(group, rate),
                rate=rate,
            )
        )
    return out


def socket_matrix(p: Profile) -> list[list[float]]:
    """Transfers per second [from socket][to socket], all lines together, scaled."""
    m = transfers_matrix(p.cachelines, sample_rate(p, LINE_PROBE))
    return [[per_second(p, v) for v in row] for row in m]


# ---- threads ----------------------------------------------------------------------


@dataclass
class Thread:
    tid: str
    name: str
    samples: int  # on-CPU
    sockets: dict[str, int]  # socket -> on-CPU samples there
    lock_wait_ns: int  # kvs lock waits, and lock waits on futexes (LOCKS' rows)
    offcpu_ns: int
    stack_quality: float | None  # share of its stacks that stopped short of the thread's entry
    top_function: str  # its leaf with the most samples, "" when none


def thread_offcpu_ns(p: Profile, tid: str) -> int:
    """A thread's off-CPU time in the window, at most the window: a wait is counted when
    it ends, so one that began before the window would otherwise count whole."""
    th = p.threads.get(tid)
    ns = th.offcpu_ns if th is not None else 0
    return min(ns, round(p.window.duration_s * 1e9)) if p.window.duration_s > 0 else ns


def offcpu_stacks(p: Profile) -> list[OffCpuStack]:
    """The off-CPU stacks, each thread's capped at its exact off-CPU total. A stack's ns
    are its sampled periods scaled by the sample rate (--offcpu-sample): unbiased, but a thread
    with a few long sleeps, one of them sampled, is estimated past the window."""
    estimated: dict[int, int] = defaultdict(int)
    for st in p.offcpu.stacks:
        estimated[st.tid] += st.ns
    out = []
    for st in p.offcpu.stacks:
        exact = thread_offcpu_ns(p, str(st.tid))
        if exact and estimated[st.tid] > exact:
            st = replace(st, ns=st.ns * exact // estimated[st.tid])
        out.append(st)
    return out


def threads(p: Profile) -> list[Thread]:
    """Every thread, most on-CPU samples first."""
    lock_ns: dict[str, int] = defaultdict(int)
    for lk in p.locks:
        for tid, tw in lk.by_thread.items():
            lock_ns[tid] += tw.wait_ns
    futex_ns: dict[str, int] = defaultdict(int)
    for fws in futex_groups(p).values():  # the lock waits on futexes no kvs probe timed
        for fw in fws:
            futex_ns[str(fw.tid)] += fw.ns
    off_ns: dict[str, int] = defaultdict(int)
    for st in p.offcpu.stacks:
        off_ns[str(st.tid)] += st.ns
    fn = functions(p)
    leaves: dict[str, dict[str, int]] = defaultdict(dict)
    for f, by_tid in fn.self_by_thread.items():
        for tid, n in by_tid.items():
            leaves[tid][f] = n
    rows = [
        Thread(
            tid=tid,
            name=th.name,
            samples=th.cpu_samples,
            sockets=dict(th.sockets),
            lock_wait_ns=(th.lock_wait_ns or lock_ns.get(tid, 0)) + futex_ns.get(tid, 0),
            offcpu_ns=thread_offcpu_ns(p, tid) or off_ns.get(tid, 0),
            stack_quality=th.stack_quality,
            top_function=max(leaves[tid].items(), key=lambda kv: (kv[1], kv[0]))[0] if leaves[tid] else "",
        )
        for tid, th in p.threads.items()
    ]
    rows.sort(key=lambda r: (-r.samples, r.tid))
    return rows


def cpu_share(p: Profile, samples: int) -> float:
    """On-CPU samples as a share of one CPU over the window (0 without a sampling rate)."""
    return samples / p.hz / seconds(p) if p.hz > 0 else 0.0


# ---- requests ---------------------------------------------------------------------


@dataclass
class Request:
    opcode: str
    samples: int  # requests sampled
    count: int  # scaled: requests served
    p50_ns: int
    p90_ns: int
    p99_ns: int
    p999_ns: int


def requests(p: Profile) -> list[Request]:
    """Per opcode, most sampled first; percentiles from the latency histogram
    (a profile without one keeps the p50 and p99 it was given)."""
    rate = sample_rate(p, REQUEST_PROBE)
    rows = []
    for op, r in p.requests.items():
        h = r.hist_log2_ns
        q = [hist_percentile(h, x) for x in PERCENTILES] if sum(h) else [r.p50_ns, 0, r.p99_ns, 0]
        rows.append(Request(op, r.count, r.count * rate, *q))
    rows.sort(key=lambda r: (-r.samples, r.opcode))
    return rows
