"""kvload, the load generator: options, exact counts, the --json contract, --verify.

Every run is bounded by --num-cycles or --duration and talks to a real server
started by the fixtures (kvcached, or Debian's memcached as a peer).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from kvprof.system.servers import Server, kvload_binary

JSON_KEYS = {
    "ops",
    "ops_per_sec",
    "gets",
    "sets",
    "hits",
    "misses",
    "errors",
    "verify_mismatches",
    "duration_s",
}


def kvload(server: Server | None, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [str(kvload_binary()), "--quiet"]
    if server is not None:
        argv.append(f"--server={server.address}")
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=timeout, check=False)


def last_json(out: str) -> dict[str, Any]:
    lines = out.strip().splitlines()
    assert lines, "kvload printed nothing on stdout"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def kvload_json(server: Server, *args: str, status: int = 0) -> dict[str, Any]:
    """`kvload ARGS --json` against `server`: it exits `status`; its last stdout line, parsed."""
    r = kvload(server, *args, "--json")
    assert r.returncode == status, r.stderr
    return last_json(r.stdout)


def fixed_work(threads: int, connections: int, batch: int, cycles: int) -> tuple[list[str], int]:
    """kvload's flags for a fixed amount of work, and the requests it makes:
    threads x connections x cycles x batch."""
    flags = [f"--num-threads={threads}", f"--connections={connections}", f"--batch-size={batch}"]
    return [*flags, f"--num-cycles={cycles}"], threads * connections * cycles * batch


def test_usage_errors_are_one_line_and_exit_64() -> None:
    """Bad options are refused with one readable line and status 64, before connecting."""
    for args in (
        ["--batch-size", "0"],
        ["--set-pct", "101"],
        ["--server", "nohost"],
        ["--key-dist", "pareto"],
        ["--min-size", "100", "--max-size", "10"],
        ["--verify", "--min-size", "8", "--max-size", "8"],
        ["--no-such-option"],
        ["--cpu-affinity", "0-"],
        ["--cpu-affinity", "100000"],
    ):
        r = kvload(None, *args)
        assert r.returncode == 64, (args, r.stderr)
        assert r.stderr.startswith("kvload: ") or "usage" in r.stderr, (args, r.stderr)


def test_cpu_affinity_pins_threads_round_robin(kvcached_factory: Callable[..., Server]) -> None:
    """--cpu-affinity LIST: client thread i runs only on LIST[i % len]."""
    cpus = sorted(os.sched_getaffinity(0))
    wanted = [cpus[-1], cpus[0]]
    server = kvcached_factory("-t", "1")
    argv = [str(kvload_binary()), "--quiet", f"--server={server.address}", "--num-threads=3", "--duration=3",
            "--batch-size=4", "--set-pct=0", f"--cpu-affinity={wanted[0]},{wanted[1]}"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    expected = {str(c) for c in wanted}
    try:
        allowed: set[str] = set()
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:  # the main thread and the 3 load threads
            try:
                tids = [t for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
                allowed = {_cpus_allowed(proc.pid, t) for t in tids}
            except (FileNotFoundError, StopIteration):
                break
            # a thread just started may not have pinned itself yet: wait for all three
            if len(tids) == 3 and allowed == expected:
                break
            time.sleep(0.02)
    finally:
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert allowed == expected, allowed


def _cpus_allowed(pid: int, tid: str) -> str:
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        return next(line.split()[1] for line in f if line.startswith("Cpus_allowed_list:"))


def test_cannot_connect_exits_2() -> None:
    """A server that is not there: status 2 and a line saying what to check."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        r = kvload(None, f"--server=127.0.0.1:{port}", "--num-cycles=1", timeout=20)
    assert r.returncode == 2
    assert "cannot connect" in r.stderr


