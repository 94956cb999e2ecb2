"""kvprof.system.attach: what every command says when it cannot attach, and SIGTERM
turned into KeyboardInterrupt while a command runs (no root, nothing attached)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from kvprof.collect import CollectError, CollectOptions
from kvprof.collect.session import TargetGone, alive, describe_target
from kvprof.system.attach import ignore_stop_signals, open_session, signal_status, stop_on_signals, stopped_by


def test_a_gone_pid_and_a_kernel_thread_are_one_line() -> None:
    """No such process, and a process with no executable, are CollectErrors naming the PID."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(CollectError, match=f"^no process with PID {gone.pid}$"):
        open_session(gone.pid)
    # to an ordinary user a kernel thread's /proc/2/exe is closed, not missing
    with pytest.raises(CollectError, match=r"^PID 2 (\(\w+\) is a kernel thread or has exited|is not ours)"):
        open_session(2)


def test_a_process_reaped_while_it_is_read_is_gone_not_an_error() -> None:
    """A reap that races a read of /proc/PID makes the read fail with ESRCH, not ENOENT:
    alive() still says False and describe_target() TargetGone, each of many times."""
    errors: list[BaseException] = []

    def watch(pid: int) -> None:
        try:
            while True:
                living = alive(pid)
                try:
                    describe_target(pid)
                except TargetGone:
                    if not living:
                        return
        except BaseException as e:  # what the main thread reports
            errors.append(e)

    for _ in range(100):
        child = subprocess.Popen(["sleep", "30"])
        watcher = threading.Thread(target=watch, args=(child.pid,))
        watcher.start()
        time.sleep(0.001)
        child.kill()
        child.wait()
        watcher.join(30)
        assert not watcher.is_alive(), "alive() never said False for a reaped process"
        assert not errors, repr(errors[0])


def test_an_unknown_collector_is_named() -> None:
    with pytest.raises(CollectError, match="unknown collector 'nope': choose from oncpu, "):
        open_session(os.getpid(), ("oncpu", "nope"))


def test_a_session_is_made_without_attaching() -> None:
    """Our own process with perf's collector (no BPF: no root needed): the target
    described, nothing started."""
    session = open_session(os.getpid(), (), CollectOptions(backend="perf"))
    try:
        assert session.target.pid == os.getpid() and session.modules == {"oncpu": "perf"}
        assert not session.active and not session.started_at
    finally:
        session.close()


def test_sigterm_is_a_keyboard_interrupt_inside_and_the_handlers_come_back() -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt(their name) inside; after, the old
    handlers, SIGINT's too (ignore_stop_signals() inside does not outlive it)."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(KeyboardInterrupt) as caught, stop_on_signals(signal.SIGHUP):
            os.kill(os.getpid(), sig)
            time.sleep(10)  # the handler raises as soon as it runs
            raise AssertionError("no KeyboardInterrupt")
        assert caught.value.args == (sig.name,)
    with stop_on_signals(signal.SIGHUP):
        ignore_stop_signals(signal.SIGHUP)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_sigint_stops_inside_even_when_it_came_in_ignored() -> None:
    """A background job of a shell starts with SIGINT ignored: inside, SIGINT raises
    KeyboardInterrupt all the same (no argument, as Python's own), read back as SIGINT and
    exit status 130; after, it is ignored again."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt) as caught, stop_on_signals():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)  # the handler raises as soon as it runs
            raise AssertionError("no KeyboardInterrupt")
        assert caught.value.args == ()
        assert stopped_by(caught.value) == signal.SIGINT and signal_status(signal.SIGINT) == 130
        assert stopped_by(KeyboardInterrupt("SIGTERM")) == signal.SIGTERM
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


WATCHER = """
import subprocess, sys, threading, time
from kvprof.system.attach import end_yield, starved_note, yield_cpu
from kvprof.system.servers import die_with_parent
yield_cpu()
def work():  # what kvprof does once attached, wanting a CPU all the time
    while True:
        sum(range(10000))
threading.Thread(target=work, daemon=True).start()
print("yielded", flush=True)
for line in sys.stdin:
    if line.strip() == "note":
        print(starved_note(), flush=True)
    elif line.strip() == "spawn":  # as a server or a load is started
        child = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent)
        print(child.pid, flush=True)
    elif line.strip() == "end":  # as record does before its last read
        end_yield()
        print("ended", flush=True)
"""


def _policies(pid: int) -> set[tuple[int, int]]:
    """(scheduling policy, nice) of every thread of `pid`."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out.add((os.sched_getscheduler(int(tid)), os.getpriority(os.PRIO_PROCESS, int(tid))))
        except OSError:  # the thread ended meanwhile
            pass
    return out


def test_yield_cpu_runs_idle_and_takes_its_share_back_when_starved() -> None:
    """A process that called yield_cpu() and then works: every thread SCHED_IDLE at
    nice WATCH_NICE. Then every CPU kept busy by more nice-0 loops than CPUs: its
    threads wait for a CPU over STARVED_S in a check, every thread goes back to
    SCHED_OTHER (nice kept), and starved_note() says so. end_yield() puts every
    thread back to the policy and nice it had before, as this test's process has
    (the last read must end on a busy machine). A process it starts meanwhile, as
    servers and loads are started, runs as this test's process does, not on idle time."""
    from kvprof.collect import WATCH_NICE

    proc = subprocess.Popen(
        [sys.executable, "-c", WATCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    loops: list[subprocess.Popen[bytes]] = []
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "yielded\n"
        assert _policies(proc.pid) == {(os.SCHED_IDLE, WATCH_NICE)}
        proc.stdin.write("spawn\n")
        proc.stdin.flush()
        child = int(proc.stdout.readline())
        try:
            assert _policies(child) == {(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))}
        finally:
            os.kill(child, signal.SIGKILL)
        busy = "while True: pass"
        loops = [subprocess.Popen([sys.executable, "-c", busy]) for _ in range((os.cpu_count() or 1) + 1)]
        deadline = time.monotonic() + 60
        while _policies(proc.pid) != {(os.SCHED_OTHER, WATCH_NICE)} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _policies(proc.pid) == {(os.SCHED_OTHER, WATCH_NICE)}, _policies(proc.pid)
        for loop in loops:
            loop.kill()
        proc.stdin.write("note\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith(f"no idle CPU for kvprof: it ran at nice {WATCH_NICE} from ")
        proc.stdin.write("end\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "ended\n"
        assert _policies(proc.pid) == {(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))}
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        proc.kill()
        proc.wait()


def test_reclaim_leaves_a_process_that_never_yielded_alone() -> None:
    """reclaim_cpu() and end_yield() in a process that never called yield_cpu() (a test
    driving top's screen, a replay) change neither its threads' policy nor their nice:
    its children (servers and loads started by the tests) would inherit them."""
    from kvprof.system.attach import end_yield, reclaim_cpu

    before = _policies(os.getpid())
    reclaim_cpu()
    end_yield()
    assert _policies(os.getpid()) == before
