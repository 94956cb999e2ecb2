"""Findings: the hotspot catalog joined with a profile's measurements.

`find(profile)` returns the findings ranked most costly first: by severity,
then by the estimated cost `cost["est_s_per_s"]`, the thread-seconds a
second of recording that the spot costs (CPU seconds on a hot function,
seconds spent waiting on a lock or futex, or cache-line transfers times the
time one transfer takes). The severity thresholds are in `Thresholds`; they
are documented in docs/report.md.

Sampled probes are scaled back: `kvs:atomic__sample` fires for 1 update in
N (`profile.status.sample_rates["atomic__sample"]`, kvcached's
--probe-sample), so its samples and transfers are multiplied by N, and the
finding says so. Lock probes fire on every contended acquisition and are not
scaled unless a rate is recorded for them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvprof.analysis.hotspots import (
    Hotspot,
    by_id,
    call_site,
    is_kernel,
    match_function,
    match_lock,
    match_site,
    normalize,
)
from kvprof.analysis.lines import line_findings
from kvprof.analysis.tables import functions, locks, offcpu_stacks, seconds, sites
from kvprof.model.profile import Finding, Profile

SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Thresholds:
    """Where a measurement becomes info, warning or critical (docs/report.md)."""

    # kvs locks: waiting as a share of the waiting threads' wall time, or ms per s of recording
    lock_critical_share: float = 0.05
    lock_critical_ms_per_s: float = 100.0
    lock_warning_share: float = 0.005
    lock_warning_ms_per_s: float = 5.0
    # cache lines written by two or more threads: transfers per second, scaled by the
    # sample rate, cross-socket ones counted `cross_socket_weight` times
    line_critical_per_s: float = 100_000.0
    line_warning_per_s: float = 10_000.0
    line_info_per_s: float = 100.0
    cross_socket_weight: float = 3.5
    transfer_ns: float = (
        57.0  # one same-socket cache-line round trip, measured (docs/design.md, "Measured numbers")
    )
    # a catalog function: share of all CPU samples with it anywhere on the stack
    hotspot_cpu_critical: float = 0.25
    hotspot_cpu_warning: float = 0.10
    hotspot_cpu_info: float = 0.01
    # any other function: share of all CPU samples with it as the leaf (never critical)
    hot_function_warning: float = 0.25
    hot_function_info: float = 0.05
    hot_functions_max: int = 3
    # futexes that are not a kvs lock: share of the waiting threads' wall time
    futex_critical_share: float = 0.20
    futex_warning_share: float = 0.02
    futex_info_ms_per_s: float = 1.0
    # off-CPU blocking (idle waits such as epoll_wait excluded): share of one thread's wall time
    offcpu_warning_share: float = 0.5
    offcpu_info_share: float = 0.2


THRESHOLDS = Thresholds()

# Off-CPU waits that mean "nothing to do", not "blocked": leaf-most user frames.
IDLE_WAITS = frozenset(
    {
        "epoll_wait",
        "epoll_pwait",
        "epoll_pwait2",
        "poll",
        "ppoll",
        "select",
        "pselect",
        "pselect6",
        "accept",
        "accept4",
        "nanosleep",
        "clock_nanosleep",
        "usleep",
        "sleep",
        "pause",
        "sigwait",
        "sigwaitinfo",
        "sigtimedwait",
        "pthread_cond_wait",
        "pthread_cond_timedwait",
        "do_epoll_wait",
        "ep_poll",
        "io_getevents",
        "io_uring_enter",
    }
)


def _is_idle(frames: list[str]) -> bool:
    return any(normalize(f) in IDLE_WAITS for f in frames)


class _Ctx:
    """What every rule needs: the window, thread names and sockets."""

    def __init__(self, profile: Profile, t: Thresholds) -> None:
        self.p = profile
        self.t = t
        self.dur = seconds(profile)
        self.names = {tid: th.name for tid, th in profile.threads.items()}

    def socket_of(self, tid: str) -> str:
        th = self.p.threads.get(tid)
        if th is None or not th.sockets:
            return "0"
        return max(th.sockets.items(), key=lambda kv: kv[1])[0]

    def named(self, tids: Iterable[str]) -> dict[str, str]:
        return {t: self.names.get(t, "") for t in tids}

    def finding(
        self, per_thread: dict[str, dict[str, float]], category: str, where: str, **fields: Any
    ) -> Finding:
        """A finding whose per-thread rows carry the threads' names; its id is
        `category:where` unless given."""
        fields.setdefault("id", f"{category}:{where}")
        names = self.named(per_thread)
        return Finding(category=category, where=where, per_thread=per_thread, thread_names=names, **fields)


def _sev(value: float, critical: float, warning: float) -> str:
    if value >= critical:
        return "critical"
    if value >= warning:
        return "warning"
    return "info"


def _worst(*sevs: str) -> str:
    return min(sevs, key=lambda s: SEVERITY_RANK[s])


def _words(hot: Hotspot | None, explanation: str, advice: str, note: str = "") -> dict[str, str]:
    """A finding's explanation, advice and hotspot: the catalog's for a known spot, else
    the generic words given; `note` ends the explanation."""
    if hot is None:
        return {"explanation": explanation + note, "advice": advice, "hotspot": ""}
    return {"explanation": hot.explanation + note, "advice": hot.fix, "hotspot": hot.id}


def _wait_cost(c: _Ctx, waits: int, wait_s_per_s: float, share: float) -> dict[str, float]:
    """The cost of waiting on a lock or futex: how often, how long, what share of the waiters' time."""
    return {
        "waits": float(waits),
        "waits_per_s": waits / c.dur,
        "wait_ms_per_s": wait_s_per_s * 1e3,
        "wait_share": share,
    }


