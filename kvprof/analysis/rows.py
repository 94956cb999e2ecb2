"""The rows `kvprof report` and `kvprof top` show: the per-window tables as rates.

kvprof.analysis.tables counts what a window holds (samples, waits, ns,
transfers, each scaled once by its probe's sample rate); the rows here turn
those counts into what a person reads: per second of the window
(tables.per_second), shares of one CPU (tables.cpu_share), ms and µs. Each
row is defined once and the views only format it, so the report and top
show the same number for the same window (tests/test_views_agree.py).

A rate over a window of unknown length (duration 0) is the count itself:
tables.seconds is 1 s then, as the findings judge it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvprof.analysis.hotspots import match_function
from kvprof.analysis.tables import (
    by_transfers,
    by_wait,
    cachelines,
    cpu_share,
    functions,
    locks,
    per_second,
    requests,
    sites,
    threads,
)
from kvprof.model.profile import Profile


def _share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def _hotspot(function: str) -> str:
    """The catalog id of a function or kvs site, "" when it is not a known spot."""
    hot = match_function(function)
    return hot.id if hot is not None else ""


# ---- functions ------------------------------------------------------------------


@dataclass(frozen=True)
class FunctionRow:
    function: str
    self_samples: int  # as the leaf
    total_samples: int  # anywhere on the stack
    self_share: float  # of the window's on-CPU samples (of the thread, when one is asked for)
    total_share: float
    hotspot: str  # catalog id, "" when none


def function_rows(p: Profile | None, tid: str | None = None) -> list[FunctionRow]:
    """Every function on a stack, most self samples first; of one thread or all."""
    fn = functions(p, tid)
    rows = [
        FunctionRow(
            function=f,
            self_samples=fn.self_samples.get(f, 0),
            total_samples=incl,
            self_share=_share(fn.self_samples.get(f, 0), fn.samples),
            total_share=_share(incl, fn.samples),
            hotspot=_hotspot(f),
        )
        for f, incl in fn.total_samples.items()
    ]
    rows.sort(key=lambda r: (-r.self_samples, -r.total_samples, r.function))
    return rows


# ---- locks ----------------------------------------------------------------------


@dataclass(frozen=True)
class LockSiteRow:
    """One call site's waits on a lock."""

    site: str
    waits: int
    waits_per_s: float
    wait_ms_per_s: float


@dataclass(frozen=True)
class LockRow:
    """One lock name (kvs lock probes) or one futex word."""

    name: str
    futex: int  # the futex word's address for a futex, 0 for a kvs lock
    waits: int
    waits_per_s: float
    wait_ms_per_s: float
    max_ms: float | None  # None for a futex: its waits are summed in the kernel, not kept one by one
    p99_ms: float | None  # from the lock's histogram; None without one
    threads: int
    call_site: str  # the site that waited longest, "" when none
    sites: tuple[LockSiteRow, ...]  # most waiting first
    wait_ns_by_thread: dict[str, int]  # tid -> its wait time
    # sampled: ± this at 90 % (tables.sampling_error_ns); None: every wait timed
    wait_ms_per_s_err90: float | None = None


def lock_rows(p: Profile) -> list[LockRow]:
    """One row per lock name or futex, most waiting first."""
    return [
        LockRow(
            name=lk.name,
            futex=lk.futex,
            waits=lk.waits,
            waits_per_s=per_second(p, lk.waits),
            wait_ms_per_s=per_second(p, lk.wait_ns / 1e6),
            max_ms=None if lk.max_ns is None else lk.max_ns / 1e6,
            p99_ms=None if lk.p99_ns is None else lk.p99_ns / 1e6,
            threads=len(lk.by_thread),
            call_site=lk.sites[0][0] if lk.sites else "",
            sites=tuple(
                LockSiteRow(site, w.waits, per_second(p, w.waits), per_second(p, w.wait_ns / 1e6))
                for site, w in lk.sites
            ),
            wait_ns_by_thread={t: w.wait_ns for t, w in lk.by_thread.items()},
            wait_ms_per_s_err90=None if lk.err90_ns is None else per_second(p, lk.err90_ns / 1e6),
        )
        for lk in by_wait(locks(p))
    ]


# ---- cache lines (kvs atomic probe) ---------------------------------------------


@dataclass(frozen=True)
class LineRow:
    """One (site, cache line), rates scaled by the probe's sample rate."""

    site: str
    line: int  # the line's address
    samples: int  # as sampled
    updates_per_s: float
    transfers_per_s: float
    cross_socket_share: float  # of its transfers
    cycles_mean: float
    writers: int


