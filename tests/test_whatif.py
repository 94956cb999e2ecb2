"""What each fix is worth (kvprof.analysis.whatif): the model on hand-made profiles
(wait-bound, stall-bound, idle), the views that carry it, the bench's check of it,
and on a real kvcached the sign and order of its predictions (BPF).
"""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from support import exposition, kvload, kvprof, record

from kvprof.analysis import find
from kvprof.analysis.whatif import (
    GAIN_KEY,
    HELD,
    WAITS,
    breakdown,
    budget,
    gain_if_all_fixed,
    gain_if_fixed,
    held_excess,
    predict,
)
from kvprof.bench import BenchError, scenarios
from kvprof.bench import whatif as bench_whatif
from kvprof.bench.runner import Bench
from kvprof.bench.variants import SITES
from kvprof.model.profile import (
    MACHINE_BUSY,
    MACHINE_IDLE,
    AddressSample,
    CpuStack,
    LockHold,
    LockStack,
    LockStat,
    OffCpu,
    OffCpuStack,
    Profile,
    SampledAddresses,
    Target,
    ThreadHolds,
    ThreadInfo,
    ThreadWaits,
    Window,
)
from kvprof.model.topology import Topology
from kvprof.system.servers import Server
from kvprof.views.metrics import Labeler, profile_metrics

HZ, DUR = 100, 10.0
T0, T1 = "101", "102"
FULL = int(HZ * DUR)  # the on-CPU samples of a thread that ran the whole window
EPOLL = ["start_thread", "worker_main", "epoll_wait", "do_epoll_wait_[k]", "schedule_[k]"]
SERVE = ["start_thread", "worker_main", "serve"]


def _profile(
    on_cpu: float, idle: float, wait: float = 0.0, runnable: float = 0.0, **extra: object
) -> Profile:
    """Two worker threads, each `on_cpu` of the window on the CPU (in `serve`), `idle` of it
    waiting for work in epoll_wait, `wait` of it waiting on the lock `biglock` in `bump`,
    and `runnable` of it waiting for a CPU."""
    ns = round(DUR * 1e9)
    threads, stacks, off, by_thread = {}, [], [], {}
    for tid in (T0, T1):
        samples = round(on_cpu * FULL)
        idle_ns, wait_ns, runnable_ns = round(idle * ns), round(wait * ns), round(runnable * ns)
        threads[tid] = ThreadInfo(
            name=f"worker-{tid}",
            cpu_samples=samples,
            offcpu_ns=idle_ns + wait_ns + runnable_ns,
            runnable_ns=runnable_ns,
        )
        stacks.append(CpuStack(int(tid), SERVE, samples))
        if idle_ns:
            off.append(OffCpuStack(int(tid), EPOLL, idle_ns))
        if wait_ns:
            off.append(OffCpuStack(int(tid), ["start_thread", "bump", "futex_wait_[k]"], wait_ns))
            by_thread[tid] = ThreadWaits(waits=1000, wait_ns=wait_ns)
    locks = []
    if by_thread:
        total = sum(w.wait_ns for w in by_thread.values())
        stack = LockStack(["start_thread", "worker_main", "bump", "kv_lock"], 2000, total)
        locks = [LockStat("biglock", 0x1000, 2000, total, 1_000_000, [], by_thread, [stack])]
    return Profile(
        target=Target(pid=100, comm="server", kvs_probes=True),
        window=Window(start=1.8e9, duration_s=DUR),
        hz=HZ,
        collectors=["oncpu", "offcpu", "locks"],
        threads=threads,
        oncpu=stacks,
        offcpu=OffCpu(stacks=off),
        locks=locks,
        **extra,  # type: ignore[arg-type]
    )


def _lock_gain(p: Profile) -> float:
    return next(f for f in find(p) if f.id == "lock:biglock").cost[GAIN_KEY]


def test_wait_bound_threads_gain_what_the_wait_takes() -> None:
    """Two threads never idle, 30 % of their time waiting on one lock: fixing it makes
    them 1 / 0.7 as fast (+43 %), and the target is called CPU-bound."""
    p = _profile(on_cpu=0.7, idle=0.0, wait=0.3)
    assert _lock_gain(p) == pytest.approx(0.3 / 0.7, rel=0.02)
    b = budget(p)
    assert b.pace == "cpu-bound" and b.busy_share == pytest.approx(1.0, abs=0.01)


