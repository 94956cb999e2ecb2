"""`kvprof probes`: the USDT probes of a running kvcached read from its ELF
notes, its semaphores read from its memory, live hit rates counted with real
BPF under load, clean detach, and one readable line for a PID it cannot use."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import load
import pytest
from support import KVPROF, NOBODY, REPO, Unprivileged, kvprof

from kvprof.collect.elf import ElfFile, open_process, read_probes
from kvprof.system.servers import Server, kvcached_binary

KVS_PROBES = {
    "conn__open", "conn__close", "cmd__start", "cmd__done", "item__create", "item__delete",
    "lock__wait__start", "lock__wait__done", "lock__hold", "atomic__sample", "stats__collect",
}  # fmt: skip
UPROBE_EVENTS = Path("/sys/kernel/tracing/uprobe_events")


def probes_json(pid: int, *args: str) -> dict[str, object]:
    done = kvprof("probes", "-p", str(pid), "--json", *args)
    assert done.returncode == 0, done.stderr
    data: dict[str, object] = json.loads(done.stdout)
    return data


def by_name(data: dict[str, object]) -> dict[str, dict[str, object]]:
    probes = data["probes"]
    assert isinstance(probes, list)
    return {p["name"]: p for p in probes}


def readelf_sites(binary: Path) -> list[tuple[str, str, int, int]]:
    """(provider, name, location, semaphore) of every stapsdt note, as `readelf -n` prints them."""
    out = subprocess.run(["readelf", "-n", str(binary)], capture_output=True, text=True, check=True).stdout
    found = re.findall(
        r"Provider: (\S+)\s+Name: (\S+)\s+"
        r"Location: (0x[0-9a-f]+), Base: 0x[0-9a-f]+, Semaphore: (0x[0-9a-f]+)",
        out,
    )
    return [(p, n, int(loc, 16), int(sem, 16)) for p, n, loc, sem in found]


def test_elf_notes_match_readelf() -> None:
    """The note parser finds exactly the sites, locations and semaphores `readelf -n` lists."""
    binary = kvcached_binary()
    ours = [(p.provider, p.name, p.location, p.semaphore) for p in read_probes(ElfFile(binary))]
    assert ours == readelf_sites(binary)
    assert {n for _, n, _, _ in ours} == KVS_PROBES


def test_lists_probes_without_attaching(kvcached_factory: Callable[..., Server]) -> None:
    """-d 0: all 10 kvs probes with sites, arguments and semaphore 0; the table fits 80 columns."""
    server = kvcached_factory("-t", "2")
    data = probes_json(server.pid, "-d", "0")
    probes = by_name(data)
    assert set(probes) == KVS_PROBES
    assert all(p["semaphore_value"] == 0 and p["hits"] is None for p in probes.values())
    assert all(p["semaphore"] and p["sites"] for p in probes.values())
    assert len(probes["atomic__sample"]["sites"]) > 1  # type: ignore[arg-type]
    assert probes["cmd__start"]["sites"][0]["arguments"][2].startswith("8@")  # type: ignore[index]
    done = kvprof("probes", "-p", str(server.pid), "-d", "0")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert lines[1].startswith(f"{len(KVS_PROBES)} USDT probes at") and lines[1].endswith(
        "; not counted (-d 0)"
    )
    assert any(
        re.match(r"kvs:atomic__sample +\d+ +0x[0-9a-f]+ +0x[0-9a-f]+ +0 +- *$", line) for line in lines
    )


def kvs_semaphores(pid: int) -> dict[str, int]:
    """Every kvs semaphore of the process, read here independently of the command."""
    from kvprof.collect.elf import load_bias, read_semaphores

    process = open_process(pid)
    elf = ElfFile(process.image)
    sites = read_probes(elf)
    values = read_semaphores(process, sites, load_bias(process, elf))
    return {s.name: values[s.semaphore] for s in sites}


@pytest.mark.bpf
def test_counts_hits_under_load_and_detaches(kvcached_factory: Callable[..., Server]) -> None:
    """Under load with --probe-sample 1: cmd__* and atomic__sample hits/s > 0; afterwards every
    semaphore is 0, no uprobe of ours is left, and the server still serves."""
    server = kvcached_factory("-t", "2", "--probe-sample", "1")
    assert set(kvs_semaphores(server.pid).values()) == {0}
    ks = load.keys("pc-", 200)
    assert load.run(server.host, server.port, [load.set_batches(ks, "v" * 32, 50)]).stored == len(ks)
    proc = subprocess.Popen(
        [*KVPROF, "probes", "-p", str(server.pid), "-d", "1", "--json"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Keep load on the server from before the counters attach until the command ends.
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            totals = load.run_processes(server.host, server.port, 2, "pc-", 200, 50, 8, duration=1.5)
            assert totals.failures == [] and totals.get_keys > 0, totals
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    data = json.loads(out)
    probes = by_name(data)
    assert set(probes) == KVS_PROBES
    assert all(p["semaphore_value"] == 0 for p in probes.values()), (
        "a semaphore was raised before we attached"
    )
    for name in ("cmd__start", "cmd__done", "atomic__sample"):
        assert probes[name]["hits_per_sec"] > 0, (name, probes[name])  # type: ignore[operator]
    # each of the 2 workers between a request's start and its done, at either end of the window
    assert probes["cmd__start"]["hits"] == pytest.approx(probes["cmd__done"]["hits"], abs=4)
    assert 0.9 < data["window_s"] < 3.0  # type: ignore[operator]
    # Detached: semaphores back to 0 (in our own reading, and in the command's after-read),
    # no uprobe named after the command's PID, and the server answers with its data intact.
    assert all(p["semaphore_value_after"] == 0 for p in probes.values())
    assert set(kvs_semaphores(server.pid).values()) == {0}
    if UPROBE_EVENTS.exists():
        left = [line for line in UPROBE_EVENTS.read_text().splitlines() if f"bcc_{proc.pid}" in line]
        assert not left, left
    assert server.alive()
    check = load.run(server.host, server.port, [load.multiget_batches(ks, 50, 4, 1)])
    assert check.complete and check.hits == check.get_keys == len(ks), check


def test_no_such_pid() -> None:
    """A PID that does not exist: one line, exit 2, no traceback."""
    done = kvprof("probes", "-p", "999999999", "-d", "0")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "kvprof probes: no process with PID 999999999\n"


def test_kernel_thread() -> None:
    """A kernel thread (kthreadd, PID 2): says it has no executable, exit 2."""
    done = kvprof("probes", "-p", "2", "-d", "0")
    assert done.returncode == 2
    assert re.fullmatch(r"kvprof probes: PID 2 \(\w+\) is a kernel thread.*\n", done.stderr), done.stderr


def test_process_without_probes() -> None:
    """A process whose executable has no USDT notes: says so, exit 0, nothing attached."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        done = kvprof("probes", "-p", str(sleeper.pid))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"PID {sleeper.pid} (sleep): /usr/bin/sleep has no USDT probes\n"


