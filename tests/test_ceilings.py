"""The ceiling each serialized resource puts on throughput (kvprof.analysis.ceilings):
the rules on hand-made profiles, then orders and bounds on a recording of kvcached."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from support import kvload, kvprof, record

from kvprof.analysis import ceilings, critical
from kvprof.analysis.findings.common import THRESHOLDS
from kvprof.model.profile import (
    HZ,
    CacheLineStat,
    Finding,
    LineThread,
    LockHold,
    Profile,
    Target,
    ThreadHolds,
    ThreadInfo,
    Window,
)
from kvprof.system.servers import Server

SECONDS = 10.0
OPS = 50_000.0  # requests a second in the hand-made profiles


def _profile(holds: list[LockHold], lines: list[CacheLineStat] | None = None, busy: float = 0.5) -> Profile:
    """SECONDS of a server that served OPS requests a second (its `stats` before and after),
    each of its two threads on the CPU `busy` of the time."""
    p = Profile(Target(pid=1, comm="kvcached"), window=Window(start=1.0, duration_s=SECONDS))
    p.server_stats = {
        "before": {"cmd_get": "1000", "cmd_set": "0"},
        "after": {"cmd_get": str(1000 + int(OPS * SECONDS)), "cmd_set": "0"},
    }
    samples = round(busy * HZ * SECONDS)
    p.threads = {t: ThreadInfo(name=f"kv-worker-{t}", cpu_samples=samples) for t in ("11", "12")}
    p.holds = holds
    p.cachelines = lines or []
    return p


def _hold(name: str, address: int, per_thread: dict[str, tuple[int, int]]) -> LockHold:
    """A lock's holds: tid -> (acquisitions, ns held in all) over the window."""
    h = LockHold(name=name, address=address, samples=100)
    for tid, (n, ns) in per_thread.items():
        h.by_thread[tid] = ThreadHolds(n, ns)
        h.acquisitions += n
        h.hold_ns += ns
    return h


def _line(site: str, writes: dict[str, int]) -> CacheLineStat:
    return CacheLineStat(
        site=site,
        line=0x1000,
        samples=sum(writes.values()),
        by_thread={t: LineThread(samples=n) for t, n in writes.items()},
    )


