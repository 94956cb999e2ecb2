"""One model of a critical section at N cores: what one acquisition of a lock costs the lock.

A lock serializes: while one thread holds it nobody else can, so the lock is
busy, per acquisition, for `hold_ns(threads)`:

- its own work, `own_ns`: the sampled holds (kvcached's `lock__hold`, or
  `record --hold`'s) when one thread held it; with several holders, the
  shortest sample (nothing moved in) and the rest is `moved_ns`;
- the transfers of the lines it writes: taken by one thread, the lock's word
  and its data stay in that core's cache; taken by two or more, each
  acquisition finds them in the last holder's: `HOLD_TRANSFERS` round trips
  (`Thresholds.transfer_ns`), or what the holds measured beyond the shortest
  (`moved_ns`) when several threads held it, less the holds the probes took
  for interrupted (over kvprof.collect.INTERRUPTED x their thread's
  shortest: a holder preempted on a machine with more threads than CPUs
  would otherwise count a time slice as lines moving in);
- for a sleeping mutex (glibc's, kvcached's kv_lock: a contended
  acquisition sleeps in FUTEX_WAIT, and the unlock that finds a sleeper
  wakes it with FUTEX_WAKE), the hand-off. It costs the lock only when the
  lock is saturated, every acquisition finding it taken (below that, a
  waiter's wake-up delays the waiter, and the others keep taking the lock).
  Two threads saturate a lock when each spends at least half of its
  working time (on a CPU) holding it (`share >= 1/2`). From then on, after
  each release the lock lies idle until the sleeper has woken and taken it,
  `handoff_ns` after the unlock, or the releaser is back: after its work
  outside the lock (`outside_ns`) and,
  once per wake-up of the sleeper, the waking unlock (`wake_ns`): glibc's
  mutex lets the running thread barge in, and the sleeper, finding the lock
  taken again, goes back to sleep to be woken by a later unlock. Whichever
  comes first ends the gap (`gap_ns`). The machine's hand-off and waking
  unlock are kvprof's atomics program's (`atomics --mode handoff`: two
  threads hand a pthread mutex to each other while the other sleeps in the
  futex wait; `Thresholds.handoff_ns`, `Thresholds.wake_ns`).

A lock that only three or more threads saturate is passed among threads that
run as it nears its ceiling (a running thread takes it the moment it is
released), so its ceiling is its own work and transfers: past that, a
sleeping mutex falls toward the two-thread convoy's throughput
(`convoy_ops_per_s`), which is stated, not taken as the ceiling.

The ceiling is the lock's throughput at the thread count where it binds, in
requests a second: 1e9 / (hold_ns x acquisitions per request). The what-if
(kvprof.analysis.whatif) reads the same section: a per-thread design keeps
the own work and loses the rest (`excess_ns`).

Pure functions over kvprof.model; the caller hands in the threads' time on a
CPU (kvprof.analysis.whatif's budget), so this module imports no analysis
that imports it. docs/findings.md has the model, its assumptions and the
study's numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvprof.analysis.findings.common import THRESHOLDS, Thresholds
from kvprof.model.profile import LockHold

HOLD_TRANSFERS = 2  # the lock's word and one line of its data, when one thread held it
SATURATED = 0.5  # the share of a thread's work in the lock from which two threads saturate it


@dataclass(frozen=True)
class Costs:
    """What the machine charges a critical section, in ns."""

    transfer_ns: float  # one cache-line round trip between two cores
    handoff_ns: float  # from an unlock to the sleeper it woke holding the lock
    wake_ns: float  # the unlocker's own time in an unlock that wakes a sleeper

    @classmethod
    def of(cls, t: Thresholds = THRESHOLDS) -> Costs:
        return cls(t.transfer_ns, t.handoff_ns, t.wake_ns)


@dataclass(frozen=True)
class Section:
    """One lock's critical section, per acquisition, as recorded, and at N threads."""

    name: str
    address: int
    own_ns: float  # the critical section's own work
    moved_ns: float  # measured beyond the own work when several threads held it (lines that moved in)
    outside_ns: float  # a holder's work (on a CPU) between two acquisitions (nan: not known)
    acquisitions_per_op: float  # acquisitions per request (0: no throughput known)
    holders: int  # threads seen holding it
    costs: Costs
    sleeping: bool = True  # its waiters sleep in the kernel (a pthread mutex); False: they spin

    def transfer_ns(self, threads: float) -> float:
        """Per acquisition, the lines that move in when `threads` threads take it."""
        if threads < 2:
            return 0.0
        if self.holders >= 2:
            return self.moved_ns
        return HOLD_TRANSFERS * self.costs.transfer_ns

    @property
    def share(self) -> float:
        """The share of a holder's working time spent holding it, at two or more threads (0..1;
        nan when the threads' time on a CPU is not known)."""
        held = self.own_ns + self.transfer_ns(2)
        return held / (held + self.outside_ns) if held + self.outside_ns > 0 else math.nan

    @property
    def saturates_at(self) -> float:
        """The thread count from which the lock is never free when asked for (1 / share; inf
        when not known)."""
        return 1.0 / self.share if self.share > 0 else math.inf

    @property
    def gap_ns(self) -> float:
        """A saturated sleeping mutex at two threads: how long it lies idle after each release."""
        if not self.sleeping:
            return 0.0
        c = self.costs
        cycle = self.own_ns + self.transfer_ns(2) + self.outside_ns  # the releaser's, per acquisition
        back = self.outside_ns + c.wake_ns * min(1.0, cycle / c.handoff_ns)  # a wake per wake-up
        return min(c.handoff_ns, back)

    def convoyed(self, threads: float) -> bool:
        """Whether at `threads` threads the lock pays the hand-off: two threads saturate it."""
        return self.sleeping and threads >= 2 and self.share >= SATURATED  # False when nan

    def hold_ns(self, threads: float) -> float:
        """The lock's busy time per acquisition at `threads` threads."""
        out = self.own_ns + self.transfer_ns(threads)
        return out + self.gap_ns if self.convoyed(threads) else out

    def excess_ns(self, threads: float) -> float:
        """What an acquisition costs the lock at `threads` threads beyond its own work: what a
        per-thread design would not pay."""
        return self.hold_ns(threads) - self.own_ns

    @property
    def binds_at(self) -> float:
        """The thread count at which the lock binds: 2 when two threads saturate it, else where
        the threads' demand reaches its ceiling."""
        return 2.0 if self.convoyed(2) else max(2.0, self.saturates_at)

    @property
    def busy_ns_per_op(self) -> float:
        """The lock's busy time per request where it binds."""
        return self.hold_ns(self.binds_at) * self.acquisitions_per_op

    @property
    def ceiling_ops_per_s(self) -> float:
        """Requests a second the lock lets through where it binds (inf: no throughput known)."""
        busy = self.busy_ns_per_op
        return 1e9 / busy if busy > 0 else math.inf

    @property
    def convoy_ops_per_s(self) -> float:
        """Requests a second of a sleeping mutex saturated at two threads (the hand-off paid)."""
        if not self.sleeping or self.acquisitions_per_op <= 0:
            return math.inf
        held = self.own_ns + self.transfer_ns(2) + self.gap_ns
        return 1e9 / (held * self.acquisitions_per_op)


