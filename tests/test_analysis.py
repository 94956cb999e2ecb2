"""The hotspot catalog and the findings, on hand-made profiles (no root).

`baseline_profile()` and `fixed_profile()` (tests/support.py) are shaped like a recording
of kvcached -t 2 under kvload, --preset baseline and --preset fixed: the
rates follow the run in docs/demo.md, the probes sampled as kvcached
--probe-sample samples them.
tests/test_report.py renders the same profiles.
"""

from __future__ import annotations

import pytest
from support import DURATION, RATE, W0, W1, baseline_profile, fixed_profile

from kvprof.analysis import CATALOG, ceilings, find, match_function, match_lock, match_site
from kvprof.analysis.findings import rank_key, summary
from kvprof.analysis.findings.common import WORTH_CRITICAL, WORTH_WARNING, severity_of, worth
from kvprof.analysis.hotspots import call_site
from kvprof.model.profile import (
    CpuStack,
    FutexWait,
    LockHold,
    OffCpu,
    OffCpuStack,
    Profile,
    RequestStat,
    Target,
    ThreadHolds,
    ThreadInfo,
    Window,
)


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
    assert lock.cost["gain_if_fixed"] > 0
    assert lock.sites[0] == "update_topkeys" and lock.hotspot == "topkeys"
    assert "update_topkeys" in lock.title
    assert set(lock.per_thread) == {W0, W1}
    assert lock.thread_names == {W0: "kv-worker-0", W1: "kv-worker-1"}
    assert lock.per_thread[W0]["waits_per_s"] == pytest.approx(39_000 / DURATION)
    assert lock.cost["wait_ms_per_s"] == pytest.approx(172 / DURATION)
    assert lock.cost["wait_share"] == pytest.approx(0.172 / DURATION / 2)
    for site in ("collect_timings", "on_create_item", "on_delete_item", "account_memory"):
        f = _by_id(findings, f"cacheline:{site}")
        assert f.severity == severity_of(worth(f), WORTH_CRITICAL, WORTH_WARNING), (site, f.cost)
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


def test_findings_are_ranked_by_one_rule() -> None:
    """One rule orders and grades: most worth first (the larger of the gain now and a fifth of
    the ceiling's share in use), severity falling with it; no finding ranks below one that its
    own numbers say is worth less (both its gain and its ceiling share lower)."""
    p = baseline_profile()
    p.holds = [_topkeys_hold(p, ceiling_share=0.3)]
    findings = find(p)
    assert findings == sorted(findings, key=rank_key)
    worths = [worth(f) for f in findings]
    assert worths == sorted(worths, reverse=True)
    ranks = [{"critical": 0, "warning": 1, "info": 2}[f.severity] for f in findings]
    assert ranks == sorted(ranks)
    for i, a in enumerate(findings):
        for b in findings[i + 1 :]:
            gains = (a.cost.get("gain_if_fixed", 0), b.cost.get("gain_if_fixed", 0))
            shares = (a.cost.get("ceiling_share", 0), b.cost.get("ceiling_share", 0))
            assert not (gains[1] > gains[0] and shares[1] > shares[0]), (a.id, b.id)
    # the topkeys mutex, a small gain now but 30 % of its ceiling in use, leads as a warning
    assert findings[0].id == "lock:topkeys" and findings[0].severity == "warning"
    assert findings[0].cost["ceiling_share"] == pytest.approx(0.3)


def _topkeys_hold(p: Profile, ceiling_share: float) -> LockHold:
    """The topkeys mutex held by both workers once per request, long enough that today's
    throughput is `ceiling_share` of its ceiling."""
    acquisitions = int(ceilings.throughput(p) * DURATION)
    hold_ns = ceiling_share / ceilings.throughput(p) * 1e9  # busy ns per request
    half = acquisitions // 2
    by = {W0: ThreadHolds(half, int(half * hold_ns)), W1: ThreadHolds(half, int(half * hold_ns))}
    return LockHold(
        "topkeys", 0xA0, 2 * half, 2 * int(half * hold_ns), 100, min_ns=int(hold_ns), by_thread=by
    )


