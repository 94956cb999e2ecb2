"""The generic collectors (oncpu, offcpu) with real BPF on real processes.

A small C program with known behaviour (tests/programs/contend.c: one thread
spinning in `spin_hot_function`, two threads fighting over one mutex) pins
what the collectors must find in any program; kvcached under kvload pins
them on the server they were built for. Every test detaches and then checks
that nothing of ours stays loaded: no BPF program, map or perf event fd in
this process, and every program id we loaded gone from the kernel.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import bpf_frames, collecting, our_bpf_fds, snapshot, stop_contend

from kvprof.collect import OFFCPU_HZ, CollectOptions
from kvprof.model.delta import delta
from kvprof.model.profile import UNSAMPLED_FRAME, Profile
from kvprof.model.topology import parse_cpulist
from kvprof.system.servers import Server, die_with_parent, kvload_binary

pytestmark = pytest.mark.bpf

HZ = 99


# ---- the test program ----------------------------------------------------


def online_cpus() -> list[int]:
    return parse_cpulist(Path("/sys/devices/system/cpu/online").read_text())


def thread_names(pid: int) -> dict[int, str]:
    """tid -> comm of a running process."""
    task = Path(f"/proc/{pid}/task")
    return {int(t.name): (t / "comm").read_text().strip() for t in task.iterdir()}


def self_samples(profile: Profile, tids: set[int] | None = None) -> Counter[str]:
    """Samples by leaf frame (the function that was running)."""
    out: Counter[str] = Counter()
    for s in profile.oncpu:
        if s.frames and (tids is None or s.tid in tids):
            out[s.frames[-1]] += s.count
    return out


# ---- the tests -------------------------------------------------------------


@pytest.mark.parametrize("offcpu_hz", [0, OFFCPU_HZ], ids=["every-switch", "sampled"])
def test_hot_function_and_mutex_waits(contend: Callable[[], subprocess.Popen[bytes]], offcpu_hz: int) -> None:
    """On the contend program: spin_hot_function leads the on-CPU samples, and
    futex waits are counted for both mutex threads and none for the hot one,
    timed at every switch or sampled (the mutex threads wait about half the
    time: a few seconds of looks see them), their stacks walked to the thread's
    function through glibc (no frame pointers)."""
    proc = contend()
    names = thread_names(proc.pid)
    by_name = {n: t for t, n in names.items()}
    with collecting(proc.pid, offcpu_hz=offcpu_hz) as (collectors, _):
        time.sleep(3.0)
        profile = snapshot(proc.pid, collectors)

    top = self_samples(profile).most_common(3)
    assert top and top[0][0] == "spin_hot_function", top
    assert {s.tid for s in profile.oncpu} <= set(names), "samples from outside the target"
    hot = profile.threads[str(by_name["hot"])]
    assert hot.name == "hot" and hot.cpu_samples > 0
    assert hot.stack_quality is not None and hot.stack_quality < 0.5
    assert any(s.frames[-3:] == ["start_thread", "hot_main", "spin_hot_function"] for s in profile.oncpu)
    assert profile.status.counters["oncpu.samples"] >= sum(s.count for s in profile.oncpu) > 0
    assert profile.status.counters["oncpu.stack_errors"] == 0
    assert profile.status.counters["oncpu.map_full"] == 0

    waits: Counter[int] = Counter()
    wait_ns: Counter[int] = Counter()
    for f in profile.offcpu.futex:
        waits[f.tid] += f.waits
        wait_ns[f.tid] += f.ns
    for name in ("mutex-a", "mutex-b"):
        tid = by_name[name]
        assert waits[tid] > 0 and wait_ns[tid] > 0, (name, dict(waits))
        assert profile.threads[str(tid)].offcpu_ns > 0
    assert waits[by_name["hot"]] == 0
    # Both mutex threads wait on the same futex word: the one mutex.
    words = {f.uaddr for f in profile.offcpu.futex if f.tid in (by_name["mutex-a"], by_name["mutex-b"])}
    assert len(words) == 1, words
    assert any("mutex_main" in f.frames for f in profile.offcpu.futex), [
        f.frames for f in profile.offcpu.futex
    ]
    # The counter is read after the map, while the program still counts.
    assert profile.status.counters["offcpu.futex_waits"] >= sum(waits.values())


def run_kvload(server: Server, seconds: float) -> dict[str, Any]:
    """Batched multi-gets from 4 connections for `seconds`; kvload's JSON summary."""
    argv = [
        str(kvload_binary()), "--server", server.address, "--num-threads", "2", "--connections", "2",
        "--batch-size", "32", "--set-pct", "0", "--num-items", "2000", "--min-size", "64",
        "--max-size", "256", "--duration", str(seconds), "--json", "--quiet",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_kvcached_workers_sampled(kvcached_factory: Callable[..., Server]) -> None:
    """On kvcached -t 2 under kvload: both kv-worker threads have samples, named
    from comm, with kvcached's own functions in their stacks, on socket 0."""
    server = kvcached_factory("-t", "2")
    with collecting(server.pid) as (collectors, _):
        load = run_kvload(server, 3.0)
        profile = snapshot(server.pid, collectors)
    assert load["ops"] > 0 and load["errors"] == 0

    workers = {name: info for info in profile.threads.values() if (name := info.name).startswith("kv-worker")}
    assert set(workers) == {"kv-worker-0", "kv-worker-1"}, {t: i.name for t, i in profile.threads.items()}
    for name, info in workers.items():
        assert info.cpu_samples > 0, name
        assert info.stack_quality is not None and 0.0 <= info.stack_quality <= 1.0
        assert sum(info.sockets.values()) == info.cpu_samples
    frames = {f for s in profile.oncpu for f in s.frames}
    assert frames & {"process_commands", "items_get", "worker_main"}, sorted(frames)[:50]
    assert any(f.endswith("_[k]") for f in frames), "no kernel frames"
    topology = CollectOptions().topology
    if topology.sockets == [0]:
        assert all(set(i.sockets) <= {"0"} for i in profile.threads.values())
    # Workers sleep in epoll_wait between batches: off-CPU time is measured for them.
    assert all(profile.threads[t].offcpu_ns > 0 for t, i in profile.threads.items() if i.name in workers)


@pytest.mark.parametrize("sample", [1, 16, 0, -1])
def test_offcpu_stacks_add_up_to_thread_totals(kvcached_factory: Callable[..., Server], sample: int) -> None:
    """Every off-CPU period is timed into its thread's total; stacks are taken
    for 1 in `sample` of them (0: 1 in n, n following the switch rate) and each
    thread's sleeps' stacks are scaled to its total less its waits for a CPU
    (switch-outs still runnable: the stack `[runnable]`, exact), so they add up
    to it (to rounding); with 1 nothing is scaled. The profile says the n: the one given, or the
    switch-outs per draw, more than one for a server under load. -1: sampled
    (record's default); the totals come from schedstat and the wait for a CPU
    is its own stack, and a sleep no look saw is under [asleep, not sampled], so
    every thread's stacks add up to its total the same way."""
    server = kvcached_factory("-t", "2")
    with collecting(server.pid, offcpu_sample=max(0, sample), offcpu_hz=OFFCPU_HZ if sample < 0 else 0) as (
        collectors,
        _,
    ):
        run_kvload(server, 2.0)
        profile = snapshot(server.pid, collectors)
    if sample >= 0:
        rate = profile.status.sample_rates["offcpu_stacks"]
        assert rate == sample if sample else rate > 1, rate
    else:
        assert profile.status.sample_rates["offcpu_hz"] == OFFCPU_HZ
        assert profile.status.counters["offcpu.samples"] > 0
    assert not bpf_frames(profile), "the BPF program's own frames are not the target's"
    by_thread: Counter[int] = Counter()
    stacks: Counter[int] = Counter()
    for st in profile.offcpu.stacks:
        by_thread[st.tid] += st.ns
        stacks[st.tid] += 1
        if sample >= 0:  # timed at every switch: a sleep has its place, a wait for a CPU is [runnable]
            assert st.frames != [UNSAMPLED_FRAME], st
    workers = [int(t) for t, i in profile.threads.items() if i.name.startswith("kv-worker")]
    assert len(workers) == 2
    assert any(by_thread[tid] for tid in workers), "no off-CPU stack for either worker"
    for tid in workers:
        total = profile.threads[str(tid)].offcpu_ns
        assert total > 0
        if sample < 0:
            assert 0 <= profile.threads[str(tid)].runnable_ns <= total
        if sample == 1:
            assert by_thread[tid] == total
        elif by_thread[tid] or sample < 0:  # timed at every switch, one with no period drawn has no stack
            assert abs(by_thread[tid] - total) <= stacks[tid], (by_thread[tid], total)


def test_sampled_sleep_is_read_once() -> None:
    """A thread asleep all along (`sleep 60`'s) is read in full at the first look only:
    its schedstat says it has not been switched in since, so every later look counts
    that sample again (offcpu.samples_reused) and its sampled time is one stack."""
    proc = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent)
    try:
        with collecting(proc.pid, offcpu_hz=99) as (collectors, _):
            time.sleep(1.0)
            profile = snapshot(proc.pid, collectors)
    finally:
        proc.kill()
        proc.wait()
    counters = profile.status.counters
    assert counters["offcpu.samples"] > 10, counters
    assert counters["offcpu.samples_reused"] == counters["offcpu.samples"] - 1, counters
    placed = [s for s in profile.offcpu.stacks if not s.placeless()]
    assert len(placed) == 1, [(s.ns, s.frames) for s in profile.offcpu.stacks]
    assert any("nanosleep" in f for f in placed[0].frames), placed[0].frames


