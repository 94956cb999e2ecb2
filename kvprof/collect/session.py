"""A profiling session: a set of collectors attached to one process.

    with open_session(pid, ["oncpu", "locks"], CollectOptions()) as s:
        for snapshot in s.run(duration=10, interval=1.0):
            ...            # a cumulative Profile every interval
        profile = s.snapshot()

start() compiles the programs of all the BPF collectors as one BCC module
(one clang run; a module that does not compile is compiled again per
collector, so one broken program fails only its collector), then attaches
each; `start(on_state=...)` hears every collector's state as it changes.
The contract the collectors follow is in kvprof/collect/__init__.py.
kvprof.system.attach.open_session() makes the Session: it reads the target
from /proc and says in one line why it cannot be traced; a Session itself
reads nothing until start().

The session owns the collectors' lifetimes: every one that started is
closed on exit, on Ctrl-C (KeyboardInterrupt unwinds through `with`; the
commands turn SIGTERM into it, kvprof.system.attach.stop_on_signals) and when
the target dies (run() stops, the last snapshot is marked partial). A collector
that does not apply to the target, or fails to attach, is recorded in
Profile.status.collectors with the reason, and the others go on.
"""

from __future__ import annotations

import math
import os
import platform
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from kvprof.collect import (
    ATTACH_NICE,
    EXEC_CHECK_S,
    CollectError,
    CollectOptions,
    collector_class,
    debuginfod,
    follow,
)
from kvprof.collect.cpustat import cpu_times
from kvprof.collect.gosym import GO_NOTE, target_is_go
from kvprof.collect.overhead import Meter
from kvprof.collect.procroot import ns_pid
from kvprof.collect.server_stats import DEFAULT_GROUPS, TargetStats
from kvprof.model.delta import delta
from kvprof.model.profile import MACHINE_BUSY, MACHINE_IDLE, Host, Profile, Status, Target, Window

if TYPE_CHECKING:  # bcc is imported only once a BPF collector is made
    from kvprof.collect.bpf import Module, Program

ALL_COLLECTORS = ("oncpu", "offcpu", "locks", "cachelines", "requests", "regsample")
OPT_IN = ("hold",)  # run only when asked for by name (record --hold): never among "all"
ORDER = ALL_COLLECTORS + OPT_IN  # the order collectors are said in
# The attach order, after the one compile: what names the contention soonest first (a live
# view shows the first numbers meanwhile); py-spy and perf, which compile nothing, first.
KVS_ORDER = ("locks", "cachelines", "oncpu", "offcpu", "requests", "regsample", "hold")
GENERIC_ORDER = ("offcpu", "oncpu", "regsample", "locks", "cachelines", "requests", "hold")
# collectors that walk and symbolize stacks: their maps take most of a read
STACK_COLLECTORS = ("oncpu", "offcpu", "regsample")
# offcpu's per-thread totals run up to the moment it is read (kvprof.collect.offsample):
# it is read first at a window's end and last at its start, next to the window's edges.
READ_AT_THE_EDGES = ("offcpu",)
NO_BPF = ("pyspy", "perf")  # modules that run a program beside the target instead of loading BPF
PERF_ONLY = "not run: --backend perf takes on-CPU stacks only"


class TargetGone(Exception):
    """The target process does not exist (any more)."""


# What a /proc/PID file gives once the process is gone: ENOENT when its directory is
# looked up after it was reaped, ESRCH when the lookup came first (the reap raced it).
GONE = (FileNotFoundError, ProcessLookupError)


def describe_target(pid: int) -> Target:
    """The target's identity from /proc; TargetGone or PermissionError when it cannot be read."""
    proc = f"/proc/{pid}"
    try:
        with open(f"{proc}/comm") as f:
            comm = f.read().strip()
    except GONE:
        raise TargetGone(f"no process with PID {pid}") from None
    try:
        exe = os.readlink(f"{proc}/exe")
        with open(f"{proc}/cmdline", "rb") as f:
            cmdline = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except GONE:
        raise TargetGone(f"PID {pid} ({comm}) is a kernel thread or has exited: nothing to profile") from None
    return Target(pid=pid, comm=comm, exe=exe, cmdline=cmdline, kvs_probes=False, ns_pid=ns_pid(pid))


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (*GONE, IndexError):
        return False
    return state not in ("Z", "X")


