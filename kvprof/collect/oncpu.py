"""On-CPU stacks of one process (probes/oncpu.bpf.c).

One `cpu-clock` software perf event per CPU at `opts.hz`, as BCC's `profile`
does (per-task events cost far more on a server that switches threads per
request, docs/design.md), shared with regsample (bpf.CpuClock). The BPF
program keeps only the target's samples and
counts them by (tid, cpu, user stack, kernel stack) in the kernel; this
module reads the maps and fills Profile.oncpu and Profile.threads.

Stacks are symbolized at every read, while the target still runs; close()
reads once more, so what was counted survives the program's maps.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from kvprof.collect.bpf import Module, Program, Sampler, cstr, map_items, percpu_counters, warn
from kvprof.collect.stacks import StackCollector
from kvprof.model.profile import CpuStack, Profile, ThreadInfo

# The order of `enum oncpu_health` in probes/oncpu.bpf.c.
HEALTH = ("samples", "user_stack_errors", "kernel_stack_errors", "map_full", "comm_full")


@dataclass
class _Snapshot:
    stacks: list[CpuStack] = field(default_factory=list)
    threads: dict[int, ThreadInfo] = field(default_factory=dict)
    health: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HEALTH, 0))


class OnCpuCollector(Sampler, StackCollector):
    name = "oncpu"
    empty = _Snapshot

    def program(self) -> Program:
        return self.program_of([])

    def _attach(self, module: Module) -> None:
        super()._attach(module)
        self._hook(module)

    def _read(self) -> _Snapshot:
        self.names.refresh()
        assert self.module is not None
        comms = {int(k): cstr(v.name) for k, v in map_items(self.table("comms"))}
        by_stack: dict[tuple[int, tuple[str, ...]], int] = defaultdict(int)
        threads: dict[int, ThreadInfo] = {}
        stops: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for key, value in map_items(self.table("counts")):
            n = int(value)
            tid = int(key.tid)
            # Root first: the user stack, then the kernel frames at the leaf end.
            frames, reason = self.frames(int(key.user_stack), int(key.kernel_stack))
            by_stack[(tid, frames)] += n
            info = threads.setdefault(tid, ThreadInfo(name=self.names.get(tid, comms.get(tid, ""))))
            info.cpu_samples += n
            socket = str(self.opts.topology.socket_of(int(key.cpu)))
            info.sockets[socket] = info.sockets.get(socket, 0) + n
            if reason is not None and reason != "root":
                stops[tid][reason] += n
        for tid, info in threads.items():
            info.sockets = dict(sorted(info.sockets.items()))
            info.stack_stops = dict(sorted(stops[tid].items()))
            early = sum(info.stack_stops.values())
            info.stack_quality = early / info.cpu_samples if info.cpu_samples else None
        return _Snapshot(
            stacks=[
                CpuStack(tid=tid, frames=list(frames), count=n)
                for (tid, frames), n in sorted(by_stack.items(), key=lambda kv: (-kv[1], kv[0]))
            ],
            threads=threads,
            health=percpu_counters(self.table("health"), HEALTH),
        )

    def contribute(self, profile: Profile) -> None:
        snap = self.latest()
        profile.oncpu = list(snap.stacks)  # new objects at every read, changed by no stage
        for tid, info in snap.threads.items():
            slot = profile.threads.setdefault(str(tid), ThreadInfo())
            slot.name = info.name or slot.name
            slot.cpu_samples = info.cpu_samples
            slot.sockets = dict(info.sockets)
            slot.stack_quality = info.stack_quality
            slot.stack_stops = dict(info.stack_stops)
        health = snap.health
        counters = profile.status.counters
        counters["oncpu.samples"] = health["samples"]
        counters["oncpu.stack_errors"] = health["user_stack_errors"] + health["kernel_stack_errors"]
        counters["oncpu.map_full"] = health["map_full"]
        stops: dict[str, int] = defaultdict(int)
        for info in snap.threads.values():
            for why, n in info.stack_stops.items():
                stops[why] += n
        for why, n in stops.items():
            counters[f"oncpu.stack_stop.{why.replace(' ', '_')}"] = n
        for w in self.unwinder.warnings:
            if w not in profile.status.warnings:
                profile.status.warnings.append(w)
        if counters["oncpu.stack_errors"]:
            warn(profile, "oncpu: stacks lost", counters["oncpu.stack_errors"], "raise --stack-storage")
        if counters["oncpu.map_full"]:
            warn(
                profile, "oncpu: samples dropped, map full", counters["oncpu.map_full"], "raise --max-entries"
            )
