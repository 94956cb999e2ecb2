"""The kvs collectors (locks, cachelines, requests) on real kvcached under real
kvload with real BPF, checked against the server's own counters, a fake
two-socket topology, and a small pinned program whose samples are exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from support import assert_detached, pin_workers, worker_tids

from kvprof.collect import CollectOptions
from kvprof.collect.cachelines import CachelinesCollector, classify_transfers
from kvprof.collect.locks import LocksCollector
from kvprof.collect.requests import RequestsCollector, opcode_names
from kvprof.model.histogram import hist_percentile, log2_slot
from kvprof.model.profile import CacheLineStat, Profile, Target
from kvprof.model.topology import Topology
from kvprof.system.servers import Server, kvload_binary

SITES = ["collect_timings", "on_create_item", "on_delete_item", "account_memory"]
ITEMS = 2000
ENOUGH_WAITS, ENOUGH_ROUNDS = 20, 6  # topkeys waits the baseline test loads for, in rounds of load
# Several connections, small batches: both workers busy at once, so shared
# lines bounce between samples (large batches let one worker run alone).
LOAD = ["--num-threads", "1", "--connections", "8", "--batch-size", "8", "--set-pct", "5",
        "--key-dist", "zipf:0.99", "--num-items", str(ITEMS)]  # fmt: skip


def kvload(server: Server, *args: str, timeout: float = 60) -> dict[str, object]:
    """Run kvload to completion against `server`; its --json summary."""
    out = subprocess.run(
        [str(kvload_binary()), "--server", server.address, "--json", "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    summary: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return summary


def fake_topology(root: Path, sockets: dict[int, int]) -> Topology:
    """A sysfs tree under `root` with cpu -> socket as given, read back."""
    for cpu, socket in sockets.items():
        topo = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "core_id").write_text(f"{cpu}\n")
        (topo / "physical_package_id").write_text(f"{socket}\n")
    return Topology.read(root)


def per_site(lines: list[CacheLineStat]) -> dict[str, tuple[int, int, int]]:
    """site -> (samples, transfers, cross-socket transfers) over all its lines."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for c in lines:
        agg = out[c.site]
        agg[0] += c.samples
        agg[1] += c.transfers
        agg[2] += c.cross_socket_transfers
    return {site: (a[0], a[1], a[2]) for site, a in out.items()}


# ---- pure parts -----------------------------------------------------------


def test_transfer_rule_on_synthetic_sequences() -> None:
    """The reference transfer rule counts same/cross-socket transfers and the matrix exactly."""
    socket_of = {0: 0, 1: 0, 2: 1, 3: 1}
    a, b = 0x1000, 0x1008  # one line (false sharing)
    c = 0x2000  # another line
    seq = [(a, 0), (b, 0), (a, 1), (c, 2), (b, 2), (a, 3), (c, 2), (b, 0), (c, 3), (a, 3)]
    got = classify_transfers(seq, socket_of, 2)
    line_a, line_c = got[0x1000], got[0x2000]
    # line a: 0 0 1 2 3 0 3 -> transfers 0->1 (same), 1->2 (cross), 2->3 (same), 3->0 (cross), 0->3 (cross)
    assert (line_a.samples, line_a.transfers, line_a.cross_socket, line_a.same_socket) == (7, 5, 3, 2)
    assert line_a.matrix == [[1, 2], [1, 1]]
    # line c: 2 2 3 -> one same-socket transfer on socket 1
    assert (line_c.samples, line_c.transfers, line_c.cross_socket) == (3, 1, 0)
    assert line_c.matrix == [[0, 0], [0, 1]]
    assert classify_transfers([(a, 0)] * 5, socket_of, 2)[0x1000].transfers == 0


def test_log2_histogram_helpers() -> None:
    """Buckets are [2^i, 2^(i+1)) with 0 in bucket 0; percentiles land in the right bucket."""
    assert [log2_slot(v) for v in (0, 1, 2, 3, 4, 1023, 1024)] == [0, 0, 1, 1, 2, 9, 10]
    hist = [0] * 64
    hist[10] = 98  # 1024..2047 ns
    hist[20] = 2  # ~1 ms
    assert 1024 <= hist_percentile(hist, 0.5) < 2048
    assert 2**20 <= hist_percentile(hist, 0.99) < 2**21
    assert hist_percentile([0] * 64, 0.5) == 0


def test_opcode_names_follow_the_header() -> None:
    """Opcode names come from server/opcodes.h (tests/test_contracts.py checks it number for number)."""
    names = opcode_names()
    assert names[0] == "get" and names[4] == "set" and names[14] == "flush_all" and len(names) == 15


