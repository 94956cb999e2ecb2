"""Findings on time off the CPU: futexes that are not a kvs lock, waited for on a lock's
acquisition path (a contended mutex or rwlock), and threads blocked (not idle) in a
wait point. Idle waits (condition variables, joins, epoll, sleeps: kvprof.analysis.waits)
are in neither."""

from __future__ import annotations

from collections import defaultdict

from kvprof.analysis.findings.common import Context, explain, severity_of, wait_cost
from kvprof.analysis.hotspots import call_site, match_function
from kvprof.analysis.tables import THREADS_NAMED, locks, offcpu_stacks
from kvprof.analysis.waits import is_idle
from kvprof.model.profile import Finding


def _fmt_tids(tids: list[str], names: dict[str, str]) -> str:
    parts = [f"{names[t]} ({t})" if names.get(t) else f"tid {t}" for t in tids[:THREADS_NAMED]]
    more = len(tids) - THREADS_NAMED
    return ", ".join(parts) + (f" and {more:,} more threads" if more > 0 else "")


def _futex_findings(c: Context) -> list[Finding]:
    """Futexes that are not a kvs lock, by their waiters' share of the time."""
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
                severity=severity_of(share, t.futex_critical_share, t.futex_warning_share),
                lock=lock,
                cost={
                    **wait_cost(c, nwaits, wait_s_per_s, share),
                    "threads": float(len(per_thread)),
                    "est_s_per_s": wait_s_per_s,
                    # sampled (--offcpu-hz above 0): the 90 % interval's half-width
                    **({} if lk.err90_ns is None else {"wait_ms_per_s_err90": lk.err90_ns / 1e6 / c.dur}),
                },
                sites=site_names,
                **explain(
                    hot,
                    "Threads slept in the kernel waiting on this futex from a lock's acquisition "
                    "path (pthread_mutex_lock, an rwlock): the lock was held by another thread, "
                    "and each wait lasted until the waiter was back on a CPU.",
                    "Shorten or split the critical section, or make the data it guards per-thread.",
                ),
            )
        )
    return out


def _blocked_findings(c: Context) -> list[Finding]:
    """Blocking off-CPU time per wait point, idle waits excluded."""
    t = c.t
    out: list[Finding] = []
    points: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for st in offcpu_stacks(c.p):
        if not st.frames or is_idle(st.frames) or st.placeless():
            # a wait for a CPU is no wait point (analysis.whatif counts it as busy), nor is a sleep not seen
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


def offcpu_findings(c: Context) -> list[Finding]:
    """The futex findings, then the blocked wait points."""
    return [*_futex_findings(c), *_blocked_findings(c)]