def modules(pid: int, names: list[str] | tuple[str, ...], opts: CollectOptions) -> dict[str, str]:
    """The module under kvprof/collect/ that collects each of `names` for this target: the
    on-CPU stacks come from perf (opts.backend "perf", and nothing else then), from py-spy
    (opts.python, or None and a CPython target) or from BPF; the off-CPU ones from looks
    at the target's threads (opts.offcpu_hz) or from every switch; everything else from BPF."""
    if opts.backend == "perf":
        if opts.python:
            raise CollectError("--python and --backend perf both take the on-CPU stacks: choose one")
        return {"oncpu": "perf"}
    from kvprof.collect.pyspy import python_version

    python = opts.python if opts.python is not None else "oncpu" in names and python_version(pid) is not None
    return {
        n: "pyspy" if n == "oncpu" and python else "offsample" if n == "offcpu" and opts.offcpu_hz else n
        for n in names
    }


@contextmanager
def _attach_priority() -> Iterator[None]:
    """This thread at nice ATTACH_NICE while it compiles and attaches, then back. The
    compile is most of attaching's CPU (docs/record.md, "Attach time"); on a machine
    whose CPUs the target keeps busy it gets a share of a CPU and takes longer by as
    much. The CPU it takes is the same, it takes it sooner; only this thread is
    raised, and only root may raise it."""
    tid = threading.get_native_id()
    try:
        old = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(old, ATTACH_NICE))
    except OSError:  # not allowed: attach at the priority it has
        yield
        return
    try:
        yield
    finally:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, old)
        except OSError:
            pass


