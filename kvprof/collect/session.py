"""A profiling session: a set of collectors attached to one process.

    with Session(pid, ["oncpu", "locks"], CollectOptions(hz=99)) as s:
        for snapshot in s.run(duration=10, interval=1.0):
            ...            # a cumulative Profile every interval
        profile = s.snapshot()

The session owns the collectors' lifetimes: every one that started is
closed on exit, on Ctrl-C (KeyboardInterrupt unwinds through `with`), on
SIGTERM (turned into KeyboardInterrupt while a session is open) and when the
target dies (run() stops, the last snapshot is marked partial). A collector
that does not apply to the target, or fails to attach, is recorded in
Profile.status.collectors with the reason, and the others go on.
"""

from __future__ import annotations

import importlib
import os
import platform
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

from kvprof.collect import CollectError, CollectOptions
from kvprof.collect.server_stats import DEFAULT_GROUPS, TargetStats
from kvprof.model.delta import delta
from kvprof.model.profile import Host, Profile, Status, Target, Window

ALL_COLLECTORS = ("oncpu", "offcpu", "locks", "cachelines", "requests", "regsample")
# The attach order: what names the contention soonest first. On kvs targets the lock and
# cache-line programs compile in a second or two each, the on-CPU one takes several (a
# live view shows the first numbers meanwhile); py-spy and perf, which compile nothing, first.
KVS_ORDER = ("locks", "cachelines", "oncpu", "offcpu", "requests", "regsample")
GENERIC_ORDER = ("offcpu", "oncpu", "regsample", "locks", "cachelines", "requests")
NO_BPF = ("pyspy", "perf")  # modules that run a program beside the target instead of loading BPF
PERF_ONLY = "not run: --backend perf takes on-CPU stacks only"


class TargetGone(Exception):
    """The target process does not exist (any more)."""


def describe_target(pid: int) -> Target:
    """The target's identity from /proc; TargetGone or PermissionError when it cannot be read."""
    proc = f"/proc/{pid}"
    try:
        with open(f"{proc}/comm") as f:
            comm = f.read().strip()
    except FileNotFoundError:
        raise TargetGone(f"no process with PID {pid}") from None
    try:
        exe = os.readlink(f"{proc}/exe")
    except FileNotFoundError:
        raise TargetGone(f"PID {pid} ({comm}) is a kernel thread or has exited: nothing to profile") from None
    with open(f"{proc}/cmdline", "rb") as f:
        cmdline = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    return Target(pid=pid, comm=comm, exe=exe, cmdline=cmdline, kvs_probes=False)


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def modules(pid: int, names: list[str] | tuple[str, ...], opts: CollectOptions) -> dict[str, str]:
    """The module under kvprof/collect/ that collects each of `names` for this target: the
    on-CPU stacks come from perf (opts.backend "perf", and nothing else then), from py-spy
    (opts.python, or None and a CPython target) or from BPF; everything else from BPF."""
    if opts.backend == "perf":
        if opts.python:
            raise CollectError("--python and --backend perf both take the on-CPU stacks: choose one")
        return {"oncpu": "perf"}
    from kvprof.collect.pyspy import python_version

    python = opts.python if opts.python is not None else "oncpu" in names and python_version(pid) is not None
    return {n: "pyspy" if n == "oncpu" and python else n for n in names}


def _collector_class(module_name: str, name: str) -> Any:
    try:
        module = importlib.import_module(f"kvprof.collect.{module_name}")
    except ImportError as e:  # a Python package it needs from Debian is missing
        raise CollectError(f"{name} cannot load ({e}): run scripts/provision.sh") from None
    for attr in vars(module).values():
        if (
            isinstance(attr, type)
            and attr.__name__.endswith("Collector")
            and getattr(attr, "name", None) == name
        ):
            return attr
    raise CollectError(f"kvprof.collect.{module_name} has no collector class named {name!r}")