def test_the_idle_share_scales_the_gain_down() -> None:
    """The same wait in threads idle half the time gains less: they set the pace only while busy."""
    busy = _lock_gain(_profile(on_cpu=0.7, idle=0.0, wait=0.3))
    half_idle = _lock_gain(_profile(on_cpu=0.2, idle=0.5, wait=0.3))
    assert 0 < half_idle < busy


def test_time_waiting_for_a_cpu_is_busy() -> None:
    """Threads that wait for a CPU the rest of the time (the machine's CPUs are the limit,
    not the requests) gain what always-busy threads gain; the same time spent waiting for
    requests instead scales the gain down, and the pace says which."""
    crowded = _profile(on_cpu=0.4, idle=0.0, wait=0.1, runnable=0.5)
    assert _lock_gain(crowded) == pytest.approx(0.1 / 0.9, rel=0.02)
    assert budget(crowded).pace == "cpu-bound"
    waiting_for_work = _profile(on_cpu=0.4, idle=0.5, wait=0.1)
    assert _lock_gain(waiting_for_work) < 0.6 * _lock_gain(crowded)
    assert budget(waiting_for_work).pace == "partly cpu-bound"


def test_a_wait_counts_once_with_the_cpu_and_preemptions_inside_it() -> None:
    """A kvs lock's wait runs from the failed trylock to the acquisition: when the thread
    was off the CPU asleep for only a third of it (the rest it was preempted, or on the CPU
    in the lock's machinery: the budget's runnable and on-CPU time), only that third is a
    wait the fix removes and the busy time counts it once. Without the offcpu collector the
    whole wait counts."""
    p = _profile(on_cpu=0.7, idle=0.0, wait=0.3, runnable=0.2)
    for th in p.threads.values():  # preempted 0.2, asleep 0.1
        th.offcpu_ns = th.runnable_ns + round(0.1 * DUR * 1e9)
    assert _lock_gain(p) == pytest.approx(0.1 / 0.9, rel=0.02)
    assert budget(p).busy_share == pytest.approx(1.0, abs=0.01)
    p.collectors = ["oncpu", "locks"]
    assert _lock_gain(p) == pytest.approx(0.3 / 0.7, rel=0.02)


def test_only_lines_moved_in_by_another_holder_are_excess() -> None:
    """The critical section (kvprof.analysis.critical) of a lock two threads hold: its holds
    past the shortest one are lines that moved in, which the fix removes (100 ns of 300 per
    acquisition, 1M acquisitions a thread in 10 s: 1 % of each thread's time). Held by one
    thread, nothing moved: the same holds are its own work."""
    p = _profile(on_cpu=0.7, idle=0.0, wait=0.3)
    lock = next(f for f in find(p) if f.id == "lock:biglock")
    two = {tid: ThreadHolds(1_000_000, 300_000_000) for tid in (T0, T1)}
    p.holds = [LockHold("biglock", 0x1000, 2_000_000, 600_000_000, 200, 200, two)]
    assert held_excess(p, lock) == pytest.approx({T0: 0.01, T1: 0.01})
    p.holds[0].by_thread = {T0: two[T0]}
    assert not any(held_excess(p, lock).values())


def test_the_what_if_says_when_other_programs_took_the_machine() -> None:
    """The machine's CPU time over the window (machine.busy_ns, machine.idle_ns): where
    other programs took a tenth of it or more, the sentence says a client among them
    takes a share of what a fix frees; not read, or the target alone, it says nothing."""
    p = _profile(on_cpu=0.5, idle=0.5)  # two workers on half of each of 2 CPUs' time
    assert math.isnan(budget(p).others) and "other programs" not in budget(p).describe()
    p.host.cpus = 2
    p.status.counters.update({MACHINE_BUSY: round(0.9 * DUR * 2e9), MACHINE_IDLE: round(0.1 * DUR * 2e9)})
    b = budget(p)
    assert b.machine_busy == pytest.approx(0.9) and b.others == pytest.approx(0.4, abs=0.01)
    assert "40% of their time with other programs" in b.describe()
    p.status.counters.update({MACHINE_BUSY: round(0.5 * DUR * 2e9), MACHINE_IDLE: round(0.5 * DUR * 2e9)})
    assert budget(p).others == pytest.approx(0.0, abs=0.01)
    assert "other programs" not in budget(p).describe()


