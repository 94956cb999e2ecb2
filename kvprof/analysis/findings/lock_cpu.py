"""Findings on the CPU the lock machinery burns: the on-CPU samples in
pthread_mutex_lock, its unlock, trylock and the futex calls under them, each
attributed to the lock it acted on and the function that called it (the
`regsample` collector's Profile.addresses.locks: the lock from the register
that holds the lock function's argument, the caller from the sample's stack).

The function that takes a lock is the most frequent caller of its lock and
trylock calls, lock wrappers skipped (kvprof.analysis.hotspots.is_wrapper); one
finding per such function holds every lock it takes, unlock and kernel time
included, so "18 % of the CPU in pthread_mutex_*" reads as "mutex `stats_lock`
taken in process_command: 18 % of the CPU". Its cost is that CPU, per thread;
fixing it (no lock there, or one taken far less often) gives that CPU back
(kvprof.analysis.whatif). It names no catalog entry: a catalog fix (per-thread
tables) may still take a lock, uncontended, and keep this cost.
"""

from __future__ import annotations

import os
from collections import defaultdict

from kvprof.analysis.findings.common import Context, severity_of
from kvprof.analysis.hotspots import is_wrapper
from kvprof.analysis.tables import THREADS_NAMED
from kvprof.model.profile import Finding, LockCpuSample, Profile

ID_PREFIX = "lock-cpu:"
UNKNOWN_CALLER = "an unknown caller"  # no stack came with the samples (no oncpu collector)
LOCKS_NAMED = 3  # a finding over more locks than this names the first and says how many
SHARING_SAMPLES = 4  # samples of each lock from which one thread alone is said to take it


def site(s: LockCpuSample) -> str:
    """The function that called the lock function, lock wrappers (`kv_lock`) skipped,
    named as the stack named it."""
    if not s.callers:
        return UNKNOWN_CALLER
    return next((c for c in s.callers if not is_wrapper(c)), s.callers[0])


def _releases(s: LockCpuSample) -> bool:
    return "unlock" in s.function


def _noun(samples: list[LockCpuSample]) -> str:
    fn = max(samples, key=lambda s: s.count).function
    return "rwlock" if "rwlock" in fn else "spinlock" if "spin" in fn else "mutex"


def named(symbol: str) -> str:
    """A lock's data symbol in backquotes; an address in memory (`heap 0x...`) as it is."""
    return symbol if symbol.startswith(("heap ", "stack ")) else f"`{symbol}`"


def describe(samples: list[LockCpuSample], exe: str = "") -> str:
    """What the locks are: "mutex `big_lock`", "mutex heap 0x...", "4,096 mutexes in heap
    0x...-0x...", "2 mutexes in `item_locks`" (`exe`: the target's program, whose name
    with an offset names data without a symbol, not an object)."""
    by_addr: dict[int, int] = defaultdict(int)
    symbols: dict[int, str] = {}
    for s in samples:
        by_addr[s.address] += s.count
        symbols[s.address] = s.symbol
    noun = _noun(samples)
    ranked = sorted(by_addr, key=lambda a: (-by_addr[a], a))
    if len(ranked) == 1:
        return f"{noun} {named(symbols[ranked[0]])}"
    plural = f"{len(ranked):,} {noun}es" if noun == "mutex" else f"{len(ranked):,} {noun}s"
    objects = {_object(symbols[a], exe) for a in ranked}
    if len(objects) == 1 and "" not in objects:  # one object: an array of locks, a struct of them
        return f"{plural} in `{next(iter(objects))}`"
    if len(ranked) <= LOCKS_NAMED:
        names = [named(symbols[a]) for a in ranked]
        return f"{plural}: {', '.join(names[:-1])} and {names[-1]}"
    regions = {_region(symbols[a]) for a in ranked}
    region = next(iter(regions))
    if len(regions) == 1 and region in ("heap", "stack"):
        return f"{plural} in {region} 0x{min(ranked):x}-0x{max(ranked):x}"
    if len(regions) == 1 and objects == {""}:  # a module's data without symbols: its offsets
        offsets = [int(symbols[a].split("+0x", 1)[1], 16) for a in ranked if "+0x" in symbols[a]]
        if len(offsets) == len(ranked):
            return f"{plural} in {region}+0x{min(offsets):x}-0x{max(offsets):x}"
    return f"{plural} ({named(symbols[ranked[0]])} and {len(ranked) - 1:,} more)"


