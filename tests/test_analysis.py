"""The hotspot catalog and the findings, on hand-made profiles (no root).

`baseline_profile()` and `fixed_profile()` are shaped like a 5 s recording
of kvcached -t 2 under kvload, --preset baseline and --preset fixed: the
numbers follow docs/demo.md (~700k ops/s, ~15k topkeys waits/s, ~34 ms/s of
waiting) and kvcached's probe sampling (atomic__sample 1 in 64).
tests/test_report.py renders the same profiles.
"""

from __future__ import annotations

import pytest

from kvprof.analysis import CATALOG, Thresholds, find, match_function, match_lock, match_site
from kvprof.analysis.findings import rank_key, summary
from kvprof.analysis.hotspots import call_site
from kvprof.model.profile import (
    CacheLineStat,
    CpuStack,
    FutexWait,
    Host,
    LineThread,
    LockStack,
    LockStat,
    OffCpu,
    OffCpuStack,
    Profile,
    RequestStat,
    Status,
    Target,
    ThreadInfo,
    ThreadWaits,
    Window,
)

MAIN, W0, W1 = "4100", "4101", "4102"
DURATION, HZ, RATE = 5.0, 99, 64
TOPKEYS_LOCK = 0x55D0_0000_1000
WORKER = ["start_thread", "worker_main", "ev_run", "conn_on_readable", "process_command"]


def _stacks(tid: str, topkeys: int) -> list[CpuStack]:
    """On-CPU stacks of one worker: mostly socket I/O, plus the four contention sites."""
    t = int(tid)
    get = [*WORKER, "process_get"]
    return [
        CpuStack(t, [*WORKER, "conn_write", "__libc_writev", "tcp_sendmsg_locked_[k]"], 90),
        CpuStack(t, [*WORKER, "conn_read", "__libc_read", "tcp_recvmsg_[k]"], 50),
        CpuStack(t, [*get, "update_topkeys"], topkeys),
        CpuStack(t, [*get, "collect_timings"], 12),
        CpuStack(t, [*get, "item_copy", "on_create_item"], 9),
        CpuStack(t, [*get, "item_copy", "account_memory"], 7),
        CpuStack(t, [*get, "hash_find"], 20),
        CpuStack(t, [*get, "item_copy", "__memmove_avx_unaligned_erms"], 25),
    ]