def test_close_detaches_and_target_keeps_serving(kvcached_factory: Callable[..., Server]) -> None:
    """close() leaves no perf event, BPF fd or program behind (one cpu-clock
    event per CPU while attached), and kvcached keeps serving."""
    server = kvcached_factory("-t", "2")
    before = our_bpf_fds()
    with collecting(server.pid) as (collectors, loaded):
        new = {fd: kind for fd, kind in our_bpf_fds().items() if fd not in before}
        perf = [fd for fd, kind in new.items() if kind == "perf_event"]
        # One cpu-clock event per online CPU; sched_switch is a raw tracepoint,
        # attached by an fd of its own, and no syscall tracepoint is used.
        assert len(perf) == len(online_cpus()), new
        assert "bpf-raw-tracepoint" in new.values() or "bpf_link" in new.values(), new
        assert len(loaded) == 2, loaded  # kv_cpu_clock, sched_switch
        run_kvload(server, 1.0)
        profile = snapshot(server.pid, collectors)
        collectors[0].close()
        collectors[0].close()  # idempotent
    assert profile.status.counters["oncpu.samples"] > 0
    assert server.alive()
    assert int(server.stats()["curr_items"]) == 2000
    assert run_kvload(server, 1.0)["hits"] > 0


@pytest.mark.bpf
def test_samplers_share_one_cpu_clock(contend: Callable[[], subprocess.Popen[bytes]]) -> None:
    """oncpu and regsample in one module sample at one cpu-clock event per CPU, not one
    each (each timer interrupt is what costs, docs/record.md); both count; one paused
    leaves the other sampling; with both paused, and once closed, no event is open."""
    from kvprof.collect.bpf import Module
    from kvprof.collect.oncpu import OnCpuCollector
    from kvprof.collect.regsample import RegsampleCollector

    proc = contend()
    opts = CollectOptions(hz=499)
    before = our_bpf_fds()

    def events() -> int:
        return sum(kind == "perf_event" for fd, kind in our_bpf_fds().items() if fd not in before)

    def counts() -> tuple[int, int]:
        c = snapshot(proc.pid, [oncpu, regs]).status.counters
        return c["oncpu.samples"], c["regsample.samples"]

    oncpu, regs = OnCpuCollector(proc.pid, opts), RegsampleCollector(proc.pid, opts)
    module = Module(proc.pid, [oncpu.program(), regs.program()], opts)
    try:
        oncpu.attach(module)
        regs.attach(module)
        assert events() == len(online_cpus())
        time.sleep(1.0)
        first = counts()
        assert min(first) > 0, first
        programs = [p for c in (oncpu, regs) for p in c.attached_programs()]
        assert [(p.collector, p.name) for p in programs] == [("oncpu+regsample", "kv_cpu_clock")]
        oncpu.pause()
        paused = counts()
        time.sleep(1.0)
        after = counts()
        assert after[0] == paused[0] and after[1] > paused[1], (paused, after)
        assert events() == len(online_cpus())
        regs.pause()
        assert events() == 0
        oncpu.resume()
        assert events() == len(online_cpus())
        oncpu.close()  # regsample now carries the program's cost
        assert [p.collector for p in regs.attached_programs()] == ["oncpu+regsample"]
    finally:
        oncpu.close()
        regs.close()
        module.cleanup()
    assert events() == 0