@pytest.mark.parametrize(("share", "severity"), [(0.05, "info"), (0.2, "warning"), (0.6, "critical")])
def test_the_ceiling_moves_severity(share: float, severity: str) -> None:
    """The same small gain now is info, warning or critical as the topkeys mutex's ceiling comes
    closer: within 10x of today's throughput a warning, within 2x critical."""
    p = baseline_profile()
    p.holds = [_topkeys_hold(p, share)]
    lock = _by_id(find(p), "lock:topkeys")
    assert lock.cost["gain_if_fixed"] < WORTH_WARNING
    assert lock.severity == severity, lock.cost


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
    # a hot function is a lead, not a fix: no gain, so info whatever its share
    assert spin.severity == "info" and spin.hotspot == ""
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
    # blocking is work, not contention: no gain, so info
    assert off.severity == "info" and set(off.per_thread) == {"11"}
    assert not [f for f in findings if "epoll_wait" in f.id]


def test_offcpu_estimates_are_capped_at_the_exact_total() -> None:
    """A thread's sampled off-CPU stacks (scaled by 1 in 64) can add up past its exact
    off-CPU time, as `kvprof record` of `kvprof top` showed (docs/top.md): the finding
    shares the exact time out by the stacks' estimates."""
    p = Profile(
        target=Target(pid=10, comm="prog"),
        window=Window(duration_s=2.0),
        hz=99,
        threads={"11": ThreadInfo(name="worker", offcpu_ns=1_000_000_000)},
        offcpu=OffCpu(
            stacks=[
                OffCpuStack(11, ["main", "load_file", "read", "ext4_read_[k]"], 4_500_000_000),
                OffCpuStack(11, ["main", "sync", "fsync", "ext4_sync_[k]"], 1_500_000_000),
            ]
        ),
    )
    read = _by_id(find(p), "offcpu:read")
    assert read.cost["max_wall_share"] == pytest.approx(0.375)  # 3/4 of the exact 1 s, in 2 s (not 2.25)


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
    cut by model.delta, or the tables: the largest value of its log2 slot (a bound)."""
    from kvprof.analysis.tables import requests
    from kvprof.model.delta import delta
    from kvprof.model.histogram import hist_percentile

    hist = [0] * 11 + [900, 100]  # 900 requests in [2048, 4096) ns, 100 in [4096, 8192)
    before = Profile(target=Target(pid=1), requests={"get": RequestStat()})
    after = Profile(target=Target(pid=1), requests={"get": RequestStat(1000, hist, 0, 0)})
    window = delta(after, before).requests["get"]
    p50, p99 = hist_percentile(hist, 0.5), hist_percentile(hist, 0.99)
    assert (p50, p99) == (4095, 8191)  # the slots' largest values
    assert (window.p50_ns, window.p99_ns) == (p50, p99)
    row = requests(after)[0]
    assert (row.p50_ns, row.p99_ns) == (p50, p99)
    # a profile whose stored numbers disagree with its histogram: the histogram wins
    after.requests["get"].p99_ns = 5000
    assert requests(after)[0].p99_ns == p99


def test_sampled_probes_scaled_once() -> None:
    """The tables scale kvs:atomic__sample and kvs:cmd__done by the recorded 1 in N, and
    the report, the findings and the tables agree on the result."""
    from kvprof.analysis.rows import line_rows
    from kvprof.analysis.tables import cachelines, requests, sites

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


def test_offcpu_stacks_are_scaled_to_each_threads_exact_total() -> None:
    """Sampled off-CPU stacks split a thread's time, its exact total sizes it; a thread
    with no exact total keeps its estimates."""
    from kvprof.collect.offcpu import to_totals

    sampled = {(1, ("epoll_wait",)): 3000, (1, ("futex",)): 1000, (2, ("read",)): 500}
    scaled = {(1, ("epoll_wait",)): 300, (1, ("futex",)): 100, (2, ("read",)): 500}
    assert to_totals(sampled, {1: 400, 2: 0}) == scaled
    assert to_totals({}, {1: 400}) == {}
