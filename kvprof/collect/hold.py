"""The `hold` collector (`kvprof record --hold LOCK`): how long one named
pthread mutex of any program is held, contended or not, from uprobes on
glibc's mutex calls (kvprof/probes/hold.bpf.c), for a bounded time.

kvcached says its own hold times (the `locks` collector's sampled
`lock__hold`); other programs have no such probe. Here every call of
pthread_mutex_lock, trylock, unlock and pthread_cond_wait/timedwait in the
target traps into the kernel, on any mutex, and the programs keep the calls
on the one lock. That costs the target a uprobe hit (UPROBE_HIT_NS) per call,
plus a second one at each lock call's return: so the probes stay attached for
CollectOptions.hold_seconds only, and are then detached while the rest of the
recording goes on. The profile's LockHold says over how many seconds
(`window_s`), and its notes what was subtracted and what it cost.

The probes' own time inside each hold (the uretprobe's trap return after the
start is stamped, the unlock's trap before the end is) is about one uprobe
hit: UPROBE_HIT_NS is subtracted from every hold in BPF.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass, field

from kvprof.collect import INTERRUPTED, INTERRUPTED_MIN_NS, UPROBE_HIT_NS, CollectError, CollectOptions
from kvprof.collect.bpf import (
    BpfCollector,
    Module,
    Program,
    ThreadNames,
    map_items,
    named_thread,
    percpu_counters,
    put_counters,
    source,
)
from kvprof.collect.debuginfo import ProcessSymbols, read_maps
from kvprof.collect.elf import ElfFile, ProbesError
from kvprof.collect.procroot import mapped_file
from kvprof.collect.server_stats import TargetStats
from kvprof.collect.symbols import DataNames
from kvprof.collect.usdt import attach_uprobe, exe_of
from kvprof.model.profile import LockHold, Profile, ThreadHolds

COUNTERS = ("hits", "short", "unmatched", "map_full")  # the order of enum hold_counter
STT_FUNC = 2
# glibc's functions, the program run at their entry, and at their return (a uretprobe)
CALLS: dict[str, tuple[str, str]] = {
    "pthread_mutex_lock": ("hold_on_take", "hold_on_taken"),
    "pthread_mutex_trylock": ("hold_on_take", "hold_on_taken"),
    "pthread_mutex_unlock": ("hold_on_give", ""),
    "pthread_cond_wait": ("hold_on_wait", "hold_on_woken"),
    "pthread_cond_timedwait": ("hold_on_wait", "hold_on_woken"),
}
# 1 hold in this many shorter than the probes' own time: the critical section is within
# their spread, and the note says the hold is an upper bound
SHORT_SHARE = 10
# where glibc keeps them: libpthread before glibc 2.34, libc since
LIBRARIES = ("libpthread.so", "libc.so")


@dataclass(frozen=True)
class Site:
    """One uprobe: a program at a file offset of the library, at entry or return."""

    function: str
    program: str
    path: str
    offset: int
    retprobe: bool


@dataclass
class _Snapshot:
    # tid -> acquisitions, ns, shortest, and of them the interrupted ones and their ns
    threads: dict[int, tuple[int, int, int, int, int]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # attached so far


def who(pid: int) -> str:
    """`PID 123 (sysbench)`, for a message."""
    return f"PID {pid} ({os.path.basename(exe_of(pid)) or '?'})"


def resolve(pid: int, lock: str) -> tuple[str, int]:
    """The lock's name and address in process `pid`: `lock` is a data symbol of the
    target (`stats_lock`, `table+0x40`) or an address (`0x5581...`); a CollectError
    in one line when it is neither."""
    if lock.lower().startswith("0x"):
        try:
            address = int(lock, 16)
        except ValueError:
            raise CollectError(f"--hold {lock}: not an address (0x followed by hex digits)") from None
        if not any(m.start <= address < m.end for m in read_maps(pid)):
            raise CollectError(f"--hold {lock}: no memory of {who(pid)} is mapped at that address")
        return DataNames(pid).name(address), address
    found = ProcessSymbols(pid).object_address(lock)
    if found is None:
        raise CollectError(
            f"--hold {lock}: no data symbol of that name in {who(pid)} "
            "(give a global mutex's symbol, or its address 0x... from `kvprof report`'s LOCKS)"
        )
    return lock, found


def mutex_sites(pid: int) -> list[Site]:
    """The uprobes on glibc's mutex calls in the library process `pid` maps them from
    (every address of each name: a versioned symbol may have an old one beside it)."""
    maps = [m for m in read_maps(pid) if m.path.startswith("/") and "x" in m.perms]
    for lib in LIBRARIES:
        m = next((m for m in maps if m.name.startswith(lib)), None)
        if m is None:
            continue
        path = mapped_file(pid, m.path, m.start, m.end, m.inode)
        try:
            elf = ElfFile(path)
        except ProbesError:
            continue
        symbols = elf.symbols(".dynsym", (STT_FUNC,))
        sites = []
        for function, (entry, ret) in CALLS.items():
            offsets = {elf.file_offset(v) for v, _, name, _ in symbols if name == function}
            for offset in sorted(o for o in offsets if o is not None):
                sites.append(Site(function, entry, path, offset, False))
                if ret:
                    sites.append(Site(function, ret, path, offset, True))
        if any(s.function == "pthread_mutex_lock" for s in sites):
            return sites
    raise CollectError(
        f"{who(pid)} has no glibc pthread_mutex_lock mapped (a static or "
        "non-glibc program): --hold measures glibc mutexes only"
    )


class HoldCollector(BpfCollector):
    name = "hold"
    fired_by = "uprobe"
    empty = _Snapshot

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        super().__init__(pid, opts)
        self.lock_name = ""
        self.address = 0
        self._sites: list[Site] = []
        self._fds: list[int] = []
        self._on_since = 0.0  # time.monotonic() of the last attach, 0 while detached
        self._on_s = 0.0  # seconds attached before that
        self._expired = False
        self._timer: threading.Timer | None = None
        self._guard = threading.Lock()  # the timer's detach against the session's
        self._names = ThreadNames(pid)
        # the target's own counters when the switch went on and off (memcached `stats`,
        # Redis INFO): its requests over the seconds measured, which may run at another
        # pace than the whole window's (the traps slow a hot lock)
        self._stats = TargetStats(pid)
        self._counters: dict[str, dict[str, str]] = {}

    def applies(self) -> str | None:
        why = super().applies()
        if why is not None:
            return why
        if not self.opts.hold:
            return "no lock given (record --hold LOCK)"
        try:
            self._resolve()
        except CollectError as e:
            return str(e)
        return None

    def _resolve(self) -> None:
        if not self._sites:
            self.lock_name, self.address = resolve(self.pid, self.opts.hold)
            self._sites = mutex_sites(self.pid)

    def program(self) -> Program:
        self._resolve()
        flags = [f"-DHOLD_LOCK={self.address}ULL", f"-DHOLD_PROBE_NS={UPROBE_HIT_NS}ULL"]
        return Program(self.name, source(self.name).read_text(), flags)

    def _attach(self, module: Module) -> None:
        self._hook(module)
        self._timer = threading.Timer(self.opts.hold_seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _hook(self, module: Module) -> None:
        from bcc import BPF

        with self._guard:
            if self._expired or self._fds:
                return
            try:
                for site in self._sites:
                    prog = module.bpf.load_func(site.program.encode(), BPF.KPROBE)
                    self._fds.append(
                        attach_uprobe(prog.fd, site.path, site.offset, 0, self.pid, site.retprobe)
                    )
            except BaseException:
                self._close_fds()
                raise
            self._measure(True)

    def _expire(self) -> None:
        """hold_seconds are up: the uprobes go, the maps stay."""
        with self._guard:
            self._expired = True
            self._close_fds()

    def _detach(self) -> None:
        with self._guard:
            self._close_fds()

    def _measure(self, on: bool) -> None:
        """The programs' switch: the measured seconds are those it is on (attaching and
        detaching the uprobes takes a while, more than a second for all of them)."""
        if self.module is not None and self.module.bpf is not None:
            self.table("on")[ctypes.c_int(0)] = ctypes.c_uint32(int(on))
        if on:
            self._on_since = time.monotonic()
        elif self._on_since:
            self._on_s += time.monotonic() - self._on_since
            self._on_since = 0.0
        if not on or "hold.before" not in self._counters:  # the first on, the last off
            when = "hold.before" if on else "hold.after"
            self._counters[when] = self._stats.read(("",), timeout=1.0).get("general", {})

    def _close_fds(self) -> None:
        if self._on_since:
            self._measure(False)
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)  # the kernel removes the uprobe

    def close(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        super().close()

    def seconds(self) -> float:
        """Seconds the uprobes were attached so far."""
        return self._on_s + (time.monotonic() - self._on_since if self._on_since else 0.0)

    def _read(self) -> _Snapshot:
        snap = _Snapshot(seconds=self.seconds())
        for tid, v in map_items(self.table("threads")):
            snap.threads[int(tid)] = (v.acquisitions, v.hold_ns, v.min_ns, v.interrupted, v.interrupted_ns)
            self._names.first_seen(int(tid))
        snap.counters = percpu_counters(self.table("counters"), COUNTERS)
        return snap

    def contribute(self, profile: Profile) -> None:
        snap = self.latest()
        hold = to_hold(self.lock_name, self.address, snap)
        profile.holds[:] = [h for h in profile.holds if (h.name, h.address) != (hold.name, hold.address)]
        if hold.acquisitions:
            profile.holds.append(hold)
        for tid in snap.threads:
            named_thread(profile, tid, self._names)
        put_counters(profile, "hold", snap.counters, "holds")
        profile.status.notes.append(note(self.lock_name, snap))
        if self._counters.get("hold.before") and self._counters.get("hold.after"):
            profile.server_stats.update(self._counters)


def to_hold(name: str, address: int, snap: _Snapshot) -> LockHold:
    """The lock's holds over the seconds it was probed, each one counted (no sampling)."""
    h = LockHold(name=name, address=address, window_s=round(snap.seconds, 3))
    for tid, (n, ns, shortest, interrupted, interrupted_ns) in snap.threads.items():
        h.acquisitions += n
        h.hold_ns += ns
        h.min_ns = shortest if h.min_ns == 0 else min(h.min_ns, shortest)
        h.interrupted += interrupted
        h.interrupted_ns += interrupted_ns
        h.by_thread[str(tid)] = ThreadHolds(n, ns)
    h.samples = h.acquisitions
    return h


