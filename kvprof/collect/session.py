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
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

from kvprof.collect import CollectError, CollectOptions
from kvprof.model.delta import delta
from kvprof.model.profile import Host, Profile, Status, Target, Window

ALL_COLLECTORS = ("oncpu", "offcpu", "locks", "cachelines", "requests", "regsample")


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


def _collector_class(name: str) -> Any:
    try:
        module = importlib.import_module(f"kvprof.collect.{name}")
    except ImportError as e:  # a Python package it needs from Debian is missing
        raise CollectError(f"{name} cannot load ({e}): run scripts/provision.sh") from None
    for attr in vars(module).values():
        if (
            isinstance(attr, type)
            and attr.__name__.endswith("Collector")
            and getattr(attr, "name", None) == name
        ):
            return attr
    raise CollectError(f"kvprof.collect.{name} has no collector class named {name!r}")


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
        self.names = list(collectors)
        self.opts = opts or CollectOptions()
        self.target = describe_target(pid)
        self.status = Status()
        self.active: list[Any] = []
        self.started_at = 0.0
        self._t0 = 0.0
        self._base: Profile | None = None  # what was counted before the window started
        self._old_term: Any = None
        # add() may attach a collector from one thread while another reads snapshots
        self._lock = threading.Lock()
        self._closed = False

    # ---- lifetime ------------------------------------------------------------

    def start(self) -> None:
        from kvprof.collect import usdt  # where the kvs probes are looked up

        self.target.kvs_probes = usdt.has_kvs_probes(self.pid)
        if threading.current_thread() is threading.main_thread():
            # only the main thread may set handlers; a program that starts the session
            # elsewhere (the TUI, from a worker) handles SIGTERM itself and calls close()
            self._old_term = signal.signal(signal.SIGTERM, self._on_term)
        try:
            for name in self.names:
                try:
                    collector = _collector_class(name)(self.pid, self.opts)
                except CollectError as e:
                    self.status.collectors[name] = f"failed: {e}"
                    continue
                reason = collector.applies()
                if reason is not None:
                    self.status.collectors[name] = f"not applicable: {reason}"
                    continue
                try:
                    collector.start()
                except CollectError as e:
                    collector.close()
                    self.status.collectors[name] = f"failed: {e}"
                    continue
                self.active.append(collector)
                self.status.collectors[name] = "ok"
        except BaseException:
            self.close()
            raise
        if not self.active:
            self.close()
            reasons = "; ".join(f"{n}: {r}" for n, r in self.status.collectors.items())
            raise CollectError(f"no collector could attach to PID {self.pid} ({reasons})")
        # The window starts once everything is attached (compiling a BPF
        # program takes a second or more each): what the first collectors
        # counted meanwhile is subtracted from every snapshot, so all of them
        # cover the same window, and `record` reads the target's own stats
        # at this point for the ground truth.
        self._base = self._read(probes_first=False)
        self.started_at = time.time()
        self._t0 = time.monotonic()

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def add(self, name: str) -> str:
        """Attach one more collector to a started session; returns its state ("ok", or
        why not, as in status.collectors). A live view uses it to show the first
        collectors' numbers while slower ones still compile; may run in another thread
        than snapshot(). The new collector's counts fall inside the window but cover
        only the part since it attached."""
        if name not in ALL_COLLECTORS:
            raise CollectError(f"unknown collector {name!r}: choose from {', '.join(ALL_COLLECTORS)}")
        try:
            collector = _collector_class(name)(self.pid, self.opts)
        except CollectError as e:
            with self._lock:
                self.status.collectors[name] = f"failed: {e}"
            return f"failed: {e}"
        reason = collector.applies()
        if reason is not None:
            state = f"not applicable: {reason}"
        else:
            try:
                collector.start()
                state = "ok"
            except CollectError as e:
                collector.close()
                state = f"failed: {e}"
        with self._lock:
            if state == "ok" and self._closed:
                collector.close()  # closed while it compiled: nothing may stay attached
                state = "closed"
            elif state == "ok":
                self.active.append(collector)
                if name not in self.names:
                    self.names.append(name)
            self.status.collectors[name] = state
        return state

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
        # read right next to the moment `record` reads the target's own stats:
        # last when the window starts (the base), first when it ends.
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
