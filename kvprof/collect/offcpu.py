"""Off-CPU time and futex waits of one process (probes/offcpu.bpf.c).

`sched_switch` (a raw tracepoint) gives the time each thread of the target spends off
the CPU, by (tid, stack where it left; user frames then kernel frames), and
the time spent asleep in FUTEX_WAIT-family calls by (tid, futex word, user
stack): the contended-mutex waits of any program. A switch-out is a futex
wait when the thread's user registers, saved at its syscall entry, say it is
in futex(2) with a wait operation; no syscall tracepoint is used (enabling
one slows every syscall on the machine). Everything is filtered by tgid in
the kernel and aggregated in maps; this module reads them into
Profile.offcpu and Profile.threads[tid].offcpu_ns.

Off-CPU time counts every state, as `offcputime` does by default; the part
that began with the thread still runnable (preempted, or rescheduled at a
syscall's exit: it left the CPU in TASK_RUNNING) is the thread's wait for a
CPU: its `[runnable]` stack, no stack walked, and `offcpu.preempted_ns`. A
futex wait is a switch-out that put the thread to sleep inside a
FUTEX_WAIT-family call, until it is back on a CPU (its wait for a CPU after
the wake-up included); a futex call that did not sleep (EAGAIN: the word
changed first) or in which the thread was only preempted is no wait.

Futex waits are counted exactly per (word, thread); their stacks come from
the sampled periods and from each (word, thread)'s first wait, and the exact
totals are spread over those stacks in proportion to their sampled time.

Every off-CPU period is timed, so per-thread totals are exact; the stacks of
only a random 1 in n of them are taken, and each sampled period's ns count
n times (an unbiased estimate): walking two stacks at every switch-out costs
the target too much (the figures are in docs/record.md). n is
`--offcpu-sample` (CollectOptions.offcpu_sample) when given; by default the
program sets it per CPU from the switch-outs it saw in the last pace epoch, so
that each CPU walks about OFFCPU_WALKS stacks a second however fast the
target switches. Each thread's stacks are then scaled to add up to its
exact total: they split its time, the total sizes it (to_totals).
`status.sample_rates.offcpu_stacks` in the profile records the given n, or
the switch-outs per random draw.

BCC attaches the raw tracepoint program itself when it compiles the module;
the program ignores it until the unwind tables are in, and close() detaches
it.

User stacks are walked in BPF from the modules' unwind tables
(probes/unwind.h, kvprof/collect/unwind.py), so a wait inside a libc built
without frame pointers still reaches the caller of `pthread_mutex_lock`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvprof.collect import OFFCPU_WALKS, CollectOptions
from kvprof.collect.bpf import Module, Program, map_items, percpu_counters, warn
from kvprof.collect.stacks import StackCollector
from kvprof.collect.symbols import DataNames
from kvprof.collect.thread_sockets import run_delays
from kvprof.model.profile import RUNNABLE_FRAME, FutexWait, OffCpuStack, Profile, ThreadInfo

# The order of `enum offcpu_health` in probes/offcpu.bpf.c.
HEALTH = (
    "switches", "stack_errors", "map_full", "start_full", "preempted_ns", "futex_waits", "drawn",
)  # fmt: skip
TRACEPOINTS = ("sched/sched_switch",)
# The adaptive n is set per CPU from the target's switch-outs in the last pace epoch of 2^PACE_SHIFT ns.
PACE_SHIFT = 27
# An adaptive n's value until a CPU's first pace epoch has counted the switch-outs.
FIRST_ONE_IN = 256
TRACEFS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


@dataclass
class OffCpuSnapshot:
    """What either off-CPU collector read (this one, or kvprof.collect.offsample's)."""

    stacks: list[OffCpuStack] = field(default_factory=list)
    futex: list[FutexWait] = field(default_factory=list)
    offcpu_ns: dict[int, int] = field(default_factory=dict)
    runnable_ns: dict[int, int] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)


@dataclass
class _Snapshot(OffCpuSnapshot):
    health: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HEALTH, 0))


