"""BCC for the BPF collectors: one compiled module for the programs of several
collectors, the base class of a BPF collector, and what they share.

A session compiles the programs of all its BPF collectors as one Module (one
clang run; each compile also pays BCC's own set-up, see docs/record.md), and
each collector then attaches its part of it (`BpfCollector.attach`). A
collector started alone (`start()`) compiles a module for itself. The
contract is in kvprof/collect/__init__.py.
"""

from __future__ import annotations

import ctypes
import functools
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from bcc import BPF, PerfSWConfig, PerfType
from bcc.libbcc import lib
from bcc.utils import get_online_cpus

from kvprof.collect import PROBES_DIR, CollectError, CollectOptions, follow
from kvprof.collect.overhead import Program as AttachedProgram
from kvprof.collect.usdt import KvsProgram, not_applicable
from kvprof.model.profile import Profile, ThreadInfo


@dataclass
class Program:
    """One collector's part of a module: C text (probes/<name>.bpf.c, with what it
    needs pasted in) and the -D flags it adds to CollectOptions.cflags()."""

    name: str
    text: str
    cflags: list[str] = field(default_factory=list)


def source(name: str) -> Path:
    return PROBES_DIR / f"{name}.bpf.c"


def first_line(e: BaseException, said: str = "") -> str:
    """The line that says what went wrong: clang's first error in what it `said`,
    else the last line of BCC's exception."""
    for line in said.splitlines():
        if "error: " in line:
            return line.split("error: ", 1)[1].strip()
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__


def read_user_flags(release: str) -> list[str]:
    """-D flags that call bpf_probe_read_user and bpf_probe_read_user_str by
    other names, on a kernel `release` that has them (Linux 5.5 and later).
    BCC's front end looks every call to either up in the kernel's symbols, to
    fall back to bpf_probe_read on older kernels, and at each call builds its
    table of every kernel symbol name again: a large part of a session's
    compile (docs/record.md, "Attach time"). Renamed, the calls are the same
    helpers and skip the lookup. Older kernels keep BCC's fallback."""
    try:
        major, minor = (int(x) for x in release.split(".")[:2])
    except ValueError:
        return []
    if (major, minor) < (5, 5):
        return []
    return ["-Dbpf_probe_read_user=kv_probe_read_user", "-Dbpf_probe_read_user_str=kv_probe_read_user_str"]


def compile_kept(text: str, cflags: list[str]) -> Any:
    """BPF(text=...), with what clang writes to fd 2 kept aside: on failure its
    first error becomes the CollectError (one line, and nothing on a TUI's
    screen); on success it is written to fd 2 as it would have been."""
    cflags = cflags + read_user_flags(os.uname().release)
    saved = os.dup(2)
    with tempfile.TemporaryFile() as said:
        os.dup2(said.fileno(), 2)
        try:
            bpf = BPF(text=text.encode(), cflags=cflags)
        except Exception as e:
            os.dup2(saved, 2)
            said.seek(0)
            raise CollectError(first_line(e, said.read().decode(errors="replace"))) from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        said.seek(0)
        warnings = said.read()
    if warnings:
        os.write(2, warnings)
    return bpf


# The collectors that sample at the module's cpu-clock events (CpuClock), in the
# order of their slots in probes/clock.bpf.c's kv_clock_on.
SAMPLERS = ("oncpu", "regsample")


class Module:
    """One BCC module holding the programs of one or more collectors for one PID.
    `shared` holds what the collectors of one module share (the unwinder of the
    unwind tables in probes/unwind.h); `clock` the cpu-clock events of its
    samplers. cleanup() detaches what BCC attached itself (tracepoint programs)
    and frees programs and maps; idempotent."""

    def __init__(self, pid: int, programs: list[Program], opts: CollectOptions, events: bool = False) -> None:
        """`events`: also what the target's processes do (probes/follow.h, which every
        module has when opts.follow_forks: it keeps the followed processes)."""
        self.pid = pid
        self.names = [p.name for p in programs]
        self.shared: dict[str, Any] = {}
        flags = list(opts.cflags(pid)) + follow.cflags(opts)
        for p in programs:
            flags += [f for f in p.cflags if f not in flags]
        self.events = events or opts.follow_forks
        texts = ([follow.text()] if self.events else []) + [p.text for p in programs]
        samplers = [n for n in SAMPLERS if n in self.names]
        if samplers:  # after the samplers' texts: it calls their functions
            texts.append(source("clock").read_text())
            flags += [f"-DKV_CLOCK_SAMPLERS={len(SAMPLERS)}"]
            flags += [f"-DKV_CLOCK_{n.upper()}={SAMPLERS.index(n)}" for n in samplers]
        try:  # follow.h first: its kv_followed() is what common.h's kv_is_target() calls
            self.bpf: Any = compile_kept("\n".join(texts), flags)
        except CollectError as e:
            raise CollectError(f"cannot compile {' + '.join(self.names)}: {e}") from None
        self.clock = CpuClock(self.bpf, samplers, opts.hz) if samplers else None

    def table(self, name: str) -> Any:
        return self.bpf[name.encode()]

    def cleanup(self) -> None:
        if self.clock is not None:
            self.clock.close()
        bpf, self.bpf = self.bpf, None
        if bpf is not None:
            bpf.cleanup()


