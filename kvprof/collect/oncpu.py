"""On-CPU stacks of one process (probes/oncpu.bpf.c).

One `cpu-clock` software perf event per CPU at `opts.hz`, as BCC's `profile`
does: per-task events cost far more on a server that switches threads per
request (DESIGN.md). The BPF program keeps only the target's samples and
counts them by (tid, cpu, user stack, kernel stack) in the kernel; this
module reads the maps and fills Profile.oncpu and Profile.threads.

Stacks are symbolized at every read, while the target still runs; close()
reads once more, so what was counted survives the program's maps.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bcc import BPF, PerfSWConfig, PerfType

from kvprof.collect import PROBES_DIR, CollectError, CollectOptions, unwind
from kvprof.collect.symbols import Symbolizer, ThreadNames
from kvprof.model.profile import CpuStack, Profile, ThreadInfo

SOURCE = PROBES_DIR / "oncpu.bpf.c"
# The order of `enum health` in probes/oncpu.bpf.c.
HEALTH = ("samples", "user_stack_errors", "kernel_stack_errors", "map_full", "comm_full")


def load_error(source: Path, e: Exception) -> str:
    """One line out of BCC's multi-line compile/load failure."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"cannot load {source.name}: {lines[-1] if lines else type(e).__name__}"


def attach_cpu_clock(bpf: Any, hz: int, who: str) -> None:
    """Attach the program's `on_sample` to a cpu-clock event at `hz` on every CPU
    (cpu=-1: BCC opens one event per online CPU, each counting every task)."""
    try:
        bpf.attach_perf_event(
            ev_type=PerfType.SOFTWARE,
            ev_config=PerfSWConfig.CPU_CLOCK,
            fn_name=b"on_sample",
            sample_freq=hz,
            cpu=-1,
        )
    except Exception as e:
        raise CollectError(
            f"{who}: cannot open cpu-clock perf events ({e}); run as root, "
            "or lower /proc/sys/kernel/perf_event_paranoid"
        ) from None


def percpu_counters(table: Any, names: tuple[str, ...]) -> dict[str, int]:
    """A BPF_PERCPU_ARRAY of u64 counters, summed over CPUs, by name."""
    return {name: int(table.sum(table.Key(i)).value) for i, name in enumerate(names)}


def warn(profile: Profile, what: str, n: int, fix: str) -> None:
    """`what: n (fix)` in the profile's warnings, replacing an earlier count of the same thing."""
    kept = [w for w in profile.status.warnings if not w.startswith(f"{what}: ")]
    profile.status.warnings = [*kept, f"{what}: {n} ({fix})"]


@dataclass
class _Snapshot:
    stacks: list[CpuStack] = field(default_factory=list)
    threads: dict[int, ThreadInfo] = field(default_factory=dict)
    health: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HEALTH, 0))


class OnCpuCollector:
    name = "oncpu"

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        self.pid = pid
        self.opts = opts
        self._bpf: Any = None
        self._unwinder = unwind.Unwinder(pid)
        self._symbols = Symbolizer(pid, self._unwinder)
        self._ustacks: dict[int, tuple[list[int], str]] = {}  # what was read of `ustacks`
        self._names = ThreadNames(pid)
        self._last = _Snapshot()

    def applies(self) -> str | None:
        if not Path(f"/proc/{self.pid}").is_dir():
            return f"no process {self.pid}"
        return None

    def cflags(self) -> list[str]:
        return [
            f"-DTARGET_TGID={self.pid}",
            f"-DSTACK_STORAGE={self.opts.stack_storage}",
            f"-DMAX_ENTRIES={self.opts.max_entries}",
            *unwind.cflags(self.opts.stack_storage),
        ]

    def start(self) -> None:
        if self._bpf is not None:
            return
        why = self.applies()
        if why:
            raise CollectError(f"oncpu: {why}")
        self._names.refresh()
        self._symbols.warm()
        try:
            self._unwinder.prepare()
            if self._unwinder.built and self.opts.progress is not None:
                self.opts.progress(self._unwinder.built_line())
        except OSError as e:
            raise CollectError(f"oncpu: cannot read the target's mappings ({e.strerror})") from None
        try:
            self._bpf = BPF(text=unwind.with_unwinder(SOURCE).encode(), cflags=self.cflags())
        except Exception as e:
            raise CollectError(f"oncpu: {load_error(SOURCE, e)}") from None
        try:
            self._unwinder.load(self._bpf)
            attach_cpu_clock(self._bpf, self.opts.hz, "oncpu")
        except BaseException as e:
            self.close()
            if isinstance(e, Exception) and not isinstance(e, CollectError):
                raise CollectError(f"oncpu: cannot push the unwind tables ({e})") from None
            raise

    def _read(self) -> _Snapshot:
        self._names.refresh()
        bpf = self._bpf
        stacks = bpf[b"stacks"]
        ustacks = unwind.read_stacks(bpf[b"ustacks"], self._ustacks)
        comms = {
            int(k.value): bytes(v.name).split(b"\0", 1)[0].decode(errors="replace")
            for k, v in bpf[b"comms"].items()
        }
        by_stack: dict[tuple[int, tuple[str, ...]], int] = defaultdict(int)
        threads: dict[int, ThreadInfo] = {}
        stops: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for key, value in bpf[b"counts"].items():
            n = int(value.value)
            tid = int(key.tid)
            ips, reason = ustacks.get(int(key.user_stack), ([], "stack not readable"))
            user = self._symbols.unwound(ips, reason) if ips else []
            kernel = self._symbols.stack(stacks, key.kernel_stack, kernel=True)
            # Root first: the user stack, then the kernel frames at the leaf end.
            by_stack[(tid, tuple(user + kernel))] += n
            info = threads.setdefault(tid, ThreadInfo(name=self._names.get(tid, comms.get(tid, ""))))
            info.cpu_samples += n
            socket = str(self.opts.topology.socket_of(int(key.cpu)))
            info.sockets[socket] = info.sockets.get(socket, 0) + n
            if ips and reason != "root":
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
            health=percpu_counters(bpf[b"health"], HEALTH),
        )

    def contribute(self, profile: Profile) -> None:
        if self._bpf is not None:
            self._unwinder.refresh(self._bpf)  # what was mapped since (the uprobe trampoline, dlopen)
            self._last = self._read()
        snap = self._last
        profile.oncpu = [CpuStack(s.tid, list(s.frames), s.count) for s in snap.stacks]
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
        for w in self._unwinder.warnings:
            if w not in profile.status.warnings:
                profile.status.warnings.append(w)
        if counters["oncpu.stack_errors"]:
            warn(profile, "oncpu: stacks lost", counters["oncpu.stack_errors"], "raise --stack-storage")
        if counters["oncpu.map_full"]:
            warn(
                profile, "oncpu: samples dropped, map full", counters["oncpu.map_full"], "raise --max-entries"
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