def _region(symbol: str) -> str:
    """`heap`, `stack`, or the module (`memcached+0x4e320` -> `memcached`)."""
    return symbol.split(" ", 1)[0].split("+", 1)[0]


def _object(symbol: str, exe: str) -> str:
    """The data object a lock lies in, by its symbol (`item_locks+0x28` -> `item_locks`);
    "" for an address in memory or in a module's data without a symbol."""
    base = symbol.split("+", 1)[0]
    if base.startswith(("heap ", "stack ")) or base == os.path.basename(exe) or ".so" in base:
        return ""
    return base


def _groups(rows: list[LockCpuSample], exe: str = "") -> dict[str, list[LockCpuSample]]:
    """The samples by the function that takes their locks. Each lock goes to the most
    frequent caller of its acquisitions (of all its calls when none was sampled); the locks
    of one object then make one group, whichever functions take them: those of one data
    symbol, and locks without one (in the heap, or in a module's data) whose ranges of
    addresses overlap (an array of locks, such as a hash table's, whose sampled elements
    differ from caller to caller). A group is named
    after its function with the most samples taking them."""
    takes: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    calls: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for s in rows:
        calls[s.address][site(s)] += s.count
        if not _releases(s):
            takes[s.address][site(s)] += s.count
    by_taker: dict[str, list[LockCpuSample]] = defaultdict(list)
    for s in rows:
        by = takes.get(s.address) or calls[s.address]
        by_taker[max(by, key=lambda c: (by[c], c))].append(s)
    groups = list(by_taker.values())
    merged = True
    while merged:  # a handful of groups: merge pairs until none is left to merge
        merged = False
        for i, a in enumerate(groups):
            for j in range(i + 1, len(groups)):
                if _same_object(a, groups[j], exe):
                    groups[i] = a + groups.pop(j)
                    merged = True
                    break
            if merged:
                break
    out: dict[str, list[LockCpuSample]] = {}
    for g in groups:
        counts: dict[str, int] = defaultdict(int)
        for s in g:
            counts[site(s)] += s.count if not _releases(s) else 0
        if not any(counts.values()):
            for s in g:
                counts[site(s)] += s.count
        out[max(counts, key=lambda c: (counts[c], c))] = g
    return out


def _spans(g: list[LockCpuSample], exe: str) -> dict[str, tuple[int, int]]:
    """The range of a group's locks without a data symbol, per region (`heap`, `stack`, or
    the module whose data holds them), where it has two or more."""
    by_region: dict[str, set[int]] = defaultdict(set)
    for s in g:
        if not _object(s.symbol, exe):
            by_region[_region(s.symbol)].add(s.address)
    return {r: (min(a), max(a)) for r, a in by_region.items() if len(a) >= 2}


def _same_object(a: list[LockCpuSample], b: list[LockCpuSample], exe: str) -> bool:
    objects = {o for s in a if (o := _object(s.symbol, exe))}
    if objects & {o for s in b if (o := _object(s.symbol, exe))}:
        return True
    sa, sb = _spans(a, exe), _spans(b, exe)
    return any(r in sb and sa[r][0] <= sb[r][1] and sb[r][0] <= sa[r][1] for r in sa)