class BpfCollector:
    """What every BPF collector does the same way; a subclass gives `name`,
    program(), _attach(module) (attach; own every fd it opens), _read() (what
    the maps hold now) and _detach(); _hook(module) is the part of _attach()
    that attaches programs to their events (no setup): pause() detaches them,
    resume() attaches them again, the programs and maps staying loaded. latest()
    is what contribute() reads: the maps while attached, what they held at
    close() after."""

    name = ""
    fired_by = "perf_event"  # what runs its programs: perf_event, tracepoint or uprobe (own-cost figure)
    empty: ClassVar[type | None] = None  # the type _read() returns: latest() is one, empty, before attaching

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        self.pid = pid
        self.opts = opts
        self.module: Module | None = None
        self._last: Any = self.empty() if self.empty else None  # the last _read(), kept when the maps go
        self._own: Module | None = None  # compiled by start() for this collector alone
        self._paused = False

    def applies(self) -> str | None:
        if not Path(f"/proc/{self.pid}").is_dir():
            return f"no process {self.pid}"
        return None

    def program(self) -> Program:
        raise NotImplementedError

    def program_names(self, module: Module) -> list[str]:
        """The names of this collector's programs in `module`: its `<name>_` functions."""
        return [n for n in (f.decode() for f in module.bpf.funcs) if n.startswith(f"{self.name}_")]

    def attached_programs(self) -> list[AttachedProgram]:
        """This collector's loaded programs, for kvprof's own-cost figure."""
        if self.module is None:
            return []
        funcs = self.module.bpf.funcs
        names = self.program_names(self.module)
        return [AttachedProgram(self.name, n, self.fired_by, funcs[n.encode()].fd) for n in names]

    def _attach(self, module: Module) -> None:
        raise NotImplementedError

    def _hook(self, module: Module) -> None:
        raise NotImplementedError

    def _read(self) -> Any:
        raise NotImplementedError

    def pause(self) -> None:
        """Detach the programs from their events; the maps keep what they counted."""
        if self.module is not None and not self._paused:
            self._detach()
            self._paused = True

    def resume(self) -> None:
        """Attach them again after pause(): nothing is compiled or set up again."""
        if self.module is not None and self._paused:
            self._hook(self.module)
            self._paused = False

    def refresh(self) -> None:
        """Tell the program what changed in the target since attaching (nothing, here)."""

    def latest(self) -> Any:
        """What the maps hold now; once closed, what they held then."""
        if self.module is not None:
            self.refresh()
            self._last = self._read()
        return self._last

    def _detach(self) -> None:
        raise NotImplementedError

    def table(self, name: str) -> Any:
        """This collector's map `<name>_<map>` in its module."""
        assert self.module is not None
        return self.module.table(f"{self.name}_{name}")

    def attach(self, module: Module) -> None:
        if self.module is not None:
            return
        self.module = module
        try:
            self._attach(module)
        except BaseException as e:
            self.close()
            if isinstance(e, Exception) and not isinstance(e, CollectError):
                raise CollectError(f"{self.name}: cannot attach ({first_line(e)})") from None
            raise

    def start(self) -> None:
        if self.module is not None:
            return
        why = self.applies()
        if why:
            raise CollectError(f"{self.name}: {why}")
        module = Module(self.pid, [self.program()], self.opts)
        self._own = module
        try:
            self.attach(module)
        finally:
            if self.module is None:  # attach failed and closed: the module goes too
                self._own = None
                module.cleanup()

    def close(self) -> None:
        if self.module is None:
            return
        try:
            self._last = self._read()  # the maps go with the module
        except Exception:  # a failed last read must not keep anything attached
            pass
        try:
            self._detach()
        finally:
            self.module = None
            own, self._own = self._own, None
            if own is not None:
                own.cleanup()


