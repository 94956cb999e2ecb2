"""kvprof.system.attach: what every command says when it cannot attach, and SIGTERM
turned into KeyboardInterrupt while a command runs (no root, nothing attached)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from kvprof.collect import CollectError, CollectOptions
from kvprof.system.attach import ignore_stop_signals, open_session, stop_on_signals


def test_a_gone_pid_and_a_kernel_thread_are_one_line() -> None:
    """No such process, and a process with no executable, are CollectErrors naming the PID."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(CollectError, match=f"^no process with PID {gone.pid}$"):
        open_session(gone.pid)
    # to an ordinary user a kernel thread's /proc/2/exe is closed, not missing
    with pytest.raises(CollectError, match=r"^PID 2 (\(\w+\) is a kernel thread or has exited|is not ours)"):
        open_session(2)


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