def lock_addresses(p: Profile, f: Finding) -> set[int]:
    """The locks of a lock-CPU finding."""
    return {s.address for s in _groups(p.addresses.locks, p.target.exe).get(f.where, [])}


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def lock_cpu_findings(c: Context) -> list[Finding]:
    """One finding per function that takes locks whose machinery had enough of the CPU."""
    rows = c.p.addresses.locks
    totals = c.p.addresses.thread_samples
    all_samples = sum(totals.values())
    if not rows or all_samples <= 0:
        return []
    hz = c.p.hz
    out: list[Finding] = []
    for taker, samples in _groups(rows, c.p.target.exe).items():
        n = sum(s.count for s in samples)
        share = n / all_samples
        if share < c.t.lock_cpu_info:
            continue
        by_thread: dict[str, int] = defaultdict(int)
        by_site: dict[str, int] = defaultdict(int)
        threads_of: dict[int, set[int]] = defaultdict(set)
        for s in samples:
            by_thread[str(s.tid)] += s.count
            by_site[site(s)] += s.count
            threads_of[s.address].add(s.tid)
        kernel = sum(s.count for s in samples if s.kernel)
        unlock = sum(s.count for s in samples if _releases(s))
        per_thread = {
            tid: {
                "samples": float(k),
                "share_of_thread": _share(k, totals.get(tid, 0)),
                "cpu_s_per_s": k / hz / c.dur if hz > 0 else k / all_samples,
            }
            for tid, k in sorted(by_thread.items(), key=lambda kv: -kv[1])
        }
        per_socket: dict[str, dict[str, float]] = {}
        for tid, k in by_thread.items():
            row = per_socket.setdefault(c.socket_of(tid), {"samples": 0.0})
            row["samples"] += k
        what = describe(samples, c.p.target.exe)
        sites = sorted(by_site, key=lambda x: (-by_site[x], x))
        sharers = max(len(t) for t in threads_of.values())
        per_lock: dict[int, int] = defaultdict(int)
        for x in samples:
            per_lock[x.address] += x.count
        seen_enough = min(per_lock.values()) >= SHARING_SAMPLES
        cpu_s = sum(r["cpu_s_per_s"] for r in per_thread.values())
        out.append(
            c.finding(
                per_thread,
                "lock",
                taker,
                id=ID_PREFIX + taker,
                title=f"{what} taken in {taker}: {share:.1%} of the CPU in lock and unlock",
                severity=severity_of(share, c.t.lock_cpu_critical, c.t.lock_cpu_warning),
                lock=what,
                sites=sites,
                cost={
                    "samples": float(n),
                    "share": share,
                    "cpu_s_per_s": cpu_s,
                    "est_s_per_s": cpu_s,
                    "unlock_share": _share(unlock, n),
                    "kernel_share": _share(kernel, n),
                    "locks": float(len(threads_of)),
                    "threads": float(len(per_thread)),
                    "sharers": float(sharers),
                },
                per_socket=per_socket,
                explanation=_why(
                    c, what, taker, sites, per_thread, (n, unlock, kernel), sharers, seen_enough
                ),
                advice=(
                    "Take the lock less often (batch the work under one acquisition), split it per "
                    "thread or per stripe, or replace the data it guards with per-thread copies "
                    "merged on read; a lock only one thread takes can go, or become thread-local data."
                ),
            )
        )
    return out


def _why(
    c: Context,
    what: str,
    taker: str,
    sites: list[str],
    per_thread: dict[str, dict[str, float]],
    counts: tuple[int, int, int],
    sharers: int,
    seen_enough: bool,
) -> str:
    n, unlock, kernel = counts
    tids = list(per_thread)
    names = [f"{c.names[t]} ({t})" if c.names.get(t) else f"tid {t}" for t in tids[:THREADS_NAMED]]
    who = ", ".join(names) + (f" and {len(tids) - THREADS_NAMED} more" if len(tids) > THREADS_NAMED else "")
    others = [s for s in sites if s != taker]
    s = (
        f"{who} ran the lock machinery of the {what} in {n:,} CPU samples: "
        f"{_share(n - unlock, n):.0%} taking it, {_share(unlock, n):.0%} releasing it, "
        f"{_share(kernel, n):.0%} in the kernel (the futex calls that put a waiter to sleep and wake it)."
        + (f" Called from {taker}" + (f", {', '.join(others[:3])}" if others else "") + ".")
    )
    if sharers <= 1 and seen_enough:
        s += (
            " Each lock was taken by one thread only: the cost is the atomic operations of "
            "locking, not waiting for another thread."
        )
    elif sharers <= 1:
        s += " Each lock had too few samples to say whether threads share it."
    else:
        s += (
            f" Up to {sharers} threads took the same lock: each acquisition pulls its cache line "
            "from the core that held it last, and a contended one goes through the futex calls."
        )
    return s