def _fmt_tids(tids: list[str], names: dict[str, str]) -> str:
    parts = [f"{names[t]} ({t})" if names.get(t) else f"tid {t}" for t in tids]
    return ", ".join(parts)


# ---- locks ------------------------------------------------------------------


def _lock_findings(c: _Ctx) -> list[Finding]:
    out: list[Finding] = []
    for lk in locks(c.p):
        if lk.futex or lk.waits <= 0:
            continue
        name, rate, waits, wait_ns = lk.name, lk.rate, lk.waits, lk.wait_ns
        per_thread = {
            t: {"waits": float(w.waits), "wait_ns": float(w.wait_ns)} for t, w in lk.by_thread.items()
        }
        site_names = [s for s, _ in lk.sites]
        nthreads = max(len(per_thread), 1)
        wait_s_per_s = wait_ns / 1e9 / c.dur
        share = wait_s_per_s / nthreads
        for row in per_thread.values():
            row["waits_per_s"] = row["waits"] / c.dur
            row["wait_ms_per_s"] = row["wait_ns"] / 1e6 / c.dur
            row["wait_share"] = row["wait_ns"] / 1e9 / c.dur
            del row["wait_ns"]
        per_socket: dict[str, dict[str, float]] = {}
        for tid, row in per_thread.items():
            ps = per_socket.setdefault(c.socket_of(tid), {"waits_per_s": 0.0, "wait_ms_per_s": 0.0})
            ps["waits_per_s"] += row["waits_per_s"]
            ps["wait_ms_per_s"] += row["wait_ms_per_s"]
        t = c.t
        severity = _worst(
            _sev(share, t.lock_critical_share, t.lock_warning_share),
            _sev(wait_s_per_s * 1e3, t.lock_critical_ms_per_s, t.lock_warning_ms_per_s),
        )
        hot = match_lock(name) or next((h for s in site_names if (h := match_function(s))), None)
        where_site = f" in {site_names[0]}" if site_names else ""
        words = _words(
            hot,
            f"Threads found the {name} lock held and had to wait for it. While a thread waits it "
            "serves no request; the more threads share the lock, the more of the server's time "
            "goes into queueing on it.",
            "Shorten the critical section, split the lock (per thread, per shard), or replace "
            "the shared data it protects with per-thread copies merged on read.",
            f" (Lock waits were sampled 1 in {rate}; the counts are scaled by {rate}.)" if rate > 1 else "",
        )
        out.append(
            c.finding(
                per_thread,
                "lock",
                name,
                title=f"{name} lock contended{where_site}",
                severity=severity,
                sites=site_names,
                cost={
                    **_wait_cost(c, waits, wait_s_per_s, share),
                    "max_ms": (lk.max_ns or 0) / 1e6,
                    "threads": float(len(per_thread)),
                    "sample_rate": float(rate),
                    "est_s_per_s": wait_s_per_s,
                },
                per_socket=per_socket,
                **words,
            )
        )
    return out


