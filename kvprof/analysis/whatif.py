"""What each fix is worth: the throughput a finding would give back if it were fixed.

For every thread of the target the window is a time budget: busy (on the
CPU, runnable and waiting for a CPU, or waiting on a contended lock or
futex: it has work in hand) or not (waiting for requests or for I/O). A fix
removes part of a thread's busy time, `removed`: the time it waited for a
contended lock or futex, the time it held a shared lock beyond the critical
section's own work (kvcached's sampled holds past the shortest one: the
lines that moved in and the hand-off), the CPU it spent in the machinery only a contended
lock runs at that call site (the futex calls, the wake-up an unlock owes a
sleeper) and stalled on the lock's own word, all the CPU of the lock
machinery at the calls that take a lock (a lock-CPU finding: a fix that takes
it far less often does not run it), the CPU of a function whose
shared cache line bounced, or the CPU samples stalled on an atomic write to
a contended line. A per-thread design still does the work itself; only that
excess goes. `breakdown` gives those parts apart (PARTS), and the CPU per
request they save: all of them but the waits are CPU.

A thread that is always busy serves 1 / (1 - r) times as fast when a fix
removes a share `r` of its time: it is the bottleneck, and r / (1 - r) is
what it gains. A thread busy a share `b` of the time is the bottleneck only
while busy: the rest of the time the client or the network has the
requests, and a shorter service time does not bring them sooner. So its
gain is b x r / (1 - r): all of it when b = 1, about nothing when it mostly
waits. The target's gain is the mean of its threads' gains
weighted by their busy time (the work each serves). Several fixes remove the
sum of their times from each thread before the formula is applied, so gains
compound rather than add. The target's threads are taken for the loop's
bottleneck while busy: a client that is close to saturation itself (which
a profile of the target does not see) takes over after a small gain, and
then this is an upper bound.

Time kvprof's own probes spent in the target (samples in the kernel's uprobe
handling) is left out of what a fix removes: the unprofiled target never
spends it. docs/findings.md has the model, its assumptions and how it
compares with the real fixes.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from kvprof.analysis import critical
from kvprof.analysis.findings.common import GAIN_KEY, THRESHOLDS
from kvprof.analysis.findings.lock_cpu import ID_PREFIX as LOCK_CPU
from kvprof.analysis.findings.lock_cpu import lock_addresses
from kvprof.analysis.hotspots import normalize
from kvprof.analysis.lines import LINE, line_table
from kvprof.analysis.tables import locks, seconds
from kvprof.model.profile import HZ, MACHINE_BUSY, MACHINE_IDLE, Finding, Profile

# GAIN_KEY, in each finding's cost: 0.12 for +12 % throughput
REMOVED_KEY = "removed_share"  # in each finding's cost: the busiest thread's share the fix removes
COUNTED = ("critical", "warning")  # the severities gain_if_all_fixed takes together
CPU_BOUND = 0.8  # the threads' busy share from which the target is CPU-bound
NOT_BOUND = 0.5  # and under which it is not: its threads wait more than they serve
OTHERS_SHARE = 0.1  # the share of the machine's CPU time other programs took from which the gains say so
# the lock machinery that runs only when a lock is contended: the futex calls and the
# wake-up an unlock owes a sleeper (a trylock's miss can be a cold line, contended or not)
CONTENDED_FRAMES = ("futex", "lll_lock_wake", "lll_unlock_wake")
WAITING = ("lock_wait", "futex_wait")  # inside a blocking wait: already in the wait time
OWN_PROBES = ("uprobe", "int3")  # the kernel handling kvprof's uprobes


@dataclass
class ThreadTime:
    """One thread's window as shares of the wall time."""

    tid: str
    name: str
    on_cpu: float
    busy: float  # on the CPU, waiting for one or on a contended lock; the rest it waited for work


