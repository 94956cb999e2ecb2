"""Run a plan: every server up front, populated once, then interleaved rounds.

Run 1 runs every variant once (A B C), run 2 again (A B C), and so on, so
that whatever else the machine is doing hits every variant alike. Servers are
started through `kvprof.system.servers` on free loopback ports and stopped by PID at
the end, also on Ctrl-C, SIGTERM and errors. Each load-generator run is a
child process; its CPU time (from the kernel's accounting of reaped children)
and the server's (from /proc) are kept with the result, so a reader can check
that the client was not the bottleneck.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from kvprof.bench import BenchError
from kvprof.bench.loadgen import (
    Counts,
    kvload_argv,
    kvload_binary,
    kvload_counts,
    kvload_populate_argv,
    memcaslap_argv,
    memcaslap_config,
    memcaslap_counts,
    tail,
)
from kvprof.bench.machine import children_cpu_s, process_cpu_s, wait_idle
from kvprof.bench.placement import Placement
from kvprof.bench.variants import KVLOAD, MEMCACHED, MEMCASLAP, Plan, ServerConfig, Variant
from kvprof.collect.cpustat import cpu_times
from kvprof.system.attach import stop_on_signals
from kvprof.system.servers import Server, TargetError, start_kvcached, start_memcached

RUN_SLACK_S = 30.0  # a run that outlives its duration by this much is stopped and reported
# --wait-idle: a run during which other processes, or the hypervisor's other
# guests (steal time), took more than NOISE_MAX_CORES is run again, up to
# REDO_MAX times (then kept; its `other_cpu_s` and `steal_s` say why it is off).
NOISE_MAX_CORES = 0.15
REDO_MAX = 3
# Each run of a round is made of slices of about SLICE_S, alternated between
# the variants (A B C, C B A, A B C, ...), so that the runs a per-round ratio
# divides were measured over the same seconds: the host moves the vCPUs
# between near and far cores more often than a round lasts
# (docs/bench-results.md, "The host moves the CPUs").
SLICE_S = 1.0


class Interrupted(Exception):
    """Ctrl-C or SIGTERM; `results` holds the complete rounds run so far."""

    def __init__(self, results: list[VariantRuns]) -> None:
        super().__init__("interrupted")
        self.results = results


@dataclass(frozen=True)
class RunResult(Counts):
    """One load-generator run against one variant: what the tool counted, and the
    machine around it."""

    client_cpu_s: float  # user + system CPU of the load generator
    server_cpu_s: float  # user + system CPU of the server during the run
    other_cpu_s: float  # CPU everything else on the machine used meanwhile: noise
    steal_s: float  # CPU time the hypervisor gave other guests meanwhile: noise too
    load_avg_1min: float  # /proc/loadavg when the run started
    date: str  # ISO 8601, when the run started
    argv: tuple[str, ...]
    redone: int = (
        0  # --wait-idle: times this run (or a slice of it) was repeated because the machine was busy
    )
    slices: int = 1  # the load-generator runs this one is the sum of
    rt_before_ns: float = math.nan  # cache-line round trip between two CPUs right before the run
    rt_after_ns: float = math.nan  # and right after it (kvprof.bench.placement)

    @property
    def noise_cores(self) -> float:
        """Cores' worth of CPU that other processes and other guests took during the run."""
        return (self.other_cpu_s + self.steal_s) / self.duration_s if self.duration_s > 0 else 0.0