# ---- cache lines --------------------------------------------------------------


def _line_findings(c: _Ctx) -> list[Finding]:
    out: list[Finding] = []
    t = c.t
    for st in sites(c.p):
        site, rate = st.site, st.rate
        transfers, cross, cycles_mean = st.transfers, st.cross_socket, st.cycles_mean
        # A line written by one thread only is per-thread data: its "transfers" are that
        # thread moving between CPUs, not sharing. Unknown writers count as shared.
        shared = st.writers != 1
        per_thread = {
            tid: {
                "updates_per_s": lt.updates / c.dur,
                "transfers_per_s": lt.transfers / c.dur,
                "cycles_mean": lt.cycles_mean,
            }
            for tid, lt in st.by_thread.items()
        }
        per_socket: dict[str, dict[str, float]] = {}
        for i, rowm in enumerate(st.socket_matrix):
            for j, v in enumerate(rowm):
                if not v:
                    continue
                for sock, key in ((str(i), "transfers_out_per_s"), (str(j), "transfers_in_per_s")):
                    ps = per_socket.setdefault(sock, {"transfers_out_per_s": 0.0, "transfers_in_per_s": 0.0})
                    ps[key] += v / c.dur
        transfers_per_s = transfers / c.dur
        cross_per_s = cross / c.dur
        weighted = transfers_per_s - cross_per_s + t.cross_socket_weight * cross_per_s
        est = weighted * t.transfer_ns * 1e-9
        if shared:
            if weighted < t.line_info_per_s:
                continue
            severity = _sev(weighted, t.line_critical_per_s, t.line_warning_per_s)
        else:
            if weighted < t.line_info_per_s:
                continue
            severity = "info"
        hot = match_site(site) or match_function(site)
        note = (
            f" (kvs:atomic__sample fires for 1 update in {rate}; updates and transfers are scaled by {rate}.)"
            if rate > 1
            else ""
        )
        if shared:
            title = f"cache line bouncing at {site}"
            words = _words(
                hot,
                f"The counter updated at {site} sits on a cache line that several threads write. "
                "Each write by a different core moves the line there first, and the writer stalls "
                "for that round trip; across sockets it takes several times longer.",
                "Give each thread its own copy (padded to a cache line) and sum the copies on "
                "read, or batch updates locally and publish them periodically.",
                note,
            )
        else:
            title = f"per-thread counter at {site} (not shared)"
            words = _words(
                None,
                f"Every cache line sampled at {site} is written by one thread only, so it does "
                "not bounce between threads; the transfers counted are that thread moving to "
                "another CPU. This is the fixed design working.",
                "Nothing to do here; pinning threads to CPUs would remove the remaining moves.",
                note,
            )
            words["hotspot"] = hot.id if hot else ""
        out.append(
            c.finding(
                per_thread,
                "cacheline",
                site,
                title=title,
                severity=severity,
                cost={
                    "updates_per_s": st.updates / c.dur,
                    "transfers_per_s": transfers_per_s,
                    "cross_socket_per_s": cross_per_s,
                    "cross_socket_share": cross / transfers if transfers else 0.0,
                    "transfer_share": transfers / st.updates,
                    "cycles_mean": cycles_mean,
                    "cycles_max": float(st.cycles_max),
                    "lines": float(len(st.lines)),
                    "writers": float(st.writers),
                    "sample_rate": float(rate),
                    "est_s_per_s": est,
                },
                per_socket=per_socket,
                sites=[site],
                **words,
            )
        )
    return out


# ---- CPU ----------------------------------------------------------------------