class KvsCollector(BpfCollector):
    """A BPF collector on kvcached's own `kvs` probes: `probes` maps each probe to
    the C function of probes/<name>.bpf.c run at it."""

    probes: ClassVar[dict[str, str]] = {}
    instead = ""  # what covers for it on a target without these probes
    fired_by = "uprobe"

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        super().__init__(pid, opts)
        self._kvs: KvsProgram | None = None

    def applies(self) -> str | None:
        return not_applicable(self.pid, list(self.probes), self.instead)

    def cflags(self) -> list[str]:
        return []

    def program(self) -> Program:
        self._kvs = KvsProgram(self.pid, self.name, self.probes)
        return Program(self.name, self._kvs.text, self.cflags())

    def _attach(self, module: Module) -> None:
        if self._kvs is None:
            self.program()
        assert self._kvs is not None
        self._hook(module)

    def _hook(self, module: Module) -> None:
        assert self._kvs is not None
        self._kvs.attach(module.bpf)

    def _detach(self) -> None:
        if self._kvs is not None:
            self._kvs.close()


class CpuClock:
    """The cpu-clock events of one module, one per CPU at `hz`, running
    probes/clock.bpf.c's kv_cpu_clock, which runs the function of each of the
    module's `samplers` whose collector is on: one timer interrupt per sample
    for all of them, not one each (docs/record.md, "One clock for the
    samplers"). The events are open while any sampler is on. The program's
    cost is counted once, under the samplers' names joined by "+", for the
    first of them still attached."""

    def __init__(self, bpf: Any, samplers: list[str], hz: int) -> None:
        self.bpf = bpf
        self.samplers = samplers
        self.hz = hz
        self.label = "+".join(samplers)
        self._fds: list[int] = []
        self._on: set[str] = set()
        self._users: list[str] = []  # attached and not closed, in attach order

    def start(self, name: str) -> None:
        """`name`'s function runs from now on; the events open if they were not
        (a CollectError when they cannot, and nothing changed)."""
        if not self._fds:
            self._fds = attach_cpu_clock(self.bpf, "kv_cpu_clock", self.hz, name)
        self._set(name, 1)
        self._on.add(name)
        if name not in self._users:
            self._users.append(name)

    def stop(self, name: str) -> None:
        """`name`'s function no longer runs; the events close when none is left on."""
        self._on.discard(name)
        if self.bpf is not None:
            self._set(name, 0)
        if not self._on:
            close_perf_events(self._fds)

    def release(self, name: str) -> None:
        """`name`'s collector closed: stop() it and hand the program's cost on."""
        self.stop(name)
        if name in self._users:
            self._users.remove(name)

    def programs(self, name: str) -> list[AttachedProgram]:
        """kv_cpu_clock for the own-cost figure, from the first sampler still attached."""
        fn = self.bpf.funcs.get(b"kv_cpu_clock") if self.bpf is not None else None
        if fn is None or not self._users or self._users[0] != name:
            return []
        return [AttachedProgram(self.label, "kv_cpu_clock", "perf_event", fn.fd)]

    def close(self) -> None:
        self._on.clear()
        close_perf_events(self._fds)
        self.bpf = None

    def _set(self, name: str, on: int) -> None:
        self.bpf[b"kv_clock_on"][ctypes.c_int(SAMPLERS.index(name))] = ctypes.c_uint32(on)


class Sampler(BpfCollector):
    """A BPF collector whose probes/<name>.bpf.c function `<name>_sample` runs at
    the module's cpu-clock events (Module.clock)."""

    def _hook(self, module: Module) -> None:
        assert module.clock is not None
        module.clock.start(self.name)

    def _detach(self) -> None:
        if self.module is not None and self.module.clock is not None:
            self.module.clock.stop(self.name)

    def close(self) -> None:
        module = self.module
        super().close()
        if module is not None and module.clock is not None:
            module.clock.release(self.name)

    def attached_programs(self) -> list[AttachedProgram]:
        if self.module is None or self.module.clock is None:
            return []
        return self.module.clock.programs(self.name)