def test_idle_target_predicts_nothing_and_says_it_is_not_cpu_bound(tmp_path: Path) -> None:
    """Threads waiting for requests 95 % of the time with a small lock wait: the gain is
    about 0 and the report says the server is not CPU-bound."""
    p = _profile(on_cpu=0.04, idle=0.95, wait=0.01)
    assert 0 < _lock_gain(p) < 0.005
    assert budget(p).pace == "not cpu-bound"
    path = tmp_path / "idle.json"
    p.save(path)
    text = kvprof("report", str(path))
    assert text.returncode == 0, text.stderr
    assert "it is not CPU-bound" in " ".join(text.stdout.split())


def _stalled(share: float, address: int = 0x5000, function: str = "bump") -> Profile:
    """Two threads always on the CPU, `share` of their samples stalled on atomic writes to
    one line (at `address`, in `function`)."""
    p = _profile(on_cpu=1.0, idle=0.0)
    p.collectors.append("regsample")
    n = round(share * FULL)
    p.addresses = SampledAddresses(
        samples=[
            AddressSample(
                int(t), i, address, 0x401000, function, "lock cmpxchg dword ptr [rdi], edx", "hits", 4, n
            )
            for i, t in enumerate((T0, T1))
        ],
        thread_samples={T0: FULL, T1: FULL},
        user_samples=2 * FULL,
    )
    return p


def _waiting_as(p: Profile, other: Profile) -> None:
    """`p` with `other`'s lock waits, its threads asleep in them as `other`'s are."""
    p.locks = other.locks
    for tid, th in p.threads.items():
        th.offcpu_ns = other.threads[tid].offcpu_ns


def test_the_breakdown_names_each_part_and_the_cpu_a_fix_saves() -> None:
    """A lock waited on 20 % of two threads' time, its holds 1 % past their own work: the
    breakdown has the wait and the excess apart, and the CPU per request saved counts the
    excess alone (a wait is not CPU): 0.01 / (0.8 - 0.01)."""
    p = _profile(on_cpu=0.8, idle=0.0, wait=0.2)
    lock = next(f for f in find(p) if f.id == "lock:biglock")
    two = {tid: ThreadHolds(1_000_000, 300_000_000) for tid in (T0, T1)}
    p.holds = [LockHold("biglock", 0x1000, 2_000_000, 600_000_000, 200, 200, two)]
    said = breakdown(p, [lock])
    assert said.parts[WAITS] == pytest.approx(0.2, rel=0.02)
    assert said.parts[HELD] == pytest.approx(0.01, rel=0.02)
    assert said.cpu_saved == pytest.approx(0.01 / 0.79, rel=0.02)
    prediction = predict(p, [lock], {"biglock": (lock.hotspot,)})
    assert prediction.parts["biglock"] == said.parts and prediction.cpu_saved["biglock"] == said.cpu_saved


def test_stall_bound_threads_gain_what_the_stall_takes() -> None:
    """Half of two busy threads' samples stalled on one shared atomic: fixing it doubles them."""
    f = next(f for f in find(_stalled(0.5)) if f.id.startswith("sampled-line:"))
    assert f.cost[GAIN_KEY] == pytest.approx(1.0, rel=0.02)


def test_a_lock_counts_the_stalls_on_its_own_word_once() -> None:
    """A contended lock whose word (at the lock's address) also stalls its takers: its fix
    removes the wait and the stall, and fixing it with the word's own line finding counts
    the stall once."""
    wait_only = _profile(on_cpu=0.8, idle=0.0, wait=0.2)
    p = _stalled(0.1, address=wait_only.locks[0].address, function="pthread_mutex_lock")
    _waiting_as(p, wait_only)
    findings = find(p)
    lock = next(f for f in findings if f.id == "lock:biglock")
    word = next(f for f in findings if f.id.startswith("sampled-line:"))
    assert lock.cost[GAIN_KEY] > _lock_gain(wait_only)
    assert gain_if_fixed(p, [lock, word]) == pytest.approx(gain_if_fixed(p, [lock]))