def _line(
    site: str, line: int, samples: int, transfers: int, cycles: float, tids: list[str]
) -> CacheLineStat:
    """A cache line sampled at `site`, its samples and transfers split evenly over `tids`."""
    per = samples // len(tids)
    return CacheLineStat(
        site=site,
        line=line,
        samples=per * len(tids),
        transfers=transfers,
        cross_socket_transfers=0,
        cycles_mean=cycles,
        cycles_max=int(cycles * 20),
        hist_log2_cycles=[],
        socket_matrix=[[transfers]],
        by_thread={t: LineThread(per, transfers // len(tids), cycles) for t in tids},
    )


def _profile(locks: list[LockStat], lines: list[CacheLineStat], topkeys_cpu: int) -> Profile:
    """A kvcached -t 2 recording with the given lock and cache-line sections."""
    oncpu = _stacks(W0, topkeys_cpu) + _stacks(W1, topkeys_cpu)
    oncpu.append(CpuStack(int(MAIN), ["main", "listener_accept", "accept4"], 2))
    per_thread = {W0: 0, W1: 0, MAIN: 0}
    for s in oncpu:
        per_thread[str(s.tid)] += s.count
    idle = ["start_thread", "worker_main", "ev_run", "epoll_wait", "do_epoll_wait_[k]", "schedule_[k]"]
    return Profile(
        target=Target(
            pid=int(MAIN),
            comm="kvcached",
            exe="/work/main/server/build/kvcached",
            cmdline=["kvcached", "-p", "0", "-t", "2"],
            kvs_probes=True,
        ),
        host=Host(
            kernel="6.1.0-test",
            cpus=2,
            topology={"0": {"core": 0, "socket": 0, "node": 0}, "1": {"core": 1, "socket": 0, "node": 0}},
        ),
        window=Window(start=1_700_000_000.0, duration_s=DURATION),
        hz=HZ,
        collectors=["oncpu", "offcpu", "locks", "cachelines", "requests"],
        threads={
            MAIN: ThreadInfo(
                name="kvcached",
                cpu_samples=per_thread[MAIN],
                sockets={"0": per_thread[MAIN]},
                stack_quality=0.0,
            ),
            W0: ThreadInfo(
                name="kv-worker-0",
                cpu_samples=per_thread[W0],
                sockets={"0": per_thread[W0]},
                stack_quality=0.02,
            ),
            W1: ThreadInfo(
                name="kv-worker-1",
                cpu_samples=per_thread[W1],
                sockets={"0": per_thread[W1]},
                stack_quality=0.03,
            ),
        },
        oncpu=oncpu,
        offcpu=OffCpu(
            stacks=[
                OffCpuStack(int(W0), idle, 1_500_000_000),
                OffCpuStack(int(W1), idle, 1_400_000_000),
                OffCpuStack(int(MAIN), ["main", "listener_run", "epoll_wait"], 4_900_000_000),
            ],
            futex=[
                FutexWait(
                    int(t),
                    TOPKEYS_LOCK,
                    [*WORKER, "update_topkeys", "kv_lock_contended", "__lll_lock_wait"],
                    30_000,
                    80_000_000,
                )
                for t in (W0, W1)
            ]
            if locks
            else [],
        ),
        locks=locks,
        cachelines=lines,
        requests={
            "get": RequestStat(count=52_000, p50_ns=2_100, p99_ns=41_000),
            "set": RequestStat(count=2_700, p50_ns=3_300, p99_ns=60_000),
        },
        status=Status(
            collectors={"oncpu": "ok", "offcpu": "ok", "locks": "ok", "cachelines": "ok", "requests": "ok"},
            sample_rates={"cmd__start": RATE, "cmd__done": RATE, "atomic__sample": RATE},
        ),
    )


def baseline_profile() -> Profile:
    """kvcached --preset baseline: topkeys waits on both workers, four bouncing counter sites."""
    topkeys = LockStat(
        name="topkeys",
        address=TOPKEYS_LOCK,
        waits=76_000,
        wait_ns=172_000_000,
        max_ns=1_900_000,
        hist_log2_ns=[],
        by_thread={W0: ThreadWaits(39_000, 90_000_000), W1: ThreadWaits(37_000, 82_000_000)},
        stacks=[
            LockStack([*WORKER, "process_get", "update_topkeys", "kv_lock_contended"], 70_000, 160_000_000),
            LockStack([*WORKER, "process_set", "update_topkeys", "kv_lock_contended"], 6_000, 12_000_000),
        ],
    )
    item_lock = LockStat(
        name="item_lock",
        address=0x55D0_0000_8000,
        waits=40,
        wait_ns=600_000,
        max_ns=90_000,
        by_thread={W0: ThreadWaits(22, 300_000), W1: ThreadWaits(18, 300_000)},
        stacks=[LockStack([*WORKER, "process_get", "item_get", "kv_lock_contended"], 40, 600_000)],
    )
    both = [W0, W1]
    # ~700k updates/s per site = 55k samples in 5 s at 1 in 64; 40 % of them find the line elsewhere
    lines = [
        _line("collect_timings", 0x55D0_0001_0040, 40_000, 16_000, 240.0, both),
        _line("collect_timings", 0x55D0_0001_0080, 15_000, 6_000, 230.0, both),
        _line("on_create_item", 0x55D0_0002_0000, 55_000, 22_000, 260.0, both),
        _line("on_delete_item", 0x55D0_0002_0000, 55_000, 22_000, 250.0, both),
        _line("account_memory", 0x55D0_0003_0000, 110_000, 44_000, 270.0, both),
    ]
    return _profile([topkeys, item_lock], lines, topkeys_cpu=30)


def fixed_profile() -> Profile:
    """kvcached --preset fixed: no topkeys waits, every counter line written by one thread."""
    lines = []
    for i, site in enumerate(["collect_timings", "on_create_item", "on_delete_item", "account_memory"]):
        for j, tid in enumerate((W0, W1)):
            # per-thread slots: a transfer only when the owner moved to the other CPU
            lines.append(_line(site, 0x55D0_0010_0000 + i * 0x1000 + j * 64, 30_000, 300, 38.0, [tid]))
    return _profile([], lines, topkeys_cpu=14)


def _by_id(findings: list, fid: str):  # type: ignore[no-untyped-def]
    """The finding with this id (fails the test when missing)."""
    hits = [f for f in findings if f.id == fid]
    assert hits, f"no finding {fid}; have {[f.id for f in findings]}"
    return hits[0]


# ---- the catalog --------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "hotspot"),
    [
        ("collect_timings", "timings"),
        ("mcbp_collect_timings", "timings"),
        ("Timings::collect(cb::mcbp::ClientOpcode, std::chrono::duration<long>)", "timings"),
        ("cb::Timings::collect", "timings"),
        ("update_topkeys", "topkeys"),
        ("on_create_item", "item-counter"),
        ("on_delete_item", "item-counter"),
        ("ObjectRegistry::onCreateItem(Item const*)", "item-counter"),
        ("ObjectRegistry::onDeleteItem", "item-counter"),
        ("account_memory", "memory-counter"),
        ("zmalloc", "memory-counter"),
        ("item_lock", "item-lock"),
        ("lru_pull_tail", "lru-lock"),
        ("kvcached+0x1a2b", None),
    ],
)
def test_catalog_matches_functions(frame: str, hotspot: str | None) -> None:
    """Each catalog function name (plain, qualified, with arguments) maps to its entry."""
    h = match_function(frame)
    assert (h.id if h else None) == hotspot


@pytest.mark.parametrize(
    "frame",
    [
        "main",
        "process_get",
        "collect_timings_v2",
        "my_update_topkeys",
        "zmalloc_size_x",
        "memcpy",
        "collect_timings_[k]",
        "TimingsCollector::run",
        "hash_find",
    ],
)
def test_catalog_ignores_other_functions(frame: str) -> None:
    """Names that merely resemble a catalog entry, and kernel frames, match nothing."""
    assert match_function(frame) is None


def test_catalog_matches_locks_and_sites() -> None:
    """Lock names and kvs site names map to their entries; the per-thread lock does not."""
    assert match_lock("topkeys").id == "topkeys"  # type: ignore[union-attr]
    assert match_lock("item_lock").id == "item-lock"  # type: ignore[union-attr]
    assert match_lock("lru").id == "lru-lock"  # type: ignore[union-attr]
    assert match_lock("stats_lock").id == "stat-mutex"  # type: ignore[union-attr]
    assert match_lock("topkeys_thread") is None
    assert match_lock("connq") is None
    for site, hid in [
        ("collect_timings", "timings"),
        ("on_create_item", "item-counter"),
        ("on_delete_item", "item-counter"),
        ("account_memory", "memory-counter"),
    ]:
        assert match_site(site).id == hid  # type: ignore[union-attr]
    assert match_site("my_counter") is None


def test_catalog_entries_are_complete() -> None:
    """Every entry has a unique id, something to match, a category, an explanation and a fix."""
    ids = [h.id for h in CATALOG]
    assert len(ids) == len(set(ids))
    for h in CATALOG:
        assert h.functions or h.locks or h.sites
        assert h.category in ("cpu", "lock", "cacheline", "offcpu")
        assert len(h.explanation) > 80 and h.fix


def test_call_site_skips_lock_plumbing() -> None:
    """The call site of a wait is the first frame above the lock wrappers and libc."""
    frames = [
        "main",
        "process_get",
        "update_topkeys",
        "kv_lock_contended",
        "___pthread_mutex_lock",
        "__lll_lock_wait",
        "libc.so.6+0x8a2f1",
        "futex_wait_[k]",
    ]
    assert call_site(frames) == "update_topkeys"


# ---- findings -----------------------------------------------------------------


def test_baseline_names_the_four_sites_with_per_thread_numbers() -> None:
    """Baseline: topkeys waits and the counter sites are found, each with both workers' numbers."""
    findings = find(baseline_profile())
    lock = _by_id(findings, "lock:topkeys")
    assert lock.severity in ("critical", "warning")
    assert lock.sites[0] == "update_topkeys" and lock.hotspot == "topkeys"
    assert "update_topkeys" in lock.title
    assert set(lock.per_thread) == {W0, W1}
    assert lock.thread_names == {W0: "kv-worker-0", W1: "kv-worker-1"}
    assert lock.per_thread[W0]["waits_per_s"] == pytest.approx(39_000 / DURATION)
    assert lock.cost["wait_ms_per_s"] == pytest.approx(172 / DURATION)
    assert lock.cost["wait_share"] == pytest.approx(0.172 / DURATION / 2)
    for site in ("collect_timings", "on_create_item", "on_delete_item", "account_memory"):
        f = _by_id(findings, f"cacheline:{site}")
        assert f.severity in ("critical", "warning"), (site, f.severity, f.cost)
        assert set(f.per_thread) == {W0, W1}
        assert all(row["transfers_per_s"] > 0 for row in f.per_thread.values())
        assert f.cost["sample_rate"] == RATE
        assert f"1 update in {RATE}" in f.explanation
    timings = _by_id(findings, "cacheline:collect_timings")
    assert timings.cost["updates_per_s"] == pytest.approx(55_000 * RATE / DURATION)
    assert timings.cost["transfers_per_s"] == pytest.approx(22_000 * RATE / DURATION)
    assert timings.cost["lines"] == 2
    assert _by_id(findings, "cacheline:account_memory").hotspot == "memory-counter"


def test_baseline_lock_futex_is_not_reported_twice() -> None:
    """The futex under the topkeys mutex is folded into the lock finding."""
    findings = find(baseline_profile())
    assert not [f for f in findings if f.id.startswith("futex:")]


def test_fixed_has_nothing_critical() -> None:
    """Fixed: no lock finding, the per-thread counter sites are at most info."""
    base = find(baseline_profile())
    fixed = find(fixed_profile())
    assert not [f for f in fixed if f.severity == "critical"], [(f.id, f.severity) for f in fixed]
    assert not [f for f in fixed if f.category == "lock"]
    for site in ("collect_timings", "on_create_item", "on_delete_item", "account_memory"):
        b = _by_id(base, f"cacheline:{site}").cost["transfers_per_s"]
        after = [f for f in fixed if f.id == f"cacheline:{site}"]
        if after:
            assert after[0].severity == "info"
            assert "not shared" in after[0].title
            assert after[0].cost["transfers_per_s"] * 10 <= b


def test_findings_are_ranked_by_severity_then_cost() -> None:
    """Critical before warning before info; within one severity the costlier first."""
    findings = find(baseline_profile())
    assert findings == sorted(findings, key=rank_key)
    ranks = [{"critical": 0, "warning": 1, "info": 2}[f.severity] for f in findings]
    assert ranks == sorted(ranks)
    crit = [f for f in findings if f.severity == "critical"]
    costs = [f.cost["est_s_per_s"] for f in crit]
    assert costs == sorted(costs, reverse=True)
    # account_memory is updated twice as often as the other sites: the costliest line
    assert findings[0].id == "cacheline:account_memory"


def test_thresholds_move_severity() -> None:
    """Raising the lock and CPU thresholds turns the topkeys finding from warning into info."""
    lax = Thresholds(
        lock_warning_share=0.5,
        lock_warning_ms_per_s=1000,
        lock_critical_share=0.9,
        lock_critical_ms_per_s=5000,
        hotspot_cpu_warning=0.5,
        hotspot_cpu_critical=0.9,
    )
    assert _by_id(find(baseline_profile(), lax), "lock:topkeys").severity == "info"


def test_sample_rate_defaults_to_one() -> None:
    """Without a recorded sample rate, cache-line counts are used as they are."""
    p = baseline_profile()
    p.status.sample_rates = {}
    f = _by_id(find(p), "cacheline:on_create_item")
    assert f.cost["updates_per_s"] == pytest.approx(55_000 / DURATION)
    assert "1 update in" not in f.explanation


def test_cpu_findings_for_catalog_and_hot_functions() -> None:
    """A catalog function's CPU share joins its lock finding; a hot user leaf gets its own."""
    p = baseline_profile()
    p.oncpu.append(CpuStack(int(W0), ["start_thread", "worker_main", "spin_forever"], 2000))
    findings = find(p)
    total = sum(s.count for s in p.oncpu)
    lock = _by_id(findings, "lock:topkeys")
    assert lock.cost["cpu_share"] == pytest.approx(60 / total)
    assert not [f for f in findings if f.id == "cpu:update_topkeys"]
    spin = _by_id(findings, "cpu:spin_forever")
    assert spin.severity == "warning" and spin.hotspot == ""
    assert spin.per_thread[W0]["samples"] == 2000
    assert "spin_forever" in summary(spin)
    kernel = _by_id(findings, "cpu:tcp_sendmsg_locked")
    assert kernel.severity == "info"  # syscall time is a lead, not a defect


def test_uncontended_catalog_function_says_so() -> None:
    """Fixed: update_topkeys still costs CPU, and the finding says its lock was never held."""
    f = _by_id(find(fixed_profile()), "cpu:update_topkeys")
    assert f.severity != "critical"
    assert "not found held" in f.title


def test_generic_futex_and_offcpu_findings() -> None:
    """A program without kvs probes: a contended futex and blocking off-CPU time are found."""
    p = Profile(
        target=Target(pid=10, comm="prog"),
        window=Window(duration_s=2.0),
        hz=99,
        threads={"11": ThreadInfo(name="worker"), "12": ThreadInfo(name="worker")},
        offcpu=OffCpu(
            stacks=[
                OffCpuStack(11, ["main", "load_file", "read", "ext4_read_[k]"], 1_500_000_000),
                OffCpuStack(12, ["main", "epoll_wait"], 2_000_000_000),
            ],
            futex=[
                FutexWait(
                    t,
                    0x7000,
                    ["main", "bump_stat", "pthread_mutex_lock", "__lll_lock_wait"],
                    5000,
                    300_000_000,
                )
                for t in (11, 12)
            ],
        ),
    )
    findings = find(p)
    fx = _by_id(findings, "futex:0x7000")
    assert fx.category == "offcpu" and fx.sites == ["bump_stat"]
    assert fx.cost["wait_ms_per_s"] == pytest.approx(300.0)
    assert fx.severity == "warning"
    off = _by_id(findings, "offcpu:read")
    assert off.severity == "warning" and set(off.per_thread) == {"11"}
    assert not [f for f in findings if "epoll_wait" in f.id]


def test_empty_profile_has_no_findings() -> None:
    """A profile with nothing in it gives no findings and no error."""
    assert find(Profile(target=Target(pid=1))) == []


def test_summary_is_plain_sentences() -> None:
    """Every finding's summary is a sentence with its numbers."""
    for f in find(baseline_profile()):
        s = summary(f)
        assert s.endswith(".") and any(ch.isdigit() for ch in s), s


def test_one_percentile_on_every_path() -> None:
    """A request's p99 is the same number whether it came from the collector, a window
    cut by model.delta, or the tables: interpolated inside its log2 slot, not the slot's edge."""
    from kvprof.analysis.tables import requests
    from kvprof.model.delta import delta
    from kvprof.model.histogram import hist_percentile

    hist = [0] * 11 + [900, 100]  # 900 requests in [2048, 4096) ns, 100 in [4096, 8192)
    before = Profile(target=Target(pid=1), requests={"get": RequestStat()})
    after = Profile(target=Target(pid=1), requests={"get": RequestStat(1000, hist, 0, 0)})
    window = delta(after, before).requests["get"]
    p50, p99 = hist_percentile(hist, 0.5), hist_percentile(hist, 0.99)
    assert 2048 < p50 < 4095 and 4096 < p99 < 8191  # inside the slot, not its upper edge
    assert (window.p50_ns, window.p99_ns) == (p50, p99)
    row = requests(after)[0]
    assert (row.p50_ns, row.p99_ns) == (p50, p99)
    # a profile whose stored numbers disagree with its histogram: the histogram wins
    after.requests["get"].p99_ns = 8191
    assert requests(after)[0].p99_ns == p99


def test_sampled_probes_scaled_once() -> None:
    """The tables scale kvs:atomic__sample and kvs:cmd__done by the recorded 1 in N, and
    the report, the findings and the tables agree on the result."""
    from kvprof.analysis.tables import cachelines, requests, sites
    from kvprof.views.report import line_rows

    p = baseline_profile()
    site = next(s for s in sites(p) if s.site == "on_create_item")
    assert site.rate == RATE and site.updates == site.samples * RATE
    assert sum(t.updates for t in site.by_thread.values()) == site.updates
    f = _by_id(find(p), "cacheline:on_create_item")
    assert f.cost["updates_per_s"] == pytest.approx(site.updates / DURATION)
    rows = [r for r in line_rows(p) if r.site == "on_create_item"]
    lines = [cl for cl in cachelines(p) if cl.site == "on_create_item"]
    assert sum(r.updates_per_s for r in rows) == pytest.approx(sum(cl.updates for cl in lines) / DURATION)
    assert requests(p)[0].count == requests(p)[0].samples * RATE