@dataclass
class Budget:
    """The target's threads' time, and what sets its pace."""

    threads: dict[str, ThreadTime] = field(default_factory=dict)
    busy_share: float = 0.0  # the threads' busy share, weighted by busy time
    pace: str = ""  # "cpu-bound", "partly cpu-bound", "not cpu-bound", "" when nothing ran
    cpus: int = 0  # the machine's
    machine_busy: float = math.nan  # the share of the machine's CPU time that was busy (nan: not read)
    others: float = math.nan  # of it, the share other programs took (the target's on-CPU time aside)

    def describe(self) -> str:
        """How busy the threads were and what that means for the gains."""
        if not self.pace:
            return "No thread of the target was seen busy: no gain can be predicted."
        return self._threads() + self._machine()

    def _machine(self) -> str:
        if not self.others >= OTHERS_SHARE:  # False when nan
            return ""
        return (
            f" The machine's {self.cpus} CPUs were {self.machine_busy:.0%} busy, "
            f"{self.others:.0%} of their time with other programs: if one is the client, it "
            "takes its share of the CPU a fix frees, and the gains are upper bounds."
        )

    def _threads(self) -> str:
        how = (
            f"The target's busy threads were on a CPU, waiting for one or on a contended lock "
            f"{self.busy_share:.0%} of the time"
        )
        if self.pace == "cpu-bound":
            return how + ": it is CPU-bound, so what a fix removes from them is throughput gained."
        if self.pace == "partly cpu-bound":
            return (
                how + ", the rest waiting for requests: it is partly CPU-bound, and a "
                "fix gains in proportion."
            )
        return (
            how + ", the rest waiting for requests: it is not CPU-bound. The client or "
            "the network sets its pace, and fixing what it does gains little throughput."
        )


def _samples_by_thread(p: Profile) -> dict[str, int]:
    """Each thread's on-CPU samples: its stacks', its own count's, or the sampled registers'."""
    out: dict[str, int] = defaultdict(int)
    for s in p.oncpu:
        out[str(s.tid)] += s.count
    for tid, th in p.threads.items():
        out[tid] = max(out[tid], th.cpu_samples, p.addresses.thread_samples.get(tid, 0))
    return out


def _waits(p: Profile) -> dict[str, float]:
    """Each thread's time waiting on contended locks and futexes (kvs locks and other futexes
    apart, so that a kvs lock's futex is counted once)."""
    out: dict[str, float] = defaultdict(float)
    for lk in locks(p):
        for tid, w in lk.by_thread.items():
            out[tid] += w.wait_ns
    return out


def asleep_share(p: Profile) -> dict[str, float]:
    """Per thread, the share of its lock and futex waits it spent asleep. A kvs lock's wait
    runs from the failed trylock to the acquisition: it holds the lock machinery's CPU and
    the thread's preemptions too, which the budget has as on-CPU and runnable time already.
    Asleep is the thread's off-CPU time less its runnable time (the offcpu collector's); a
    thread it did not time off the CPU keeps its whole wait."""
    if "offcpu" not in p.collectors:
        return {}
    out = {}
    for tid, ns in _waits(p).items():
        th = p.threads.get(tid)
        if th is not None and th.offcpu_ns > 0 and ns > 0:
            out[tid] = min(1.0, max(0.0, th.offcpu_ns - th.runnable_ns) / ns)
    return out


def machine_busy(p: Profile) -> float:
    """The share of the machine's CPU time that was busy over the window (nan when the
    recording did not read it)."""
    busy, idle = p.status.counters.get(MACHINE_BUSY, 0), p.status.counters.get(MACHINE_IDLE, 0)
    return busy / (busy + idle) if busy + idle > 0 else math.nan


def budget(p: Profile) -> Budget:
    """Every thread's time budget over the window."""
    dur, hz = seconds(p), p.hz or HZ
    samples = _samples_by_thread(p)
    waits = _waits(p)
    asleep = asleep_share(p)
    out = Budget()
    for tid in sorted(set(p.threads) | set(samples)):
        th = p.threads.get(tid)
        on = min(1.0, samples.get(tid, 0) / hz / dur)
        runnable = th.runnable_ns / 1e9 / dur if th else 0.0
        busy = min(1.0, on + runnable + waits.get(tid, 0.0) * asleep.get(tid, 1.0) / 1e9 / dur)
        out.threads[tid] = ThreadTime(tid, th.name if th else "", on, busy)
    out.cpus, out.machine_busy = p.host.cpus, machine_busy(p)
    target = sum(t.on_cpu for t in out.threads.values()) / (p.host.cpus or 1)
    out.others = max(0.0, out.machine_busy - target) if not math.isnan(out.machine_busy) else math.nan
    total = sum(t.busy for t in out.threads.values())
    if total > 0:
        out.busy_share = sum(t.busy * t.busy for t in out.threads.values()) / total
        out.pace = (
            "cpu-bound"
            if out.busy_share >= CPU_BOUND
            else "partly cpu-bound"
            if out.busy_share >= NOT_BOUND
            else "not cpu-bound"
        )
    return out