@pytest.mark.parametrize("offcpu_hz", [0, OFFCPU_HZ], ids=["every-switch", "sampled"])
def test_target_exits_mid_run(contend: Callable[[], subprocess.Popen[bytes]], offcpu_hz: int) -> None:
    """When the target exits while attached, contribute() still returns what
    was counted (names and symbols included) and close() works."""
    proc = contend()
    by_name = {n: t for t, n in thread_names(proc.pid).items()}
    with collecting(proc.pid, offcpu_hz=offcpu_hz) as (collectors, _):
        time.sleep(2.0)
        stop_contend(proc)
        assert proc.returncode == 0
        profile = snapshot(proc.pid, collectors)
        for c in collectors:
            c.close()
        after = snapshot(proc.pid, collectors)
    for p in (profile, after):
        assert p.threads[str(by_name["hot"])].cpu_samples > 0
        assert p.threads[str(by_name["hot"])].name == "hot"
        assert self_samples(p).most_common(1)[0][0] == "spin_hot_function"
        assert sum(f.waits for f in p.offcpu.futex if f.tid == by_name["mutex-a"]) > 0
    assert after.oncpu == profile.oncpu and after.offcpu == profile.offcpu


def test_time_runnable_waiting_for_a_cpu_is_counted_per_thread() -> None:
    """A spinning thread that shares its CPU with three other spinners waits runnable for
    about three quarters of the window; alone on its CPU it waits for it far less:
    offcpu's `runnable_ns` (the kernel's run delay, taken over the window) says so. The
    machine's other work can only add to the shared figure; "alone" is the quieter of a
    window before the rivals and one after, so that a burst of it in one window does
    not make the thread look shared."""
    cpu = str(online_cpus()[-1])
    spin = ["taskset", "-c", cpu, "python3", "-c", "while True: pass"]
    target = subprocess.Popen(spin)
    rivals: list[subprocess.Popen[bytes]] = []

    def runnable_share(seconds: float) -> float:
        start, t0 = snapshot(target.pid, collectors), time.monotonic()
        time.sleep(seconds)
        end = snapshot(target.pid, collectors)
        return delta(end, start).threads[str(target.pid)].runnable_ns / 1e9 / (time.monotonic() - t0)

    try:
        with collecting(target.pid) as (collectors, _):
            before = runnable_share(1.0)
            rivals = [subprocess.Popen(spin) for _ in range(3)]
            time.sleep(0.5)
            shared = runnable_share(2.0)
            for p in rivals:
                p.kill()
                p.wait()
            time.sleep(0.5)
            after = runnable_share(1.0)
        # four spinners on one CPU: each waits about 3/4 of the time; more load only adds
        assert shared >= 0.5, shared
        assert min(before, after) < shared, (before, after, shared)
    finally:
        for p in (*rivals, target):
            p.kill()
            p.wait(10)