def test_fixes_together_compound_rather_than_add() -> None:
    """A lock wait and a line stall in the same threads: fixing both gains more than the sum."""
    p = _stalled(0.2)
    _waiting_as(p, _profile(on_cpu=0.8, idle=0.0, wait=0.2))
    findings = find(p)
    each = [f.cost[GAIN_KEY] for f in findings if f.cost[GAIN_KEY] > 0]
    assert len(each) == 2
    assert gain_if_all_fixed(p, findings) > sum(each)


def test_cpu_work_and_kvprofs_own_probes_are_not_a_fix() -> None:
    """A hot function is work (no gain); samples in the kernel's uprobe handling are kvprof's
    own and leave what a fix removes unchanged."""
    p = _profile(on_cpu=0.7, idle=0.0, wait=0.3)
    hot = next(f for f in find(p) if f.category == "cpu")
    assert hot.cost[GAIN_KEY] == 0.0
    before = _lock_gain(p)
    own = ["start_thread", "bump", "uprobe_dispatcher_[k]", "futex_wake_[k]"]
    p.oncpu.append(CpuStack(int(T0), own, 300))
    assert _lock_gain(p) == pytest.approx(before)


def test_report_json_carries_the_gains(tmp_path: Path) -> None:
    """`report --json`: every finding's cost.gain_if_fixed, the top-level gain_if_all_fixed,
    and the budget it comes from."""
    path = tmp_path / "wait.json"
    _profile(on_cpu=0.7, idle=0.0, wait=0.3).save(path)
    r = kvprof("report", str(path), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert all(GAIN_KEY in f["cost"] for f in d["findings"])
    lock = next(f for f in d["findings"] if f["id"] == "lock:biglock")
    assert d["gain_if_all_fixed"] >= lock["cost"][GAIN_KEY] > 0.3
    assert d["whatif"]["pace"] == "cpu-bound" and set(d["whatif"]["threads"]) == {T0, T1}


def test_exporter_serves_a_gauge_per_finding() -> None:
    """The exporter's families hold each contention finding's gain and the all-fixed one."""
    p = _profile(on_cpu=0.7, idle=0.0, wait=0.3)
    got = exposition(profile_metrics(p, Labeler(Topology.read())))
    gains = {s.labels["finding"]: s.value for s in got["kvprof_finding_gain_if_fixed"]}
    assert gains["lock:biglock"] == pytest.approx(0.3 / 0.7, rel=0.02)
    assert got["kvprof_gain_if_all_fixed"][0].value >= gains["lock:biglock"]


# ---- the bench's check -----------------------------------------------------------------


def test_whatif_plan_runs_each_site_alone_then_all() -> None:
    """baseline first (the reference), each site's fix alone, fixed last, under the demo's
    load, then under the study's on servers of its own; or under one load when asked."""
    demo, study = bench_whatif.plan().groups
    for group, load in ((demo, "demo"), (study, "study")):
        names = [v.name for v in group.variants]
        assert names[0] == f"baseline t=2 {load}" and names[-1] == f"fixed t=2 {load}"
        assert [bench_whatif.fix_of(v) for v in group.variants[1:-1]] == list(SITES)
        assert {v.server.load for v in group.variants} == {load}
    assert {v.client for v in demo.variants} == {bench_whatif.DEMO_CLIENT}
    assert {v.client for v in study.variants} == {scenarios.study_client(2)}
    assert {v.client.batch for v in study.variants} == {100} and study.variants[0].client.set_pct == 0
    assert not {v.server for v in demo.variants} & {v.server for v in study.variants}
    (only,) = bench_whatif.plan(loads=("study",)).groups
    assert only == study
    # on request, the demo's requests from two kvload threads, the connections split between them
    (two,) = bench_whatif.plan(loads=("demo2",)).groups
    client = two.variants[0].client
    assert (client.threads, client.total_connections) == (2, bench_whatif.DEMO_CLIENT.total_connections)
    assert client.batch == bench_whatif.DEMO_CLIENT.batch and "demo2" not in bench_whatif.LOADS


def test_whatif_load_option_is_whatifs_own() -> None:
    """`--load` goes with --scenario whatif only, and whatif takes no client settings: one
    line each, no traceback."""
    for args, said in (
        (("--load", "demo"), "--load goes with --scenario whatif"),
        (("--scenario", "whatif", "--batch-size", "8"), "chooses its own variants and loads"),
        (("--scenario", "whatif", "--load", "nope"), "invalid choice: 'nope'"),
    ):
        done = kvprof("bench", *args)
        assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_whatif_table_judges_each_prediction() -> None:
    """Predicted against the paired rounds' gain: close within max(30 %, 3 points), and an
    order the rounds contradict is named."""
    (group,) = bench_whatif.plan(loads=("demo",)).groups
    gains = {"topkeys": 0.20, "timings": 0.00, "item-counter": 0.05, "memory-counter": 0.00, "fixed": 0.25}
    base = [100.0, 102.0, 98.0, 101.0]
    ops = {group.variants[0].name: base}
    for v in group.variants[1:]:
        g = {"topkeys": 0.18, "timings": 0.10, "fixed": 0.40}.get(bench_whatif.fix_of(v), 0.0)
        ops[v.name] = [x * (1 + g) for x in base]
    prediction = predict(_profile(on_cpu=0.7, idle=0.0), [], {})
    prediction.gains = gains
    rows = {r.fix: r for r in bench_whatif.checks(group.variants, ops, prediction)}
    assert rows["topkeys"].close and not rows["fixed"].close
    assert rows["timings"].measured == pytest.approx(0.10)
    assert bench_whatif.order_misses(list(rows.values())) == ["timings > item-counter"]

    # measured toggled on one server, the prediction is judged against that instead
    toggled = {
        "fixed": bench_whatif.Toggled("fixed", (1.24, 1.26, 1.25, 1.25)),
        "timings": bench_whatif.Toggled("timings", (1.0, 1.01, 0.99, 1.0)),
    }
    rows = {r.fix: r for r in bench_whatif.checks(group.variants, ops, prediction, toggled)}
    assert rows["fixed"].close and rows["fixed"].measured == pytest.approx(0.25)
    assert rows["fixed"].rounds == pytest.approx(0.40)
    assert rows["topkeys"].measured == pytest.approx(0.18)  # not toggled: the rounds'
    assert bench_whatif.order_misses(list(rows.values())) == []
    # the server CPU per operation the rounds saved, beside: what the fix gave the server
    cpu = {group.variants[0].name: [800.0, 820.0], group.variants[1].name: [640.0, 656.0]}
    rows = {r.fix: r for r in bench_whatif.checks(group.variants, ops, prediction, toggled, cpu)}
    assert rows["topkeys"].cpu == pytest.approx(0.25) and rows["timings"].cpu is None
    # one window something else took moves neither the gain nor its error much
    steady = bench_whatif.Toggled("x", tuple(1.0 + 0.01 * (i % 5 - 2) for i in range(40)))
    upset = bench_whatif.Toggled("x", (*steady.ratios[:-1], 9.0))
    assert upset.gain == pytest.approx(steady.gain) and upset.error < 2 * steady.error
    # what each prediction removes, part by part, beside the CPU per op toggling saved
    prediction.parts = {"fixed": {"lock waits": 0.1, "shared counter CPU": 0.0}}
    prediction.cpu_saved = {"fixed": 0.125}
    W = bench_whatif.Window
    where = (  # the server's CPU per op, shared over per-thread: 1.2, 1.1, 1.1
        (W(960, 500, 250), W(800, 500, 250)),
        (W(880, 510, 240), W(800, 490, 260)),
        (W(990, 500, 260), W(900, 510, 250)),
    )
    toggled["fixed"] = bench_whatif.Toggled("fixed", toggled["fixed"].ratios, where)
    rows = {r.fix: r for r in bench_whatif.checks(group.variants, ops, prediction, toggled)}
    base = group.variants[0].name
    rec = bench_whatif.Recorder(predict=lambda p, f: prediction, predicted={base: prediction})
    rec.toggled[base] = toggled
    text = " ".join(bench_whatif.render(group.variants, ops, rec))  # wrapped at 80 columns
    said = "fixed removes: lock waits 10.0 %; server CPU per op saved: predicted +12.5 %, toggled +10.0 %"
    assert said in text
    # and where each operation's CPU time went in the toggled windows, the medians
    assert (
        "ns per op toggled, shared -> per-thread: server 960 -> 800, client 500 -> 500, idle 250 -> 250"
        in text
    )
    assert "timings removes" not in text  # nothing to break down
    names = {f.name: f.value for f in bench_whatif.figures(group.variants, ops, rec)}
    assert names[f"{group.title}: fixed server CPU per op saved, predicted"] == 12.5
    assert names[f"{group.title}: fixed toggled, per-thread windows: server ns per op (median)"] == 800
    assert names[f"{group.title}: fixed toggled, shared windows: idle ns per op (median)"] == 250
    assert rows["fixed"].toggled is not None and rows["fixed"].toggled.cpu_saved == pytest.approx(0.1)
    # each lock's mean hold in baseline and in the fixed preset, beside the prediction
    rec.holds = {base: {"topkeys": 201.4}, group.variants[-1].name: {"topkeys_thread": 180.0}}
    text = " ".join(bench_whatif.render(group.variants, ops, rec))
    assert f"{base} topkeys 201 ns; {group.variants[-1].name} topkeys_thread 180 ns" in text
    names = {f.name: f.value for f in bench_whatif.figures(group.variants, ops, rec)}
    assert names[f"{group.title}: {base}: mean hold of topkeys (interrupted holds aside)"] == 201.4


def test_mean_holds_leave_the_interrupted_aside() -> None:
    """A lock's mean hold over several profiles, weighted by acquisitions, less the holds
    taken for interrupted; its addresses (one per thread of a per-thread design) together."""
    p = _profile(on_cpu=0.5, idle=0.5)
    p.holds = [
        LockHold("topkeys", 1, acquisitions=1000, hold_ns=990 * 200 + 10 * 50_000, interrupted=10,
                 interrupted_ns=10 * 50_000),
        LockHold("topkeys_thread", 2, acquisitions=100, hold_ns=100 * 150),
        LockHold("topkeys_thread", 3, acquisitions=300, hold_ns=300 * 250),
        LockHold("never", 4),
    ]  # fmt: skip
    q = _profile(on_cpu=0.5, idle=0.5)
    q.holds = [LockHold("topkeys", 1, acquisitions=990, hold_ns=990 * 100)]
    got = bench_whatif.mean_holds([p, q])
    assert got == {"topkeys": pytest.approx((990 * 200 + 990 * 100) / 1980), "topkeys_thread": 225.0}


def test_a_fix_toggled_on_one_server_under_load(kvcached_factory: Callable[..., Server]) -> None:
    """The toggled measurement on a real kvcached under kvload: one ratio per pair, each
    window's CPU time per operation (the server's, the load generator's, the machine's
    idle), the site shared again afterwards; a kvcached that refuses the switch is one
    clear error, and so is a load generator that ended."""
    server = kvcached_factory("-t", "2", "--preset", "baseline")
    with kvload(server, 60) as load:
        got = bench_whatif.toggled_fix(server, "topkeys", 4, window=0.1, settle=0.01, client=load.pid)
        assert got.fix == "topkeys" and len(got.ratios) == 4 and all(r > 0 for r in got.ratios)
        assert len(got.cpu_ratios) == 4 and all(r > 0 for r in got.cpu_ratios)  # the server's CPU per op
        assert len(got.windows) == 4
        for shared, fixed in got.windows:
            assert shared.server > 0 and fixed.server > 0  # both served, and kvload sent
            assert shared.client > 0 and fixed.client > 0
            assert shared.idle >= 0 and fixed.idle >= 0
        assert set(got.per_op()) == {"server", "client", "idle"}
        assert server.stats("settings")["update_topkeys"] == "shared"
        everything = bench_whatif.toggled_fix(server, bench_whatif.ALL, 2, window=0.1, settle=0.01)
        assert len(everything.ratios) == 2 and server.stats("settings")["preset"] == "baseline"
        with pytest.raises(
            BenchError, match="kvcached refused `site nope shared`: CLIENT_ERROR unknown site"
        ):
            bench_whatif.toggled_fix(server, "nope", 1)
    with pytest.raises(BenchError, match=rf"the load generator \(PID {load.pid}\) ended"):
        bench_whatif.toggled_fix(server, "topkeys", 1, window=0.1, settle=0.01, client=load.pid)


@pytest.mark.bpf
def test_predictions_and_toggled_gains_come_from_the_same_minutes(
    kvcached_factory: Callable[..., Server],
) -> None:
    """Interleaved blocks on a real kvcached under kvload: a profile of baseline with real
    BPF, then every fix toggled, twice; the prediction judged is the blocks' mean, each
    fix's gain is over every block's pairs, and the sites are shared again afterwards."""
    plan = bench_whatif.plan()
    base = plan.groups[0].variants[0]
    server = kvcached_factory("-t", "2", "--preset", "baseline")
    said: list[float] = []

    def model(p: Profile, fixes: dict[str, tuple[str, ...]]) -> bench_whatif.Predicted:
        out = predict(p, find(p), fixes)
        said.append(out.gains["topkeys"])
        return out

    progress = io.StringIO()
    bench = Bench(plan, progress)
    bench.servers[base.server] = server
    try:
        mean, toggled, profiles = bench_whatif.interleaved(bench, base, 2, 2, 1.0, model)
    finally:
        shutil.rmtree(bench.workdir, ignore_errors=True)
    assert len(said) == 2 and mean.gains["topkeys"] == pytest.approx(sum(said) / 2)
    assert set(mean.gains) == set(toggled) == set(bench_whatif.fixes())
    assert all(len(t.ratios) == 4 and all(r > 0 for r in t.ratios) for t in toggled.values())
    assert "block 1/2" in progress.getvalue() and "block 2/2" in progress.getvalue()
    assert len(profiles) == 2 and all(p.target.pid == server.pid and p.oncpu for p in profiles)
    assert server.stats("settings")["preset"] == "baseline"


# ---- the ground truth: kvcached's fixes (BPF) ------------------------------------------


def _predicted(server: Server, tmp_path: Path, name: str) -> dict[str, float]:
    out = tmp_path / f"{name}.json.gz"
    with kvload(server, 60):  # stopped once the recording is done
        done = record(server.pid, out, "-d", "4")
    assert done.returncode == 0, done.stderr
    p = Profile.load(out)
    said = predict(p, find(p), bench_whatif.fixes())
    return {**said.gains, "largest": said.largest}


@pytest.mark.bpf
def test_kvcached_fixes_predict_gains_where_the_sites_are_shared(
    kvcached_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """kvcached baseline under load predicts a gain from the topkeys fix and from all of
    them; the fixed preset, the same load, predicts none for any site and less in all
    than baseline does (sign and order: load moves the numbers, not these)."""
    # denser probes than kvcached's defaults: this load is lighter than the demo's, and 4 s of
    # it at the defaults can hold too few lock waits and counter samples to see any gain
    dense = ("--probe-sample", "1024", "--lock-sample", "8")
    base = _predicted(kvcached_factory("-t", "2", "--preset", "baseline", *dense), tmp_path, "baseline")
    fixed = _predicted(kvcached_factory("-t", "2", "--preset", "fixed", *dense), tmp_path, "fixed")
    assert base["topkeys"] > 0 and base["fixed"] >= base["topkeys"], base
    assert all(fixed[site] == 0 for site in SITES), fixed
    assert fixed["fixed"] < base["fixed"], (fixed, base)


@pytest.mark.bpf
def test_a_program_without_probes_gets_gains_from_its_futex_waits(
    contend: Callable[[], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """The same model on a foreign binary (tests/programs/contend.c): its contended mutex,
    seen as futex waits, predicts a gain; its hot spinning function, work, predicts none."""
    proc = contend()
    out = tmp_path / "contend.json"
    done = record(proc.pid, out, "-d", "3")
    assert done.returncode == 0, done.stderr
    findings = find(Profile.load(out))
    futex = [f for f in findings if f.id.startswith("futex:")]
    assert futex and max(f.cost[GAIN_KEY] for f in futex) > 0, [(f.id, f.cost) for f in findings]
    hot = [f for f in findings if f.where == "spin_hot_function"]
    assert hot and all(f.cost[GAIN_KEY] == 0 for f in hot)
