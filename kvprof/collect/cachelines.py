"""The `cachelines` collector: shared counters whose cache line bounces
between CPUs and sockets, from kvcached's `kvs:atomic__sample` probe
(probes/cachelines.bpf.c).

The transfer rule (the BPF program implements it; `classify_transfers` is
its reference, used by the tests and the docs): walk the samples of one
64-byte line in order; a sample whose previous sample on the same line came
from another CPU is a transfer, from the previous CPU's socket to this
CPU's socket; it is cross-socket when those sockets differ. The first sample
of a line is no transfer.

What it counts is sampled: the server fires atomic__sample for a sample of
the updates per worker and per site (paced, or 1 in N with `--probe-sample
N`), each with the number of updates it stands for (its weight), and the
program counts each sample that many times: samples, transfers, cycles, the
histograms and the matrix estimate every update's (profiles recorded before
the weights carry `Profile.status.sample_rates["atomic__sample"]` instead).
A transfer means the line moved at least once between two sampled updates.
Transfers per sample is the comparable rate (shared vs per-thread design, one
run vs another).

Rows are kept per (site, line, thread); per CPU only through the socket
matrix, since a thread's CPU changes and what matters is where the line went.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from kvprof.collect import HIST_SLOTS, CollectOptions
from kvprof.collect.bpf import (
    KvsCollector,
    Module,
    ThreadNames,
    map_items,
    named_thread,
    percpu_counters,
    put_counters,
)
from kvprof.model.profile import CacheLineStat, LineThread, Profile
from kvprof.model.topology import Topology

MAX_SOCKETS = 8
LINE = 64
COUNTERS = ("events", "map_full")  # the order of enum cachelines_counter


@dataclass
class Transfers:
    """The outcome of the transfer rule over a sequence of samples."""

    samples: int = 0
    transfers: int = 0
    cross_socket: int = 0
    matrix: list[list[int]] = field(default_factory=list)  # [from socket][to socket]

    @property
    def same_socket(self) -> int:
        return self.transfers - self.cross_socket


def classify_transfers(
    samples: Iterable[tuple[int, int]], socket_of: dict[int, int], sockets: int
) -> dict[int, Transfers]:
    """The reference transfer rule: `samples` are (address, cpu) in order;
    returns per 64-byte line the samples, transfers, cross-socket transfers
    and the socket x socket matrix. A CPU missing from `socket_of` is on
    socket 0, as in the BPF program."""
    last: dict[int, int] = {}
    out: dict[int, Transfers] = {}
    for addr, cpu in samples:
        line = addr & ~(LINE - 1)
        t = out.setdefault(line, Transfers(matrix=[[0] * sockets for _ in range(sockets)]))
        t.samples += 1
        prev = last.get(line)
        last[line] = cpu
        if prev is None or prev == cpu:
            continue
        src, dst = socket_of.get(prev, 0), socket_of.get(cpu, 0)
        t.transfers += 1
        t.cross_socket += src != dst
        t.matrix[src][dst] += 1
    return out


@dataclass
class LineMapEntry:
    """One BPF map entry: the samples of one thread on one (site, line)."""

    site: str
    line: int
    tid: int
    samples: int
    transfers: int
    cross: int
    cycles: int
    max_cycles: int


@dataclass
class _Snapshot:
    rows: list[LineMapEntry] = field(default_factory=list)
    hist: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    matrix: dict[tuple[str, int], dict[tuple[int, int], int]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)


def socket_count(topology: Topology) -> int:
    """Side of the socket matrix: sockets 0..max, capped at MAX_SOCKETS."""
    return min(max(topology.sockets, default=0) + 1, MAX_SOCKETS)


class CachelinesCollector(KvsCollector):
    name = "cachelines"
    empty = _Snapshot
    probes: ClassVar[dict[str, str]] = {"atomic__sample": "cachelines_on_sample"}
    instead = "shared-counter cache-line transfers need the server's own atomic__sample probe"

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        super().__init__(pid, opts)
        self.sockets = socket_count(opts.topology)
        self._names = ThreadNames(pid)
        self._sites: dict[int, str] = {}  # address of a site's name in the target -> the name

    def site(self, address: int) -> str:
        """A site's name, read from the target's memory the first time its address is seen."""
        name = self._sites.get(address)
        if name is None:
            try:
                with open(f"/proc/{self.pid}/mem", "rb") as mem:
                    mem.seek(address)
                    name = mem.read(64).split(b"\0", 1)[0].decode(errors="replace")
            except (OSError, ValueError):  # the target is gone: the address stands for it
                name = f"site {address:#x}"
            self._sites[address] = name
        return name

    def cflags(self) -> list[str]:
        max_cpus = max([*self.opts.topology.cpus, (os.cpu_count() or 1) - 1], default=0) + 1
        return [f"-DCACHELINES_CPUS={max_cpus}", f"-DCACHELINES_SOCKETS={MAX_SOCKETS}"]

    def _attach(self, module: Module) -> None:
        table = module.table("cachelines_cpu_socket")
        for cpu, place in self.opts.topology.cpus.items():
            table[ctypes.c_int(cpu)] = ctypes.c_uint(min(place.socket, MAX_SOCKETS - 1))
        super()._attach(module)

    def _read(self) -> _Snapshot:
        snap = _Snapshot()
        for k, v in map_items(self.table("lines")):
            snap.rows.append(
                LineMapEntry(
                    self.site(k.site), k.line, k.tid, v.samples, v.transfers, v.cross, v.cycles, v.max_cycles
                )
            )
            self._names.first_seen(k.tid)
        for k, n in map_items(self.table("hist")):
            h = snap.hist.setdefault((self.site(k.site), k.line), [0] * HIST_SLOTS)
            h[min(k.slot, HIST_SLOTS - 1)] += n
        for k, n in map_items(self.table("matrix")):
            cell = snap.matrix.setdefault((self.site(k.site), k.line), {})
            cell[(k.__getattribute__("from"), k.to)] = n
        snap.counters = percpu_counters(self.table("counters"), COUNTERS)
        return snap

    def contribute(self, profile: Profile) -> None:
        snap = self.latest()
        stats = aggregate(snap.rows, snap.hist, snap.matrix, self.sockets)
        ours = {(c.site, c.line) for c in stats}
        profile.cachelines[:] = [c for c in profile.cachelines if (c.site, c.line) not in ours] + stats
        for tid in {r.tid for r in snap.rows}:
            named_thread(profile, tid, self._names)
        put_counters(profile, "cachelines", snap.counters, "samples")


def aggregate(
    rows: list[LineMapEntry],
    hist: dict[tuple[str, int], list[int]],
    matrix: dict[tuple[str, int], dict[tuple[int, int], int]],
    sockets: int,
) -> list[CacheLineStat]:
    """Fold map rows into one CacheLineStat per (site, line), most transfers first."""
    out: dict[tuple[str, int], CacheLineStat] = {}
    cycles: dict[tuple[str, int], int] = {}
    for r in rows:
        key = (r.site, r.line)
        st = out.get(key)
        if st is None:
            grid = [[0] * sockets for _ in range(sockets)]
            for (src, dst), n in matrix.get(key, {}).items():
                grid[min(src, sockets - 1)][min(dst, sockets - 1)] += n
            st = out[key] = CacheLineStat(
                site=r.site,
                line=r.line,
                hist_log2_cycles=list(hist.get(key, [0] * HIST_SLOTS)),
                socket_matrix=grid,
            )
        st.samples += r.samples
        st.transfers += r.transfers
        st.cross_socket_transfers += r.cross
        st.cycles_max = max(st.cycles_max, r.max_cycles)
        cycles[key] = cycles.get(key, 0) + r.cycles
        st.by_thread[str(r.tid)] = LineThread(
            samples=r.samples, transfers=r.transfers, cycles_mean=r.cycles / r.samples if r.samples else 0.0
        )
    for key, st in out.items():
        st.cycles_mean = cycles[key] / st.samples if st.samples else 0.0
    return sorted(out.values(), key=lambda c: (-c.transfers, -c.samples, c.site, c.line))