def attach_cpu_clock(bpf: Any, fn_name: str, hz: int, who: str) -> list[int]:
    """Attach `fn_name` to a cpu-clock event at `hz` on every online CPU, each
    counting every task (as BCC's `profile` does); returns the events' fds,
    which the caller closes (close_perf_events)."""
    prog = bpf.load_func(fn_name.encode(), BPF.PERF_EVENT)
    fds: list[int] = []
    for cpu in get_online_cpus():
        fd = lib.bpf_attach_perf_event(prog.fd, PerfType.SOFTWARE, PerfSWConfig.CPU_CLOCK, 0, hz, -1, cpu, -1)
        if fd < 0:
            close_perf_events(fds)
            raise CollectError(
                f"{who}: cannot open cpu-clock perf events; run as root, "
                "or lower /proc/sys/kernel/perf_event_paranoid"
            )
        fds.append(fd)
    return fds


def close_perf_events(fds: list[int]) -> None:
    while fds:
        lib.bpf_close_perf_event_fd(fds.pop())


def map_items(table: Any) -> list[tuple[Any, Any]]:
    """Every (key, value) of a map, integer keys and values as int, in one
    BPF_MAP_LOOKUP_BATCH (Linux 5.6; BCC's items() makes two syscalls and a
    Python round per entry, and a live view reads every map each interval),
    else by BCC's items()."""
    try:
        return list(table.items_lookup_batch())  # an array of a ctypes integer gives int
    except Exception:  # BCC raises a plain Exception when the kernel has no batch ops
        return [(_plain(k), _plain(v)) for k, v in table.items()]


def _plain(x: Any) -> Any:
    return x.value if isinstance(x, ctypes._SimpleCData) else x


def percpu_counters(table: Any, names: tuple[str, ...]) -> dict[str, int]:
    """A BPF_PERCPU_ARRAY of u64 counters, summed over CPUs, by name."""
    return {name: int(table.sum(table.Key(i)).value) for i, name in enumerate(names)}


def cstr(raw: Any) -> str:
    """A fixed-size C char array of a map key, as text."""
    return _text(bytes(raw))


@functools.lru_cache(maxsize=4096)  # the same few names in every row of every read
def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def warn(profile: Profile, what: str, n: int, fix: str) -> None:
    """`what: n (fix)` in the profile's warnings, replacing an earlier count of the same thing."""
    kept = [w for w in profile.status.warnings if not w.startswith(f"{what}: ")]
    profile.status.warnings = [*kept, f"{what}: {n} ({fix})"]


def named_thread(profile: Profile, tid: int, names: ThreadNames) -> ThreadInfo:
    """The profile's row of thread `tid`, named from `names` when it has no name yet."""
    info = profile.threads.setdefault(str(tid), ThreadInfo())
    if not info.name:
        info.name = names.get(tid)
    return info


def put_counters(profile: Profile, collector: str, counters: dict[str, int], lost: str) -> None:
    """A collector's own counters into the profile's status as `collector.label`, and a
    warning when its map filled and `lost` (what it keeps: "waits") were dropped."""
    for label, value in counters.items():
        profile.status.counters[f"{collector}.{label}"] = value
    if counters.get("map_full"):
        warn(profile, f"{collector}: {lost} dropped, map full", counters["map_full"], "raise --max-entries")


class ThreadNames:
    """Thread names (`/proc/PID/task/TID/comm`) read while the target runs and
    kept once it is gone; names it never saw come from `fallback`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._names: dict[int, str] = {}

    def refresh(self) -> None:
        task = Path(f"/proc/{self.pid}/task")
        try:
            tids = [int(t.name) for t in task.iterdir()]
        except OSError:  # the process is gone
            return
        for tid in tids:
            try:
                self._names[tid] = (task / str(tid) / "comm").read_text().rstrip("\n")
            except OSError:  # the thread exited meanwhile
                pass

    def get(self, tid: int, fallback: str = "") -> str:
        return self._names.get(tid) or fallback

    def first_seen(self, tid: int) -> str:
        """The name of one thread, read the first time it is asked for ("" once it is gone)."""
        if tid not in self._names:
            try:
                self._names[tid] = Path(f"/proc/{self.pid}/task/{tid}/comm").read_text().strip()
            except OSError:
                self._names[tid] = ""
        return self._names[tid]