def note(name: str, snap: _Snapshot) -> str:
    """What the measurement did and cost, for the report."""
    hits = snap.counters.get("hits", 0)
    acquired = sum(t[0] for t in snap.threads.values())
    cpu_ms = hits * UPROBE_HIT_NS / 1e6
    line = (
        f"hold: {name}'s holds timed by uprobes on glibc's mutex calls for {snap.seconds:.1f} s "
        f"({acquired:,} holds), {UPROBE_HIT_NS} ns (one uprobe hit, the probes' own time inside "
        f"the critical section) subtracted from each; the probes trapped on every mutex call "
        f"while attached, {hits:,} times at about {UPROBE_HIT_NS} ns: {cpu_ms:,.0f} ms of the "
        "target's CPU, and inside its critical sections"
    )
    short, unmatched = snap.counters.get("short", 0), snap.counters.get("unmatched", 0)
    if short:
        line += f"; {short:,} holds were shorter than that and count as 1 ns"
    if short * SHORT_SHARE > acquired:
        line += (
            ": a critical section this short is within the probes' own time and its spread, "
            "and its hold is an upper bound"
        )
    if unmatched:
        line += f"; {unmatched:,} releases had no acquisition seen (taken before, or by a timed lock)"
    interrupted = sum(t[3] for t in snap.threads.values())
    if interrupted:
        line += (
            f"; {interrupted:,} holds took over {INTERRUPTED}x their thread's shortest, and over "
            f"{INTERRUPTED * INTERRUPTED_MIN_NS:,} ns (taken for interrupted: left out of what moved "
            "into the critical section)"
        )
    return line
