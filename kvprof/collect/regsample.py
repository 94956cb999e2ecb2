"""Data addresses of contended atomics on any process, from sampled user
registers (probes/regsample.bpf.c): no PMU, no probes in the target.

Sampled at the cpu-clock events `oncpu` samples at (one per CPU at the
on-CPU rate, `opts.hz`; bpf.CpuClock), filtered to the target in BPF. A
sample that interrupted user mode keeps its IP and general registers in a
ring of RING slots; this module decodes each distinct IP once
(kvprof.collect.decode, capstone), and for an atomic read-modify-write
computes the data address from that sample's registers. It fills
Profile.addresses; kvprof.analysis.lines folds them into 64-byte cache
lines.

Bound: the ring keeps the newest RING samples of the target (32768: 165 s
of both CPUs at 99 Hz). `record` reads it once, at the end of its window;
`top` every second. Samples overwritten before a read are counted in
`regsample.lost` and said in a warning.
"""

from __future__ import annotations

import ctypes
import importlib.util
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvprof.collect import CollectError, CollectOptions
from kvprof.collect.bpf import (
    Module,
    Program,
    Sampler,
    ThreadNames,
    map_items,
    percpu_counters,
    source,
    warn,
)
from kvprof.model.profile import AddressSample, Profile, SampledAddresses, ThreadInfo

if TYPE_CHECKING:
    from kvprof.collect.decode import Process

RING = 32768  # a power of two (the BPF program masks with RING - 1)
MAX_THREADS = 4096
HEALTH = ("samples", "threads_full")  # the order of `enum regsample_health`
_BATCH = 1024  # more new slots than this: one batch read of the whole ring


@dataclass
class _Raw:
    tid: int
    cpu: int
    ip: int
    regs: tuple[int, ...]


@dataclass
class _State:
    """Everything decoded so far (cumulative, survives the program's maps)."""

    rows: dict[tuple[int, int, int, int], int] = field(default_factory=lambda: defaultdict(int))
    meta: dict[tuple[int, int], tuple[str, str, str, int]] = field(default_factory=dict)
    unattributed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    user: int = 0
    kernel: int = 0
    lost: int = 0
    threads: dict[int, int] = field(default_factory=dict)
    health: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HEALTH, 0))


def _import_decode() -> None:
    try:
        import kvprof.collect.decode  # noqa: F401
    except ImportError:
        pass  # attach() says it


class RegsampleCollector(Sampler):
    name = "regsample"

    def __init__(self, pid: int, opts: CollectOptions) -> None:
        super().__init__(pid, opts)
        self._process: Process | None = None
        self._names = ThreadNames(pid)
        self._next = 0  # sequence number of the next sample to read
        self._state = _State()
        self._symbols: dict[int, str] = {}

    def program(self) -> Program:
        missing = [m for m in ("capstone", "elftools") if importlib.util.find_spec(m) is None]
        if missing:  # both come from Debian, like BCC
            raise CollectError(
                f"regsample: no module named {missing[0]!r}: "
                "apt-get install python3-capstone python3-pyelftools"
            )
        # Importing capstone is a noticeable part of attaching's CPU (docs/record.md,
        # "Attach time"): done while BCC compiles (which leaves the GIL), not after it.
        threading.Thread(target=_import_decode, name="kvprof-capstone", daemon=True).start()
        text = source(self.name).read_text()
        return Program(self.name, text, [f"-DREGSAMPLE_RING={RING}", f"-DREGSAMPLE_THREADS={MAX_THREADS}"])

    def _attach(self, module: Module) -> None:
        try:
            from kvprof.collect.decode import Process  # waits for _import_decode's import
        except ImportError as e:
            raise CollectError(f"regsample: {e}: apt-get install python3-capstone") from None
        self._process = Process(self.pid)
        self._names.refresh()
        self._hook(module)

    def _new_samples(self) -> list[_Raw]:
        """Ring slots written since the last read, oldest first; counts the overwritten."""
        end = int(self.table("seq")[ctypes.c_int(0)].value)
        if end - self._next > RING:
            self._state.lost += end - self._next - RING
            self._next = end - RING
        ring = self.table("ring")
        if end - self._next > _BATCH:
            slots = {int(k): v for k, v in map_items(ring)}
        else:
            slots = {i % RING: ring[ctypes.c_int(i % RING)] for i in range(self._next, end)}
        out: list[_Raw] = []
        n = self._next
        while n < end:
            s = slots[n % RING]
            if int(s.seq) == 0 or int(s.seq) < n + 1:
                break  # still being written: read it next time
            if int(s.seq) > n + 1:
                self._state.lost += 1  # overwritten since `end` was read
            else:
                out.append(_Raw(int(s.tid), int(s.cpu), int(s.ip), tuple(int(r) for r in s.regs)))
            n += 1
        self._next = n
        return out

    def _read(self) -> None:
        if self.module is None or self._process is None:
            return
        self._names.refresh()
        st = self._state
        proc = self._process
        raws = self._new_samples()
        if any(proc.mapping(r.ip) is None for r in raws):
            proc.refresh()  # a library loaded since
        for r in raws:
            st.user += 1
            d = proc.decode(r.ip)
            if d.atomic is None:
                if d.reason:
                    st.unattributed[d.reason] += 1
                continue
            a = d.atomic
            addr = a.effective_address(r.regs)
            st.rows[(r.tid, r.cpu, a.address, addr)] += 1
            if (a.address, addr) not in st.meta:
                symbol = self._symbols.get(addr)
                if symbol is None:
                    symbol = self._symbols[addr] = proc.data_symbol(addr)
                st.meta[(a.address, addr)] = (
                    proc.function_name(a.address),
                    a.text,
                    symbol,
                    a.width,
                )
        threads = {int(k.value): (int(v.user), int(v.kernel)) for k, v in self.table("threads").items()}
        st.threads = {tid: u + k for tid, (u, k) in threads.items()}
        st.kernel = sum(k for _, k in threads.values())
        st.health = percpu_counters(self.table("health"), HEALTH)

    def contribute(self, profile: Profile) -> None:
        self.latest()  # adds what is new to self._state
        st = self._state
        samples = [
            AddressSample(tid, cpu, addr, ip, *st.meta[(ip, addr)], count=n)
            for (tid, cpu, ip, addr), n in sorted(st.rows.items(), key=lambda kv: (-kv[1], kv[0]))
        ]
        profile.addresses = SampledAddresses(
            samples=samples,
            thread_samples={str(t): n for t, n in sorted(st.threads.items())},
            user_samples=st.user,
            kernel_samples=st.kernel,
            unattributed=dict(sorted(st.unattributed.items())),
            lost=st.lost,
        )
        for tid in st.threads:
            info = profile.threads.setdefault(str(tid), ThreadInfo())
            if not info.name:
                info.name = self._names.get(tid)
        counters = profile.status.counters
        counters["regsample.samples"] = st.health["samples"]
        counters["regsample.lost"] = st.lost
        counters["regsample.threads_full"] = st.health["threads_full"]
        counters["regsample.unattributed"] = sum(st.unattributed.values())
        if st.lost:
            warn(profile, "regsample: samples overwritten before they were read", st.lost,
                 f"the ring keeps the newest {RING}: record shorter or at a lower --hz")  # fmt: skip
        if st.health["threads_full"]:
            warn(profile, "regsample: threads not counted", st.health["threads_full"],
                 f"more than {MAX_THREADS} threads")  # fmt: skip