def _cpu_findings(c: _Ctx) -> list[Finding]:
    t = c.t
    counts = functions(c.p)
    total = counts.samples
    if total <= 0:
        return []
    thread_total, incl, self_ = counts.thread_samples, counts.total_samples, counts.self_samples
    incl_thread, self_thread = counts.total_by_thread, counts.self_by_thread

    def cpu_s(n: int) -> float:
        # without a sampling rate, fall back to the share of samples
        return n / c.p.hz / c.dur if c.p.hz > 0 else n / total

    def thread_rows(counts: dict[str, int]) -> dict[str, dict[str, float]]:
        return {
            tid: {
                "samples": float(n),
                "share_of_thread": n / thread_total[tid] if thread_total[tid] else 0.0,
                "cpu_s_per_s": cpu_s(n),
            }
            for tid, n in sorted(counts.items(), key=lambda kv: -kv[1])
        }

    def socket_rows(counts: dict[str, int]) -> dict[str, dict[str, float]]:
        rows: dict[str, dict[str, float]] = {}
        for tid, n in counts.items():
            row = rows.setdefault(c.socket_of(tid), {"samples": 0.0})
            row["samples"] += n
        return rows

    out: list[Finding] = []
    matched: dict[str, Hotspot] = {}
    for frame in incl:
        hot = match_function(frame)
        if hot is not None:
            matched[frame] = hot
    # several frames may normalize to one function (e.g. different offsets)
    by_fn: dict[str, list[str]] = defaultdict(list)
    for frame in matched:
        by_fn[normalize(frame)].append(frame)
    for fn, frames in by_fn.items():
        hot = matched[frames[0]]
        n = sum(incl[f] for f in frames)
        ns = sum(self_.get(f, 0) for f in frames)
        share = n / total
        if share < t.hotspot_cpu_info:
            continue
        tcounts: dict[str, int] = defaultdict(int)
        for f in frames:
            for tid, k in incl_thread[f].items():
                tcounts[tid] += k
        per_thread = thread_rows(tcounts)
        out.append(
            c.finding(
                per_thread,
                "cpu",
                fn,
                title=f"{fn}: {hot.title}",
                severity=_sev(share, t.hotspot_cpu_critical, t.hotspot_cpu_warning),
                cost={
                    "samples": float(n),
                    "self_samples": float(ns),
                    "share": share,
                    "self_share": ns / total,
                    "cpu_s_per_s": cpu_s(n),
                    "est_s_per_s": cpu_s(n),
                },
                per_socket=socket_rows(tcounts),
                explanation=hot.explanation,
                advice=hot.fix,
                hotspot=hot.id,
                sites=[fn],
            )
        )
    generic = 0
    for leaf, n in sorted(self_.items(), key=lambda kv: -kv[1]):
        if generic >= t.hot_functions_max or n / total < t.hot_function_info:
            break
        if leaf in matched:
            continue
        generic += 1
        fn = normalize(leaf) + (" [kernel]" if is_kernel(leaf) else "")
        share = n / total
        per_thread = thread_rows(self_thread[leaf])
        out.append(
            c.finding(
                per_thread,
                "cpu",
                normalize(leaf),
                title=f"hot function {fn}",
                # kernel time in a network server is mostly per-request syscalls: a lead
                # (batch the requests), not a defect, so it stays info
                severity="warning" if share >= t.hot_function_warning and not is_kernel(leaf) else "info",
                cost={
                    "samples": float(incl[leaf]),
                    "self_samples": float(n),
                    "share": incl[leaf] / total,
                    "self_share": share,
                    "cpu_s_per_s": cpu_s(n),
                    "est_s_per_s": cpu_s(n),
                },
                per_socket=socket_rows(self_thread[leaf]),
                explanation=(
                    f"{fn} itself (not its callees) was running in {share:.0%} of the CPU samples. "
                    "A function this hot is where work can be saved, or where a thread spins; "
                    "it is not a contention problem by itself."
                ),
                advice=(
                    "Look at its callers in the flame graph (kvprof flamegraph FILE --kind cpu): "
                    "do less of it per request, batch it, or make it cheaper."
                ),
                sites=[normalize(leaf)],
            )
        )
    return out


# ---- off-CPU ------------------------------------------------------------------