class Session:
    def __init__(self, target: Target, modules: dict[str, str], opts: CollectOptions) -> None:
        """The collectors of `modules` (collector name -> its module, modules()) on `target`
        (describe_target()), not attached yet."""
        self.pid = target.pid
        self.opts = opts
        self.modules = modules
        self.names = list(self.modules)
        self.target = target
        self.status = Status()
        if self.opts.backend == "perf":
            self.status.collectors.update(dict.fromkeys(ALL_COLLECTORS[1:], PERF_ONLY))
        self.target_stats = TargetStats(target.pid)
        self.stats_before: dict[str, dict[str, str]] = {}  # the target's own counters at the window's start
        self.active: list[Any] = []
        self.started_at = 0.0
        self._edge: tuple[float, float] | None = None  # (wall, monotonic) when offcpu's last read began
        self._t0 = 0.0
        self._base: Profile | None = None  # what was counted before the window started
        self._modules: list[Module] = []  # the compiled BCC modules the active collectors attached to
        # start() may attach collectors in one thread while another reads snapshots
        self._lock = threading.Lock()
        # held while start() compiles and attaches: close() from another
        # thread waits for the step under way, so nothing stays attached
        self._attaching = threading.RLock()
        self._closed = False
        self._started = False  # start() has attached what it could: pause() may act
        self._paused_at = 0.0  # time.monotonic() of pause(), 0 while not paused
        self._paused_s = 0.0  # the window's time paused before that
        self._meter = Meter(target.pid)  # what kvprof itself costs over the window
        self._events: list[follow.Events | None] = [
            None,
            None,
        ]  # follow.h's counts: at the window's start, last read

    # ---- lifetime ------------------------------------------------------------

    def start(self, on_state: Callable[[str, str], None] | None = None) -> None:
        """Attach every collector, then start the window (opts.live: the first attach
        starts it). py-spy and perf, which compile nothing, start first; the programs
        of every BPF collector are compiled as one module (one clang run and one
        kernel-symbol load in BCC: a live view too, see docs/record.md), then
        each is attached in the attach order. `on_state(name, state)` hears each collector's state as it
        changes, from this thread: "compiling" (BPF), "attaching", then "ok",
        "not applicable: ...", "failed: ..." or "not attached: the session was
        closed". A close() from another thread meanwhile ends start() early, with
        nothing attached."""
        from kvprof.collect import usdt  # where the kvs probes are looked up

        self.target.kvs_probes = usdt.has_kvs_probes(self.pid)
        debuginfod.start(self.pid, self.opts.progress, _lacking_names)  # in the background
        if target_is_go(self.pid):
            self.status.notes.append(GO_NOTE)
        order = KVS_ORDER if self.target.kvs_probes else GENERIC_ORDER
        at_window: list[Any] = []  # collectors that count from the window's start (reads_once)
        try:
            with self._attaching:
                with_bpf = []
                for name in sorted(self.names, key=lambda n: (self.modules[n] not in NO_BPF, order.index(n))):
                    collector = None if self._closed else self._prepare(name, on_state)
                    if collector is None:
                        continue
                    if getattr(collector, "reads_once", False):
                        at_window.append(collector)
                    elif hasattr(collector, "program"):
                        with_bpf.append(collector)
                    else:
                        self._start(collector, None, on_state)
                # not while py-spy or perf start (before) or py-spy record (after): they would inherit it
                with _attach_priority():
                    for module, collectors in self._compile(with_bpf, on_state):
                        for collector in collectors:
                            self._start(collector, module, on_state)
                    if self._closed:
                        return
                    if self._base is None:
                        self._begin_window()
                for collector in at_window:
                    self._start(collector, None, on_state)
                self.stats_before = self.target_stats.read()
        except BaseException:
            for collector in at_window:
                collector.close()
            self.close()
            raise
        if self.closed:
            return
        if not self.active:
            self.close()
            reasons = "; ".join(f"{n}: {r}" for n, r in self.status.collectors.items())
            raise CollectError(f"no collector could attach to PID {self.pid} ({reasons})")
        with self._lock:  # said in the order asked for, whatever the attach order
            self._started = True
            self.active.sort(key=lambda c: ORDER.index(c.name))
            self.status.collectors = dict(
                sorted(self.status.collectors.items(), key=lambda kv: ORDER.index(kv[0]))
            )

    @property
    def closed(self) -> bool:
        """True once close() was called (from any thread)."""
        return self._closed

    def _begin_window(self) -> None:
        # The window starts once everything is attached: what the first collectors
        # counted meanwhile is subtracted from every snapshot, so all of them
        # cover the same window, and the target's own stats are read at this
        # point for the ground truth.
        self._base = self._read(probes_first=False)
        # the window's clock starts as offcpu's base read begins (its per-thread totals
        # run up to that moment; its stacks are named after): time between the two
        # would be counted in the threads' totals but not in the window
        self.started_at, self._t0 = self._edge or (time.time(), time.monotonic())
        self._events[0] = self._events[1]
        self._meter.start(self._programs())

    def _say(self, name: str, state: str, on_state: Callable[[str, str], None] | None) -> None:
        with self._lock:
            self.status.collectors[name] = state
        if on_state is not None:
            on_state(name, state)

    def _prepare(self, name: str, on_state: Callable[[str, str], None] | None) -> Any:
        """The collector of `name` if it applies to the target, else None (its state said).
        A CollectError from applies() ends the session: py-spy that --python asked for."""
        try:
            collector = collector_class(self.modules[name])(self.pid, self.opts)
        except CollectError as e:
            self._say(name, f"failed: {e}", on_state)
            return None
        reason = collector.applies()
        if reason is not None:
            self._say(name, f"not applicable: {reason}", on_state)
            return None
        return collector

    def _compile(
        self, collectors: list[Any], on_state: Callable[[str, str], None] | None
    ) -> list[tuple[Module, list[Any]]]:
        """The modules to attach `collectors` to: one for all of them, or, when that
        does not compile, one per collector (the one that fails is reported)."""
        programs: list[tuple[Any, Program]] = []
        for c in collectors:
            if self._closed:
                return []
            try:
                programs.append((c, c.program()))
            except CollectError as e:
                self._say(c.name, f"failed: {e}", on_state)
        for c, _ in programs:
            self._say(c.name, "compiling", on_state)
        groups = [programs] if programs else []
        try:
            if programs:
                return self._keep_module([c for c, _ in programs], [p for _, p in programs])
        except CollectError as e:
            if len(programs) == 1:
                self._say(programs[0][0].name, f"failed: {e}", on_state)
                return []
            groups = [[one] for one in programs]  # find the one that breaks the module
        out = []
        for group in groups:
            try:
                out += self._keep_module([c for c, _ in group], [p for _, p in group])
            except CollectError as e:
                self._say(group[0][0].name, f"failed: {e}", on_state)
        return out

    def _keep_module(self, collectors: list[Any], programs: list[Program]) -> list[tuple[Module, list[Any]]]:
        from kvprof.collect.bpf import Module

        if self._closed:
            return []
        module = Module(self.pid, programs, self.opts, events=not self._modules)
        self._modules.append(module)
        return [(module, collectors)]

    def _start(
        self, collector: Any, module: Module | None, on_state: Callable[[str, str], None] | None
    ) -> None:
        """Attach one collector: to `module` (a BPF one), or by its own start()."""
        if self._closed:
            self._say(collector.name, "not attached: the session was closed", on_state)
            return
        self._say(collector.name, "attaching", on_state)
        try:
            collector.start() if module is None else collector.attach(module)
        except CollectError as e:
            collector.close()
            self._say(collector.name, f"failed: {e}", on_state)
            return
        except BaseException:  # Ctrl-C or SIGTERM while it attached: nothing may stay attached
            collector.close()
            raise
        with self._lock:
            closed = self.closed
            if closed:
                collector.close()  # closed while it attached: nothing may stay attached
            else:
                self.active.append(collector)
        self._say(collector.name, "not attached: the session was closed" if closed else "ok", on_state)
        if not closed and self.opts.live and self._base is None:
            self._begin_window()

    def pause(self) -> None:
        """Detach every BPF collector's programs from their events, keeping them loaded
        and the maps as they are (record and top do it on SIGUSR1:
        kvprof.system.attach.pause_on_signals); the window goes on, and its warnings
        say for how long it was paused. Nothing before start() has attached all."""
        with self._lock:
            if not self._started or self._closed or self._paused_at:
                return
            for collector in self.active:
                if hasattr(collector, "pause"):
                    collector.pause()
            self._paused_at = time.monotonic()

    def resume(self) -> None:
        """Attach them again after pause() (SIGUSR2): no compile, no setup."""
        with self._lock:
            if not self._paused_at or self._closed:
                return
            for collector in self.active:
                if hasattr(collector, "resume"):
                    try:
                        collector.resume()
                    except Exception as e:  # the target exited meanwhile, a probe went: the rest go on
                        self.status.warnings.append(
                            f"{collector.name}: not attached again after the pause: {e}"
                        )
            self._paused_s += time.monotonic() - self._paused_at
            self._paused_at = 0.0

    def is_paused(self) -> bool:
        """Between pause() and resume(). Without the lock: top's UI thread asks at every
        tick, and pause() holds the lock while it detaches (most of a second)."""
        return bool(self._paused_at)

    def paused_s(self) -> float:
        """Seconds of the window spent paused so far."""
        with self._lock:
            return self._paused_s + (time.monotonic() - self._paused_at if self._paused_at else 0.0)

    def close(self) -> None:
        """Detach every collector; safe to call twice, from error paths, and from
        another thread while start() or add() attaches (it waits for the step under way)."""
        with self._lock:
            self._closed = True
        with self._attaching:
            while self.active:
                collector = self.active.pop()
                try:
                    collector.close()
                except Exception as e:  # one collector's failure must not leave the others attached
                    self.status.warnings.append(f"{collector.name}: close failed: {e}")
            while self._modules:
                self._modules.pop().cleanup()
            self._meter.close()

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---- data -------------------------------------------------------------------

    def stats(
        self, groups: tuple[str, ...] = DEFAULT_GROUPS, timeout: float = 2.0
    ) -> dict[str, dict[str, str]]:
        """The target's own counters now (memcached `stats` groups or Redis INFO); {} when it
        answers none or has exited."""
        return self.target_stats.read(groups, timeout) if alive(self.pid) else {}

    def finish(self) -> Profile:
        """The last snapshot, with the target's own counters from the window's start and end
        in profile.server_stats ("before", "before.locks", …, "after", …): the counters are
        read first, then the maps (the small probe maps first), so the two windows end
        within milliseconds, not after seconds of symbolizing stacks. It also says which
        modules had no symbols for its frames (kvprof.collect.unnamed)."""
        after = self.stats()
        profile = self.snapshot()
        for when, groups in (("before", self.stats_before), ("after", after)):
            for name, group in groups.items():
                profile.server_stats[when if name == "general" else f"{when}.{name}"] = group
        try:  # reads ELF files with pyelftools, which a recording does not need
            from kvprof.collect.unnamed import missing_symbols
        except ImportError:  # missing: the collectors that need it say so
            return profile
        profile.missing_symbols = missing_symbols(self.pid, profile)
        return profile

    def elapsed(self) -> float:
        return time.monotonic() - self._t0 if self._t0 else 0.0

    def snapshot(self) -> Profile:
        """Everything counted since the window started, as a Profile (no findings yet)."""
        # the meter first: this read's own work (maps, symbols) is after the window;
        # a live view's earlier reads are in it, as they were CPU it took
        overhead = self._meter.read(self._programs())
        raw = self._read()
        profile = delta(raw, self._base) if self._base is not None else raw
        profile.overhead = overhead
        return profile

    def _programs(self) -> list[Any]:
        with self._lock:
            active = list(self.active)
        return [p for c in active if hasattr(c, "attached_programs") for p in c.attached_programs()]

    def _read(self, probes_first: bool = True) -> Profile:
        profile = Profile(
            target=self.target,
            host=Host(
                kernel=platform.release(), cpus=os.cpu_count() or 0, topology=self.opts.topology.to_dict()
            ),
            window=Window(start=self.started_at, duration_s=round(self.elapsed(), 3)),
            hz=self.opts.hz,
        )
        with self._lock:
            active = list(self.active)
            profile.collectors = [c.name for c in active]
            profile.status = Status(
                partial=self.status.partial,
                reason=self.status.reason,
                collectors=dict(self.status.collectors),
                counters={},
                warnings=list(self.status.warnings),
                sample_rates=dict(self.status.sample_rates),
                notes=list(self.status.notes),
            )
            modules = list(self._modules)
        paused = self.paused_s()
        if paused >= 0.05:
            profile.status.warnings.append(
                f"paused for {paused:.1f} s of the window (SIGUSR1 to SIGUSR2): "
                "rates are over the whole window"
            )
        self._target_events(profile, modules)
        # The probe collectors' maps are small and read in milliseconds; the
        # stack collectors symbolize thousands of frames. The probe maps are
        # read right next to the moment the target's own stats are read:
        # last when the window starts (the base), first when it ends (finish),
        # but for READ_AT_THE_EDGES, read at the window's very edges.
        stacks_last = sorted(
            active, key=lambda c: -1 if c.name in READ_AT_THE_EDGES else c.name in STACK_COLLECTORS
        )
        self._edge = None
        for collector in stacks_last if probes_first else stacks_last[::-1]:
            if collector.name in READ_AT_THE_EDGES:
                self._edge = (time.time(), time.monotonic())
            collector.contribute(profile)
        machine = cpu_times()  # the whole machine: what else ran beside the target (the what-if says)
        profile.status.counters[MACHINE_BUSY] = round(machine.busy * 1e9)
        profile.status.counters[MACHINE_IDLE] = round(machine.idle * 1e9)
        warnings, notes = debuginfod.said()  # what the names above were read from
        profile.status.warnings += warnings
        profile.status.notes += notes
        return profile

    def _target_events(self, profile: Profile, modules: list[Module]) -> None:
        """What the target's processes did in the window (kvprof.collect.follow), as notes."""
        try:
            self._events[1] = follow.read(modules[0]) if modules and modules[0].bpf else self._events[1]
        except Exception:  # closed meanwhile: the last read stands
            pass
        events = self._events[1]
        if events is not None:
            profile.status.notes += follow.notes(events, self._events[0], self.opts.follow_forks)

    def stop_reason(self) -> str | None:
        """Why run() must stop now: the target exited or exec'd another program."""
        if not alive(self.pid):
            return f"the target (PID {self.pid}) exited after {self.elapsed():.1f} s"
        with self._lock:
            module = self._modules[0] if self._modules else None
        try:
            execd = module is not None and module.bpf is not None and follow.target_execd(module)
        except Exception:  # closed meanwhile
            execd = False
        return follow.exec_reason(self.pid, self.elapsed()) if execd else None

    def run(
        self, duration: float | None, interval: float = 1.0, snapshots: bool = True
    ) -> Iterator[Profile | None]:
        """A cumulative snapshot every `interval` seconds until `duration` (None: until
        Ctrl-C) or until the target dies, which marks the session partial (and always
        yields a last snapshot then). With snapshots=False it yields None instead:
        reading every map costs CPU on the machine being measured, so a recording
        that shows no live numbers reads them once, at the end."""
        deadline = None if duration is None else self._t0 + duration
        with _ExitWait(self.pid) as exit_wait:
            while True:
                now = time.monotonic()
                wake = now + interval if deadline is None else min(now + interval, deadline)
                while (left := wake - time.monotonic()) > 0:
                    exit_wait.wait(min(EXEC_CHECK_S, left))
                    reason = self.stop_reason()
                    if reason is not None:
                        self.status.partial = True
                        self.status.reason = reason
                        yield self.snapshot()
                        return
                yield self.snapshot() if snapshots else None
                if deadline is not None and time.monotonic() >= deadline - 1e-3:
                    return


class _ExitWait:
    """Sleeps that end early when process `pid` exits: a poll on its pidfd. Where there
    is none (the process is gone already, or an older kernel) a sleep of at most
    EXIT_POLL_S, after which the caller looks at /proc."""

    EXIT_POLL_S = 0.1

    def __init__(self, pid: int) -> None:
        self._poll: select.poll | None = None
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except OSError:
            self._fd = None
            return
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)

    def __enter__(self) -> _ExitWait:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def wait(self, seconds: float) -> None:
        if self._poll is None:
            time.sleep(min(self.EXIT_POLL_S, seconds))
        elif self._poll.poll(max(0, math.ceil(seconds * 1000))):
            self._poll = None  # it exited: from here on /proc says so, no poll can wait


def _lacking_names(pid: int) -> list[tuple[str, str]]:
    """The modules of `pid` without names (kvprof.collect.debuginfo; it needs pyelftools,
    which the session itself does not import)."""
    from kvprof.collect.debuginfo import lacking_names

    return lacking_names(pid)