def gain(b: Budget, removed: dict[str, float]) -> float:
    """The throughput gained when `removed` (tid -> share of the wall time) goes from each thread."""
    total = sum(t.busy for t in b.threads.values())
    if total <= 0:
        return 0.0
    out = 0.0
    for tid, r in removed.items():
        t = b.threads.get(tid)
        if t is None or r <= 0 or t.busy <= 0:
            continue
        r = min(r, 0.95 * t.busy)  # a fix cannot take all of a thread's work away
        out += t.busy / total * t.busy * r / (1.0 - r)
    return out


# ---- what a fix removes -------------------------------------------------------------


def _frames(frames: list[str]) -> list[str]:
    return [normalize(f) for f in frames]


def _contended_only(name: str) -> bool:
    return any(c in name for c in CONTENDED_FRAMES)


class Stacks:
    """The on-CPU stacks, normalized once, without the samples of kvprof's own probes;
    and the sampled registers' stalls by line."""

    def __init__(self, p: Profile) -> None:
        self.per_s = 1.0 / (p.hz or HZ) / seconds(p)
        self._profile = p
        self.stacks = []
        for s in p.oncpu:
            names = _frames(s.frames)
            if any(own in n for n in names for own in OWN_PROBES):
                continue
            self.stacks.append((str(s.tid), set(names), names, s.count))

    @functools.cached_property
    def asleep(self) -> dict[str, float]:
        """Per thread, the share of its waits spent asleep (asleep_share)."""
        return asleep_share(self._profile)

    @functools.cached_property
    def lines(self) -> dict[int, dict[str, int]]:
        """The sampled registers' stalls: line -> tid -> samples (built when a lock asks)."""
        return {sl.line: sl.threads for sl in line_table(self._profile)}

    def cpu(self, sites: list[str], lock_only: bool) -> dict[str, float]:
        """Per thread, the share of the window on the CPU with one of `sites` on the stack
        (`lock_only`: in the machinery of a contended lock there, outside a blocking wait)."""
        want = set(sites)
        out: dict[str, float] = defaultdict(float)
        for tid, names, ordered, count in self.stacks:
            if not want & names:
                continue
            if lock_only and (
                not any(_contended_only(n) for n in ordered) or any(w in n for n in ordered for w in WAITING)
            ):
                continue
            out[tid] += count * self.per_s
        return out


def lock_lines(p: Profile, f: Finding) -> set[int]:
    """The cache lines of the lock words behind a lock, lock-CPU or futex finding (none for others)."""
    if f.id.startswith(LOCK_CPU):
        return {a & ~(LINE - 1) for a in lock_addresses(p, f)}
    if f.id.startswith("futex:"):
        return {int(f.id.split(":", 1)[1], 16) & ~(LINE - 1)}
    if f.category == "lock":
        name = f.id.split(":", 1)[1]
        return {lk.address & ~(LINE - 1) for lk in p.locks if lk.name == name and lk.address}
    return set()


def held_excess(p: Profile, f: Finding) -> dict[str, float]:
    """Per thread, the share of the window its holds of a lock finding's lock took beyond
    the critical section's own work at the number of threads that held it: the lines that
    moved in. The lock's holds are kvcached's lock__hold, or record --hold's on a futex
    finding's mutex; the section is the one the lock's ceiling comes from
    (kvprof.analysis.critical), and a per-thread design keeps its own work and loses the
    rest. The section's hand-off, where two threads saturate a sleeping mutex, is the
    waiter's time asleep: in its wait, which the fix removes already."""
    dur = seconds(p)
    if f.category == "lock":
        name = f.id.split(":", 1)[1]
    elif f.id.startswith("futex:") and f.lock:
        name = f.lock
    else:
        return {}
    holds = [h for h in p.holds if h.name == name and h.acquisitions > 0]
    if dur <= 0 or not holds:
        return {}
    out: dict[str, float] = defaultdict(float)
    for h in holds:
        s = critical.section(h, dur, 0.0, {})  # the lines moved in need neither throughput nor busy time
        moved = s.transfer_ns(s.holders)
        for tid, th in h.by_thread.items():
            out[tid] += th.acquisitions * moved / 1e9 / (h.window_s or dur)
    return dict(out)


def _line_of(f: Finding) -> int | None:
    """The line of a sampled-line finding."""
    return int(f.id.split(":", 1)[1], 16) if f.id.startswith("sampled-line:") else None