ACQ = int(OPS * SECONDS)  # one acquisition per request
SHARED = _hold("topkeys", 0xA0, {"11": (ACQ // 2, ACQ // 2 * 4000), "12": (ACQ // 2, ACQ // 2 * 4000)})


def test_a_lock_every_request_takes_caps_throughput_at_one_over_its_hold() -> None:
    """Held 4 us per request by two threads: the ceiling is 250k ops/s (the utilization law)."""
    (c,) = ceilings.lock_ceilings(_profile([SHARED]), OPS)
    assert c.resource == "topkeys mutex" and c.kind == "lock"
    assert c.busy_ns_per_op == pytest.approx(4000)
    assert c.ceiling_ops_per_s == pytest.approx(250_000)


def test_a_lock_held_by_one_thread_pays_the_transfers_more_cores_would_bring() -> None:
    """One holder (one worker) holding it 4 us of every 10 us busy: its lines never moved, so
    the hold at several cores adds HOLD_TRANSFERS round trips to the one measured; two
    threads do not saturate it, so no hand-off."""
    one = _hold("topkeys", 0xA0, {"11": (ACQ, ACQ * 4000)})
    (c,) = ceilings.lock_ceilings(_profile([one], busy=0.5), OPS)
    assert c.busy_ns_per_op == pytest.approx(4000 + critical.HOLD_TRANSFERS * THRESHOLDS.transfer_ns)


def test_a_sleeping_mutex_two_threads_saturate_pays_the_hand_off_where_it_binds() -> None:
    """One holder holding it 16 us of every 20 us busy: two threads saturate it, so each
    acquisition also pays the gap a release leaves (the releaser back first: its outside work
    and a share of a waking unlock); the ceiling is far below one over the hold."""
    one = _hold("topkeys", 0xA0, {"11": (ACQ, ACQ * 16_000)})
    (c,) = ceilings.lock_ceilings(_profile([one], busy=1.0), OPS)
    held = 16_000 + critical.HOLD_TRANSFERS * THRESHOLDS.transfer_ns
    outside = 20_000 - 16_000
    gap = outside + THRESHOLDS.wake_ns * min(1.0, (held + outside) / THRESHOLDS.handoff_ns)
    assert gap < THRESHOLDS.handoff_ns
    assert c.busy_ns_per_op == pytest.approx(held + gap)
    assert c.ceiling_ops_per_s < 1e9 / held * 0.8


def test_threads_that_share_a_lock_above_its_convoy_figure_are_not_a_convoy() -> None:
    """Two holders, each holding it 16 us of every 32 us on a CPU: the model alone would have
    them saturate it and pay the hand-off, a ceiling below the OPS they serve. Serving OPS
    says they do not: the ceiling is its own work and transfers, at or above today's."""
    half = ACQ // 2
    two = _hold("topkeys", 0xA0, {"11": (half, half * 16_000), "12": (half, half * 16_000)})
    two.min_ns = 16_000
    s = critical.section(two, SECONDS, OPS, {"11": 0.8, "12": 0.8})
    assert s.convoyed(2) and s.ceiling_ops_per_s < OPS  # what the section alone says
    (c,) = ceilings.lock_ceilings(_profile([two], busy=0.8), OPS)
    assert c.busy_ns_per_op == pytest.approx(16_000)
    assert c.ceiling_ops_per_s >= OPS


def _section(own: float, outside: float, sleeping: bool = True) -> critical.Section:
    return critical.Section(
        "lock", 0xA0, own, 0.0, outside, 1.0, 1, critical.Costs(100.0, 20_000.0, 5_000.0), sleeping
    )


def test_the_gap_is_the_hand_off_when_the_sleeper_wakes_before_the_releaser_is_back() -> None:
    """Releaser back late (long outside work): the sleeper takes it after the hand-off; back
    early: the releaser barges in after its outside work and a share of the waking unlock."""
    late, early = _section(30_000.0, 25_000.0), _section(10_000.0, 2_000.0)
    assert late.gap_ns == pytest.approx(20_000.0)
    assert early.gap_ns == pytest.approx(2_000.0 + 5_000.0 * (10_200.0 + 2_000.0) / 20_000.0)
    assert late.convoyed(2) and early.convoyed(2)
    assert early.hold_ns(2) == pytest.approx(10_200.0 + early.gap_ns)
    assert early.excess_ns(2) == pytest.approx(200.0 + early.gap_ns)


def test_no_hand_off_below_saturation_at_one_thread_or_for_a_spinning_lock() -> None:
    """A lock two threads do not saturate binds where the threads' demand reaches one over its
    hold (its own work and transfers); one thread moves no line; a spinlock sleeps no waiter;
    without the threads' busy time, no saturation is claimed."""
    short = _section(300.0, 1_500.0)
    assert not short.convoyed(2) and short.binds_at == pytest.approx((500.0 + 1_500.0) / 500.0)
    assert short.ceiling_ops_per_s == pytest.approx(1e9 / 500.0)
    assert short.hold_ns(1) == pytest.approx(300.0) and short.excess_ns(1) == 0.0
    spin = _section(10_000.0, 2_000.0, sleeping=False)
    assert not spin.convoyed(2) and spin.hold_ns(2) == pytest.approx(10_200.0)
    unknown = _section(10_000.0, math.nan)
    assert not unknown.convoyed(2) and unknown.hold_ns(2) == pytest.approx(10_200.0)


def test_locks_of_one_name_on_several_addresses_get_no_ceiling() -> None:
    """Per-thread locks (each thread its own) and striped ones: the paced sample cannot say how
    the name's acquisitions spread over its addresses, so no ceiling is claimed."""
    mine = _hold("topkeys_thread", 0xB0, {"11": (ACQ // 2, ACQ // 2 * 4000)})
    yours = _hold("topkeys_thread", 0xC0, {"12": (ACQ // 2, ACQ // 2 * 4000)})
    assert ceilings.lock_ceilings(_profile([mine, yours]), OPS) == []


def test_a_line_every_request_writes_caps_throughput_at_one_transfer_per_write() -> None:
    """Written once per request by two threads: 1 / transfer_ns, and the stated cross-socket
    factor lower; a line one thread writes is not serialized."""
    writes = int(OPS * SECONDS)
    lines = [_line("collect_timings", {"11": writes // 2, "12": writes // 2}), _line("mine", {"11": writes})]
    (c,) = ceilings.line_ceilings(_profile([], lines), OPS)
    assert c.where == "collect_timings"
    assert c.ceiling_ops_per_s == pytest.approx(1e9 / THRESHOLDS.transfer_ns)
    assert c.cross_socket_ops_per_s == pytest.approx(c.ceiling_ops_per_s / THRESHOLDS.cross_socket_weight)


def test_the_ladder_binds_lowest_first_and_each_fix_reaches_the_next_rung() -> None:
    """Lowest ceiling first; a rung's after-fix is the next rung's ceiling, the last's none;
    the lock's finding carries its ceiling and the thread count it binds at."""
    writes = int(OPS * SECONDS)
    p = _profile([SHARED], [_line("collect_timings", {"11": writes // 2, "12": writes // 2})])
    found = [Finding(id="lock:topkeys", title="", category="lock", severity="warning", where="topkeys")]
    rungs = ceilings.ladder(p, found)
    assert [c.resource for c in rungs] == ["topkeys mutex", "collect_timings shared line"]
    assert rungs[0].after_fix_ops_per_s == rungs[1].ceiling_ops_per_s
    assert math.isinf(rungs[1].after_fix_ops_per_s)
    assert rungs[0].finding == "lock:topkeys" and rungs[1].finding == ""
    assert rungs[0].binds_at_threads > 0
    ceilings.annotate(found, rungs, OPS)
    assert found[0].cost["ceiling_ops_per_s"] == pytest.approx(250_000)
    assert "topkeys mutex" in ceilings.ladder_line(rungs)


def test_the_what_if_removes_the_hold_beyond_the_critical_sections_own_work() -> None:
    """One model of a critical section: a per-thread fix keeps the shortest hold (the work)
    and removes the rest (lines moved in, hand-off), so the lock's gain grows with it."""
    from support import W0, W1, baseline_profile

    from kvprof.analysis import find
    from kvprof.analysis.whatif import held_excess

    p = baseline_profile()
    lock = next(f for f in find(p) if f.id == "lock:topkeys")
    assert not any(held_excess(p, lock).values())  # the fixture's holds are all the shortest one
    h = p.holds[0]
    for t in h.by_thread.values():
        t.hold_ns = 3 * t.hold_ns  # three times the shortest hold: two thirds moved in
    h.hold_ns = 3 * h.hold_ns
    excess = held_excess(p, lock)
    for tid in (W0, W1):
        t = h.by_thread[tid]
        assert excess[tid] == pytest.approx(2 * t.acquisitions * h.min_ns / 1e9 / p.window.duration_s)
    longer = next(f for f in find(p) if f.id == "lock:topkeys")
    assert longer.cost["gain_if_fixed"] > lock.cost["gain_if_fixed"]


def test_a_section_held_by_two_threads_has_its_shortest_hold_as_own_work() -> None:
    """Two holders: the shortest sampled hold is the work, the mean's excess the lines that
    moved in; the busy time between acquisitions is each holder's busy ns per acquisition
    less the hold; what a per-thread design removes is that excess on every acquisition."""
    h = _hold("topkeys", 0xA0, {"11": (ACQ // 2, ACQ // 2 * 3000), "12": (ACQ // 2, ACQ // 2 * 3000)})
    h.min_ns = 1000
    busy = {"11": 0.5, "12": 0.5}  # 5 s busy over 250k acquisitions each: 20 us apiece
    s = critical.section(h, SECONDS, OPS, busy)
    assert (s.own_ns, s.moved_ns, s.holders) == (1000.0, 2000.0, 2)
    assert s.outside_ns == pytest.approx(20_000.0 - 3000.0)
    assert s.acquisitions_per_op == pytest.approx(1.0) and not s.convoyed(2)
    assert s.excess_ns(2) == pytest.approx(2000.0)
    excess = critical.excess_by_thread(s, h, SECONDS, 2)
    assert excess == pytest.approx(
        {"11": ACQ // 2 * 2000.0 / 1e9 / SECONDS, "12": ACQ // 2 * 2000.0 / 1e9 / SECONDS}
    )


def test_interrupted_holds_are_not_lines_moving_in() -> None:
    """A hold the probes took for interrupted (a holder preempted) stays in the hold time
    but not in what moved in: one sample of a time slice among short holds would otherwise
    count as lines moving in on every acquisition."""
    h = _hold("topkeys", 0xA0, {"11": (ACQ // 2, ACQ // 2 * 3000), "12": (ACQ // 2, ACQ // 2 * 3000)})
    h.min_ns = 1000
    busy = {"11": 0.5, "12": 0.5}
    before = critical.section(h, SECONDS, OPS, busy)
    h.interrupted, h.interrupted_ns = 1000, 1000 * 2_000_000  # weighted samples of a 2 ms slice
    h.acquisitions += h.interrupted
    h.hold_ns += h.interrupted_ns
    s = critical.section(h, SECONDS, OPS, busy)
    assert s.moved_ns == pytest.approx(before.moved_ns) == pytest.approx(2000.0)
    assert s.own_ns == 1000.0


def test_no_throughput_no_ceiling() -> None:
    """A target whose counters say nothing (no stats, no sampled requests) gets no ladder."""
    p = _profile([SHARED])
    p.server_stats = {}
    assert ceilings.throughput(p) == 0 and ceilings.ladder(p, []) == []


# ---- on kvcached ---------------------------------------------------------------------

HOLD_NS = 10_000


def _recorded(server: Server, tmp_path: Path) -> dict[str, object]:
    """`report --json` of a 4 s recording of `server` under the demo's load."""
    out = tmp_path / "p.json"
    with kvload(server, 30):
        r = record(server.pid, out, "-d", "4")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = kvprof("report", "--json", str(out))
    assert rep.returncode == 0, rep.stderr[-2000:]
    data: dict[str, object] = json.loads(rep.stdout)
    return data


@pytest.mark.bpf
def test_one_worker_with_a_slow_critical_section_names_the_topkeys_ceiling(
    kvcached_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """One worker, topkeys held >= 10 us of each request's few: two threads saturate the
    mutex, so it is the first rung, its hold where it binds the 10 us and the hand-off's gap,
    its ceiling below twice today's throughput (plain scaling overshoots it) and binding
    before a second thread; the shared lines bind later."""
    server = kvcached_factory("-t", "1", "--topkeys-hold-ns", str(HOLD_NS))
    data = _recorded(server, tmp_path)
    ops = float(data["throughput_ops_per_s"])  # type: ignore[arg-type]
    rungs: list[dict[str, float | str]] = data["ceilings"]  # type: ignore[assignment]
    assert ops > 0 and rungs, data.get("ceilings")
    first = rungs[0]
    assert first["resource"] == "topkeys mutex", rungs
    # the acquisitions per request are an estimate from paced samples: a margin for that alone
    assert float(first["busy_ns_per_op"]) > 1.1 * HOLD_NS, first
    assert float(first["ceiling_ops_per_s"]) < 2 * ops, (ops, first)
    assert float(first["binds_at_threads"]) < 2, first
    assert all(float(r["ceiling_ops_per_s"]) >= float(first["ceiling_ops_per_s"]) for r in rungs)


@pytest.mark.bpf
def test_fixed_preset_claims_no_near_ceiling(kvcached_factory: Callable[..., Server], tmp_path: Path) -> None:
    """Per-thread sites share no lock or line between workers: no ceiling within 10x of today's
    throughput."""
    server = kvcached_factory("--preset", "fixed", "-t", "2")
    data = _recorded(server, tmp_path)
    ops = float(data["throughput_ops_per_s"])  # type: ignore[arg-type]
    assert ops > 0
    near = [r for r in data["ceilings"] if float(r["ceiling_ops_per_s"]) < 10 * ops]  # type: ignore[union-attr,index]
    assert not near, (ops, near)