class OffCpuCollector(StackCollector):
    name = "offcpu"
    empty = _Snapshot
    fired_by = "tracepoint"

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        super().__init__(pid, opts)
        self._data = DataNames(pid)
        self._run_delays: dict[int, int] = {}  # each thread's run delay when attached

    def _attach(self, module: Module) -> None:
        self._run_delays = run_delays(self.pid)
        super()._attach(module)

    def applies(self) -> str | None:
        why = super().applies()
        if why:
            return why
        events = next((t / "events" for t in TRACEFS if (t / "events").is_dir()), None)
        if events is None:
            return "tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)"
        missing = [tp for tp in TRACEPOINTS if not (events / tp).is_dir()]
        if missing:
            return f"the kernel has no tracepoint {', '.join(missing)}"
        return None

    def program(self) -> Program:
        fixed = self.opts.offcpu_sample
        budget = 0 if fixed else walk_budget()
        return self.program_of(
            [
                f"-DOFFCPU_STACK_SAMPLE={fixed or FIRST_ONE_IN}",
                f"-DOFFCPU_WALK_BUDGET={budget}",
                f"-DOFFCPU_PACE_SHIFT={PACE_SHIFT}",
            ]
        )

    def program_names(self, module: Module) -> list[str]:
        return [*super().program_names(module), "raw_tracepoint__sched_switch"]

    def _hook(self, module: Module) -> None:
        """Again after pause(): BCC attached it when it compiled the module."""
        if b"sched_switch" not in module.bpf.raw_tracepoint_fds:
            module.bpf.attach_raw_tracepoint(tp=b"sched_switch", fn_name=b"raw_tracepoint__sched_switch")

    def _detach(self) -> None:
        bpf = self.module.bpf if self.module is not None else None
        if bpf is None:
            return
        if b"sched_switch" in bpf.raw_tracepoint_fds:
            bpf.detach_raw_tracepoint(b"sched_switch")

    def _read(self) -> _Snapshot:
        self.names.refresh()
        assert self.module is not None
        # the exact totals first, then the stacks that split them (naming them takes time):
        # the totals are those of the moment the read began, the window's edge
        threads = map_items(self.table("threads"))
        futex_items = map_items(self.table("futex"))
        sampled_off: dict[tuple[int, tuple[str, ...]], int] = defaultdict(int)
        for key, value in map_items(self.table("periods")):  # each period already weighted by its n
            frames, _ = self.frames(int(key.user_stack), int(key.kernel_stack))
            sampled_off[(int(key.tid), frames)] += int(value)
        per_thread = {int(k): int(v.total_ns) for k, v in threads if v.total_ns}
        runnable = {int(k): int(v.runnable_ns) for k, v in threads if v.runnable_ns}
        asleep = {tid: ns - runnable.get(tid, 0) for tid, ns in per_thread.items()}
        off = to_totals(sampled_off, asleep)
        for tid, ns in runnable.items():  # a wait for a CPU: no stack was taken, no place to wait at
            off[(tid, (RUNNABLE_FRAME,))] = ns
        exact = {(int(k.tid), int(k.uaddr)): (int(v.waits), int(v.ns)) for k, v in futex_items}
        sampled: dict[tuple[int, int], dict[tuple[str, ...], int]] = defaultdict(lambda: defaultdict(int))
        for key, value in map_items(self.table("futex_stacks")):
            frames, _ = self.frames(int(key.user_stack), -1)
            sampled[(int(key.tid), int(key.uaddr))][frames] += int(value.ns) or 1
        futex = spread(exact, sampled)
        tids = set(per_thread) | {tid for tid, _, _ in futex}
        stacks, waits = as_lists(off, futex, self._data)
        return _Snapshot(
            stacks=stacks,
            futex=waits,
            offcpu_ns=dict(per_thread),
            # since attaching, as every count here: the threads it saw switch (one that
            # never switched waited for no CPU)
            runnable_ns={
                tid: ns - self._run_delays.get(tid, 0)
                for tid, ns in run_delays(self.pid).items()
                if tid in tids
            },
            names={tid: self.names.get(tid) for tid in tids},
            health=percpu_counters(self.table("health"), HEALTH),
        )

    def contribute(self, profile: Profile) -> None:
        snap = self.latest()
        put(profile, snap)
        health = snap.health
        counters = profile.status.counters
        for name in ("stack_errors", "preempted_ns", "futex_waits"):
            counters[f"offcpu.{name}"] = health[name]
        drawn = max(1, health["drawn"])
        fixed = self.opts.offcpu_sample
        profile.status.sample_rates["offcpu_stacks"] = fixed or max(1, round(health["switches"] / drawn))
        counters["offcpu.map_full"] = health["map_full"] + health["start_full"]
        if counters["offcpu.stack_errors"]:
            warn(profile, "offcpu: stack ids lost", counters["offcpu.stack_errors"], "raise --stack-storage")
        if counters["offcpu.map_full"]:
            warn(
                profile, "offcpu: waits dropped, map full", counters["offcpu.map_full"], "raise --max-entries"
            )