def modelled(f: Finding) -> bool:
    """Whether the model has a fix for `f`: a contended lock or futex, or a shared cache
    line. CPU in a function and blocking off the CPU are work, not contention: 0."""
    return f.category in ("lock", "cacheline") or f.id.startswith("futex:")


# what a fix removes, part by part (`removed_parts`); every part but WAITS is the target's CPU
WAITS = "lock waits"  # asleep on a contended lock or futex
MACHINERY = "contended lock CPU"  # the futex calls and wake-ups only a contended lock runs
WORD = "lock word stalls"  # stalled on the lock word's line, which another core took last
HELD = "held beyond own work"  # the lines that moved into the critical section
LOCK_MACHINERY = "lock CPU"  # a lock-CPU finding's machinery at the calls that take the lock
LINE_STALLS = "line stalls"  # the sampled registers' stalls on a contended line
COUNTER = "shared counter CPU"  # the CPU of a function whose shared line bounced
PARTS = (WAITS, MACHINERY, WORD, HELD, LOCK_MACHINERY, LINE_STALLS, COUNTER)


def _lock_parts(p: Profile, f: Finding, stacks: Stacks, cpu: bool) -> dict[str, dict[str, float]]:
    """A lock or futex finding's parts (without `cpu`, its wait alone)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    asleep = stacks.asleep
    for tid, row in f.per_thread.items():
        out[WAITS][tid] += row.get("wait_share", 0.0) * asleep.get(tid, 1.0)
    if not cpu:
        return out
    for tid, share in stacks.cpu(f.sites, lock_only=True).items():
        out[MACHINERY][tid] += share
    # taking a lock another core took last stalls on its word's line: the sampled
    # registers' stalls there (the `sampled-line` finding of that word)
    for line in lock_lines(p, f):
        for tid, n in stacks.lines.get(line, {}).items():
            out[WORD][tid] += n * stacks.per_s
    for tid, share in held_excess(p, f).items():
        out[HELD][tid] += share
    return out


def removed_parts(p: Profile, f: Finding, stacks: Stacks, cpu: bool = True) -> dict[str, dict[str, float]]:
    """Per part of PARTS, per thread, the share of the wall time fixing `f` would remove
    (without `cpu`, a lock's or futex's wait alone: its lock-CPU finding has the CPU of its
    machinery)."""
    if f.id.startswith(LOCK_CPU):
        # the lock machinery's CPU at the calls that take it: a fix that takes it less
        # often, or not at all, does not run it
        return {LOCK_MACHINERY: {tid: row.get("cpu_s_per_s", 0.0) for tid, row in f.per_thread.items()}}
    if f.category == "lock" or f.id.startswith("futex:"):
        return _lock_parts(p, f, stacks, cpu)
    if f.id.startswith("sampled-line:"):
        hz, dur = p.hz or HZ, seconds(p)
        return {LINE_STALLS: {tid: row.get("samples", 0.0) / hz / dur for tid, row in f.per_thread.items()}}
    if f.category == "cacheline" and f.cost.get("writers", 2.0) != 1.0:
        # the CPU samples in the function see the stall. Without them, each transfer stalls
        # the writer for a round trip; but only an unsampled probe counts transfers between
        # consecutive updates: a sampled one's are between sampled updates, N updates apart,
        # and say that the line moved at some point in between, not how often.
        if p.oncpu:
            return {COUNTER: stacks.cpu(f.sites or [f.where], lock_only=False)}
        if f.cost.get("sample_rate", 1.0) <= 1.0:
            return {
                COUNTER: {
                    tid: row.get("transfers_per_s", 0.0) * THRESHOLDS.transfer_ns * 1e-9
                    for tid, row in f.per_thread.items()
                }
            }
    return {}


def removed(p: Profile, f: Finding, stacks: Stacks, cpu: bool = True) -> dict[str, float]:
    """Per thread, the share of the wall time fixing `f` would remove: its parts summed."""
    return dict(_per_thread(removed_parts(p, f, stacks, cpu)))


def annotate(p: Profile, findings: list[Finding]) -> list[Finding]:
    """`findings`, each with cost["gain_if_fixed"] and cost["removed_share"] (kept when present)."""
    b: Budget | None = None
    stacks: Stacks | None = None
    for f in findings:
        if GAIN_KEY in f.cost:
            continue
        if b is None or stacks is None:
            b, stacks = budget(p), Stacks(p)
        r = removed(p, f, stacks)
        f.cost[GAIN_KEY] = gain(b, r)
        f.cost[REMOVED_KEY] = max(r.values(), default=0.0)
    return findings


def _parts_together(p: Profile, findings: list[Finding], stacks: Stacks) -> dict[str, dict[str, float]]:
    """Per part, per thread, what fixing `findings` together removes (each time counted once)."""
    words = {line for f in findings for line in lock_lines(p, f)}
    cpu_words = {line for f in findings if f.id.startswith(LOCK_CPU) for line in lock_lines(p, f)}
    total: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for f in findings:
        if _line_of(f) in words:
            continue  # a lock word's stalls: in its lock's finding
        # a lock whose machinery's CPU a lock-CPU finding has: its wait alone
        cpu = f.id.startswith(LOCK_CPU) or not lock_lines(p, f) & cpu_words
        for name, part in removed_parts(p, f, stacks, cpu).items():
            for tid, r in part.items():
                total[name][tid] += r
    return total


def _per_thread(together: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Per thread, the parts summed."""
    total: dict[str, float] = defaultdict(float)
    for part in together.values():
        for tid, r in part.items():
            total[tid] += r
    return total


