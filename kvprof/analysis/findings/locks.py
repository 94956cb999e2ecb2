"""Findings on kvs locks (the lock probes): waiting as a share of the waiters' time."""

from __future__ import annotations

from kvprof.analysis.findings.common import Context, explain, severity_of, wait_cost, worst
from kvprof.analysis.hotspots import match_function, match_lock
from kvprof.analysis.tables import locks
from kvprof.model.profile import Finding


def lock_findings(c: Context) -> list[Finding]:
    """One finding per contended kvs lock."""
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
        severity = worst(
            severity_of(share, t.lock_critical_share, t.lock_warning_share),
            severity_of(wait_s_per_s * 1e3, t.lock_critical_ms_per_s, t.lock_warning_ms_per_s),
        )
        hot = match_lock(name) or next((h for s in site_names if (h := match_function(s))), None)
        where_site = f" in {site_names[0]}" if site_names else ""
        words = explain(
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
                    **wait_cost(c, waits, wait_s_per_s, share),
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