class Session:
    def __init__(
        self,
        pid: int,
        collectors: list[str] | tuple[str, ...] = ALL_COLLECTORS,
        opts: CollectOptions | None = None,
    ) -> None:
        unknown = [c for c in collectors if c not in ALL_COLLECTORS]
        if unknown:
            raise CollectError(f"unknown collector {unknown[0]!r}: choose from {', '.join(ALL_COLLECTORS)}")
        self.pid = pid
        self.opts = opts or CollectOptions()
        self.modules = modules(pid, collectors, self.opts)  # collector name -> its module
        self.names = list(self.modules)
        self.target = describe_target(pid)
        self.status = Status()
        if self.opts.backend == "perf":
            self.status.collectors.update(dict.fromkeys(ALL_COLLECTORS[1:], PERF_ONLY))
        self.target_stats = TargetStats(pid)
        self.stats_before: dict[str, dict[str, str]] = {}  # the target's own counters at the window's start
        self.active: list[Any] = []
        self.started_at = 0.0
        self._t0 = 0.0
        self._base: Profile | None = None  # what was counted before the window started
        self._old_term: Any = None
        # start() may attach collectors in one thread while another reads snapshots
        self._lock = threading.Lock()
        self._closed = False

    # ---- lifetime ------------------------------------------------------------

    def start(self, on_state: Callable[[str, str], None] | None = None) -> None:
        """Attach every collector, in the attach order, then start the window (opts.live:
        the first attach starts it). `on_state(name, state)` says each one's progress, from
        this thread: "attaching", then "ok", "not applicable: …" or "failed: …". A session
        closed from another thread meanwhile attaches no more and detaches what it did."""
        from kvprof.collect import usdt  # where the kvs probes are looked up

        self.target.kvs_probes = usdt.has_kvs_probes(self.pid)
        if threading.current_thread() is threading.main_thread():
            # only the main thread may set handlers; a program that starts the session
            # elsewhere (the TUI, from a worker) handles SIGTERM itself and calls close()
            self._old_term = signal.signal(signal.SIGTERM, self._on_term)
        order = KVS_ORDER if self.target.kvs_probes else GENERIC_ORDER
        at_window = []  # collectors that count from the window's start (reads_once)
        try:
            for name in sorted(self.names, key=lambda n: (self.modules[n] not in NO_BPF, order.index(n))):
                collector = None if self._closed else self._prepare(name, on_state)
                if collector is not None and getattr(collector, "reads_once", False):
                    at_window.append((name, collector))
                elif collector is not None:
                    self._start(name, collector, on_state)
                    if self.opts.live and self._base is None and self.active:
                        self._begin_window()
            if self._base is None:
                self._begin_window()
            for name, collector in at_window:
                self._start(name, collector, on_state)
            self.stats_before = self.target_stats.read()
        except BaseException:
            for _, collector in at_window:
                collector.close()
            self.close()
            raise
        if not self.active:
            self.close()
            reasons = "; ".join(f"{n}: {r}" for n, r in self.status.collectors.items())
            raise CollectError(f"no collector could attach to PID {self.pid} ({reasons})")
        with self._lock:  # said in the order asked for, whatever the attach order
            self.active.sort(key=lambda c: ALL_COLLECTORS.index(c.name))
            self.status.collectors = dict(
                sorted(self.status.collectors.items(), key=lambda kv: ALL_COLLECTORS.index(kv[0]))
            )

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def _begin_window(self) -> None:
        # The window starts once everything is attached (compiling a BPF
        # program takes a second or more each): what the first collectors
        # counted meanwhile is subtracted from every snapshot, so all of them
        # cover the same window, and the target's own stats are read at this
        # point for the ground truth.
        self._base = self._read(probes_first=False)
        self.started_at = time.time()
        self._t0 = time.monotonic()

    def _say(self, name: str, state: str, on_state: Callable[[str, str], None] | None) -> None:
        with self._lock:
            self.status.collectors[name] = state
        if on_state is not None:
            on_state(name, state)

    def _prepare(self, name: str, on_state: Callable[[str, str], None] | None) -> Any:
        """The collector of `name` if it applies to the target, else None (its state said).
        A CollectError from applies() ends the session: py-spy that --python asked for."""
        self._say(name, "attaching", on_state)
        try:
            collector = _collector_class(self.modules[name], name)(self.pid, self.opts)
        except CollectError as e:
            self._say(name, f"failed: {e}", on_state)
            return None
        reason = collector.applies()
        if reason is not None:
            self._say(name, f"not applicable: {reason}", on_state)
            return None
        return collector

    def _start(self, name: str, collector: Any, on_state: Callable[[str, str], None] | None) -> None:
        try:
            collector.start()
        except CollectError as e:
            collector.close()
            self._say(name, f"failed: {e}", on_state)
            return
        except BaseException:  # Ctrl-C or SIGTERM while it attached: nothing may stay attached
            collector.close()
            raise
        with self._lock:
            closed = self._closed
            if closed:
                collector.close()  # closed while it compiled: nothing may stay attached
            else:
                self.active.append(collector)
        self._say(name, "not attached: the session was closed" if closed else "ok", on_state)

    def close(self) -> None:
        """Detach every collector; safe to call twice, and from error paths."""
        with self._lock:
            self._closed = True
        while self.active:
            collector = self.active.pop()
            try:
                collector.close()
            except Exception as e:  # one collector's failure must not leave the others attached
                self.status.warnings.append(f"{collector.name}: close failed: {e}")
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None

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
        within milliseconds, not after seconds of symbolizing stacks."""
        after = self.stats()
        profile = self.snapshot()
        for when, groups in (("before", self.stats_before), ("after", after)):
            for name, group in groups.items():
                profile.server_stats[when if name == "general" else f"{when}.{name}"] = group
        return profile

    def elapsed(self) -> float:
        return time.monotonic() - self._t0 if self._t0 else 0.0

    def snapshot(self) -> Profile:
        """Everything counted since the window started, as a Profile (no findings yet)."""
        raw = self._read()
        return delta(raw, self._base) if self._base is not None else raw

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
            )
        # The probe collectors' maps are small and read in milliseconds; the
        # stack collectors symbolize thousands of frames. The probe maps are
        # read right next to the moment the target's own stats are read:
        # last when the window starts (the base), first when it ends (finish).
        stacks_last = sorted(active, key=lambda c: c.name in ("oncpu", "offcpu", "regsample"))
        for collector in stacks_last if probes_first else stacks_last[::-1]:
            collector.contribute(profile)
        return profile

    def run(
        self, duration: float | None, interval: float = 1.0, snapshots: bool = True
    ) -> Iterator[Profile | None]:
        """A cumulative snapshot every `interval` seconds until `duration` (None: until
        Ctrl-C) or until the target dies, which marks the session partial (and always
        yields a last snapshot then). With snapshots=False it yields None instead:
        reading every map costs CPU on the machine being measured, so a recording
        that shows no live numbers reads them once, at the end."""
        deadline = None if duration is None else self._t0 + duration
        while True:
            now = time.monotonic()
            wake = now + interval if deadline is None else min(now + interval, deadline)
            while time.monotonic() < wake:
                time.sleep(min(0.1, max(0.0, wake - time.monotonic())))
                if not alive(self.pid):
                    self.status.partial = True
                    self.status.reason = f"the target (PID {self.pid}) exited after {self.elapsed():.1f} s"
                    yield self.snapshot()
                    return
            yield self.snapshot() if snapshots else None
            if deadline is not None and time.monotonic() >= deadline - 1e-3:
                return
