"""The four contention sites of kvcached, through its own stats (no root).

The same exact workload must give the same totals whichever design a site
uses (`shared` or `per-thread`); `stats settings` must report each site's
mode as the flags set it; and the shared `topkeys` mutex must really be
contended under load while the per-thread tables never are.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable

import load
import pytest

from kvprof.system.servers import Server, kvcached_binary

SITES = ["collect_timings", "update_topkeys", "on_create_item", "on_delete_item", "account_memory"]
FLAGS = {
    "--timings": ["collect_timings"],
    "--topkeys": ["update_topkeys"],
    "--item-counter": ["on_create_item", "on_delete_item"],
    "--memory-counter": ["account_memory"],
}
MODE = {"baseline": "shared", "fixed": "per-thread"}
OTHER = {"shared": "per-thread", "per-thread": "shared"}

# ---- one exact workload ----------------------------------------------------

HOT = load.keys("hot-", 3)
REGULAR = load.keys("reg-", 45)
MISSING = load.keys("miss-", 4)  # 52 distinct keys: fewer than a 64-key topkeys table, so counts are exact
CONNECTIONS = 2
GET_BATCHES, GETS_PER_BATCH, WINDOW = 30, 4, 16


def value_for(key: str) -> str:
    """Value lengths differ per key, so `bytes` accounting is not a multiple of one size."""
    return "v" * (8 + sum(map(ord, key)) % 23)


def plan(conn: int) -> list[list[load.Command]]:
    """Connection `conn`: set every stored key, then multi-gets of hot + a window + one missing key."""
    batches = load.set_batches(HOT + REGULAR, value_for, 16)
    i = conn * 7  # the connections walk the keys from different places
    for _ in range(GET_BATCHES):
        batch = []
        for _ in range(GETS_PER_BATCH):
            window = [REGULAR[(i + j) % len(REGULAR)] for j in range(WINDOW)]
            batch.append(load.get([*HOT, *window, MISSING[i % len(MISSING)]]))
            i += WINDOW
        batches.append(batch)
    return batches


def expected_key_counts(plans: list[list[list[load.Command]]]) -> Counter[str]:
    """Accesses per key: each set once, each key of a multi-get once."""
    return Counter(k for p in plans for b in p for c in b for k in c.keys)


def topkeys(server: Server) -> tuple[int, dict[str, tuple[int, int]]]:
    """(topkeys_total, {key: (count, error)}) from `stats topkeys`."""
    s = server.stats("topkeys")
    keys = {}
    for name, value in s.items():
        if name.startswith("topkey:"):
            fields = dict(kv.split("=", 1) for kv in value.split(","))
            keys[name[len("topkey:") :]] = (int(fields["count"]), int(fields["error"]))
    return int(s["topkeys_total"]), keys


def wait_idle(server: Server, timeout: float = 5.0) -> dict[str, str]:
    """`stats` once item objects and accounted memory have settled on the stored items."""
    deadline = time.monotonic() + timeout
    while True:
        s = server.stats()
        settled = s["item_objects"] == s["curr_items"] and s["mem_accounted"] == s["bytes"]
        if settled or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


@pytest.mark.parametrize("preset", ["baseline", "fixed"])
def test_same_exact_totals_in_both_designs(kvcached_factory: Callable[..., Server], preset: str) -> None:
    """One exact workload gives the exact timings, topkeys and general totals under either preset."""
    server = kvcached_factory("--preset", preset, "-t", "2")
    plans = [plan(c) for c in range(CONNECTIONS)]
    counts = expected_key_counts(plans)
    sets = CONNECTIONS * len(HOT + REGULAR)
    get_keys = CONNECTIONS * GET_BATCHES * GETS_PER_BATCH * (len(HOT) + WINDOW + 1)
    misses = CONNECTIONS * GET_BATCHES * GETS_PER_BATCH
    assert sum(counts.values()) == sets + get_keys

    totals = load.run(server.host, server.port, plans)
    assert totals.complete, totals.failures
    assert (totals.sets, totals.stored, totals.get_keys, totals.misses) == (sets, sets, get_keys, misses)

    timings = server.stats("timings")
    assert int(timings["get:count"]) == get_keys
    assert int(timings["set:count"]) == sets
    assert int(timings["total:count"]) == get_keys + sets
    assert sum(int(b) for b in timings["get:log2_ns"].split(",")) == get_keys

    total, keys = topkeys(server)
    assert total == get_keys + sets
    for key in HOT:
        assert keys[key] == (counts[key], 0), f"{key}: {keys.get(key)} != ({counts[key]}, 0)"
    for key, (count, error) in keys.items():
        assert (count, error) == (counts[key], 0), f"{key}: count={count},error={error} vs {counts[key]}"
    assert len(keys) == min(20, len(counts))

    general = wait_idle(server)
    assert int(general["cmd_get"]) == get_keys
    assert int(general["cmd_set"]) == sets
    assert int(general["get_hits"]) == get_keys - misses
    assert int(general["get_misses"]) == misses
    assert int(general["curr_items"]) == len(HOT + REGULAR)
    assert int(general["bytes"]) > sum(len(k) + len(value_for(k)) for k in HOT + REGULAR)
    assert general["item_objects"] == general["curr_items"], general
    assert general["mem_accounted"] == general["bytes"], general


# ---- stats settings ----------------------------------------------------------


def site_modes(server: Server) -> tuple[str, dict[str, str]]:
    s = server.stats("settings")
    return s["preset"], {site: s[site] for site in SITES}


@pytest.mark.parametrize("preset", ["baseline", "fixed"])
def test_settings_report_the_preset(kvcached_factory: Callable[..., Server], preset: str) -> None:
    """`stats settings` reports baseline as every site shared and fixed as every site per-thread."""
    server = kvcached_factory("--preset", preset, "-t", "2")
    assert site_modes(server) == (preset, dict.fromkeys(SITES, MODE[preset]))


def test_settings_default_is_baseline(kvcached_factory: Callable[..., Server]) -> None:
    """Without --preset every site is shared and the preset is baseline."""
    server = kvcached_factory("-t", "2")
    assert site_modes(server) == ("baseline", dict.fromkeys(SITES, "shared"))


@pytest.mark.parametrize("flag_first", [False, True], ids=["preset-then-flag", "flag-then-preset"])
@pytest.mark.parametrize("preset", ["baseline", "fixed"])
@pytest.mark.parametrize("flag", list(FLAGS))
def test_site_flag_flips_only_its_site(
    kvcached_factory: Callable[..., Server], flag: str, preset: str, flag_first: bool
) -> None:
    """Each per-site flag flips only its site(s), before or after --preset; the preset reads custom."""
    flipped = OTHER[MODE[preset]]
    args = [flag, flipped, "--preset", preset] if flag_first else ["--preset", preset, flag, flipped]
    server = kvcached_factory(*args, "-t", "2")
    expected = {site: flipped if site in FLAGS[flag] else MODE[preset] for site in SITES}
    assert site_modes(server) == ("custom", expected)


# ---- the topkeys mutex under load -------------------------------------------

LOAD_SECONDS = 3.0
NKEYS, KEYS_PER_GET, GETS_PER_BATCH_HEAVY = 200, 100, 8


def locks(server: Server) -> dict[str, tuple[int, int]]:
    """`stats locks` as name -> (contended, wait_ns)."""
    s = server.stats("locks")
    return {
        n.split(":", 1)[0]: (int(s[n]), int(s[n.replace(":contended", ":wait_ns")]))
        for n in s
        if n.endswith(":contended")
    }


def contend(server: Server) -> tuple[dict[str, tuple[int, int]], load.Totals]:
    """Two processes, one connection each (one per worker), hammering multi-gets; the lock deltas."""
    populated = load.run(server.host, server.port, [load.set_batches(load.keys("tk-", NKEYS), "x" * 32, 50)])
    assert populated.stored == NKEYS
    before = locks(server)
    totals = load.run_processes(
        server.host, server.port, 2, "tk-", NKEYS, KEYS_PER_GET, GETS_PER_BATCH_HEAVY, duration=LOAD_SECONDS
    )
    after = locks(server)
    assert totals.failures == [] and totals.hits == totals.get_keys > 0, totals
    delta = {n: (after[n][0] - before[n][0], after[n][1] - before[n][1]) for n in after}
    return delta, totals


def test_topkeys_mutex_contended_under_baseline(kvcached_factory: Callable[..., Server]) -> None:
    """Under --preset baseline -t 2, two loaded connections contend on the shared topkeys mutex."""
    server = kvcached_factory("--preset", "baseline", "-t", "2")
    delta, totals = contend(server)
    contended, wait_ns = delta["topkeys"]
    print(
        f"\nbaseline: {totals.get_keys / totals.elapsed_s:,.0f} keys/s, topkeys contended "
        f"{contended} ({contended / totals.elapsed_s:,.0f}/s, "
        f"{contended / totals.get_keys:.2%} of accesses), "
        f"wait {wait_ns / 1e6:.1f} ms; all locks {delta}"
    )
    assert contended > 0 and wait_ns > 0, delta


def test_topkeys_never_contended_under_fixed(kvcached_factory: Callable[..., Server]) -> None:
    """Under --preset fixed -t 2, the same load never contends on topkeys (per-thread tables)."""
    server = kvcached_factory("--preset", "fixed", "-t", "2")
    delta, totals = contend(server)
    print(f"\nfixed: {totals.get_keys / totals.elapsed_s:,.0f} keys/s; all locks {delta}")
    assert delta["topkeys"] == (0, 0), delta
    assert delta["topkeys_thread"] == (0, 0), "nobody else takes a worker's own table lock without stats"


# ---- worker placement -------------------------------------------------------


def _allowed_cpus(pid: int, tid: int) -> str:
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        return next(line.split()[1] for line in f if line.startswith("Cpus_allowed_list:"))


def _workers(server: Server) -> dict[int, str]:
    """Worker index -> the CPUs it may run on, for each thread named kv-worker-N now."""
    workers = {}
    for tid in os.listdir(f"/proc/{server.pid}/task"):
        with open(f"/proc/{server.pid}/task/{tid}/comm") as f:
            name = f.read().strip()
        if name.startswith("kv-worker-"):
            workers[int(name.rsplit("-", 1)[1])] = _allowed_cpus(server.pid, int(tid))
    return workers


def test_cpu_affinity_pins_workers_round_robin(kvcached_factory: Callable[..., Server]) -> None:
    """--cpu-affinity LIST pins worker i to LIST[i % len], already when the server says
    it listens; `stats settings` says so."""
    cpus = sorted(os.sched_getaffinity(0))
    wanted = [cpus[0], cpus[-1]]
    server = kvcached_factory("-t", "3", "--cpu-affinity", f"{wanted[0]},{wanted[1]}")
    assert _workers(server) == {i: str(wanted[i % 2]) for i in range(3)}
    assert server.stats("settings")["cpu_affinity"] == f"{wanted[0]},{wanted[1]}"


@pytest.mark.kvcached_only("kv-worker-N is kvcached's name for its workers")
def test_every_worker_is_named_when_the_server_says_it_listens(
    kvcached_factory: Callable[..., Server],
) -> None:
    """What reads the threads as soon as kvcached says it listens (kvprof attaching, a
    test pinning them) finds every worker under its name, start after start."""
    for _ in range(10):
        server = kvcached_factory("-t", "8")
        assert sorted(_workers(server)) == list(range(8))
        server.stop()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x", "wants CPU numbers and ranges like 0,2-3, not 'x'"),
        ("1-0", "not '1-0'"),
        ("0,", "not '0,'"),
        ("100000", "names CPU 100000, which is not available to this process"),
    ],
)
def test_cpu_affinity_bad_lists_refused(value: str, message: str) -> None:
    """A bad --cpu-affinity is a usage error (exit 64) that names the problem."""
    done = subprocess.run(
        [str(kvcached_binary()), "-p", "0", "--cpu-affinity", value],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 64, done
    assert message in done.stderr and done.stderr.count("\n") == 1, done.stderr