def merge(parts: list[RunResult]) -> RunResult:
    """Slices of one run as one: counts and CPU times summed, ops/s over the summed duration,
    each latency percentile the median of the slices' (the maximum the largest)."""
    first, last = parts[0], parts[-1]
    duration = sum(p.duration_s for p in parts)
    ops = sum(p.ops for p in parts)
    names = {k for p in parts for k in p.latency_us}
    latency = {}
    for k in names:
        values = sorted(p.latency_us[k] for p in parts if k in p.latency_us)
        latency[k] = values[-1] if k == "max" else values[len(values) // 2]
    return RunResult(
        ops_per_sec=ops / duration if duration > 0 else 0.0,
        duration_s=duration,
        ops=ops,
        gets=sum(p.gets for p in parts),
        sets=sum(p.sets for p in parts),
        hits=sum(p.hits for p in parts),
        misses=sum(p.misses for p in parts),
        latency_us=latency,
        client_cpu_s=sum(p.client_cpu_s for p in parts),
        server_cpu_s=sum(p.server_cpu_s for p in parts),
        other_cpu_s=sum(p.other_cpu_s for p in parts),
        steal_s=sum(p.steal_s for p in parts),
        load_avg_1min=first.load_avg_1min,
        date=first.date,
        argv=first.argv,
        redone=sum(p.redone for p in parts),
        rt_before_ns=first.rt_before_ns,
        rt_after_ns=last.rt_after_ns,
        slices=len(parts),
    )


@dataclass
class VariantRuns:
    """Everything measured for one variant."""

    variant: Variant
    server_argv: list[str]
    server_version: str
    runs: list[RunResult] = field(default_factory=list)
    warmup: RunResult | None = None


def _die_with_parent() -> None:
    # In the child: a killed bench must not leave a load generator running.
    os.setsid()  # and a Ctrl-C meant for the bench is the bench's to handle
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


class Bench:
    """Owns a plan's servers; `run()` does the rounds. Use as a context manager."""

    def __init__(self, plan: Plan, progress: TextIO, before: Callable[[Bench], None] | None = None) -> None:
        self.plan = plan
        self.progress = progress
        self.before = before  # called once the servers are up and populated
        self.servers: dict[ServerConfig, Server] = {}
        self.failed = False
        tools = {v.client.tool for v in plan.variants}
        self.kvload = kvload_binary() if KVLOAD in tools else None
        self.memcaslap = shutil.which("memcaslap") if MEMCASLAP in tools else None
        if MEMCASLAP in tools and self.memcaslap is None:
            raise BenchError("memcaslap not found: apt-get install libmemcached-tools")
        self.workdir = Path(tempfile.mkdtemp(prefix="kvprof-bench-"))  # memcaslap's config files
        self.placement = Placement()

    def say(self, line: str) -> None:
        print(line, file=self.progress, flush=True)

    # servers

    def start(self) -> None:
        """Start every distinct server, then populate each once for its kvload variants."""
        for config in self.plan.servers():
            try:
                if config.kind == MEMCACHED:
                    server = start_memcached(config.args())
                else:
                    server = start_kvcached(
                        config.args(), binary=Path(config.binary) if config.binary else None
                    )
            except TargetError as e:
                raise BenchError(f"cannot start {config.kind} {' '.join(config.args())}: {e}") from None
            self.servers[config] = server
            name = config.kind if config.kind == MEMCACHED else f"{config.kind} {config.label}"
            self.say(f"started {name} -t {config.workers}: PID {server.pid} on {server.address}")
        populated: set[tuple[ServerConfig, int, int]] = set()
        for v in self.plan.variants:
            key = (v.server, v.client.num_items, v.client.value_size)
            if v.client.tool != KVLOAD or key in populated:
                continue
            self._populate(v)
            populated.add(key)

    def _populate(self, v: Variant) -> None:
        assert self.kvload is not None
        server = self.servers[v.server]
        argv = kvload_populate_argv(self.kvload, server.address, v.client)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, preexec_fn=_die_with_parent)
        if proc.returncode != 0:
            raise BenchError(
                f"populating {server.name} on {server.address} failed (kvload status {proc.returncode}):\n"
                + tail(proc.stderr + proc.stdout)
            )

    def stop(self) -> None:
        """Stop every server by PID; keep the logs of any that failed."""
        for config, server in self.servers.items():
            status = server.stop()
            if status not in (0, -signal.SIGTERM) or self.failed:
                if status not in (0, -signal.SIGTERM):
                    self.say(f"{config.kind} PID {server.pid} exited with status {status}")
                self.say(f"  its log: {server.log_path}")
            else:
                server.log_path.unlink(missing_ok=True)
        self.servers.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None and not issubclass(exc_type, KeyboardInterrupt | Interrupted):
            self.failed = True
        self.stop()

    # runs

    def run_once(self, v: Variant, duration: float) -> RunResult:
        """One timed load-generator run against variant `v`'s server, between two
        placement probes (kvprof.bench.placement)."""
        server = self.servers[v.server]
        if not server.alive():
            self.failed = True
            raise BenchError(
                f"{server.name} for {v.name} exited with status {server.proc.returncode}:\n"
                + tail(server.log())
            )
        if v.client.tool == KVLOAD:
            assert self.kvload is not None
            argv = kvload_argv(self.kvload, server.address, v.client, duration)
        else:
            assert self.memcaslap is not None
            config = self.workdir / f"memcaslap-{abs(hash(v.client))}.cfg"
            if not config.exists():
                config.write_text(memcaslap_config(v.client))
            argv = memcaslap_argv(self.memcaslap, server.address, v.client, config, duration)
        rt0 = self.placement.probe()
        date = datetime.datetime.now().isoformat(" ", "seconds")
        load = os.getloadavg()[0]
        machine0, server_cpu0, client_cpu0 = cpu_times(), process_cpu_s(server.pid), children_cpu_s()
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=duration + RUN_SLACK_S,
                preexec_fn=_die_with_parent,
            )
        except subprocess.TimeoutExpired:
            raise BenchError(f"{v.client.tool} against {v.name} did not finish in {duration:g} s") from None
        client_cpu = children_cpu_s() - client_cpu0
        server_cpu = process_cpu_s(server.pid) - server_cpu0 if server.alive() else math.nan
        machine1 = cpu_times()
        other_cpu = max(0.0, machine1.busy - machine0.busy - client_cpu - server_cpu)
        rt1 = self.placement.probe()
        counts = kvload_counts(v, proc) if v.client.tool == KVLOAD else memcaslap_counts(v, proc)
        return RunResult(
            **vars(counts),
            client_cpu_s=client_cpu,
            server_cpu_s=server_cpu,
            other_cpu_s=other_cpu,
            steal_s=machine1.steal - machine0.steal,
            load_avg_1min=load,
            date=date,
            argv=tuple(argv),
            rt_before_ns=rt0,
            rt_after_ns=rt1,
        )

    def wait_idle(self) -> float:
        return wait_idle(self.say)

    def run_slices(
        self, variants: list[Variant], seconds: float, wait_idle: bool, label: str
    ) -> list[RunResult]:
        """One slice of every variant, back to back in the given order; with `wait_idle`, on an
        idle machine, and again (all of them, up to REDO_MAX times) when other processes got
        busy during one."""
        if not wait_idle:
            return [self.run_once(v, seconds) for v in variants]
        for redone in range(REDO_MAX + 1):
            self.wait_idle()
            done = [replace(self.run_once(v, seconds), redone=redone) for v in variants]
            noisy = max(done, key=lambda r: r.noise_cores)
            if noisy.noise_cores <= NOISE_MAX_CORES or redone == REDO_MAX:
                return done
            self.say(f"{label}: other processes or guests took {noisy.noise_cores:.2f} cores, again")
        raise AssertionError("unreachable")

    def run_round(self, results: list[VariantRuns], duration: float, wait_idle: bool, label: str) -> None:
        """One run of every variant, as slices alternated A B C, C B A, ... (SLICE_S)."""
        slices = max(1, round(duration / SLICE_S))
        parts: dict[int, list[RunResult]] = {i: [] for i in range(len(results))}
        for k in range(slices):
            order = list(range(len(results))) if k % 2 == 0 else list(reversed(range(len(results))))
            done = self.run_slices([results[i].variant for i in order], duration / slices, wait_idle, label)
            for i, part in zip(order, done, strict=True):
                parts[i].append(part)
        for i, vr in enumerate(results):
            vr.runs.append(merge(parts[i]))

    def run(self, runs: int, duration: float, warmup: float, wait_idle: bool = False) -> list[VariantRuns]:
        """Start, populate, `self.before` (the servers up), warm up, then `runs` interleaved
        rounds; Interrupted keeps complete rounds."""
        results: list[VariantRuns] = []
        with stop_on_signals(signal.SIGHUP):  # SIGTERM and SIGHUP stop it as Ctrl-C does
            try:
                self.start()
                if self.before is not None:
                    self.before(self)
                for v in self.plan.variants:
                    server = self.servers[v.server]
                    version = server.stats().get("version", "?")
                    results.append(VariantRuns(v, list(server.argv), version))
                if warmup > 0:
                    for r in results:
                        r.warmup = self.run_once(r.variant, warmup)
                        self.say(f"[warm-up] {r.variant.name}: {r.warmup.ops_per_sec:,.0f} ops/s")
                for n in range(1, runs + 1):
                    label = f"[run {n}/{runs}]"
                    self.run_round(results, duration, wait_idle, label)
                    for r in results:
                        self.say(f"{label} {r.variant.name}: {r.runs[-1].ops_per_sec:,.0f} ops/s")
            except KeyboardInterrupt:
                complete = min((len(r.runs) for r in results), default=0)
                for r in results:  # a round cut short would favour the variants that ran in it
                    del r.runs[complete:]
                raise Interrupted(results) from None
            except TargetError as e:
                self.failed = True
                raise BenchError(str(e)) from None
        return results


def run_plan(
    plan: Plan,
    runs: int,
    duration: float,
    warmup: float,
    progress: TextIO,
    wait_idle: bool = False,
    before: Callable[[Bench], None] | None = None,
) -> list[VariantRuns]:
    """Run a plan start to end (`before`: once the servers are up); every server is
    stopped whatever happens."""
    started = time.monotonic()
    with Bench(plan, progress, before) as bench:
        results = bench.run(runs, duration, warmup, wait_idle)
    bench.say(f"done in {time.monotonic() - started:.0f} s")
    return results