def line_rows(p: Profile) -> list[LineRow]:
    """One row per (site, cache line), most transfers first."""
    return [
        LineRow(
            site=cl.site,
            line=cl.line,
            samples=cl.samples,
            updates_per_s=per_second(p, cl.updates),
            transfers_per_s=per_second(p, cl.transfers),
            cross_socket_share=_share(cl.cross_socket, cl.transfers),
            cycles_mean=cl.cycles_mean,
            writers=cl.writers,
        )
        for cl in by_transfers(cachelines(p))
    ]


@dataclass(frozen=True)
class SiteThreadRow:
    """One thread's updates of a site's lines."""

    tid: str
    name: str
    updates_per_s: float
    transfers_per_s: float
    cycles_mean: float


@dataclass(frozen=True)
class SiteRow:
    """One kvs site's cache lines together."""

    site: str
    lines: int  # distinct cache lines the site updated
    samples: int  # as sampled
    updates_per_s: float
    transfers_per_s: float
    transfer_share: float  # of its updates
    cross_socket_share: float  # of its transfers
    cycles_mean: float
    cycles_p99: int
    writers: int  # most threads that updated one of its lines
    hotspot: str  # catalog id, "" when none
    threads: tuple[SiteThreadRow, ...]  # those that updated it, most updates first


def site_rows(p: Profile) -> list[SiteRow]:
    """One row per kvs site with samples, most transfers first."""
    rows = []
    for st in sites(p):
        updates_per_s, transfers_per_s = per_second(p, st.updates), per_second(p, st.transfers)
        by_thread = [
            SiteThreadRow(
                tid,
                p.threads[tid].name if tid in p.threads else "",
                per_second(p, lt.updates),
                per_second(p, lt.transfers),
                lt.cycles_mean,
            )
            for tid, lt in st.by_thread.items()
            if lt.samples > 0
        ]
        by_thread.sort(key=lambda r: (-r.updates_per_s, r.tid))
        rows.append(
            SiteRow(
                site=st.site,
                lines=len(st.lines),
                samples=st.samples,
                updates_per_s=updates_per_s,
                transfers_per_s=transfers_per_s,
                transfer_share=_share(transfers_per_s, updates_per_s),
                cross_socket_share=_share(st.cross_socket, st.transfers),
                cycles_mean=st.cycles_mean,
                cycles_p99=st.cycles_p99,
                writers=st.writers,
                hotspot=_hotspot(st.site),
                threads=tuple(by_thread),
            )
        )
    rows.sort(key=lambda r: (-r.transfers_per_s, r.site))
    return rows


# ---- threads --------------------------------------------------------------------


@dataclass(frozen=True)
class ThreadRow:
    tid: str
    name: str
    samples: int  # on-CPU
    cpu_share: float  # of one CPU over the window
    sockets: dict[str, int]  # socket -> on-CPU samples there
    lock_wait_ms: float  # kvs lock waits over the window
    offcpu_ms: float
    lock_wait_share: float  # of the thread's wall time
    offcpu_share: float
    stack_quality: float | None  # share of its stacks that stopped short of the thread's entry
    top_function: str  # its leaf with the most samples, "" when none


def thread_rows(p: Profile) -> list[ThreadRow]:
    """Every thread, most on-CPU samples first."""
    return [
        ThreadRow(
            tid=th.tid,
            name=th.name,
            samples=th.samples,
            cpu_share=cpu_share(p, th.samples),
            sockets=th.sockets,
            lock_wait_ms=th.lock_wait_ns / 1e6,
            offcpu_ms=th.offcpu_ns / 1e6,
            lock_wait_share=per_second(p, th.lock_wait_ns / 1e9),
            offcpu_share=per_second(p, th.offcpu_ns / 1e9),
            stack_quality=th.stack_quality,
            top_function=th.top_function,
        )
        for th in threads(p)
    ]


# ---- requests -------------------------------------------------------------------


@dataclass(frozen=True)
class RequestRow:
    opcode: str
    samples: int  # requests sampled: what the percentiles rest on
    per_s: float  # requests served a second, scaled by the probe's sample rate
    p50_us: float
    p90_us: float
    p99_us: float
    p999_us: float


def request_rows(p: Profile) -> list[RequestRow]:
    """Requests per opcode, most sampled first."""
    return [
        RequestRow(
            r.opcode,
            r.samples,
            per_second(p, r.count),
            r.p50_ns / 1e3,
            r.p90_ns / 1e3,
            r.p99_ns / 1e3,
            r.p999_ns / 1e3,
        )
        for r in requests(p)
    ]