def test_not_applicable_to_memcached(memcached_factory: Callable[..., Server]) -> None:
    """Against Debian's memcached every kvs collector says why it does not apply."""
    server = memcached_factory("-t", "2")
    opts = CollectOptions()
    for cls, words in ((LocksCollector, "futex"), (CachelinesCollector, "atomic__sample"),
                       (RequestsCollector, "cmd__done")):  # fmt: skip
        reason = cls(server.pid, opts).applies()
        assert reason is not None and reason.startswith("no kvs probes in ") and "memcached" in reason
        assert words in reason, reason


# ---- real BPF on kvcached ---------------------------------------------------


@pytest.mark.bpf
def test_kvs_collectors_on_baseline(kvcached_factory: Callable[..., Server]) -> None:
    """Baseline under load: topkeys waits per worker match `stats locks`; sites bounce; gets timed."""
    # every contended wait fires (by default the short ones are sampled): the counts can match
    server = kvcached_factory("--preset", "baseline", "-t", "2", "--lock-sample", "1")
    kvload(server, "--populate-only", "--num-items", str(ITEMS))
    opts = CollectOptions()
    collectors = [LocksCollector(server.pid, opts), CachelinesCollector(server.pid, opts),
                  RequestsCollector(server.pid, opts)]  # fmt: skip
    assert [c.applies() for c in collectors] == [None, None, None]
    before = server.stats("locks")
    profile = Profile(Target(server.pid, kvs_probes=True))
    pin_workers(server)  # one worker per CPU: they meet on the shared sites even beside a CPU hog
    try:
        for c in collectors:
            c.start()
        # Contention needs both workers running at once, which a busy machine makes rare:
        # load in 3 s rounds until the server itself counted enough topkeys waits (bounded).
        for _ in range(ENOUGH_ROUNDS):
            kvload(server, *LOAD, "--no-population", "--duration", "3")
            if (
                int(server.stats("locks")["topkeys:contended"]) - int(before["topkeys:contended"])
                >= ENOUGH_WAITS
            ):
                break
    finally:
        for c in collectors:
            c.close()
    after = server.stats("locks")
    assert_detached(server)
    for c in collectors:
        c.contribute(profile)  # what was read at close

    workers = worker_tids(server)
    locks = {lk.name: lk for lk in profile.locks}
    assert "topkeys" in locks, f"no topkeys waits; locks seen: {sorted(locks)}"
    topkeys = locks["topkeys"]
    assert {int(t) for t in topkeys.by_thread} == set(workers), topkeys.by_thread
    assert all(w.waits > 0 and w.wait_ns > 0 for w in topkeys.by_thread.values())
    truth_waits = int(after["topkeys:contended"]) - int(before["topkeys:contended"])
    truth_ns = int(after["topkeys:wait_ns"]) - int(before["topkeys:wait_ns"])
    assert abs(topkeys.waits - truth_waits) <= 0.1 * truth_waits, (topkeys.waits, truth_waits)
    assert abs(topkeys.wait_ns - truth_ns) <= 0.1 * truth_ns, (topkeys.wait_ns, truth_ns)
    assert sum(topkeys.hist_log2_ns) == topkeys.waits and topkeys.max_ns <= topkeys.wait_ns
    assert any("update_topkeys" in s.frames for s in topkeys.stacks), topkeys.stacks[:3]
    for tid in workers:
        assert profile.threads[str(tid)].lock_wait_ns >= topkeys.by_thread[str(tid)].wait_ns
        assert profile.threads[str(tid)].name.startswith("kv-worker-")

    sites = per_site(profile.cachelines)
    assert set(sites) == set(SITES), sorted(sites)
    for site, (samples, transfers, _) in sites.items():
        assert transfers > 0, f"{site}: {samples} samples, no transfer under baseline"
    sockets = opts.topology.sockets
    for c in profile.cachelines:
        assert sum(map(sum, c.socket_matrix)) == c.transfers
        assert sum(t.samples for t in c.by_thread.values()) == c.samples
        assert sum(c.hist_log2_cycles) == c.samples and c.cycles_max >= c.cycles_mean > 0
        if len(sockets) == 1:  # this machine: one socket, nothing crosses
            assert c.cross_socket_transfers == 0 and c.socket_matrix == [[c.transfers]]
    # each sample counted as the updates and requests it stands for: no rate to multiply by
    assert not {"atomic__sample", "cmd__done"} & set(profile.status.sample_rates), profile.status.sample_rates

    assert profile.requests["get"].count > 0
    get = profile.requests["get"]
    assert sum(get.hist_log2_ns) == get.count and 0 < get.p50_ns <= get.p99_ns