def as_lists(
    off: dict[tuple[int, tuple[str, ...]], int],
    futex: Mapping[tuple[int, int, tuple[str, ...]], Sequence[int]],
    data: DataNames,
) -> tuple[list[OffCpuStack], list[FutexWait]]:
    """The profile's off-CPU stacks, from (tid, frames) -> ns, and futex waits, from
    (tid, word, frames) -> (waits, ns[, samples: the looks that saw them, when
    sampled[, the variance of ns from that sampling]]), each most ns first."""
    return [
        OffCpuStack(tid=tid, frames=list(frames), ns=ns)
        for (tid, frames), ns in sorted(off.items(), key=lambda kv: (-kv[1], kv[0]))
    ], [
        FutexWait(
            tid=tid,
            uaddr=uaddr,
            frames=list(frames),
            waits=counts[0],
            ns=counts[1],
            name=data.name(uaddr),
            samples=counts[2] if len(counts) > 2 else 0,
            sd_ns=round(math.sqrt(counts[3])) if len(counts) > 3 else 0,
        )
        for (tid, uaddr, frames), counts in sorted(futex.items(), key=lambda kv: (-kv[1][1], kv[0]))
    ]


def put(profile: Profile, snap: OffCpuSnapshot) -> None:
    """A snapshot's stacks, futex waits and per-thread totals into `profile`."""
    # every read builds new objects and no stage changes them: a snapshot shares them
    profile.offcpu.stacks = list(snap.stacks)
    profile.offcpu.futex = list(snap.futex)
    for tid, name in snap.names.items():
        info = profile.threads.setdefault(str(tid), ThreadInfo())
        info.offcpu_ns = snap.offcpu_ns.get(tid, 0)
        info.name = info.name or name
        info.runnable_ns = snap.runnable_ns.get(tid, 0)


def to_totals(
    sampled: dict[tuple[int, tuple[str, ...]], int], totals: dict[int, int]
) -> dict[tuple[int, tuple[str, ...]], int]:
    """(tid, frames) -> estimated ns, scaled so that each thread's stacks add up to
    its exact off-CPU total (a thread without one keeps its estimates). The
    estimates alone scatter: a few long periods drawn at 1 in a thousand weigh a
    thousand times each, so they split a thread's time, and the exact total sizes it."""
    sums: dict[int, int] = defaultdict(int)
    for (tid, _), ns in sampled.items():
        sums[tid] += ns
    return {
        (tid, frames): round(ns * totals[tid] / sums[tid]) if totals.get(tid) and sums[tid] else ns
        for (tid, frames), ns in sampled.items()
    }


def walk_budget() -> int:
    """Stacks walked per CPU per pace epoch (2^PACE_SHIFT ns) for about OFFCPU_WALKS a second."""
    return max(1, round(OFFCPU_WALKS * (1 << PACE_SHIFT) / 1e9))


def spread(
    exact: dict[tuple[int, int], tuple[int, int]], sampled: dict[tuple[int, int], dict[tuple[str, ...], int]]
) -> dict[tuple[int, int, tuple[str, ...]], list[int]]:
    """(tid, word) -> exact (waits, ns), spread over that pair's sampled stacks in
    proportion to their sampled ns: (tid, word, frames) -> [waits, ns]. A pair
    with no stack keeps its totals under no frames."""
    out: dict[tuple[int, int, tuple[str, ...]], list[int]] = {}
    for (tid, uaddr), (waits, ns) in exact.items():
        stacks = sampled.get((tid, uaddr)) or {(): 1}
        total = sum(stacks.values())
        left_w, left_ns = waits, ns
        for i, (frames, weight) in enumerate(sorted(stacks.items(), key=lambda kv: -kv[1])):
            last = i == len(stacks) - 1
            w = left_w if last else min(left_w, round(waits * weight / total))
            n = left_ns if last else min(left_ns, round(ns * weight / total))
            left_w, left_ns = left_w - w, left_ns - n
            if w or n:
                out[(tid, uaddr, frames)] = [w, n]
    return out
