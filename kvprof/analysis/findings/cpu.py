"""Findings on CPU time: catalog functions anywhere on the stack, other hot leaves,
and a catalog function's CPU share folded into its lock or cache-line finding."""

from __future__ import annotations

from collections import defaultdict

from kvprof.analysis.findings.common import Context, severity_of, worst
from kvprof.analysis.hotspots import Hotspot, by_id, is_kernel, match_function, normalize
from kvprof.analysis.tables import Functions, functions
from kvprof.model.profile import Finding


class _Samples:
    """The window's on-CPU samples by function, and the rows a CPU finding has of them."""

    def __init__(self, c: Context, counts: Functions) -> None:
        self.c = c
        self.counts = counts
        self.total = counts.samples

    def cpu_s(self, n: int) -> float:
        # without a sampling rate, fall back to the share of samples
        return n / self.c.p.hz / self.c.dur if self.c.p.hz > 0 else n / self.total

    def thread_rows(self, counts: dict[str, int]) -> dict[str, dict[str, float]]:
        thread_total = self.counts.thread_samples
        return {
            tid: {
                "samples": float(n),
                "share_of_thread": n / thread_total[tid] if thread_total[tid] else 0.0,
                "cpu_s_per_s": self.cpu_s(n),
            }
            for tid, n in sorted(counts.items(), key=lambda kv: -kv[1])
        }

    def socket_rows(self, counts: dict[str, int]) -> dict[str, dict[str, float]]:
        rows: dict[str, dict[str, float]] = {}
        for tid, n in counts.items():
            row = rows.setdefault(self.c.socket_of(tid), {"samples": 0.0})
            row["samples"] += n
        return rows


def _catalog_findings(s: _Samples, matched: dict[str, Hotspot]) -> list[Finding]:
    """Catalog functions with enough of the samples anywhere on the stack."""
    c, t, incl, self_ = s.c, s.c.t, s.counts.total_samples, s.counts.self_samples
    out: list[Finding] = []
    # several frames may normalize to one function (e.g. different offsets)
    by_fn: dict[str, list[str]] = defaultdict(list)
    for frame in matched:
        by_fn[normalize(frame)].append(frame)
    for fn, frames in by_fn.items():
        hot = matched[frames[0]]
        n = sum(incl[f] for f in frames)
        ns = sum(self_.get(f, 0) for f in frames)
        share = n / s.total
        if share < t.hotspot_cpu_info:
            continue
        tcounts: dict[str, int] = defaultdict(int)
        for f in frames:
            for tid, k in s.counts.total_by_thread[f].items():
                tcounts[tid] += k
        out.append(
            c.finding(
                s.thread_rows(tcounts),
                "cpu",
                fn,
                title=f"{fn}: {hot.title}",
                severity=severity_of(share, t.hotspot_cpu_critical, t.hotspot_cpu_warning),
                cost={
                    "samples": float(n),
                    "self_samples": float(ns),
                    "share": share,
                    "self_share": ns / s.total,
                    "cpu_s_per_s": s.cpu_s(n),
                    "est_s_per_s": s.cpu_s(n),
                },
                per_socket=s.socket_rows(tcounts),
                explanation=hot.explanation,
                advice=hot.fix,
                hotspot=hot.id,
                sites=[fn],
            )
        )
    return out


def _hot_leaf_findings(s: _Samples, matched: dict[str, Hotspot]) -> list[Finding]:
    """The few hottest leaves that are not catalog functions, nor lock functions whose
    samples the sampled registers gave to their locks (the lock-CPU findings)."""
    c, t, incl = s.c, s.c.t, s.counts.total_samples
    locked = {normalize(x.leaf) for x in c.p.addresses.locks}
    out: list[Finding] = []
    for leaf, n in sorted(s.counts.self_samples.items(), key=lambda kv: -kv[1]):
        if len(out) >= t.hot_functions_max or n / s.total < t.hot_function_info:
            break
        if leaf in matched or normalize(leaf) in locked:
            continue
        fn = normalize(leaf) + (" [kernel]" if is_kernel(leaf) else "")
        share = n / s.total
        by_thread = s.counts.self_by_thread[leaf]
        out.append(
            c.finding(
                s.thread_rows(by_thread),
                "cpu",
                normalize(leaf),
                title=f"hot function {fn}",
                # kernel time in a network server is mostly per-request syscalls: a lead
                # (batch the requests), not a defect, so it stays info
                severity="warning" if share >= t.hot_function_warning and not is_kernel(leaf) else "info",
                cost={
                    "samples": float(incl[leaf]),
                    "self_samples": float(n),
                    "share": incl[leaf] / s.total,
                    "self_share": share,
                    "cpu_s_per_s": s.cpu_s(n),
                    "est_s_per_s": s.cpu_s(n),
                },
                per_socket=s.socket_rows(by_thread),
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


def cpu_findings(c: Context) -> list[Finding]:
    """Catalog functions by their share of the samples, then the hottest other leaves."""
    counts = functions(c.p)
    if counts.samples <= 0:
        return []
    s = _Samples(c, counts)
    matched = {frame: hot for frame in counts.total_samples if (hot := match_function(frame)) is not None}
    return [*_catalog_findings(s, matched), *_hot_leaf_findings(s, matched)]


def fold_cpu(c: Context, findings: list[Finding]) -> list[Finding]:
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
                    host.severity = worst(host.severity, f.severity)
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
