"""Off-CPU time and futex waits of one process (probes/offcpu.bpf.c).

`sched_switch` (a raw tracepoint) gives the time each thread of the target spends off
the CPU, by (tid, stack where it left; user frames then kernel frames);
`syscalls:sys_{enter,exit}_futex` give the time spent in FUTEX_WAIT-family
calls by (tid, futex word, user stack): the contended-mutex waits of any
program. Both are filtered by tgid in the kernel and aggregated in maps;
this module reads them into Profile.offcpu and Profile.threads[tid].offcpu_ns.

Off-CPU time counts every state, as `offcputime` does by default; the part
that began with a preemption (the thread was still runnable) is counted in
`offcpu.preempted_ns`. A futex wait that returned at once (EAGAIN: the word
changed before the thread slept) is not a wait (`offcpu.futex_eagain`).

Every off-CPU period is timed, so per-thread totals are exact; the stacks of
only a random 1 in `--offcpu-sample` (default 64) of them are taken, and the
stacks' ns are the sampled periods' ns times that factor (an unbiased
estimate): walking two stacks cost 5-12 µs here (the kernel stack 2.5x the
user stack), at every switch-out 10 % of a core under load.
`status.sample_rates.offcpu_stacks` in the profile records the factor.

User stacks are walked in BPF from the modules' unwind tables
(probes/unwind.h, kvprof/collect/unwind.py), so a wait inside a libc built
without frame pointers still reaches the caller of `pthread_mutex_lock`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bcc import BPF

from kvprof.collect import PROBES_DIR, CollectError, CollectOptions, unwind
from kvprof.collect.oncpu import load_error, percpu_counters, warn
from kvprof.collect.symbols import DataNames, Symbolizer, ThreadNames
from kvprof.model.profile import FutexWait, OffCpuStack, Profile, ThreadInfo

SOURCE = PROBES_DIR / "offcpu.bpf.c"
# The order of `enum health` in probes/offcpu.bpf.c.
HEALTH = (
    "switches", "stack_errors", "map_full", "start_full", "preempted_ns", "futex_waits", "futex_eagain",
)  # fmt: skip
TRACEPOINTS = ("sched/sched_switch", "syscalls/sys_enter_futex", "syscalls/sys_exit_futex")
TRACEFS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


@dataclass
class _Snapshot:
    stacks: list[OffCpuStack] = field(default_factory=list)
    futex: list[FutexWait] = field(default_factory=list)
    offcpu_ns: dict[int, int] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    health: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HEALTH, 0))


class OffCpuCollector:
    name = "offcpu"

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        self.pid = pid
        self.opts = opts
        self._bpf: Any = None
        self._unwinder = unwind.Unwinder(pid)
        self._symbols = Symbolizer(pid, self._unwinder)
        self._ustacks: dict[int, tuple[list[int], str]] = {}  # what was read of `ustacks`
        self._data = DataNames(pid, self._unwinder)
        self._names = ThreadNames(pid)
        self._last = _Snapshot()

    def applies(self) -> str | None:
        if not Path(f"/proc/{self.pid}").is_dir():
            return f"no process {self.pid}"
        events = next((t / "events" for t in TRACEFS if (t / "events").is_dir()), None)
        if events is None:
            return "tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)"
        missing = [tp for tp in TRACEPOINTS if not (events / tp).is_dir()]
        if missing:
            return f"the kernel has no tracepoint {', '.join(missing)}"
        return None

    def cflags(self) -> list[str]:
        return [
            f"-DTARGET_TGID={self.pid}",
            f"-DSTACK_STORAGE={self.opts.stack_storage}",
            f"-DMAX_ENTRIES={self.opts.max_entries}",
            f"-DSTACK_SAMPLE={self.opts.offcpu_sample}",
            *unwind.cflags(self.opts.stack_storage),
        ]

    def start(self) -> None:
        if self._bpf is not None:
            return
        why = self.applies()
        if why:
            raise CollectError(f"offcpu: {why}")
        self._names.refresh()
        self._symbols.warm()
        try:
            self._unwinder.prepare()
            if self._unwinder.built and self.opts.progress is not None:
                self.opts.progress(self._unwinder.built_line())
        except OSError as e:
            raise CollectError(f"offcpu: cannot read the target's mappings ({e.strerror})") from None
        try:
            # BCC attaches every TRACEPOINT_PROBE of the program while loading it;
            # until the tables are in, stacks stop at their first frame ("outside known code").
            self._bpf = BPF(text=unwind.with_unwinder(SOURCE).encode(), cflags=self.cflags())
            self._unwinder.load(self._bpf)
        except Exception as e:
            self.close()
            raise CollectError(f"offcpu: {load_error(SOURCE, e)}") from None

    def _read(self) -> _Snapshot:
        self._names.refresh()
        bpf = self._bpf
        stacks = bpf[b"stacks"]
        ustacks = unwind.read_stacks(bpf[b"ustacks"], self._ustacks)
        scale = max(1, self.opts.offcpu_sample)
        off: dict[tuple[int, tuple[str, ...]], int] = defaultdict(int)
        for key, value in bpf[b"offcpu"].items():
            user = self._user(ustacks, int(key.user_stack))
            kernel = self._symbols.stack(stacks, key.kernel_stack, kernel=True)
            off[(int(key.tid), tuple(user + kernel))] += int(value.value) * scale
        per_thread = {int(k.value): int(v.total_ns) for k, v in bpf[b"threads"].items() if v.total_ns}
        futex: dict[tuple[int, int, tuple[str, ...]], list[int]] = {}
        for key, value in bpf[b"futex"].items():
            frames = tuple(self._user(ustacks, int(key.user_stack)))
            slot = futex.setdefault((int(key.tid), int(key.uaddr), frames), [0, 0])
            slot[0] += int(value.waits)
            slot[1] += int(value.ns)
        tids = set(per_thread) | {tid for tid, _, _ in futex}
        return _Snapshot(
            stacks=[
                OffCpuStack(tid=tid, frames=list(frames), ns=ns)
                for (tid, frames), ns in sorted(off.items(), key=lambda kv: (-kv[1], kv[0]))
            ],
            futex=[
                FutexWait(
                    tid=tid, uaddr=uaddr, frames=list(frames), waits=w, ns=ns, name=self._data.name(uaddr)
                )
                for (tid, uaddr, frames), (w, ns) in sorted(futex.items(), key=lambda kv: (-kv[1][1], kv[0]))
            ],
            offcpu_ns=dict(per_thread),
            names={tid: self._names.get(tid) for tid in tids},
            health=percpu_counters(bpf[b"health"], HEALTH),
        )

    def _user(self, ustacks: dict[int, tuple[list[int], str]], key: int) -> list[str]:
        ips, reason = ustacks.get(key, ([], "root"))
        return self._symbols.unwound(ips, reason) if ips else []

    def contribute(self, profile: Profile) -> None:
        if self._bpf is not None:
            self._unwinder.refresh(self._bpf)  # what was mapped since (the uprobe trampoline, dlopen)
            self._last = self._read()
        snap = self._last
        profile.offcpu.stacks = [OffCpuStack(s.tid, list(s.frames), s.ns) for s in snap.stacks]
        profile.offcpu.futex = [
            FutexWait(f.tid, f.uaddr, list(f.frames), f.waits, f.ns, f.name) for f in snap.futex
        ]
        for tid, name in snap.names.items():
            info = profile.threads.setdefault(str(tid), ThreadInfo())
            info.offcpu_ns = snap.offcpu_ns.get(tid, 0)
            info.name = info.name or name
        health = snap.health
        counters = profile.status.counters
        for name in ("stack_errors", "preempted_ns", "futex_waits", "futex_eagain"):
            counters[f"offcpu.{name}"] = health[name]
        profile.status.sample_rates["offcpu_stacks"] = max(1, self.opts.offcpu_sample)
        counters["offcpu.map_full"] = health["map_full"] + health["start_full"]
        if counters["offcpu.stack_errors"]:
            warn(profile, "offcpu: stack ids lost", counters["offcpu.stack_errors"], "raise --stack-storage")
        if counters["offcpu.map_full"]:
            warn(
                profile, "offcpu: waits dropped, map full", counters["offcpu.map_full"], "raise --max-entries"
            )

    def close(self) -> None:
        bpf = self._bpf
        if bpf is None:
            return
        try:
            self._last = self._read()  # keep what was counted: the maps go with the program
        except Exception:
            pass
        finally:
            self._bpf = None
            bpf.cleanup()