@pytest.mark.bpf
def test_fake_two_sockets_and_fixed_preset(kvcached_factory: Callable[..., Server], tmp_path: Path) -> None:
    """With cpu0/cpu1 on two fake sockets every baseline transfer is cross-socket; fixed bounces less.

    Less, not a factor: with other work on the pinned CPUs fixed's per-thread
    lines still move now and then, by how much depends on that work."""
    topo = fake_topology(tmp_path, {0: 0, 1: 1})
    assert topo.sockets == [0, 1]
    rates: dict[str, dict[str, float]] = {}
    for preset in ("baseline", "fixed"):
        server = kvcached_factory("--preset", preset, "-t", "2")
        pin_workers(server)  # what fixed still shows is then not the scheduler moving threads
        kvload(server, "--populate-only", "--num-items", str(ITEMS))
        collector = CachelinesCollector(server.pid, CollectOptions(topology=topo))
        try:
            collector.start()
            kvload(server, *LOAD, "--no-population", "--duration", "3")
        finally:
            collector.close()
        assert_detached(server)
        profile = Profile(Target(server.pid))
        collector.contribute(profile)
        sites = per_site(profile.cachelines)
        assert set(sites) == set(SITES), sorted(sites)
        rates[preset] = {site: transfers / samples for site, (samples, transfers, _) in sites.items()}
        for c in profile.cachelines:
            assert c.cross_socket_transfers == c.transfers, c
            assert c.socket_matrix[0][0] == c.socket_matrix[1][1] == 0, c.socket_matrix
            assert c.socket_matrix[0][1] + c.socket_matrix[1][0] == c.transfers
        if preset == "baseline":
            assert all(sites[s][1] > 0 for s in SITES), sites
    for site in SITES:
        assert rates["fixed"][site] < rates["baseline"][site], (site, rates)


PINNED_C = textwrap.dedent(
    r"""
    #define _GNU_SOURCE
    #include <sched.h>
    #include <stdint.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <sys/sdt.h>

    static uint64_t counters[16] __attribute__((aligned(64)));

    static void pin(int cpu)
    {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0) {
            perror("sched_setaffinity");
            exit(1);
        }
    }

    /* argv[1]: the CPU of each sample, e.g. "0011101"; runs when stdin says go */
    int main(int argc, char **argv)
    {
        char line[16];
        printf("ready\n");
        fflush(stdout);
        if (argc < 2 || !fgets(line, sizeof(line), stdin))
            return 2;
        for (const char *c = argv[1]; *c; c++) {
            pin(*c - '0');
            uint64_t cycles = 100;
            int weight = 1; /* each update sampled */
            __asm__ volatile("" : "+r"(cycles), "+r"(weight)); /* registers: BCC 0.26 reads `$100` as 0 */
            __atomic_fetch_add(&counters[(c - argv[1]) % 8], 1, __ATOMIC_RELAXED);
            DTRACE_PROBE4(kvs, atomic__sample, &counters[(c - argv[1]) % 8], "pinned_site", cycles, weight);
        }
        printf("done\n");
        fflush(stdout);
        return fgets(line, sizeof(line), stdin) ? 0 : 0;
    }
    """
)


@pytest.mark.bpf
def test_exact_transfers_from_a_pinned_program(tmp_path: Path) -> None:
    """A program pinned to cpu0/cpu1 in a known order gives exact transfer counts and matrix."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two CPUs to move a cache line between them")
    src, exe = tmp_path / "pinned.c", tmp_path / "pinned"
    src.write_text(PINNED_C)
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True, timeout=60)
    order = "0011101" * 10 + "0"  # 71 samples on one line
    expected_01 = order.count("01")
    expected_10 = order.count("10")
    topo = fake_topology(tmp_path / "sys", {0: 0, 1: 1})
    proc = subprocess.Popen([str(exe), order], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    collector = CachelinesCollector(proc.pid, CollectOptions(topology=topo))
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "ready\n"
        assert collector.applies() is None
        collector.start()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"
    finally:
        collector.close()
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=10)
    profile = Profile(Target(proc.pid))
    collector.contribute(profile)
    (line,) = profile.cachelines
    assert line.site == "pinned_site" and line.samples == len(order)
    reference = classify_transfers([(line.line, int(c)) for c in order], {0: 0, 1: 1}, 2)[line.line]
    assert line.transfers == reference.transfers == expected_01 + expected_10
    assert line.cross_socket_transfers == line.transfers
    assert line.socket_matrix == reference.matrix == [[0, expected_01], [expected_10, 0]]
    assert line.cycles_mean == 100 and line.hist_log2_cycles[6] == len(order)
