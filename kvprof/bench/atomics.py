"""`kvprof bench --scenario atomics`: the study's counter experiment.

`server/build/atomics` increments a counter from N pinned threads in one of
four designs (one shared atomic, per-thread atomics in one cache line,
per-thread atomics on their own lines, plain per-thread counters). This runs
each design at 1..ncpu threads, interleaved like the server benchmarks,
pinned to CPUs chosen from the topology: distinct cores of one socket first;
when the machine has several sockets, also spread across sockets, to show
what a cache line crossing the interconnect costs.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import pyperf  # type: ignore[import-untyped]  # pyperf ships no type information

from kvprof import __version__
from kvprof.bench import BenchError
from kvprof.bench.machine import host_metadata, wait_idle
from kvprof.bench.placement import Cpu, atomics_binary, sockets
from kvprof.bench.results import Metadata

MODES = ("local", "padded", "false-shared", "shared")  # local first: the reference
SAME, CROSS = "same-socket", "cross-socket"
ALL_COUNTS_UP_TO = 8  # every thread count up to this, then doublings and ncpu


def placement(cpus: Sequence[Cpu], threads: int, where: str) -> list[int]:
    """The CPUs for `threads` threads: packed into one socket first (SAME), or
    round-robin over the sockets (CROSS). Threads beyond the CPUs wrap around."""
    per_socket = list(sockets(cpus).values())
    if where == SAME:
        order = [c for s in per_socket for c in s]
    else:
        order = []
        for i in range(max(len(s) for s in per_socket)):
            order += [s[i] for s in per_socket if i < len(s)]
    return [order[i % len(order)] for i in range(threads)]


def thread_counts(ncpu: int) -> list[int]:
    """1..ncpu; beyond ALL_COUNTS_UP_TO only doublings and ncpu itself."""
    counts = list(range(1, min(ncpu, ALL_COUNTS_UP_TO) + 1))
    while counts[-1] * 2 <= ncpu:
        counts.append(counts[-1] * 2)
    if counts[-1] != ncpu:
        counts.append(ncpu)
    return counts


@dataclass(frozen=True)
class Config:
    """One atomics run configuration."""

    mode: str
    threads: int
    cpus: tuple[int, ...]
    where: str  # SAME or CROSS
    nsockets: int

    @property
    def name(self) -> str:
        return f"{self.mode} t={self.threads}" + (" cross-socket" if self.where == CROSS else "")

    @property
    def group(self) -> str:
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        return threads + (" across sockets" if self.where == CROSS else "")


def plan(cpus: Sequence[Cpu], counts: Sequence[int]) -> list[Config]:
    """Every mode at every thread count; a cross-socket copy where that uses other CPUs."""
    socket_of = {c.cpu: c.socket for c in cpus}
    multi = len({c.socket for c in cpus}) > 1
    out = []
    for n in counts:
        same = placement(cpus, n, SAME)
        wheres = [(SAME, same)]
        cross = placement(cpus, n, CROSS)
        if multi and n >= 2 and sorted(cross) != sorted(same):
            wheres.append((CROSS, cross))
        for where, chosen in wheres:
            nsockets = len({socket_of[c] for c in chosen})
            out += [Config(mode, n, tuple(chosen), where, nsockets) for mode in MODES]
    return out


class AtomicsInterrupted(Exception):
    """Ctrl-C; `results` holds the complete rounds."""

    def __init__(self, results: list[ConfigRuns]) -> None:
        super().__init__("interrupted")
        self.results = results


@dataclass
class ConfigRuns:
    config: Config
    ops: list[float]
    meta: list[Metadata]


def run_one(exe: Path, c: Config, duration: float) -> tuple[float, Metadata]:
    argv = [
        str(exe),
        "--mode",
        c.mode,
        "--threads",
        str(c.threads),
        "--cpus",
        ",".join(map(str, c.cpus)),
        "--duration-ms",
        str(max(10, round(duration * 1000))),
        "--json",
    ]
    date = datetime.datetime.now().isoformat(" ", "seconds")
    load = os.getloadavg()[0]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 30)
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv)} failed (status {proc.returncode}): {proc.stderr.strip()}")
    found = re.search(r'"ops_per_sec": ([\d.]+)', proc.stdout)
    if not found:
        raise BenchError(f"atomics printed no result: {proc.stdout[-200:]!r}")
    ops = float(found.group(1))
    if ops <= 0:
        # its threads wait for a start flag: on a busy machine a pinned thread
        # can miss the whole window (it then prints ns_per_op inf)
        raise BenchError(
            f"{c.name} on CPUs {c.cpus}: no increments counted, the pinned threads got no CPU "
            "time within the run; use a longer --duration"
        )
    meta: Metadata = {
        "date": date,
        "duration": duration,
        "load_avg_1min": load,
        "ops_per_sec": ops,
        "loops": max(1, round(ops * duration)),  # increments counted: value x loops = the run's time
        "ns_per_op": c.threads / ops * 1e9,
        "client_args": " ".join(argv[1:]),
    }
    return ops, meta


def run(
    configs: Sequence[Config], runs: int, duration: float, progress: TextIO, idle: bool = False
) -> list[ConfigRuns]:
    """Interleaved rounds over every configuration; AtomicsInterrupted keeps the complete rounds.

    With `idle`, each run waits for an idle machine first: a pinned thread
    shares its CPU with whatever else runs there."""
    exe = atomics_binary()
    results = [ConfigRuns(c, [], []) for c in configs]

    def say(line: str) -> None:
        print(line, file=progress, flush=True)

    try:
        for n in range(1, runs + 1):
            for r in results:
                if idle:
                    wait_idle(say)
                ops, meta = run_one(exe, r.config, duration)
                r.ops.append(ops)
                r.meta.append(meta)
                print(
                    f"[run {n}/{runs}] {r.config.name}: {ops / 1e6:,.1f} M ops/s", file=progress, flush=True
                )
    except KeyboardInterrupt:
        complete = min(len(r.ops) for r in results)
        for r in results:  # keep complete rounds only
            del r.ops[complete:], r.meta[complete:]
        raise AtomicsInterrupted(results) from None
    return results


def to_suite(results: Sequence[ConfigRuns]) -> pyperf.BenchmarkSuite:
    """pyperf JSON like the server benchmarks: value = seconds per increment (all threads)."""
    host = host_metadata()
    benchmarks = []
    for r in results:
        c = r.config
        pruns = []
        for ops, meta in zip(r.ops, r.meta, strict=True):
            full: Metadata = {
                **host,
                **meta,
                "name": c.name,
                "unit": "second",
                "kvprof_version": __version__,
                "kvprof_scenario": "atomics",
                "kvprof_group": c.group,
                "mode": c.mode,
                "threads": c.threads,
                "cpus": ",".join(map(str, c.cpus)),
                "placement": c.where,
                "sockets": c.nsockets,
            }
            pruns.append(pyperf.Run([1 / ops], metadata=full, collect_metadata=False))
        if pruns:
            benchmarks.append(pyperf.Benchmark(pruns))
    if not benchmarks:
        raise ValueError("no complete runs to write")
    return pyperf.BenchmarkSuite(benchmarks)


def describe_host(cpus: Sequence[Cpu]) -> str:
    """`2 CPUs (2 cores, 1 socket), kernel 6.1.0`."""
    cores = len({(c.socket, c.core) for c in cpus})
    nsockets = len({c.socket for c in cpus})
    return (
        f"{len(cpus)} CPUs ({cores} cores, {nsockets} socket{'s' if nsockets != 1 else ''}), "
        f"kernel {platform.release()}"
    )
