"""The closed loop around a server (kvprof.analysis.loop, kvprof.collect.loop): mean-value
analysis on hand-made loops, the what-if through it, and the tcp_probe collector on
kvcached under kvload."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support import kvload, record

from kvprof.analysis import loop, whatif
from kvprof.model.profile import MACHINE_BUSY, Loop, Profile, Target, ThreadInfo, Window
from kvprof.system.servers import Server

SECONDS = 4.0


def _loop(server_us: float, client_us: float, exchanges: int = 40_000, clients: int = 1) -> Loop:
    """`exchanges` in SECONDS, each `server_us` in the server and `client_us` in the client."""
    return Loop(
        exchanges,
        round(exchanges * server_us * 1e3),
        round(exchanges * client_us * 1e3),
        {str(100 + i): exchanges // clients for i in range(clients)},
    )


def test_the_measured_loop_is_solved_back_to_its_own_throughput() -> None:
    """The demands come from the measured residences: solved again, the loop runs at the
    rate it was measured at, whatever its threads on either side."""
    for servers, clients in ((1, 1), (2, 1), (2, 2), (4, 3)):
        cl = loop.of(_loop(120.0, 100.0, clients=clients), SECONDS, servers)
        assert cl is not None
        assert cl.in_flight == pytest.approx(40_000 / SECONDS * 220e-6)
        assert loop.throughput((cl.server, cl.client), cl.in_flight) == pytest.approx(cl.rate, rel=1e-6)
        assert cl.gain(0.0) == 0.0


def test_a_server_the_client_keeps_saturated_gains_what_it_saves() -> None:
    """Many requests in flight, the client's part a sliver: the server is the loop's
    bottleneck and a fix that removes 30 % of its demand gains about 1 / 0.7 - 1."""
    cl = loop.of(_loop(2000.0, 5.0), SECONDS, 1)
    assert cl is not None and cl.in_flight > 10
    assert cl.gain(0.3) == pytest.approx(1 / 0.7 - 1, rel=0.03)


def test_a_client_bound_loop_gains_little_from_a_faster_server() -> None:
    """The same fix where the one client thread is the loop's bottleneck (its part much the
    longer, the server's mostly its own work): far less, and less than where the two are
    balanced, which gains less than the saturated server."""
    saturated = loop.of(_loop(2000.0, 5.0), SECONDS, 1)
    balanced = loop.of(_loop(110.0, 100.0), SECONDS, 1)
    client_bound = loop.of(_loop(30.0, 400.0), SECONDS, 1)
    assert saturated and balanced and client_bound
    gains = [c.gain(0.3) for c in (saturated, balanced, client_bound)]
    assert gains[0] > gains[1] > gains[2] > 0
    assert gains[2] < 0.05


def test_too_few_exchanges_make_no_loop() -> None:
    """A client elsewhere (no answer seen at this machine) or no load: the what-if takes
    the target's threads alone."""
    assert loop.of(Loop(), SECONDS, 2) is None
    assert loop.of(_loop(100.0, 100.0, exchanges=loop.MIN_EXCHANGES - 1), SECONDS, 2) is None


def _two_workers(lp: Loop) -> Profile:
    p = Profile(Target(pid=100, comm="server"), window=Window(start=1.0, duration_s=SECONDS), hz=49)
    p.threads = {t: ThreadInfo(name="worker", cpu_samples=round(0.8 * 49 * SECONDS)) for t in ("11", "12")}
    p.loop = lp
    return p


def test_the_what_if_goes_through_the_loop_when_it_was_measured() -> None:
    """With a loop measured, a fix's gain is the loop's for the share of the busy threads'
    time it removes; without one, each thread's busy share weighs it."""
    removed = {"11": 0.2, "12": 0.2}  # a quarter of each thread's busy time
    measured = whatif.budget(_two_workers(_loop(30.0, 400.0)))
    assert measured.loop is not None and measured.loop.server.servers == 2
    assert whatif.gain(measured, removed) == pytest.approx(measured.loop.gain(0.25), rel=0.01)
    alone = whatif.budget(_two_workers(Loop()))
    assert alone.loop is None
    assert whatif.gain(alone, removed) > 5 * whatif.gain(measured, removed)


# ---- on kvcached ---------------------------------------------------------------------


@pytest.mark.bpf
@pytest.mark.parametrize("threads", [1, 2])
def test_kvcached_under_kvload_is_a_loop_with_kvloads_threads_as_its_client(
    kvcached_factory: Callable[..., Server], tmp_path: Path, threads: int
) -> None:
    """kvload's threads each wait for their connections' answers: the recording sees whole
    exchanges, time on both sides of each, and kvload's threads (and only them) sending;
    and the machine's CPU time, busy at least with kvcached's."""
    server = kvcached_factory("-t", "2")
    out = tmp_path / "p.json"
    with kvload(server, 30, f"--num-threads={threads}") as load:
        r = record(server.pid, out, "-d", "3")
        senders = {str(t) for t in _threads_of(load.pid)}
    assert r.returncode == 0, r.stderr[-2000:]
    p = Profile.load(out)
    assert p.status.collectors.get("loop") == "ok", p.status.collectors
    assert p.loop.exchanges > loop.MIN_EXCHANGES, p.loop
    assert p.loop.server_ns > 0 and p.loop.client_ns > 0, p.loop
    assert set(p.loop.senders) <= senders and len(p.loop.senders) == threads, (p.loop.senders, senders)
    assert whatif.budget(p).loop is not None
    assert p.status.counters[MACHINE_BUSY] > 0


def _threads_of(pid: int) -> list[int]:
    return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
