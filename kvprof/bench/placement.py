"""Where the host put our CPUs: the cache-line round trip between two of them.

A virtual machine's CPUs are threads on the host, and the host moves them.
On the 2-vCPU development VM the round trip of one cache line between the two
vCPUs (`server/build/atomics --mode pingpong`) takes one of two values, the
far one several times the near (host cores that share a cache, and cores
that do not), and flips between them every few tens of seconds, idle or
loaded, often in the middle of a run. Whatever crosses between threads costs
accordingly more or less: a shared mutex, a shared atomic counter, a socket's
data. kvcached `baseline`, whose mutex and atomics bounce between the workers,
serves markedly fewer ops/s on the far placement; `fixed`, which shares no
line between workers, changes much less (docs/bench-results.md, "The host
moves the CPUs", has the readings). Runs at different placements measure
different machines.

So every run of `kvprof bench` and of bench/overhead.py is bracketed by a
short round-trip probe (30 ms, between the first two CPUs the bench may use,
distinct cores first). The bench keeps the readings in its result file and
says under its table when the host moved the CPUs; bench/overhead.py gives
its ratio over all pairs and over the pairs whose runs shared a placement. Holding the placement
still for a whole bench (waiting for it, or loading the machine until the
host moved the CPUs back) was tried and did not make the runs steadier: the
host moved them again within runs.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvprof.bench import BenchError
from kvprof.collect.server_stats import TargetError
from kvprof.model.topology import Topology
from kvprof.system.lab import lab_binary

PROBE_MS = 30
MAX_NS = 20_000.0  # no cache line takes this long to go and come back; a descheduled thread does
# Two round trips within this factor are one placement: the readings of one
# placement spread by less, the two placements lie further apart
# (docs/bench-results.md, "The host moves the CPUs").
ALIKE = 2.0


@dataclass(frozen=True)
class Cpu:
    cpu: int
    core: int
    socket: int


def usable_cpus(topology: Topology, allowed: set[int] | None = None) -> list[Cpu]:
    """The topology's CPUs we may pin to (all of them when `allowed` is None)."""
    cpus = [
        Cpu(n, place.core, place.socket)
        for n, place in sorted(topology.cpus.items())
        if allowed is None or n in allowed
    ]
    if not cpus:
        raise BenchError("no usable CPUs in the topology")
    return cpus


def _socket_order(cpus: Sequence[Cpu]) -> list[int]:
    """One CPU per core first, then their SMT siblings: threads get cores of their own."""
    by_core: dict[int, list[int]] = {}
    for c in sorted(cpus, key=lambda c: c.cpu):
        by_core.setdefault(c.core, []).append(c.cpu)
    out = []
    depth = max(len(v) for v in by_core.values())
    for level in range(depth):
        out += [siblings[level] for _, siblings in sorted(by_core.items()) if level < len(siblings)]
    return out


def sockets(cpus: Sequence[Cpu]) -> dict[int, list[int]]:
    """Socket -> its CPUs in the order threads are placed on it."""
    by_socket: dict[int, list[Cpu]] = {}
    for c in cpus:
        by_socket.setdefault(c.socket, []).append(c)
    return {s: _socket_order(members) for s, members in sorted(by_socket.items())}


def probe_cpus() -> tuple[int, int] | None:
    """Two CPUs this process may run on, on distinct cores when the topology
    has them; None on a one-CPU machine."""
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        return None
    try:
        order = [c for s in sockets(usable_cpus(Topology.read(), allowed)).values() for c in s]
    except (OSError, ValueError, BenchError):  # no sysfs topology (containers): any two allowed CPUs
        order = sorted(allowed)
    return (order[0], order[1]) if len(order) >= 2 else None


def atomics_binary() -> Path:
    """server/bench/atomics.c's program, counters and the ping-pong (lab_binary)."""
    try:
        return lab_binary("atomics")
    except TargetError as e:
        raise BenchError(str(e)) from None


def round_trip_ns(cpus: tuple[int, int], ms: int = PROBE_MS) -> float:
    """ns for one cache line to go to the other CPU and back (NaN when the probe cannot run)."""
    try:
        exe = atomics_binary()
    except BenchError:
        return math.nan
    argv = [str(exe), "--mode", "pingpong", "--threads", "2", "--cpus", f"{cpus[0]},{cpus[1]}",
            "--duration-ms", str(ms), "--json"]  # fmt: skip
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        value = float(json.loads(out.stdout)["ns_per_op"]) if out.returncode == 0 else math.nan
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return math.nan
    # 0: a thread got no CPU in the window; beyond MAX_NS one lost its CPU for a while:
    # neither is a round trip
    return value if 0 < value <= MAX_NS else math.nan


def handoff_ns(hold_ns: int, ms: int = PROBE_MS) -> tuple[float, float]:
    """A pthread mutex handed to a thread asleep in the futex wait after a `hold_ns` hold
    (`atomics --mode handoff`): ns from the unlock to the sleeper holding it, and the
    unlocker's own ns in that waking unlock (NaN, NaN when the probe cannot run)."""
    try:
        exe = atomics_binary()
    except BenchError:
        return math.nan, math.nan
    argv = [str(exe), "--mode", "handoff", "--threads", "2", "--hold-ns", str(hold_ns),
            "--duration-ms", str(ms), "--json"]  # fmt: skip
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        row = json.loads(out.stdout) if out.returncode == 0 else {}
        value, wake = float(row["ns_per_op"]), float(row["wake_ns"])
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return math.nan, math.nan
    return (value, wake) if value > 0 else (math.nan, math.nan)


def alike(a: float, b: float) -> bool:
    """Two readings of one placement (True when either is missing: nothing says otherwise)."""
    if math.isnan(a) or math.isnan(b):
        return True
    return max(a, b) <= ALIKE * min(a, b)


class Placement:
    """Probes the round trip between two CPUs (NaN where there is no pair or no probe)."""

    def __init__(self) -> None:
        self.cpus = probe_cpus()

    @property
    def where(self) -> str:
        return f"CPUs {self.cpus[0]} and {self.cpus[1]}" if self.cpus else "no CPU pair"

    def probe(self) -> float:
        return math.nan if self.cpus is None else round_trip_ns(self.cpus)