def test_exact_counts_for_a_fixed_number_of_cycles(kvcached_factory: Callable[..., Server]) -> None:
    """threads x connections x cycles x batch requests, split exactly into gets/sets and hits/misses."""
    server = kvcached_factory("-t", "2")
    work, requests = fixed_work(threads=2, connections=3, batch=25, cycles=40)
    out = kvload_json(server, *work, "--set-pct=30", "--num-items=500", "--min-size=16", "--max-size=64")
    assert out.keys() >= JSON_KEYS and {"p50", "p99", "p999", "max"} <= out["latency_us"].keys()
    assert out["ops"] == requests
    assert out["gets"] + out["sets"] == out["ops"]
    assert out["hits"] + out["misses"] == out["gets"]
    assert out["misses"] == 0  # populated first
    assert out["errors"] == 0 and out["verify_mismatches"] == 0
    assert 0 < out["latency_us"]["p50"] <= out["latency_us"]["p99"] <= out["latency_us"]["p999"]
    assert out["latency_us"]["p999"] <= out["latency_us"]["max"]
    # the server saw exactly those requests (plus the 500 population sets)
    stats = server.stats()
    assert int(stats["cmd_get"]) == out["gets"]
    assert int(stats["cmd_set"]) == out["sets"] + 500


def test_no_population_counts_misses(kvcached_factory: Callable[..., Server]) -> None:
    """Without population an empty server answers every get with a miss."""
    server = kvcached_factory("-t", "1")
    out = kvload_json(server, "--no-population", "--set-pct=0", "--batch-size=10", "--num-cycles=20")
    assert out["gets"] == out["misses"] == 200 and out["hits"] == 0


def test_populate_only_stores_every_key(kvcached_factory: Callable[..., Server]) -> None:
    """--populate-only stores each of --num-items keys once and exits."""
    server = kvcached_factory("-t", "2")
    r = kvload(server, "--populate-only", "--num-items=1234", "--num-threads=2", "--batch-size=50")
    assert r.returncode == 0, r.stderr
    assert int(server.stats()["curr_items"]) == 1234


@pytest.mark.parametrize("peer", ["kvcached", "memcached"])
def test_verify_with_half_sets_finds_no_mismatch(
    peer: str, kvcached_factory: Callable[..., Server], memcached_factory: Callable[..., Server]
) -> None:
    """--verify, 50 % sets, 2 threads, zipf keys: every value read checks out, against both servers."""
    server = kvcached_factory("-t", "2") if peer == "kvcached" else memcached_factory("-t", "2")
    work, requests = fixed_work(threads=2, connections=2, batch=20, cycles=100)
    out = kvload_json(server, "--verify", "--set-pct=50", *work, "--num-items=300", "--key-dist=zipf:0.99")
    assert out["verify_mismatches"] == 0 and out["errors"] == 0
    assert out["hits"] > 0 and out["ops"] == requests


def test_verify_catches_a_value_changed_behind_its_back(kvcached_factory: Callable[..., Server]) -> None:
    """A raw `set` over one of kvload's keys makes --verify count a mismatch and fail the run."""
    server = kvcached_factory("-t", "1")
    assert kvload(server, "--populate-only", "--verify", "--num-items=1").returncode == 0
    with socket.create_connection((server.host, server.port), timeout=5) as s:
        s.sendall(b"set kvload:0 0 0 64\r\n" + b"x" * 64 + b"\r\n")
        assert s.recv(100) == b"STORED\r\n"
    out = kvload_json(
        server, "--no-population", "--verify", "--num-items=1", "--set-pct=0", "--num-cycles=3", status=1
    )
    assert out["verify_mismatches"] == 3 and out["hits"] == 3


def test_json_against_memcached(memcached_factory: Callable[..., Server]) -> None:
    """Against Debian's memcached the --json object has the same contract."""
    server = memcached_factory("-t", "2")
    out = kvload_json(server, "--duration=0.5", "--batch-size=10")
    assert out.keys() >= JSON_KEYS
    assert out["ops"] > 0 and out["errors"] == 0 and 0.4 < out["duration_s"] < 5
