"""Off-CPU time and futex waits of one process, sampled (probes/offsample.bpf.c):
the `offcpu` collector by default (CollectOptions.offcpu_hz > 0).

Most of the time nothing runs at the target's switches: the cost of
kvprof.collect.offcpu, whose program runs at every switch of the machine, is the
attachment itself, however little the program does (docs/record.md, "Overhead").
Instead, offcpu_hz times a second, a thread of kvprof's looks at each thread of the
target:

- /proc/PID/task/TID/schedstat says how long it has run and waited for a CPU;
- /proc/PID/task/TID/syscall says whether it is asleep and in which system
  call, with its arguments, stack pointer and pc, as one sample the kernel
  takes with the thread off the CPU (a thread that is running or runnable
  says "running"): the sample's instant, however short the sleep;
- a task iterator, one link per thread, then gives the rest of the user
  registers saved at that entry to the kernel (rbp) and its kernel stack;
  they are the sleep's when its sp and pc are the ones /proc gave;
- its user stack is walked here from /proc/PID/mem with the unwind tables
  (unwind.Unwinder.walk: the rules probes/unwind.h walks by in BPF).

A look's CPU is CPU the target could have had (on a busy machine even at
SCHED_IDLE), so a look reads no more than it must: a thread whose schedstat
says it has not been switched in since its last sample is in the same sleep
(or woken from it, when /proc says it is running), and that sample counts
again with only /proc's syscall line read; the threads are listed
again only when /proc/PID/task's link count (their number) changes, or once a
second; the stack is read a page at a time, as far as the walk goes.

A target with more threads than OFFCPU_LOOKS / offcpu_hz has a slice of them
looked at each time, in turn, so that kvprof's own CPU does not grow with the
target's threads. Each kept sample stands for the time since that thread's
previous look. A thread's total
off-CPU time is exact, from schedstat (time since attaching minus the time it
ran); of it, the run delay is its wait for a CPU (ThreadInfo.runnable_ns, and
the stack `[runnable]`), and its sampled stacks split the rest, scaled to add
up to it (offcpu.to_totals); a thread that slept but was never seen asleep
(its sleeps all fell between looks) has the rest under `[asleep, not
sampled]`, so that every thread's stacks add up to its total.

Lock waits are timed, in stretches. While a thread of the target was seen in a
lock wait within OFFCPU_HOT_S (or the last stretch timed a wait on a word a look
saw a lock wait on), a switch timer (probes/offsample.bpf.c's offsample_switch)
is attached to sched_switch for OFFCPU_TIMED_S of every OFFCPU_TIMED_EVERY_S. It
times, per (thread, word), every futex wait that begins in the stretch from the
switch-out to the thread's next time on a CPU (its wait for a CPU after the
wake-up included); it stays attached past the stretch until those waits are
accounted. Each stretch's ns are scaled up to the time the gate was open since the
previous stretch (Stretches), and their spread is the figure's variance; the looks
only split it over the stacks they found for that pair (a pair no look found has no
frames, and no stack makes it a lock wait). The share of the looks that find a
thread woken and waiting for a CPU is no measure of that wait: a look takes one of
the CPUs, and the scheduler decides where a woken waiter waits.

A pair the timer never saw (the gate was shut) keeps the looks' estimate. A sample
in futex(2) with a wait operation (from /proc: the call's number, its first argument
the word, its second the operation) samples a wait on that word; so does a thread
/proc says is running whose iterator shows it off the CPU (a kernel stack: the
kernel unwinds no task running on another CPU) with its kernel stack still in the
futex wait and its saved registers in the call: woken, waiting for a CPU, which the
wait lasts until (the kernel functions it sleeps in are told by their address ranges
in /proc/kallsyms). A futex row stands for its share of the thread's looks (their
ns) times the thread's time, in two strata: its looks asleep in the wait, and woken
from it; each stratum's rows of one thread are capped at that stratum's exact total
(schedstat: the thread's sleep, and its wait for a CPU), since a look takes a CPU
and may find the target's threads asleep or runnable more often than they are.
`samples` keeps how many looks stand behind each row and `sd_ns` its binomial
standard deviation, for the report's sampling error. A thread seen in a lock's futex
wait (asleep in it, or woken from it, with the value 2, glibc's "locked, with
waiters") is looked at OFFCPU_LOCK_HZ for OFFCPU_HOT_S after, the others at
offcpu_hz: a lock wait is often a few per cent of a thread's time, and its error
shrinks as the square root of the looks that find it; a thread asleep in a condition
variable stays at offcpu_hz. `waits` counts the waits seen: consecutive samples of
one thread on one word with no run in between are one wait. That is a lower bound: a
wait shorter than a look's interval is seen with a probability of its length over
the interval. Exact counts take --offcpu-hz 0 (kvprof.collect.offcpu: every switch
timed, at a cost at every switch).

The looking thread keeps SCHED_OTHER at LOOK_NICE when kvprof yields the CPU
(kvprof.system.attach): a look that runs only when a CPU is free comes when
the target's threads wait, and finds them waiting more often than they do.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import struct
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvprof.collect import (
    LOOK_NICE,
    OFFCPU_HOT_S,
    OFFCPU_LOCK_HZ,
    OFFCPU_LOOKS,
    OFFCPU_TIMED_EVERY_S,
    OFFCPU_TIMED_S,
    CollectError,
    CollectOptions,
)
from kvprof.collect.bpf import BpfCollector, Module, Program, ThreadNames, map_items, source, warn
from kvprof.collect.offcpu import OffCpuSnapshot, as_lists, put, spread, to_totals
from kvprof.collect.overhead import Program as AttachedProgram
from kvprof.collect.symbols import DataNames, Symbolizer
from kvprof.collect.unwind import UNWIND_FRAMES, Unwinder
from kvprof.model.profile import RUNNABLE_FRAME, UNSAMPLED_FRAME, Profile

KFRAMES = 32  # kernel frames kept per sample (-DOFFSAMPLE_KFRAMES)
RECORD = struct.Struct(f"<QQQQQQQq{KFRAMES}Q")  # struct offsample_rec
STACK_READ = 4096  # bytes of a sleeping thread's stack read at once from its saved sp, more as the walk needs
STACK_MAX = 65536  # ... up to this many
# the target's threads listed again when their count changed, and at least this often (one
# that ends while another starts leaves the count as it was)
LIST_EVERY_NS = 1_000_000_000
SYS_FUTEX = 202  # x86-64
# futex(2) operations that put the caller to sleep (op & FUTEX_CMD_MASK): WAIT,
# LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2
FUTEX_WAIT_OPS = (0, 6, 9, 11, 13)
FUTEX_CMD_MASK = 127  # without FUTEX_PRIVATE_FLAG (128) and FUTEX_CLOCK_REALTIME (256)
LOCKED_WAITERS = 2  # the futex value a glibc lock waits on: locked, with waiters
# The kernel functions a futex waiter sleeps in: a runnable thread with one of them on its
# kernel stack was woken from its wait and waits for a CPU (one preempted on its way in
# or out of the call has none of them).
FUTEX_SLEEPS = frozenset(
    {
        "futex_do_wait",  # newer kernels' name of futex_wait_queue
        "futex_wait_queue",
        "futex_wait_queue_me",
        "futex_wait_requeue_pi",
        "futex_lock_pi",
        "__futex_wait",
    }
)

SWITCH = b"sched_switch"  # the raw tracepoint the switch timer (offsample_switch) is attached to
# (tid, user ips, why the walk stopped, kernel ips)
StackKey = tuple[int, tuple[int, ...], str, tuple[int, ...]]
FutexKey = tuple[int, int, tuple[int, ...], str]  # (tid, word, user ips, why)


@dataclass
class _Thread:
    tid: int
    syscall: int  # open /proc/PID/task/TID/syscall and schedstat, read again with pread
    schedstat: int
    first: tuple[int, int, int]  # when first seen: (monotonic ns, ns run, ns waited for a CPU)
    last: tuple[int, int, int]  # at the last look
    link: int = -1  # its iterator link, -1 while paused
    looked: int = 0  # monotonic ns of its last look
    runs: int = 0  # times it was switched in, at the last look
    wait: tuple[int, int] = (0, -1)  # (word, runs) of the last futex wait seen
    hot: int = 0  # monotonic ns until which it is looked at OFFCPU_LOCK_HZ (seen in a futex wait)
    # its last sample while it has not run since: (runs, stack key or None, futex key or None)
    asleep: tuple[int, StackKey | None, FutexKey | None] | None = None


@dataclass(frozen=True)
class _Regs:
    """What a thread's iterator gives: its user registers saved at its last entry to
    the kernel, and its kernel stack (leaf first; empty while it runs on a CPU)."""

    sp: int
    ip: int
    bp: int
    orig_ax: int  # the system call it is in (-1 and below: an interrupt)
    di: int
    si: int
    dx: int  # the call's third argument: a futex wait's value (LOCKED_WAITERS on a lock's path)
    kernel: tuple[int, ...]


@dataclass
class _Snapshot(OffCpuSnapshot):
    looks: int = 0
    samples: int = 0
    failed: int = 0  # samples not taken: a thread gone between the reads, or no iterator
    reused: int = 0  # samples that were the thread's previous one (it had not run since)
    stretches: int = 0  # the switch timer's stretches
    stretch_ns: int = 0  # ... their summed length
    gated_ns: int = 0  # ... and the time they stand for (a lock wait seen)
    map_full: int = 0  # ... and the waits they could not time (a map was full)


def _pread_text(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode(errors="replace")


def _schedstat(fd: int, now: int) -> tuple[tuple[int, int, int], int]:
    """((now, ns run, ns waited for a CPU), times switched in) from an open schedstat."""
    run, delay, count = (int(x) for x in _pread_text(fd).split())
    return (now, run, delay), count


class OffSampleCollector(BpfCollector):
    name = "offcpu"
    empty = _Snapshot

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        super().__init__(pid, opts)
        self.unwinder = Unwinder(pid)
        self.symbols = Symbolizer(pid, self.unwinder, opts.inline)
        self.names = ThreadNames(pid)
        self._data = DataNames(pid)
        self._threads: dict[int, _Thread] = {}
        self._gone: dict[int, tuple[tuple[int, int, int], tuple[int, int, int]]] = {}  # tid -> (first, last)
        self._stacks: dict[StackKey, int] = defaultdict(int)  # -> sampled ns
        # -> [waits, ns and looks asleep in the wait, ns and looks woken from it (runnable)]
        self._futex: dict[FutexKey, list[int]] = {}
        self._looked: dict[int, int] = defaultdict(int)  # tid -> sampled ns of all its looks
        self._looks = self._samples = self._failed = 0
        self._next_after = 0  # the last tid looked at, when a look takes a slice of the threads
        self._listed = (0, 0)  # (monotonic ns, links of /proc/PID/task) at the last listing of its threads
        self._tasks = -1  # open /proc/PID/task: its link count follows the number of threads
        self._reused = 0  # samples that were a thread's previous one: it had not run since
        self._lock = threading.Lock()
        self._sampling = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mem = -1
        self._fn_fd = -1
        self._sleeps: list[tuple[int, int]] = []  # FUTEX_SLEEPS' address ranges in the kernel
        self._hot_period = 0  # ns between the looks at a thread seen in a lock wait lately
        self._timer: Any = None  # the switch timer's program (offsample_switch), once loaded
        self._timing = 0  # monotonic ns its current stretch began; 0: not attached
        self._closing = 0  # monotonic ns it began to end (no wait begins since); 0: not ending
        self._next_stretch = 0  # monotonic ns before which no stretch begins
        self._timed = Stretches()
        self._map_full = 0  # the switch timer's waits not timed, a map full (offsample_full)
        self._gate_tick = 0  # monotonic ns of the last tick that found a thread in a lock wait lately
        self._gated = 0  # ns of such ticks since the last stretch ended: the time it stands for
        self._lock_words: set[int] = set()  # the futex words a look saw a lock wait on (hot)
        # monotonic ns until which the switch timer's gate stays open: a look saw a lock wait,
        # or a stretch timed a wait on a word one was seen on, OFFCPU_HOT_S before
        self._gate_until = 0

    def program(self) -> Program:
        if not self.opts.offcpu_hz:
            raise CollectError("offcpu: sampling needs --offcpu-hz above 0")
        return Program(self.name, source("offsample").read_text(), [f"-DOFFSAMPLE_KFRAMES={KFRAMES}"])

    def program_names(self, module: Module) -> list[str]:
        return ["bpf_iter__task"]  # BCC's name for a task iterator's function

    def attached_programs(self) -> list[AttachedProgram]:
        """The switch timer, for the own-cost figure; not the iterator: it runs in
        kvprof's own thread, when it reads, so its time is in kvprof's own CPU, not in
        the target's threads."""
        if self._timer is None:
            return []
        return [AttachedProgram(self.name, "offsample_switch", "tracepoint", self._timer.fd)]

    def _attach(self, module: Module) -> None:
        from bcc import BPF

        self.names.refresh()
        self.symbols.warm()
        # the module's one Unwinder (oncpu's, when it is in the module): its tables, walked here
        self.unwinder = module.shared.setdefault("unwinder", self.unwinder)
        self.symbols.unwinder = self.unwinder
        try:
            self.unwinder.prepare()
            self._mem = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY)
            self._tasks = os.open(f"/proc/{self.pid}/task", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            raise CollectError(f"offcpu: cannot read the target's maps or memory ({e.strerror})") from None
        self._fn_fd = module.bpf.load_func(b"bpf_iter__task", BPF.TRACING).fd
        self._timer = module.bpf.load_func(b"offsample_switch", BPF.RAW_TRACEPOINT)
        self._sleeps = _kernel_ranges(FUTEX_SLEEPS)
        self._look(time.monotonic_ns(), 0)  # every thread's start
        try:
            self._link_all()
        except OSError as e:
            raise CollectError(f"offcpu: cannot attach a task iterator to the target ({e})") from None
        if not self._threads:
            raise CollectError(f"offcpu: process {self.pid} has no threads left")
        self._sampling.set()
        self._thread = threading.Thread(target=self._run, name="kvprof-offsample", daemon=True)
        self._thread.start()

    def _hook(self, module: Module) -> None:
        with self._lock:
            try:
                self._link_all()
            except OSError:  # counted as sample errors from now on
                pass
        self._sampling.set()

    def _link_all(self) -> None:
        """Every thread's iterator link (one per thread, so that a paused kvprof holds none)."""
        for th in self._threads.values():
            self._link(th)

    def refresh(self) -> None:
        """Read what was mapped since (libraries opened late): their frames can be walked."""
        with self._lock:
            try:
                self.unwinder.prepare()
            except OSError:  # the target is gone
                pass

    def _detach(self) -> None:
        """Stop looking and drop the links (a paused kvprof holds no attachment)."""
        self._sampling.clear()
        with self._lock:
            self._end_stretch()
            self._gate_tick = 0  # a pause is not time in a lock wait
            for th in self._threads.values():
                if th.link >= 0:
                    os.close(th.link)
                    th.link = -1

    def close(self) -> None:
        self._stop.set()
        self._sampling.set()  # wake a paused loop so that it sees the stop
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        super().close()
        with self._lock:
            for th in self._threads.values():
                os.close(th.syscall)
                os.close(th.schedstat)
            self._threads.clear()
        for fd in (self._mem, self._tasks):
            if fd >= 0:
                os.close(fd)
        self._mem = self._tasks = -1

    # ---- the looks, in kvprof's sampling thread ------------------------------------

    def _run(self) -> None:
        """Every thread at offcpu_hz (its turn), and the threads seen in a futex wait within
        OFFCPU_HOT_S at OFFCPU_LOCK_HZ: the ticks between the turns look at those only."""
        hot_hz = max(OFFCPU_LOCK_HZ, self.opts.offcpu_hz)
        every = max(1, round(hot_hz / self.opts.offcpu_hz))
        period = 1e9 / hot_hz
        self._hot_period = int(period)
        last = time.monotonic_ns()
        tick = 0
        while not self._stop.is_set():
            self._stop.wait(max(0.0, (last + period - time.monotonic_ns()) / 1e9))
            self._sampling.wait()
            if self._stop.is_set():
                return
            _keep_timing()
            now = time.monotonic_ns()
            with self._lock:
                self._time_switches(now)
                if tick % every == 0:
                    self._look(now, int(period * every))
                else:
                    self._look_hot(now, max(1, OFFCPU_LOOKS // hot_hz))
            tick += 1
            last = now

    def _time_switches(self, now: int) -> None:
        """Begin or end a stretch of the switch timer: one begins every OFFCPU_TIMED_EVERY_S
        while a thread of the target was seen in a lock wait within OFFCPU_HOT_S, or the
        last stretch timed a wait on a word a look saw a lock wait on, times the
        waits that begin in its OFFCPU_TIMED_S, and ends once they are all accounted (each
        at its thread's next switch-out), or OFFCPU_TIMED_S / 2 later (a thread asleep
        longer than that in a condition variable)."""
        assert self.module is not None
        hot = self._gate_until > now
        if hot and self._gate_tick:
            self._gated += now - self._gate_tick
        self._gate_tick = now if hot else 0
        if self._closing:
            busy = any(v.futex for _, v in map_items(self.module.table("offsample_threads")))
            if not busy or now - self._closing >= OFFCPU_TIMED_S * 1e9 / 2:
                self._end_stretch()
        elif self._timing:
            if now - self._timing >= OFFCPU_TIMED_S * 1e9:
                self.module.table("offsample_closing")[ctypes.c_int(0)] = ctypes.c_uint32(1)
                self._closing = time.monotonic_ns()
        elif now >= self._next_stretch and hot:
            self._next_stretch = now + int(OFFCPU_TIMED_EVERY_S * 1e9)
            self.module.table("offsample_closing")[ctypes.c_int(0)] = ctypes.c_uint32(0)
            self.module.table("offsample_threads").clear()  # each thread's first switch-out starts it
            try:
                self.module.bpf.attach_raw_tracepoint(tp=SWITCH, fn_name=b"offsample_switch")
            except Exception:  # BCC raises a plain Exception: no stretch, the looks alone
                return
            self._timing = time.monotonic_ns()

    def _end_stretch(self) -> None:
        """Detach the switch timer, and add what it timed, scaled from the time in which
        waits could begin to the time the gate was open since the previous stretch. A
        stretch ended early (paused) counts what was accounted by then."""
        if not self._timing or self.module is None:
            return
        if SWITCH in self.module.bpf.raw_tracepoint_fds:
            self.module.bpf.detach_raw_tracepoint(SWITCH)
        length = max(1, (self._closing or time.monotonic_ns()) - self._timing)
        self._timing = self._closing = 0
        table = self.module.table("offsample_futex")
        timed = map_items(table)
        table.clear()
        self._map_full = int(self.module.table("offsample_full")[ctypes.c_int(0)].value)
        self._timed.add(
            length, self._gated, {(int(k.tid), int(k.uaddr)): (int(v.waits), int(v.ns)) for k, v in timed}
        )
        self._gated = 0
        if any(int(k.uaddr) in self._lock_words for k, _ in timed):
            self._gate_until = max(self._gate_until, time.monotonic_ns() + int(OFFCPU_HOT_S * 1e9))

    def _look(self, now: int, period: int) -> None:
        """Look at the next threads in turn, all of them when they are no more than
        OFFCPU_LOOKS / offcpu_hz; a sleeping thread's sample counts the ns since its
        last look, up to its interval (a pause is not a sample's time). `period` 0:
        every thread's start, no sample. A look stands for no more than its thread's
        interval: one that comes late (kvprof waited for a CPU, which frees when the
        target's threads go to sleep) must not weigh more for it."""
        tids = self._tids(now, period)
        self._looks += bool(period)
        per_look = max(1, OFFCPU_LOOKS // self.opts.offcpu_hz)
        if period and len(tids) > per_look:  # the next slice, after the last tid looked at
            start = bisect.bisect_right(tids, self._next_after)
            tids = (tids[start:] + tids[:start])[:per_look]
            self._next_after = tids[-1]
        turn = period * max(1, -(-len(self._threads) // per_look))
        later = []
        for tid in tids:
            th = self._threads.get(tid) or self._new(tid, now)
            if th is not None:
                interval = self._hot_period if th.hot > now else turn
                later.append(self._look_at(th, now, min(now - th.looked, interval) if period else 0))
        self._walk_later(later)

    def _look_hot(self, now: int, most: int) -> None:
        """Look at the threads seen in a futex wait lately (`most` of them at most)."""
        hot = [th for th in self._threads.values() if th.hot > now][:most]
        self._looks += bool(hot)
        self._walk_later([self._look_at(th, now, min(now - th.looked, self._hot_period)) for th in hot])

    def _walk_later(self, later: list[Callable[[], None] | None]) -> None:
        """What a look left for after every thread's state was read: the stack walks and
        what they name. A walk takes longer than the reads, and while kvprof looks it
        holds a CPU the target's threads wait for: a state read after it is not the
        state the target is in without kvprof."""
        for finish in later:
            try:
                if finish is not None:
                    finish()
            except (OSError, ValueError, IndexError):  # gone meanwhile: no sample
                self._failed += 1

    def _look_at(self, th: _Thread, now: int, weight: int) -> Callable[[], None] | None:
        """One look at a thread: a sample that stands for `weight` ns (0: none, only its
        schedstat read). A thread not switched in since its last sample counts that
        sample again, only /proc's syscall line read (the module's docstring says why).
        What it returns walks the stack read and counts the sample (_walk_later)."""
        th.looked = now
        try:
            th.last, th.runs = _schedstat(th.schedstat, now)
            if not weight:
                return None
            call = _pread_text(th.syscall).split()
            if th.asleep is not None and th.asleep[0] == th.runs:
                self._again(th, bool(call) and call[0] == "running", weight)
                return None
            th.asleep = None
        except (OSError, ValueError):  # gone meanwhile
            self._forget(th.tid)
            return None
        try:
            finish = None
            if call and call[0] != "running":
                finish = self._sample(th, call, weight)
            elif call:
                finish = self._woken(th, weight)
            self._looked[th.tid] += weight
            return finish
        except (OSError, ValueError, IndexError):  # gone meanwhile, or no iterator: no sample
            self._failed += 1
            return None

    def _tids(self, now: int, period: int) -> list[int]:
        """The target's threads: listed again at the first look, when their number
        changed and once every LIST_EVERY_NS, else the ones known (those gone are
        forgotten here)."""
        try:
            links = os.fstat(self._tasks).st_nlink
        except OSError:  # the target is gone
            links = -1
        if period and links == self._listed[1] and now - self._listed[0] < LIST_EVERY_NS:
            return sorted(self._threads)
        self._listed = (now, links)
        try:
            tids = sorted(int(t) for t in os.listdir(f"/proc/{self.pid}/task"))
        except OSError:  # the target is gone
            tids = []
        for tid in set(self._threads) - set(tids):
            self._forget(tid)
        return tids

    def _new(self, tid: int, now: int) -> _Thread | None:
        try:
            call = os.open(f"/proc/{self.pid}/task/{tid}/syscall", os.O_RDONLY)
            sched = os.open(f"/proc/{self.pid}/task/{tid}/schedstat", os.O_RDONLY)
            first, runs = _schedstat(sched, now)
        except (OSError, ValueError):
            return None
        th = self._threads[tid] = _Thread(tid, call, sched, first, first, runs=runs, looked=now)
        if self._sampling.is_set():
            try:
                self._link(th)
            except OSError:  # counted as sample errors, when it sleeps
                pass
        return th

    def _forget(self, tid: int) -> None:
        th = self._threads.pop(tid)
        self._gone[tid] = (th.first, th.last)
        for fd in (th.syscall, th.schedstat, th.link):
            if fd >= 0:
                os.close(fd)

    def _link(self, th: _Thread) -> int:
        if th.link < 0:
            from bcc import libbcc

            attach = libbcc.lib.bcc_iter_attach
            attach.restype, attach.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint]
            info = struct.pack("IIII", th.tid, 0, 0, 0)  # union bpf_iter_link_info: task {tid, pid, pid_fd}
            th.link = attach(self._fn_fd, ctypes.create_string_buffer(info, len(info)), len(info))
            if th.link < 0:
                raise OSError(-th.link, "bcc_iter_attach")
        return th.link

    def _sample(self, th: _Thread, call: list[str], weight: int) -> Callable[[], None]:
        """One sample of a thread asleep: `call` is its /proc syscall line ("nr args... sp pc",
        "-1 sp pc" asleep outside a system call); its stack read now, walked and counted by
        what it returns."""
        nr, sp, pc = int(call[0]), int(call[-2], 16), int(call[-1], 16)
        args = [int(a, 16) for a in call[1:-2]]
        regs = self._regs(th)
        bp = 0
        kernel: tuple[int, ...] = ()
        if regs is not None and (regs.sp, regs.ip) == (sp, pc):  # the same entry: the sleep's registers
            bp, kernel = regs.bp, regs.kernel
        stack, ran = self._user_stack(th, sp)

        def finish() -> None:
            ips, why = self._walked(pc, sp, bp, stack, ran)
            key = (th.tid, ips, why, kernel)
            futex: FutexKey | None = None
            if nr == SYS_FUTEX and len(args) > 1 and (args[1] & FUTEX_CMD_MASK) in FUTEX_WAIT_OPS:
                futex = (th.tid, args[0], ips, why)
            self._count(th, key, futex, weight)
            if futex is not None and len(args) > 2 and args[2] == LOCKED_WAITERS:
                th.hot = th.looked + int(OFFCPU_HOT_S * 1e9)
                self._gate_until = max(self._gate_until, th.hot)
                self._lock_words.add(args[0])
            if not ran:
                th.asleep = (th.runs, key, futex)

        return finish

    def _woken(self, th: _Thread, weight: int) -> Callable[[], None] | None:
        """A thread /proc says is running: on a CPU, or runnable. Runnable inside a
        futex wait it slept in (woken, its kernel stack still in the futex wait, not
        yet back on a CPU) is a sample of that wait: the wait lasts until it runs
        again. Its time is the thread's [runnable] time, so the sample counts for the
        futex wait only, not for its off-CPU stacks. Its stack is read now, walked and
        counted by what it returns."""
        regs = self._regs(th)
        if regs is None or not regs.kernel:  # on a CPU
            return None
        if regs.orig_ax != SYS_FUTEX or (regs.si & FUTEX_CMD_MASK) not in FUTEX_WAIT_OPS:
            self._count(th, None, None, weight)  # preempted
            return None
        if not self._in_futex_sleep(regs.kernel):  # preempted on its way in or out of the call
            self._count(th, None, None, weight)
            return None
        stack, ran = self._user_stack(th, regs.sp)

        def finish() -> None:
            ips, why = self._walked(regs.ip, regs.sp, regs.bp, stack, ran)
            futex = (th.tid, regs.di, ips, why)
            self._count(th, None, futex, weight)
            if regs.dx == LOCKED_WAITERS:  # a lock's wait, not a condition variable's
                th.hot = th.looked + int(OFFCPU_HOT_S * 1e9)
                self._gate_until = max(self._gate_until, th.hot)
                self._lock_words.add(regs.di)
            if not ran:
                th.asleep = (th.runs, None, futex)

        return finish

    def _in_futex_sleep(self, kernel: tuple[int, ...]) -> bool:
        """Whether a kernel stack is in a function a futex waiter sleeps in: by the
        functions' address ranges when /proc/kallsyms gave them (read here, since a
        symbol table read while other programs load can come back short), else by name."""
        if self._sleeps:
            return any(lo <= a < hi for a in kernel for lo, hi in self._sleeps)
        frames = self.symbols.kernel_stack(list(kernel))
        return any(f.removesuffix("_[k]").split(".")[0] in FUTEX_SLEEPS for f in frames)

    def _regs(self, th: _Thread) -> _Regs | None:
        """The user registers saved at the thread's last entry to the kernel and its
        kernel stack, from its iterator (None: the record did not come)."""
        from bcc import libbcc

        fd = libbcc.lib.bcc_iter_create(self._link(th))
        if fd < 0:
            raise OSError(-fd, "bcc_iter_create")
        try:
            data = os.read(fd, RECORD.size)
        finally:
            os.close(fd)
        if len(data) != RECORD.size:
            return None
        sp, ip, bp, orig_ax, di, si, dx, kbytes, *kstack = RECORD.unpack(data)
        return _Regs(sp, ip, bp, orig_ax, di, si, dx, tuple(kstack[: max(0, kbytes) // 8]))

    def _user_stack(self, th: _Thread, sp: int) -> tuple[bytes, bool]:
        """The first bytes of the stack of a thread off the CPU, from its saved sp, and
        whether it ran since the look (they may then not be the sleep's)."""
        stack = self._stack(sp)
        try:
            ran = _schedstat(th.schedstat, 0)[1] != th.runs
        except (OSError, ValueError):
            ran = True
        return stack, ran

    def _walked(self, pc: int, sp: int, bp: int, stack: bytes, ran: bool) -> tuple[tuple[int, ...], str]:
        """(ips, why the walk stopped) from the registers and stack bytes of a look."""
        if ran:  # it woke and ran since the sample: its stack may have changed under the read
            return (pc,), "stack not readable"
        return self._walk(pc, sp, bp, stack)

    def _again(self, th: _Thread, running: bool, weight: int) -> None:
        """A thread not switched in since its last sample: that sample again, as a wait
        for a CPU when /proc now says it is running (woken from that sleep since)."""
        assert th.asleep is not None
        runs, key, futex = th.asleep
        if running and key is not None:
            th.asleep = (runs, None, futex)
            key = None
        self._count(th, key, futex, weight)
        self._looked[th.tid] += weight
        self._reused += 1

    def _count(self, th: _Thread, key: StackKey | None, futex: FutexKey | None, weight: int) -> None:
        """One sample of `th` off the CPU: asleep with this stack, or (key None) runnable,
        waiting for a CPU (counted with the thread's [runnable] time); in futex wait
        (tid, word, ips, why) or not (None)."""
        self._samples += 1
        if key is not None:
            self._stacks[key] += weight
        if futex is not None:
            word = futex[1]
            entry = self._futex.setdefault(futex, [0, 0, 0, 0, 0])
            entry[0] += th.wait != (word, th.runs)  # one wait however many looks see it
            i = 1 if key is not None else 3
            entry[i] += weight
            entry[i + 1] += 1
            th.wait = (word, th.runs)

    def _stack(self, sp: int) -> bytes:
        """STACK_READ bytes of the target's memory from sp on (b"": not readable)."""
        try:
            return os.pread(self._mem, STACK_READ, sp) if sp else b""
        except (OSError, OverflowError):
            return b""

    def _walk(self, ip: int, sp: int, bp: int, stack: bytes) -> tuple[tuple[int, ...], str]:
        """The user stack from these registers; `stack`: the memory from sp on, read
        STACK_READ bytes at a time as far as the walk goes (STACK_MAX at most), single
        words beyond."""
        if not ip or not sp:
            return (), "root"
        buf = bytearray(stack)
        end = [len(stack) < STACK_READ]  # a short read: the end of what can be read

        def read(addr: int) -> int | None:
            if not end[0] and sp + len(buf) < addr + 8 <= sp + STACK_MAX:
                want = min(STACK_MAX, addr + 8 - sp + STACK_READ) - len(buf)
                try:
                    more = os.pread(self._mem, want, sp + len(buf))
                except (OSError, OverflowError):
                    more = b""
                buf.extend(more)
                end[0] = len(more) < want
            if sp <= addr and addr + 8 <= sp + len(buf):
                return int.from_bytes(buf[addr - sp : addr - sp + 8], "little")
            try:
                word = os.pread(self._mem, 8, addr)
            except (OSError, OverflowError):
                return None
            return int.from_bytes(word, "little") if len(word) == 8 else None

        ips, why = self.unwinder.walk(ip, sp, bp, read)
        return tuple(ips[:UNWIND_FRAMES]), why

    # ---- what the looks add up to ----------------------------------------------------

    def _read(self) -> _Snapshot:
        self.names.refresh()
        now = time.monotonic_ns()
        with self._lock:
            for th in self._threads.values():  # the totals up to now, not to the last look
                try:
                    th.last, th.runs = _schedstat(th.schedstat, now)
                except (OSError, ValueError):
                    pass
            stacks = dict(self._stacks)
            futex = {k: list(v) for k, v in self._futex.items()}
            looked = dict(self._looked)
            spans = {**self._gone, **{tid: (th.first, th.last) for tid, th in self._threads.items()}}
            looks, samples, failed, reused = self._looks, self._samples, self._failed, self._reused
            timed = self._timed.copy()
            map_full = self._map_full
        offcpu_ns: dict[int, int] = {}
        runnable_ns: dict[int, int] = {}
        for tid, ((t0, run0, delay0), (t1, run1, delay1)) in spans.items():
            off = max(0, (t1 - t0) - (run1 - run0))
            if off:
                offcpu_ns[tid] = off
                runnable_ns[tid] = min(off, max(0, delay1 - delay0))
        sampled: dict[tuple[int, tuple[str, ...]], int] = defaultdict(int)
        for (tid, ips, why, kernel), ns in stacks.items():
            sampled[(tid, self._frames(ips, why, kernel))] += ns
        asleep = {tid: off - runnable_ns[tid] for tid, off in offcpu_ns.items()}
        scaled = to_totals(sampled, asleep)
        for tid, ns in runnable_ns.items():
            if ns:
                scaled[(tid, (RUNNABLE_FRAME,))] = ns
        for tid in set(asleep) - {tid for tid, _ in sampled}:
            if asleep[tid]:
                scaled[(tid, (UNSAMPLED_FRAME,))] = asleep[tid]
        waits = self._futex_rows(futex, timed, spans, looked, asleep, runnable_ns)
        tids = set(offcpu_ns) | {tid for tid, _ in sampled}
        off_stacks, futex_waits = as_lists(scaled, waits, self._data)
        share = OFFCPU_TIMED_S / OFFCPU_TIMED_EVERY_S
        futex_waits = [
            replace(f, timed_share=share) if (f.tid, f.uaddr) in timed.keys else f for f in futex_waits
        ]
        return _Snapshot(
            stacks=off_stacks,
            futex=futex_waits,
            offcpu_ns=offcpu_ns,
            runnable_ns=runnable_ns,
            names={tid: self.names.get(tid) for tid in tids},
            looks=looks,
            samples=samples,
            failed=failed,
            reused=reused,
            stretches=timed.n,
            stretch_ns=timed.length_ns,
            gated_ns=timed.gated_ns,
            map_full=map_full,
        )

    def _futex_rows(
        self,
        futex: dict[FutexKey, list[int]],
        timed: Stretches,
        spans: dict[int, tuple[tuple[int, int, int], tuple[int, int, int]]],
        looked: dict[int, int],
        asleep: dict[int, int],
        runnable_ns: dict[int, int],
    ) -> dict[tuple[int, int, tuple[str, ...]], list[int]]:
        """(tid, word, frames) -> [waits, ns, looks, variance of ns]: a (thread, word) the
        switch timer saw is its timed figure, which its looks only split over stacks; any
        other is its share of the thread's looks, asleep and woken, each share (its time)
        capped at the exact total of its stratum."""
        found: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for (tid, *_), (_, a_ns, _, w_ns, _) in futex.items():
            found[tid][0] += a_ns
            found[tid][1] += w_ns
        waits: dict[tuple[int, int, tuple[str, ...]], list[int]] = {}
        split: dict[tuple[int, int], dict[tuple[str, ...], int]] = defaultdict(lambda: defaultdict(int))
        looks_of: dict[tuple[int, int, tuple[str, ...]], int] = defaultdict(int)
        for (tid, word, ips, why), (n, a_ns, a_k, w_ns, w_k) in futex.items():
            frames = self._frames(ips, why, ())
            if (tid, word) in timed.keys:
                split[(tid, word)][frames] += a_ns + w_ns
                looks_of[(tid, word, frames)] += a_k + w_k
                continue
            span = spans[tid][1][0] - spans[tid][0][0] if tid in spans else 0
            scale = span / looked[tid] if span and looked.get(tid) else 1.0
            a = stratum_share(a_ns, a_k, found[tid][0], looked.get(tid, 0), scale, asleep.get(tid))
            r = stratum_share(w_ns, w_k, found[tid][1], looked.get(tid, 0), scale, runnable_ns.get(tid))
            w = waits.setdefault((tid, word, frames), [0, 0, 0, 0])
            w[0] += n
            w[1] += round(a[0] + r[0])
            w[2] += a_k + w_k
            w[3] += round(a[1] + r[1])
        waits.update(timed.rows(split, looks_of))
        return waits

    def _frames(self, ips: tuple[int, ...], why: str, kernel: tuple[int, ...]) -> tuple[str, ...]:
        user = self.symbols.unwound(list(ips), why) if ips else []
        return (*user, *self.symbols.kernel_stack(list(kernel)))

    def contribute(self, profile: Profile) -> None:
        snap = self.latest()
        put(profile, snap)
        counters = profile.status.counters
        counters["offcpu.looks"] = snap.looks
        counters["offcpu.samples"] = snap.samples
        counters["offcpu.sample_errors"] = snap.failed
        counters["offcpu.samples_reused"] = snap.reused
        counters["offcpu.futex_waits"] = sum(f.waits for f in snap.futex)
        counters["offcpu.timed_stretches"] = snap.stretches
        counters["offcpu.timed_stretch_ns"] = snap.stretch_ns
        counters["offcpu.timed_gated_ns"] = snap.gated_ns
        counters["offcpu.map_full"] = snap.map_full
        if snap.map_full:
            warn(profile, "offcpu: lock waits not timed, map full", snap.map_full, "raise --max-entries")
        profile.status.sample_rates["offcpu_hz"] = self.opts.offcpu_hz


def _kernel_ranges(names: frozenset[str]) -> list[tuple[int, int]]:
    """[start, next function's start) of these kernel functions (with their .isra/.part
    clones), from /proc/kallsyms; [] when it hides the addresses (kptr_restrict)."""
    starts: list[int] = []
    wanted: list[int] = []
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                addr, kind, name = line.split()[:3]
                if kind in "tT":
                    a = int(addr, 16)
                    starts.append(a)
                    if name.split(".")[0] in names:
                        wanted.append(a)
    except (OSError, ValueError):
        return []
    starts.sort()
    out = []
    for a in wanted:
        i = bisect.bisect_right(starts, a)
        if a and i < len(starts):
            out.append((a, starts[i]))
    return out


def stratum_share(
    ns: int, looks: int, found: int, looked: int, scale: float, total: int | None
) -> tuple[float, float]:
    """(estimated ns, its sampling variance in ns²) of one futex row in one stratum of its
    thread (asleep, or woken and waiting for a CPU): `ns` of the `looked` ns of the
    thread's looks found it there, `looks` of them, so it stands for that share of the
    thread's time (`scale`: its time over its looks' ns); all its rows of that stratum
    (`found` ns) are capped at the stratum's exact total (`total`, schedstat). A share p
    of n looks has the binomial variance p (1 - p) / n, here p (1 - p) / (looks / p)."""
    if not looks or not looked:
        return 0.0, 0.0
    est = ns * scale
    cap = 1.0
    if total is not None and found * scale > total:
        cap = total / (found * scale)  # the looks found the stratum more often than it lasted
    p = ns / looked
    return est * cap, (est * cap) ** 2 * max(1.0 - p, 1.0 / looks) / looks


@dataclass
class Stretches:
    """What the switch timer's stretches timed: each (thread, word)'s waits and ns that
    began in them, each stretch scaled up to the time it stands for: the time since
    the previous stretch in which a thread of the target was seen in a lock wait
    within OFFCPU_HOT_S (outside it no stretch runs). Each stretch adds its own part,
    so the difference of two reads is what the stretches between them timed."""

    n: int = 0
    length_ns: int = 0  # the stretches' summed length (in which waits could begin)
    gated_ns: int = 0  # ... and the time they stand for
    # (tid, word) -> [waits, ns, sum of each stretch's ns squared], each scaled
    keys: dict[tuple[int, int], list[float]] = field(default_factory=dict)

    def add(self, length: int, gated: int, timed: dict[tuple[int, int], tuple[int, int]]) -> None:
        """One stretch of `length` ns that stands for `gated` ns (at least its length)."""
        gated = max(gated, length)
        scale = gated / max(1, length)
        self.n += 1
        self.length_ns += length
        self.gated_ns += gated
        for key, (waits, ns) in timed.items():
            entry = self.keys.setdefault(key, [0.0, 0.0, 0.0])
            entry[0] += waits * scale
            entry[1] += ns * scale
            entry[2] += (ns * scale) ** 2

    def copy(self) -> Stretches:
        return replace(self, keys={k: list(v) for k, v in self.keys.items()})

    def estimate(self, key: tuple[int, int]) -> tuple[float, float, float]:
        """(waits, ns, variance of ns) of one pair: the sum of its scaled stretches, whose
        variance is n times their sample variance (a stretch that did not time the pair
        counts as 0), less the share of the time they covered."""
        waits, ns, sq = self.keys[key]
        if self.n < 2:
            return waits, ns, ns * ns
        var = max(0.0, sq - ns * ns / self.n) / (self.n - 1)
        covered = min(1.0, self.length_ns / max(1, self.gated_ns))
        return waits, ns, self.n * var * (1 - covered)

    def rows(
        self,
        split: dict[tuple[int, int], dict[tuple[str, ...], int]],
        looks: dict[tuple[int, int, tuple[str, ...]], int],
    ) -> dict[tuple[int, int, tuple[str, ...]], list[int]]:
        """The futex rows of the timed (thread, word)s, each pair's estimate spread over
        the stacks its looks found (`split`: their ns; none: no frames), as (tid, word,
        frames) -> [waits, ns, looks, variance], each stack its share of the variance."""
        est = {key: self.estimate(key) for key in self.keys}
        exact = {key: (round(w), round(ns)) for key, (w, ns, _) in est.items()}
        out: dict[tuple[int, int, tuple[str, ...]], list[int]] = {}
        for (tid, word, frames), (w, ns) in spread(exact, split).items():
            total, var = est[(tid, word)][1:]
            part = ns / total if total else 0.0
            out[(tid, word, frames)] = [w, ns, looks.get((tid, word, frames), 0), round(var * part * part)]
        return out


def _keep_timing() -> None:
    """This thread back to SCHED_OTHER at LOOK_NICE when kvprof's yield (SCHED_IDLE, nice
    WATCH_NICE: kvprof.system.attach) reached it: a look must come when its timer says,
    not when a CPU is free, or it finds the target's threads waiting more often than
    they do. Not root: it keeps what it was given."""
    tid = threading.get_native_id()
    try:
        if os.sched_getscheduler(tid) != os.SCHED_OTHER:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        if os.getpriority(os.PRIO_PROCESS, tid) != LOOK_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, LOOK_NICE)
    except OSError:
        pass