def test_not_ours_to_trace(kvcached_factory: Callable[..., Server], unprivileged: Unprivileged) -> None:
    """An ordinary user on root's kvcached: one line saying to run as root, exit 2."""
    server = kvcached_factory("-t", "1")
    done = unprivileged.run(unprivileged.kvprof("probes", "-p", str(server.pid)))
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (
        f"kvprof probes: PID {server.pid} is not ours to trace (permission denied reading /proc): "
        "run kvprof as root (sudo)\n"
    )


def test_non_root_cannot_count(unprivileged: Unprivileged) -> None:
    """An ordinary user on a kvcached of its own: one line, exit 2, no traceback."""
    kvcached = subprocess.Popen(
        [unprivileged.kvcached, "-l", "127.0.0.1", "-p", "0", "-t", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd="/",
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
    )
    try:
        time.sleep(0.3)
        assert kvcached.poll() is None, "kvcached did not start as nobody"
        done = unprivileged.run(unprivileged.kvprof("probes", "-p", str(kvcached.pid)))
    finally:
        kvcached.send_signal(signal.SIGTERM)
        kvcached.wait(10)
    assert (done.returncode, done.stdout) == (2, ""), done
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    # Either its memory is closed to us (Yama ptrace_scope) or BPF needs root: both name the fix.
    assert "root" in done.stderr and done.stderr.startswith("kvprof probes: "), done.stderr