def _offcpu_findings(c: _Ctx) -> list[Finding]:
    t = c.t
    out: list[Finding] = []
    for lk in locks(c.p):
        if not lk.futex:
            continue
        uaddr, nwaits, ns = lk.futex, lk.waits, lk.wait_ns
        wait_s_per_s = ns / 1e9 / c.dur
        if nwaits <= 0 or wait_s_per_s * 1e3 < t.futex_info_ms_per_s:
            continue
        per_thread = {
            tid: {
                "waits_per_s": w.waits / c.dur,
                "wait_ms_per_s": w.wait_ns / 1e6 / c.dur,
                "wait_share": w.wait_ns / 1e6 / c.dur / 1e3,
            }
            for tid, w in lk.by_thread.items()
        }
        share = wait_s_per_s / max(len(per_thread), 1)
        site_names = [s for s, _ in lk.sites]
        hot = next((h for s in site_names if (h := match_function(s))), None)
        lock = lk.name
        out.append(
            c.finding(
                per_thread,
                "offcpu",
                # the caller of pthread_mutex_lock & co. (the first frame outside libc), as a kvs lock's
                site_names[0] if site_names else lock,
                id=f"futex:{uaddr:#x}",
                title=f"{lock} contended" + (f" in {site_names[0]}" if site_names else ""),
                severity=_sev(share, t.futex_critical_share, t.futex_warning_share),
                lock=lock,
                cost={
                    **_wait_cost(c, nwaits, wait_s_per_s, share),
                    "threads": float(len(per_thread)),
                    "est_s_per_s": wait_s_per_s,
                },
                sites=site_names,
                **_words(
                    hot,
                    "Threads slept in the kernel waiting on this futex: a contended mutex, or a "
                    "condition variable or semaphore they were waiting on. The stack shows which.",
                    "If it is a mutex, shorten or split its critical section or make the data "
                    "per-thread; if it is a condition variable, check that the waiting is by design.",
                ),
            )
        )
    # blocking off-CPU time per wait point, idle waits excluded
    points: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for st in offcpu_stacks(c.p):
        if not st.frames or _is_idle(st.frames):
            continue
        points[call_site(st.frames)][str(st.tid)] += st.ns
    for point, by_tid in points.items():
        worst = max(by_tid.values()) / 1e9 / c.dur
        if worst < t.offcpu_info_share:
            continue
        per_thread = {
            tid: {"offcpu_ms_per_s": ns / 1e6 / c.dur, "wall_share": ns / 1e9 / c.dur}
            for tid, ns in sorted(by_tid.items(), key=lambda kv: -kv[1])
        }
        total_s = sum(by_tid.values()) / 1e9 / c.dur
        heavy = [tid for tid, r in per_thread.items() if r["wall_share"] >= t.offcpu_info_share]
        out.append(
            c.finding(
                per_thread,
                "offcpu",
                point,
                title=f"threads blocked off-CPU in {point}",
                severity="warning" if worst >= t.offcpu_warning_share else "info",
                cost={
                    "offcpu_ms_per_s": total_s * 1e3,
                    "max_wall_share": worst,
                    "threads": float(len(by_tid)),
                    "est_s_per_s": total_s,
                },
                explanation=(
                    f"{_fmt_tids(heavy, c.names)} spent up to {worst:.0%} of the recording off-CPU "
                    f"in {point}, not waiting for work (idle waits such as epoll_wait are left out) "
                    "but blocked: on I/O, a lock, a page fault, or preempted by other work."
                ),
                advice=(
                    "Look at the off-CPU flame graph (kvprof flamegraph FILE --kind offcpu) to see "
                    "what the thread waited for; move blocking work off the request path."
                ),
                sites=[point],
            )
        )
    return out


# ---- all ----------------------------------------------------------------------


def rank_key(f: Finding) -> tuple[int, float, str]:
    """Sort key: severity first, then estimated cost (descending), then id."""
    return (SEVERITY_RANK.get(f.severity, 3), -f.cost.get("est_s_per_s", 0.0), f.id)


def _fold_cpu(c: _Ctx, findings: list[Finding]) -> list[Finding]:
    """One finding per spot: a catalog function's CPU share joins its lock or cache-line finding."""
    hosts = [f for f in findings if f.category in ("lock", "cacheline")]
    out = []
    for f in findings:
        if f.category == "cpu" and f.hotspot:
            host = next((h for h in hosts if f.where == h.where or f.where in h.sites), None)
            if host is not None:
                host.cost["cpu_share"] = f.cost["share"]
                host.cost["cpu_s_per_s"] = f.cost["cpu_s_per_s"]
                if host.cost.get("writers", 2.0) != 1.0:
                    host.severity = _worst(host.severity, f.severity)
                continue
            hot = by_id(f.hotspot)
            lock_data = c.p.target.kvs_probes and "locks" in c.p.collectors
            if hot is not None and hot.category == "lock" and lock_data:
                # the lock this spot is known for was never found held: the time is the work
                f.explanation = (
                    f"{f.where} is a known contention spot, but no contended wait on its lock was "
                    "recorded in this profile: its CPU time is the work it does, not waiting. "
                    + hot.explanation
                )
                f.title = f"{f.where}: {hot.title}, but its lock was not found held"
                if f.severity == "critical":
                    f.severity = "warning"
        out.append(f)
    return out


