"""The ceiling each serialized resource puts on throughput, and the ladder of them.

A resource that every request must hold alone caps the server whatever its
number of cores (the utilization law: a resource busy `D` seconds per
request serves at most `1 / D` requests a second):

- a lock held `h` ns per acquisition, `a` acquisitions per request, is busy
  `a x h` per request. `h` is its critical section's at the thread count
  where it binds (kvprof.analysis.critical): its own work, the transfers of
  the lines it writes, and for a sleeping mutex two threads saturate, the
  hand-off;
- a cache line written by two or more threads moves between cores for
  every write: `w` writes per request each wait a transfer `t`, so the line
  is busy `w x t` per request. `t` is one same-socket round trip
  (`Thresholds.transfer_ns`) on a one-socket machine, and the cross-socket
  ceiling is stated with `Thresholds.cross_socket_weight` times that.

Throughput is the target's own counters over the window (memcached/kvcached
`stats`, Redis `INFO`), or kvcached's sampled requests; a program that counts
no requests has the acquisitions of the lock `record --hold` timed as its
operations (each one a request of the lock). The thread count at
which a ceiling binds is the ceiling over today's throughput per busy thread
(kvprof.analysis.whatif's budget). The ladder is the ceilings lowest first:
fixing one lets the server rise to the next, so each rung's `after_fix` is
the next ceiling (or none left).

Pure functions over kvprof.model; docs/findings.md has the model, its
assumptions and a check against the study's numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from kvprof.analysis import critical
from kvprof.analysis.findings.common import CEILING_SHARE_KEY, THRESHOLDS, Thresholds, rank
from kvprof.analysis.tables import LINE_PROBE, REQUEST_PROBE, sample_rate, seconds
from kvprof.analysis.whatif import budget
from kvprof.model.profile import Finding, LockHold, Profile

FAR = 1000.0  # a ceiling further than this factor above today's throughput is not a rung


@dataclass
class Ceiling:
    """One serialized resource: what it costs each request, and where it caps throughput."""

    resource: str  # "topkeys mutex", "collect_timings shared line"
    kind: str  # lock | line
    where: str  # a finding's `where` it belongs to (lock name or site)
    busy_ns_per_op: float  # the resource's time per request
    ceiling_ops_per_s: float
    binds_at_threads: float
    cross_socket_ops_per_s: float = math.nan  # a line's ceiling when its writers span sockets
    convoy_ops_per_s: float = math.nan  # a lock's past its ceiling: two threads saturate it, hand-off paid
    finding: str = ""  # the id of the finding it belongs to
    after_fix_ops_per_s: float = math.nan  # the next rung of the ladder (inf: none left)


def throughput(p: Profile) -> float:
    """Requests a second over the window (0 when nothing says)."""
    return counted(p)[0]


def counted(p: Profile) -> tuple[float, str]:
    """Throughput and what it counts: the target's own counters or kvcached's sampled
    requests ("requests"), else, for a program that counts none, the acquisitions a
    second of the lock `record --hold` timed, each taken as one operation
    ("acquisitions of LOCK"); (0, "") when nothing says."""
    dur = seconds(p)
    if dur <= 0:
        return 0.0, ""
    before, after = p.server_stats.get("before", {}), p.server_stats.get("after", {})
    done = _ops(after) - _ops(before) if before and after else -1
    if done > 0:
        return done / dur, "requests"
    sampled = sum(r.count for r in p.requests.values()) * sample_rate(p, REQUEST_PROBE)
    if sampled > 0:
        return sampled / dur, "requests"
    timed = [(h.acquisitions / h.window_s, h.name) for h in p.holds if h.window_s > 0 and h.acquisitions]
    if timed:
        rate, name = max(timed)
        return rate, f"acquisitions of {name}"
    return 0.0, ""


def _ops(general: dict[str, str]) -> int:
    try:
        if general.get("protocol") == "redis":
            return int(general["total_commands_processed"])
        return int(general["cmd_get"]) + int(general["cmd_set"])
    except (KeyError, ValueError):
        return -1


def _ops_while(p: Profile, h: LockHold) -> float:
    """Requests a second while `record --hold` timed `h`, from the target's counters
    when its probes went on and off (0 when they do not say): the traps slow a hot
    lock, and the requests with it."""
    before, after = p.server_stats.get("hold.before", {}), p.server_stats.get("hold.after", {})
    done = _ops(after) - _ops(before) if h.window_s > 0 and before and after else -1
    return done / h.window_s if done > 0 else 0.0


def _busy_threads(p: Profile) -> float:
    return sum(t.busy for t in budget(p).threads.values())


def lock_ceilings(p: Profile, ops: float, t: Thresholds = THRESHOLDS) -> list[Ceiling]:
    """A ceiling for each single lock (kvcached's lock__hold, or the one lock
    `record --hold` timed, over the seconds it did: `window_s`), from its critical
    section (kvprof.analysis.critical): a name whose holds were all on one
    address. A name on several addresses is striped or one per thread: the
    paced sample stands for the acquisitions of the whole name, and cannot say
    how they spread over the addresses, so it gets none."""
    dur = seconds(p)
    addresses: dict[str, set[int]] = {}
    for h in p.holds:
        addresses.setdefault(h.name, set()).add(h.address)
    out = []
    on_cpu = {tid: th.on_cpu for tid, th in budget(p).threads.items()} if p.holds else {}
    for h in p.holds:
        if h.acquisitions <= 0 or dur <= 0 or len(addresses[h.name]) > 1:
            continue
        s = critical.section(h, dur, _ops_while(p, h) or ops, on_cpu, t)
        if s.acquisitions_per_op <= 0:
            continue
        if s.holders >= 2 and s.ceiling_ops_per_s < (_ops_while(p, h) or ops):
            # threads that already share it serve more than a convoy would: it is not handed
            # over asleep at this count, and its ceiling is its own work and transfers
            s = replace(s, sleeping=False)
        out.append(
            Ceiling(
                f"{h.name} mutex",
                "lock",
                h.name,
                s.busy_ns_per_op,
                s.ceiling_ops_per_s,
                math.nan,
                convoy_ops_per_s=s.convoy_ops_per_s,
            )
        )
    return out


def line_ceilings(p: Profile, ops: float, t: Thresholds = THRESHOLDS) -> list[Ceiling]:
    """A ceiling for each kvs counter site whose line two or more threads write, from its
    busiest line: writes per request times a transfer, a cross-socket one costing
    `cross_socket_weight` times a same-socket one in the share of transfers that crossed."""
    dur = seconds(p)
    busiest: dict[str, tuple[float, float]] = {}  # site -> (busy ns per request, writes per request)
    for cl in p.cachelines:
        if sum(1 for th in cl.by_thread.values() if th.samples > 0) < 2 or dur <= 0:
            continue
        per_op = cl.samples * sample_rate(p, LINE_PROBE) / dur / ops  # a profile from before the weights
        crossed = cl.cross_socket_transfers / cl.transfers if cl.transfers else 0.0
        busy = per_op * t.transfer_ns * (1 - crossed + crossed * t.cross_socket_weight)
        if busy > busiest.get(cl.site, (0.0, 0.0))[0]:
            busiest[cl.site] = (busy, per_op)
    return [
        Ceiling(
            f"{site} shared line",
            "line",
            site,
            busy,
            1e9 / busy,
            math.nan,
            1e9 / (writes * t.transfer_ns * t.cross_socket_weight),
        )
        for site, (busy, writes) in busiest.items()
        if busy > 0
    ]


def ranked(p: Profile, findings: list[Finding]) -> list[Finding]:
    """`findings` with their ceilings, ranked by the one rule (kvprof.analysis.findings.common)."""
    ops = throughput(p)
    annotate(findings, ladder(p, findings, ops=ops), ops)
    return rank(findings)


def ladder(
    p: Profile, findings: list[Finding], t: Thresholds = THRESHOLDS, ops: float | None = None
) -> list[Ceiling]:
    """Every serialized resource's ceiling, lowest first (the ladder), each tied
    to its finding and with what the server reaches once it is fixed. `ops`:
    the throughput when the caller knows it better than the profile (a live view)."""
    if ops is None:
        ops = throughput(p)
    if ops <= 0:
        return []
    found = [
        c for c in [*lock_ceilings(p, ops, t), *line_ceilings(p, ops, t)] if c.ceiling_ops_per_s <= FAR * ops
    ]
    per_thread = ops / max(_busy_threads(p), 1e-9)
    for c in found:
        c.binds_at_threads = c.ceiling_ops_per_s / per_thread
        c.finding = next((f.id for f in findings if _belongs(c, f)), "")
    found.sort(key=lambda c: c.ceiling_ops_per_s)
    for i, c in enumerate(found):
        c.after_fix_ops_per_s = found[i + 1].ceiling_ops_per_s if i + 1 < len(found) else math.inf
    return found


def _belongs(c: Ceiling, f: Finding) -> bool:
    if c.kind == "lock":
        if f.id.startswith("futex:"):  # the mutex of record --hold, where its futex was waited on
            return f.lock == c.where
        return f.category == "lock" and (f.where == c.where or f.lock == c.where)
    return f.category == "cacheline" and f.where == c.where


def annotate(findings: list[Finding], rungs: list[Ceiling], ops: float) -> None:
    """Each finding's cost gets its resource's ceiling, the thread count it binds at and the
    share of it today's throughput `ops` uses (kept when present: a stored finding's)."""
    by_id = {c.finding: c for c in rungs if c.finding}
    for f in findings:
        c = by_id.get(f.id)
        if c is not None and CEILING_SHARE_KEY not in f.cost:
            f.cost["ceiling_ops_per_s"] = round(c.ceiling_ops_per_s, 1)
            f.cost["binds_at_threads"] = round(c.binds_at_threads, 2)
            f.cost[CEILING_SHARE_KEY] = ops / c.ceiling_ops_per_s


def ladder_line(rungs: list[Ceiling], limit: int = 2) -> str:
    """One line for a screen: "ceiling 5.1M ops/s at ~18 threads: topkeys mutex; then 9.8M: ..."."""
    if not rungs:
        return ""
    first = rungs[0]
    words = [f"ceiling {ops_text(first.ceiling_ops_per_s)} ops/s at ~{first.binds_at_threads:.0f} threads: "
             f"{first.resource}"]  # fmt: skip
    words += [f"then {ops_text(c.ceiling_ops_per_s)}: {c.resource}" for c in rungs[1:limit]]
    return "; ".join(words)


def to_json(c: Ceiling) -> dict[str, Any]:
    """A rung as report --json has it (inf and NaN as null)."""
    return {
        "finding": c.finding,
        "resource": c.resource,
        "kind": c.kind,
        "busy_ns_per_op": round(c.busy_ns_per_op, 1),
        "ceiling_ops_per_s": round(c.ceiling_ops_per_s, 1),
        "binds_at_threads": round(c.binds_at_threads, 2),
        "cross_socket_ops_per_s": _finite(c.cross_socket_ops_per_s),
        "convoy_ops_per_s": _finite(c.convoy_ops_per_s),
        "after_fix_ops_per_s": _finite(c.after_fix_ops_per_s),
    }


def _finite(x: float) -> float | None:
    return round(x, 1) if math.isfinite(x) else None


def ops_text(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.1f}M"
    if x >= 1e3:
        return f"{x / 1e3:.0f}k"
    return f"{x:.0f}"
