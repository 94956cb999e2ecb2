"""`kvprof top -p PID` live: real BPF on a real kvcached under kvload, through Textual's run_test."""

from __future__ import annotations

import asyncio
import os
import pty
import select
import signal
import subprocess
import time
from collections.abc import Callable

import pytest
from support import (
    KVPROF,
    assert_detached,
    kvload,
    reaped,
    semaphores,
    thread_nices,
    top_app,
    until,
    wait_until,
)
from textual.widgets import Static

from kvprof.collect import LOOK_NICE, WATCH_NICE
from kvprof.system.servers import Server
from kvprof.tui.sources import LiveSource
from kvprof.tui.widgets import OverviewPanel

DEADLINE_S = 10.0  # top's promise (docs/top.md): the topkeys lock named this soon after start


@pytest.mark.bpf
def test_top_names_the_topkeys_lock_within_10_s(kvcached_factory: Callable[..., Server]) -> None:
    """Attached to baseline kvcached under load, the findings list names the topkeys lock in time;
    q detaches everything and the server keeps serving."""
    server = kvcached_factory("-t", "2", "--preset", "baseline")
    seen: list[str] = []
    with kvload(server, 60):
        time.sleep(0.5)
        source = LiveSource(server.pid)
        app = top_app(source)

        async def go() -> None:
            async with app.run_test(size=(132, 40)) as pilot:
                start = time.monotonic()
                while time.monotonic() - start < DEADLINE_S:
                    rows = app.query_one(OverviewPanel).rows.values()
                    seen[:] = [r.cost for r in rows]
                    if any(r.where == "topkeys" and r.cost.startswith("update_topkeys") for r in rows):
                        print(f"topkeys named after {time.monotonic() - start:.1f} s; {source.states}")
                        break
                    await pilot.pause(0.1)
                status = str(app.query_one("#status", Static).render())
                assert any(c.startswith("update_topkeys — topkeys mutex") for c in seen), (seen, status)
                await pilot.press("q")

        asyncio.run(go())
        app.wait_closed()
        # a compile q did not wait for finishes, sees the session closed and detaches;
        # wait for it: BCC crashes when two threads compile at once (the next test's)
        while source.attaching():
            time.sleep(0.1)
    assert app.return_code in (0, None)
    assert_detached(server)
    assert server.stats()["curr_items"]  # still serving


@pytest.mark.bpf
def test_a_session_paused_from_outside_freezes_the_screen(kvcached_factory: Callable[..., Server]) -> None:
    """What SIGUSR1 does to `top` (Session.pause, through pause_on_signals): the probes go
    (the kernel lowers the kvs semaphores), the screen says PAUSED and no map is read until
    the session resumes (SIGUSR2); then the refreshes come back at their pace. A benchmark
    toggling top's cost this way keeps its refresh pace: a stopped and continued TUI would
    refresh at once on every SIGCONT (docs/top.md, "Overhead")."""
    server = kvcached_factory("-t", "2", "--preset", "baseline")
    with kvload(server, 60):
        source = LiveSource(server.pid)
        app = top_app(source, interval=0.3)

        async def go() -> None:
            async with app.run_test(size=(132, 40)) as pilot:
                assert await until(pilot, lambda: not source.attaching() and app.frames > 0, 90), (
                    source.states
                )
                assert any(semaphores(server).values())
                source.session.pause()
                assert await until(pilot, lambda: not any(semaphores(server).values())), semaphores(server)
                assert await until(
                    pilot, lambda: "PAUSED (SIGUSR1" in str(app.query_one("#status", Static).render())
                )
                polls = app.polls  # PAUSED drawn: no refresh starts now; one may be in flight
                await pilot.pause(1.5)  # five intervals
                assert app.polls <= polls + 1, (polls, app.polls)
                source.session.resume()
                assert await until(pilot, lambda: app.polls >= polls + 2)
                assert "PAUSED" not in str(app.query_one("#status", Static).render())
                assert any(semaphores(server).values())
                await pilot.press("q")

        asyncio.run(go())
        app.wait_closed()
    assert_detached(server)


@pytest.mark.bpf
def test_top_watches_at_the_lowest_priority(kvcached_factory: Callable[..., Server]) -> None:
    """`kvprof top -p PID` in a terminal: once every collector is attached, each of its
    threads runs at nice WATCH_NICE (the target's threads win a contested CPU), but the one
    that looks at the target's sleeping threads, at LOOK_NICE (a look on time); a plain
    SIGSTOP and SIGCONT (a debugger, a benchmark pausing it) leave its threads as they were,
    and q still detaches."""
    server = kvcached_factory("-t", "2")
    master, slave = pty.openpty()
    top = subprocess.Popen([*KVPROF, "top", "-p", str(server.pid)], stdin=slave, stdout=slave, stderr=slave)
    with reaped(top) as proc:
        os.close(slave)
        drawn = b""
        deadline = time.monotonic() + 120
        while "collectors ✓".encode() not in drawn and time.monotonic() < deadline and proc.poll() is None:
            if select.select([master], [], [], 0.5)[0]:
                drawn = (drawn + os.read(master, 65536))[-65536:]
        assert "collectors ✓".encode() in drawn, drawn[-500:]

        def watching() -> bool:  # the off-CPU look thread keeps LOOK_NICE (offsample._keep_timing)
            return [n for n in thread_nices(proc.pid).values() if n != WATCH_NICE] in ([], [LOOK_NICE])

        assert wait_until(watching), thread_nices(proc.pid)
        threads = len(os.listdir(f"/proc/{proc.pid}/task"))
        for _ in range(3):
            os.kill(proc.pid, signal.SIGSTOP)
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.3)
            while select.select([master], [], [], 0.2)[0]:
                os.read(master, 65536)
        # Textual's terminal set-up again would add its input and writer threads each time;
        # one more may be a refresh's worker thread
        assert len(os.listdir(f"/proc/{proc.pid}/task")) <= threads + 1
        os.write(master, b"q")
        proc.wait(timeout=60)
        os.close(master)
    assert_detached(server)
