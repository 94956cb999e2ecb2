"""The target's own counters over its port: memcached `stats` and Redis `INFO`,
autodetected from the ports the process listens on, under each server's own
benchmark client (redis-benchmark; libmemcached's memcaslap for memcached:
Debian has no memtier_benchmark). `record` keeps them before and after the window, `top`'s
header shows ops/s from them, and a target that answers neither still works.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import record, top_app
from textual.widgets import Static

from kvprof.collect.server_stats import general_stats, ops_total, server_stats
from kvprof.model.profile import Profile
from kvprof.system.servers import Server, start_memcached, start_redis
from kvprof.tui.sources import LiveSource


@pytest.fixture
def redis() -> Iterator[Server]:
    if shutil.which("redis-server") is None or shutil.which("redis-benchmark") is None:
        pytest.skip("needs Debian's redis-server and redis-benchmark (scripts/provision.sh)")
    server = start_redis(["--latency-tracking", "yes"])
    yield server
    server.stop()


@pytest.fixture
def memcached() -> Iterator[Server]:
    if shutil.which("memcached") is None:
        pytest.skip("needs Debian's memcached (scripts/provision.sh)")
    server = start_memcached(["-t", "2"])
    yield server
    server.stop()


def redis_benchmark(server: Server) -> subprocess.Popen[bytes]:
    """redis-benchmark pipelining GET/SET until killed (-l loops)."""
    return subprocess.Popen(
        [
            "redis-benchmark",
            "-h",
            server.host,
            "-p",
            str(server.port),
            "-q",
            "-l",
            "-P",
            "16",
            "-t",
            "get,set",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def memcaslap(server: Server) -> subprocess.Popen[bytes]:
    """libmemcached's benchmark client (memaslap: gets and sets), until stopped."""
    if shutil.which("memcaslap") is None:
        pytest.skip("needs memcaslap (libmemcached-tools, scripts/provision.sh)")
    return subprocess.Popen(
        ["memcaslap", "-s", server.address, "-T", "1", "-c", "8", "-t", "300s"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
    proc.wait(timeout=30)


def test_redis_info_is_read_with_its_sections(redis: Server) -> None:
    """INFO as the general group (protocol: redis), commandstats and latencystats as their own."""
    general = general_stats(redis.host, redis.port)
    assert general["protocol"] == "redis" and "redis_version" in general
    assert ops_total(general) is not None
    stats = server_stats(redis.pid)
    assert stats["general"]["protocol"] == "redis"
    assert any(k.startswith("cmdstat_") for k in stats["commandstats"])  # INFO itself was a command
    assert "latencystats" in stats  # Redis 7 with --latency-tracking


def test_memcached_stats_still_win_on_a_memcached_port(memcached: Server) -> None:
    """Debian's memcached answers INFO with ERROR: its `stats` are read as before."""
    stats = server_stats(memcached.pid)
    assert "cmd_get" in stats["general"] and "protocol" not in stats["general"]
    assert ops_total(stats["general"]) == 0


def record_under(server: Server, client: subprocess.Popen[bytes], out: Path) -> Profile:
    """`record` for 2 s while `client` loads `server`, then `report` on the profile."""
    try:
        time.sleep(1.0)
        r = record(server.pid, out, "-d", "2", "--collectors", "oncpu,offcpu,regsample")
        assert r.returncode == 0, r.stderr
    finally:
        stop(client)
    report = subprocess.run(
        [*r.args[:3], "report", str(out)], capture_output=True, text=True, timeout=60, check=False
    )
    assert report.returncode == 0 and "CACHE LINES FROM SAMPLED REGISTERS" in report.stdout, report.stderr
    return Profile.load(out)


@pytest.mark.bpf
def test_record_redis_keeps_info_before_and_after(redis: Server, tmp_path: Path) -> None:
    """record and report on redis-server under redis-benchmark: server_stats hold INFO around the window."""
    p = record_under(redis, redis_benchmark(redis), tmp_path / "redis.json")
    before, after = p.server_stats["before"], p.server_stats["after"]
    assert before["protocol"] == after["protocol"] == "redis"
    assert int(after["total_commands_processed"]) > int(before["total_commands_processed"])
    assert int(after["instantaneous_ops_per_sec"]) > 0
    assert "cmdstat_set" in p.server_stats["after.commandstats"]


@pytest.mark.bpf
def test_record_memcached_keeps_stats(memcached: Server, tmp_path: Path) -> None:
    """record and report on Debian's memcached under memcaslap: server_stats hold `stats` around it."""
    p = record_under(memcached, memcaslap(memcached), tmp_path / "mc.json")
    before, after = ops_total(p.server_stats["before"]), ops_total(p.server_stats["after"])
    assert before is not None and after is not None and after > before


def _header(pid: int, until: Callable[[str], bool]) -> str:
    """The Overview header of `kvprof top -p PID` once `until(header)` holds (or after 20 s)."""
    source = LiveSource(pid, collectors=("oncpu",))
    app = top_app(source)
    seen = [""]

    async def go() -> None:
        async with app.run_test(size=(132, 40)) as pilot:
            start = time.monotonic()
            while time.monotonic() - start < 20 and not until(seen[0]):
                await pilot.pause(0.2)
                seen[0] = str(app.query_one("#ov-info", Static).render())
            await pilot.press("q")

    asyncio.run(go())
    app.wait_closed()
    while source.attaching():
        time.sleep(0.1)
    return seen[0]


def _ops_shown(header: str) -> float:
    after = header.split("ops/s ", 1)[1].split()[0].replace(",", "")
    return float(after) if after != "-" else 0.0


@pytest.mark.bpf
def test_top_header_shows_ops_of_redis_and_memcached(redis: Server, memcached: Server) -> None:
    """top -p on redis-server and on memcached, each under load: ops/s from the server's own counters."""
    bench = redis_benchmark(redis)
    try:
        header = _header(redis.pid, lambda h: "ops/s" in h and _ops_shown(h) > 0)
    finally:
        stop(bench)
    assert _ops_shown(header) > 0 and "(Redis INFO)" in header, header
    load = memcaslap(memcached)
    try:
        header = _header(memcached.pid, lambda h: "ops/s" in h and _ops_shown(h) > 0)
    finally:
        stop(load)
    assert _ops_shown(header) > 0 and "Redis" not in header, header


@pytest.mark.bpf
def test_a_target_answering_neither_protocol(
    contend: Callable[[], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """No memcached or Redis port: record works with no server_stats, top's header says so."""
    proc = contend()
    out = tmp_path / "none.json"
    r = record(proc.pid, out, "-d", "1", "--collectors", "oncpu")
    assert r.returncode == 0, r.stderr
    assert Profile.load(out).server_stats == {}
    header = _header(proc.pid, lambda h: "neither" in h)
    assert "ops/s - (its ports answer neither memcached stats nor Redis INFO)" in header, header