def gain_if_fixed(p: Profile, findings: list[Finding]) -> float:
    """The gain of fixing `findings` together: their removed times summed per thread."""
    return gain(budget(p), _per_thread(_parts_together(p, findings, Stacks(p))))


@dataclass
class Breakdown:
    """What fixing some findings together removes, part by part."""

    parts: dict[str, float]  # PARTS -> share of the target's threads' wall time, weighted by busy time
    cpu_saved: float  # the target's CPU the fix saves over what it still spends (reference / fixed - 1)


def breakdown(p: Profile, findings: list[Finding]) -> Breakdown:
    """What fixing `findings` together removes: each part's share of the wall time of the
    target's threads, their mean weighted by busy time (as the gain weighs them), and the
    CPU per request it saves, as a benchmark measures it (every part but the waits is CPU)."""
    return _breakdown(budget(p), _parts_together(p, findings, Stacks(p)))


def _breakdown(b: Budget, together: Mapping[str, Mapping[str, float]]) -> Breakdown:
    busy = sum(t.busy for t in b.threads.values())
    parts = {
        name: sum(b.threads[t].busy * r for t, r in together[name].items() if t in b.threads) / busy
        for name in PARTS
        if name in together and busy > 0
    }
    cpu = sum(r for name, part in together.items() if name != WAITS for r in part.values())
    on = sum(t.on_cpu for t in b.threads.values())
    return Breakdown(parts, cpu / (on - cpu) if on > cpu > 0 else 0.0)


def gain_if_all_fixed(p: Profile, findings: list[Finding]) -> float:
    """The gain of fixing every critical and warning finding together."""
    return gain_if_fixed(p, [f for f in findings if f.severity in COUNTED])


@dataclass
class Prediction:
    """What the model says of one profile, for a benchmark to check against the fixes."""

    gains: dict[str, float]  # fix -> the gain of its findings together
    largest: float  # the largest single finding's gain
    largest_id: str
    busy_share: float
    pace: str
    parts: dict[str, dict[str, float]] = field(default_factory=dict)  # fix -> what it removes, by part
    cpu_saved: dict[str, float] = field(default_factory=dict)  # fix -> the CPU per request it saves


def predict(p: Profile, findings: list[Finding], fixes: Mapping[str, Collection[str]]) -> Prediction:
    """The gain of each fix, a fix being the catalog entries (hotspot ids) it removes."""
    b, stacks = budget(p), Stacks(p)
    top = max(findings, key=lambda f: f.cost.get(GAIN_KEY, 0.0), default=None)
    chosen = {fix: [f for f in findings if f.hotspot in ids] for fix, ids in fixes.items()}
    together = {fix: _parts_together(p, fs, stacks) for fix, fs in chosen.items()}
    said = {fix: _breakdown(b, parts) for fix, parts in together.items()}
    return Prediction(
        gains={fix: gain(b, _per_thread(parts)) for fix, parts in together.items()},
        largest=top.cost.get(GAIN_KEY, 0.0) if top is not None else 0.0,
        largest_id=top.id if top is not None else "",
        busy_share=b.busy_share,
        pace=b.pace,
        parts={fix: d.parts for fix, d in said.items()},
        cpu_saved={fix: d.cpu_saved for fix, d in said.items()},
    )