def find(profile: Profile, thresholds: Thresholds = THRESHOLDS) -> list[Finding]:
    """Every finding for `profile`, most costly first."""
    c = _Ctx(profile, thresholds)
    findings = [
        *_lock_findings(c),
        *_line_findings(c),
        *line_findings(profile, skip_functions={cl.site for cl in profile.cachelines}),
        *_cpu_findings(c),
        *_offcpu_findings(c),
    ]
    return sorted(_fold_cpu(c, findings), key=rank_key)


def _n(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}".rstrip("0").rstrip(".") if x else "0"


def _cpu_note(f: Finding) -> str:
    if "cpu_share" not in f.cost:
        return ""
    where = f.sites[0] if f.sites else f.where
    return f" {where} was on the stack in {f.cost['cpu_share']:.1%} of the CPU samples."


def summary(f: Finding) -> str:
    """The finding's measurements in one or two plain sentences ("how much")."""
    k = f.cost
    if f.category == "lock":
        threads = int(k.get("threads", 0))
        s = (
            f"The {f.where} lock was found held {_n(k.get('waits_per_s', 0))} times a second"
            + (f", mostly in {f.sites[0]}" if f.sites else "")
            + f"; waiting for it cost {_n(k.get('wait_ms_per_s', 0))} ms per second"
            + f" ({k.get('wait_share', 0):.1%} of the time of the {threads} waiting "
            + ("thread" if threads == 1 else "threads")
            + f"), the longest wait {_n(k.get('max_ms', 0))} ms."
        )
        return s + _cpu_note(f)
    if f.id.startswith("sampled-line:"):
        what = "distinct addresses in one line" if k.get("false_sharing") else "one line"
        return (
            f"{int(k.get('samples', 0))} on-CPU samples stalled on atomic writes to {what}, "
            f"written by {int(k.get('writers', 0))} threads: ~{k.get('share', 0):.1%} of those threads' CPU "
            "(from sampled registers, no probes)."
        )
    if f.category == "cacheline":
        s = (
            f"{f.where} updated its counter {_n(k.get('updates_per_s', 0))} times a second; "
            f"{_n(k.get('transfers_per_s', 0))} a second ({k.get('transfer_share', 0):.0%}) "
            f"found the cache line on another CPU"
        )
        if k.get("cross_socket_per_s", 0):
            s += f", {k.get('cross_socket_share', 0):.0%} of them on another socket"
        s += f"; an update took {_n(k.get('cycles_mean', 0))} cycles on average"
        writers = int(k.get("writers", 0))
        s += f" ({writers} writing thread{'' if writers == 1 else 's'} per line)."
        return s + _cpu_note(f)
    if f.category == "cpu":
        s = (
            f"{f.where} was on the stack in {k.get('share', 0):.1%} of the CPU samples "
            f"and running itself in {k.get('self_share', 0):.1%}"
        )
        if "cpu_s_per_s" in k:
            s += f" ({_n(k['cpu_s_per_s'] * 1e3)} ms of CPU per second)"
        return s + "."
    if f.id.startswith("futex:"):
        on = f"{f.lock} in {f.where}" if f.lock and f.lock != f.where else f.where
        return (
            f"Threads waited on {on} {_n(k.get('waits_per_s', 0))} times a second, "
            f"{_n(k.get('wait_ms_per_s', 0))} ms per second "
            f"({k.get('wait_share', 0):.1%} of the waiting threads' time)."
        )
    return (
        f"{int(k.get('threads', 0))} threads were blocked in {f.where} for "
        f"{_n(k.get('offcpu_ms_per_s', 0))} ms per second in all, one of them "
        f"{k.get('max_wall_share', 0):.0%} of the time."
    )
