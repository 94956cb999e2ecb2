"""What kvprof itself costs while it watches: the run time of each of its BPF
programs, the uprobe hits they were fired by, and the CPU time of the kvprof
process, over the window. The session reads it with every snapshot
(Profile.overhead); kvprof.analysis.own_cost turns it into a share of
the target.

The kernel counts a program's run time only while BPF run-time statistics are
on. The meter turns them on with BPF_ENABLE_STATS, which returns a file
descriptor that keeps them on while it is open and off again when it closes,
also when kvprof is killed; where that is refused (not root, an old kernel) it
uses them if `kernel.bpf_stats_enabled` is on, else says they were not
measured. Counting costs each program two clock reads per run.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path

from kvprof.collect import SAMPLE_INTERRUPT_NS, UPROBE_HIT_NS
from kvprof.model.profile import Overhead, ProgramCost

SYS_BPF = 321  # x86-64
BPF_ENABLE_STATS = 32
BPF_STATS_RUN_TIME = 0
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
TICKS = os.sysconf("SC_CLK_TCK")


def enable_stats() -> int | None:
    """A descriptor that keeps BPF run-time statistics on while it is open, or None."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint32 * 2)(BPF_STATS_RUN_TIME, 0)
    fd = libc.syscall(SYS_BPF, BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr))
    return fd if fd >= 0 else None


def program_stats(fd: int) -> tuple[int, int]:
    """(run_cnt, run_time_ns) of the BPF program behind our descriptor `fd`."""
    runs = ns = 0
    try:
        for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "run_cnt":
                runs = int(value)
            elif key == "run_time_ns":
                ns = int(value)
    except (OSError, ValueError):
        pass
    return runs, ns


def cpu_seconds(pid: int | str) -> float:
    """utime + stime of every thread of `pid` ("self" for this process), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class Program:
    """One attached BPF program: who loaded it, what fires it, its descriptor."""

    collector: str
    name: str
    kind: str
    fd: int


@dataclass
class _Reading:
    at: float
    target_cpu_s: float
    kvprof_cpu_s: float
    programs: dict[tuple[str, str], tuple[int, int]]


class Meter:
    """The programs' statistics and the two processes' CPU, read at the window's start
    (start()) and at every read(): what kvprof cost between the two."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None
        self.measured = False
        self._base: _Reading | None = None

    def _reading(self, programs: list[Program]) -> _Reading:
        return _Reading(
            at=time.monotonic(),
            target_cpu_s=cpu_seconds(self.pid),
            kvprof_cpu_s=cpu_seconds("self"),
            programs={(p.collector, p.name): program_stats(p.fd) for p in programs},
        )

    def start(self, programs: list[Program]) -> None:
        """Turn the statistics on (the programs' counts start from here) and take the base."""
        if self._fd is None:
            self._fd = enable_stats()
        self.measured = self._fd is not None or _sysctl_on()
        self._base = self._reading(programs)

    def read(self, programs: list[Program]) -> Overhead:
        if self._base is None:
            return Overhead()
        now, base = self._reading(programs), self._base
        costs = []
        for p in programs:
            runs, ns = now.programs[(p.collector, p.name)]
            runs0, ns0 = base.programs.get((p.collector, p.name), (0, 0))
            costs.append(ProgramCost(p.collector, p.name, p.kind, max(0, runs - runs0), max(0, ns - ns0)))
        return Overhead(
            measured=self.measured,
            window_s=round(now.at - base.at, 3),
            cpus=os.cpu_count() or 0,
            target_cpu_s=round(max(0.0, now.target_cpu_s - base.target_cpu_s), 3),
            kvprof_cpu_s=round(max(0.0, now.kvprof_cpu_s - base.kvprof_cpu_s), 3),
            uprobe_hit_ns=UPROBE_HIT_NS,
            sample_interrupt_ns=SAMPLE_INTERRUPT_NS,
            programs=costs,
        )

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _sysctl_on() -> bool:
    try:
        return STATS_SYSCTL.read_text().strip() == "1"
    except OSError:
        return False