def section(
    h: LockHold,
    window_s: float,
    ops: float,
    on_cpu: Mapping[str, float],
    t: Thresholds = THRESHOLDS,
) -> Section:
    """The critical section of lock `h` (its sampled holds, over `h.window_s` or else
    `window_s` seconds), with `ops` requests a second (acquisitions per request from it) and
    `on_cpu` the share of the wall time each thread ran on a CPU (tid -> 0..1:
    kvprof.analysis.whatif's budget): its work. Waiting for a CPU the machine's other
    programs took, or for a lock, is not work between acquisitions."""
    dur = h.window_s or window_s
    holders = [tid for tid, th in h.by_thread.items() if th.acquisitions > 0]
    mean = h.hold_ns / h.acquisitions if h.acquisitions else 0.0
    if len(holders) >= 2 and h.min_ns:
        own, moved = float(h.min_ns), max(0.0, _uninterrupted(h) - h.min_ns)
    else:
        own, moved = mean, 0.0
    per_s = h.acquisitions / dur if dur > 0 else 0.0
    return Section(
        name=h.name,
        address=h.address,
        own_ns=own,
        moved_ns=moved,
        outside_ns=_outside(h, dur, on_cpu, mean),
        acquisitions_per_op=per_s / ops if ops > 0 else 0.0,
        holders=len(holders),
        costs=Costs.of(t),
    )


def _uninterrupted(h: LockHold) -> float:
    """The mean hold without the interrupted ones (a holder preempted: no line moves in
    meanwhile, and the lock's waiters' time is in their waits)."""
    kept = h.acquisitions - h.interrupted
    return (h.hold_ns - h.interrupted_ns) / kept if kept > 0 else 0.0


def _outside(h: LockHold, dur: float, on_cpu: Mapping[str, float], mean: float) -> float:
    """A holder's work between two acquisitions: its ns on a CPU per acquisition less the hold,
    weighted by acquisitions over the threads that held it and were seen on a CPU (nan: none)."""
    total = n = 0.0
    for tid, th in h.by_thread.items():
        ran = on_cpu.get(tid, 0.0)
        if th.acquisitions <= 0 or ran <= 0 or dur <= 0:
            continue
        per_acq = ran * dur * 1e9 / th.acquisitions
        total += th.acquisitions * max(0.0, per_acq - mean)
        n += th.acquisitions
    return total / n if n else math.nan


def excess_by_thread(s: Section, h: LockHold, window_s: float, threads: float) -> dict[str, float]:
    """Per thread, the share of the wall time its acquisitions of `h` cost the lock beyond their
    own work at `threads` threads (s.excess_ns): what a per-thread design removes."""
    dur = h.window_s or window_s
    if dur <= 0:
        return {}
    per = s.excess_ns(threads)
    return {tid: th.acquisitions * per / 1e9 / dur for tid, th in h.by_thread.items() if th.acquisitions > 0}
