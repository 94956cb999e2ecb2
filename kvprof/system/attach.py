"""Attaching to a running process, the same way for every command.

    session = open_session(pid, collectors, CollectOptions(...))   # CollectError: one line
    with stop_on_signals(), session:
        ...                                  # SIGTERM detaches as Ctrl-C does

open_session() checks what can be checked before anything is loaded, and says
what is wrong in one line with what to do (a CollectError, each text written
once here): the collectors asked for, the target (read from /proc: gone, a
kernel thread, not ours to trace), and whether this process may load BPF
programs when a collector needs them. stop_on_signals() turns SIGINT, SIGTERM (and
the signals given) into KeyboardInterrupt in the main thread, so a command stopped
by its service manager, or started in the background of a script (which inherits
SIGINT ignored), detaches and writes what it has, as on Ctrl-C.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from kvprof.collect import STARVE_CHECK_S, STARVED_S, WATCH_NICE, CollectError, CollectOptions
from kvprof.collect.session import (
    ALL_COLLECTORS,
    NO_BPF,
    OPT_IN,
    Session,
    TargetGone,
    describe_target,
    modules,
)
from kvprof.collect.thread_sockets import run_delays
from kvprof.model.profile import Target

NEEDS_ROOT = "loading BPF programs needs root (or CAP_BPF and CAP_PERFMON): run it with sudo"
TRACEFS = Path("/sys/kernel/tracing")


def yield_cpu() -> None:
    """Every thread of this process to SCHED_IDLE (and nice WATCH_NICE), once the
    collectors are attached. What kvprof does from then on (reading maps, looking at
    sleeping threads, symbolizing, drawing top's screen) then runs only on CPU time
    nothing else on the machine wants, and a thread of the target's that wakes takes
    the CPU from it at once; at nice 19 it still took a share of a CPU the target
    wanted, and a woken target thread could wait for the end of its slice
    (docs/record.md, "Overhead"). Threads started later inherit it.

    A machine with no idle CPU at all would starve it: a watchdog thread, idle too,
    adds up every STARVE_CHECK_S how long the process's threads waited for a CPU, and
    once that is more than STARVED_S it puts every thread back to SCHED_OTHER at nice
    WATCH_NICE for the rest of the run (starved_note() then says so).

    A process it starts afterwards (a server, a load) would inherit both from the
    thread that starts it: those go through as_before_yield() (servers.die_with_parent)."""
    global _watchdog, _before
    if _before is None:
        _before = (os.sched_getscheduler(os.getpid()), os.getpriority(os.PRIO_PROCESS, os.getpid()))
    _set_policy(os.SCHED_IDLE, nice=WATCH_NICE)
    _idle.set()
    if _watchdog is None:
        _watchdog = threading.Thread(target=_watch_starvation, name="kvprof-starve", daemon=True)
        _watchdog.start()


def reclaim_cpu() -> None:
    """Every thread back to SCHED_OTHER (at the nice yield_cpu() gave it) when
    yield_cpu() was called: the watchdog's, when idle time never comes. A process that
    never yielded (a test driving top's screen, a replay) is left as it is."""
    if not _idle.is_set():
        return
    _idle.clear()
    _set_policy(os.SCHED_OTHER)


def end_yield() -> None:
    """Every thread back to the policy and the nice it had before yield_cpu(), for
    work that has to end now (record's last read and the profile it writes, top's
    and the exporter's detach): on a machine whose CPUs are all busy, nice WATCH_NICE
    stretches a second of that work over a minute. Nothing when it never yielded
    (a test driving top's screen, a replay)."""
    if _before is None:
        return
    _idle.clear()  # the watchdog has nothing left to reclaim
    policy, nice = _before
    _set_policy(policy, nice=nice)


def as_before_yield() -> None:
    """In a child between fork and exec: the scheduling policy and nice this process
    had before yield_cpu(), so that a server or load kvprof starts once attached does
    not run on idle time. Nothing when it never yielded."""
    if _before is None:
        return
    policy, nice = _before
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:  # not root: a lower nice needs CAP_SYS_NICE; the child keeps WATCH_NICE
        pass


def starved_note() -> str | None:
    """One line when the watchdog found no idle CPU and kvprof took its share at nice
    WATCH_NICE from then on, else None."""
    if _starved_at is None:
        return None
    return f"no idle CPU for kvprof: it ran at nice {WATCH_NICE} from {_starved_at:.0f} s after attaching"


_idle = threading.Event()  # yield_cpu() set it, reclaim_cpu() and end_yield() cleared it
_watchdog: threading.Thread | None = None
_before: tuple[int, int] | None = None  # (policy, nice) of the main thread before yield_cpu()
_starved_at: float | None = None


def _set_policy(policy: int, nice: int | None = None) -> None:
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            if nice is not None and os.getpriority(os.PRIO_PROCESS, tid) != nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:  # a thread that ended meanwhile; a lower nice without CAP_SYS_NICE
            pass
        try:
            if os.sched_getscheduler(tid) != policy:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
        except OSError:  # a thread that ended meanwhile
            pass


def _waited_ns() -> int:
    """How long this process's threads have waited for a CPU, in all."""
    return sum(run_delays(os.getpid()).values())


def _watch_starvation() -> None:
    """Every STARVE_CHECK_S: starving when this process's threads waited longer than
    STARVED_S for a CPU, in all, since the last check (a process stopped by SIGSTOP is
    not waiting; one with nothing to do does not wait either)."""
    global _starved_at
    start = time.monotonic()
    before = _waited_ns()
    while True:
        time.sleep(STARVE_CHECK_S)
        waited = _waited_ns()
        if waited - before > STARVED_S * 1e9 and _idle.is_set():
            _starved_at = time.monotonic() - start
            reclaim_cpu()
        before = waited


def not_ours(pid: int) -> str:
    return f"PID {pid} is not ours to trace (permission denied reading /proc): run kvprof as root (sudo)"


def may_load_bpf() -> bool:
    """Root, or both capabilities BPF programs with perf events need."""
    if os.geteuid() == 0:
        return True
    from kvprof.system.doctor import CAP_BPF, CAP_PERFMON, Host, cap_eff

    caps = cap_eff(Host())
    return bool(caps >> CAP_BPF & 1 and caps >> CAP_PERFMON & 1)


def bpf_unavailable() -> str | None:
    """Why BPF collectors cannot work here (one line with the fix), or None."""
    if not may_load_bpf():
        return NEEDS_ROOT
    from kvprof.collect import missing_bcc

    why = missing_bcc()
    if why is not None:
        return why
    if not (TRACEFS / "uprobe_events").exists():
        return f"tracefs is not mounted on {TRACEFS}: mount -t tracefs tracefs {TRACEFS}"
    return None


def target(pid: int) -> Target:
    """The process `pid` from /proc; CollectError when it is gone, a kernel thread, or not ours."""
    try:
        return describe_target(pid)
    except TargetGone as e:
        raise CollectError(str(e)) from None
    except PermissionError:
        raise CollectError(not_ours(pid)) from None


def open_session(
    pid: int, collectors: list[str] | tuple[str, ...] = (), opts: CollectOptions | None = None
) -> Session:
    """A Session of `collectors` (all when none are given) on `pid`, not attached yet;
    CollectError says in one line why there cannot be one."""
    opts = opts or CollectOptions()
    names = tuple(collectors) or ALL_COLLECTORS
    unknown = [c for c in names if c not in ALL_COLLECTORS + OPT_IN]
    if unknown:
        raise CollectError(f"unknown collector {unknown[0]!r}: choose from {', '.join(ALL_COLLECTORS)}")
    described = target(pid)
    try:
        chosen = modules(pid, names, opts)
    except PermissionError:
        raise CollectError(not_ours(pid)) from None
    if any(module not in NO_BPF for module in chosen.values()) and not may_load_bpf():
        raise CollectError(f"{NEEDS_ROOT}; `kvprof doctor` checks the rest")
    return Session(described, chosen, opts)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def stop_on_signals(*signums: signal.Signals) -> Iterator[None]:
    """SIGINT, SIGTERM and `signums` raise KeyboardInterrupt while inside (its argument
    the signal's name; SIGINT's has none, as Python's own), whatever their handling
    was: a shell starts a background job with SIGINT ignored. The handlers are put
    back at the end, so ignore_stop_signals() may be called inside. Only the main
    thread may set handlers: elsewhere (the TUI's worker) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = (signal.SIGTERM, *signums)
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *caught)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in caught:
        signal.signal(sig, _interrupt)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def stopped_by(e: KeyboardInterrupt) -> signal.Signals:
    """The signal that stop_on_signals() turned into `e`."""
    return signal.Signals[e.args[0]] if e.args and e.args[0] in signal.Signals.__members__ else signal.SIGINT


def signal_status(sig: signal.Signals) -> int:
    """The exit status of a command that `sig` stopped early, as a shell gives it: 128 + its number."""
    return 128 + int(sig)


PAUSE, RESUME = signal.SIGUSR1, signal.SIGUSR2


@contextmanager
def pause_on_signals(session: Callable[[], Session | None]) -> Iterator[None]:
    """While inside, SIGUSR1 pauses `session()` (its programs detached from their
    events, nothing unloaded: Session.pause) and SIGUSR2 resumes it: what
    bench/overhead.py toggles to compare seconds with and without kvprof's probes
    on one server, without a compile between them. A thread of its own does it, in
    the order the signals came (a handler runs in the main thread, which may hold
    the session's lock). Main thread only, as stop_on_signals()."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    asked: queue.SimpleQueue[signal.Signals | None] = queue.SimpleQueue()

    def apply() -> None:
        while (sig := asked.get()) is not None:
            target = session()
            if target is not None:
                target.pause() if sig == PAUSE else target.resume()

    worker = threading.Thread(target=apply, name="kvprof-pause", daemon=True)
    worker.start()
    old = {sig: signal.getsignal(sig) for sig in (PAUSE, RESUME)}
    for sig in old:
        signal.signal(sig, lambda signum, _frame: asked.put(signal.Signals(signum)))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        asked.put(None)


def ignore_stop_signals(*signums: signal.Signals) -> None:
    """Ctrl-C, SIGTERM and `signums` do nothing from now until stop_on_signals() ends:
    a second Ctrl-C while stopping must not leave a server or a load behind."""
    for sig in (signal.SIGINT, signal.SIGTERM, *signums):
        signal.signal(sig, signal.SIG_IGN)
