"""Data addresses of contended atomics and of the locks the lock machinery
works on, on any process, from sampled user registers (probes/regsample.bpf.c):
no PMU, no probes in the target.

Sampled at the cpu-clock events `oncpu` samples at (one per CPU at the
on-CPU rate, `opts.hz`; bpf.CpuClock), filtered to the target in BPF. Every
sample keeps its user IP and general registers (in kernel mode, those the
thread entered the kernel with) and the key of the user stack oncpu took, in
a ring of RING slots; this module decodes each distinct IP once
(kvprof.collect.decode, capstone):
- at a user-mode sample on an atomic read-modify-write, it computes the data
  address from that sample's registers (Profile.addresses.samples;
  kvprof.analysis.lines folds them into 64-byte cache lines);
- at a sample in a lock function (pthread_mutex_lock, its unlock, the futex
  calls under them: kvprof.collect.lockarg), it takes the lock's address from
  the register that holds the function's first argument there, and the
  caller from the stack: the first frame outside the lock functions
  (Profile.addresses.locks; kvprof.analysis.findings.lock_cpu).

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

from kvprof.collect import CollectError, CollectOptions, unwind
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
from kvprof.collect.symbols import Symbolizer
from kvprof.model.profile import INLINED, AddressSample, LockCpuSample, Profile, SampledAddresses, ThreadInfo

if TYPE_CHECKING:
    from kvprof.collect.decode import Process

RING = 32768  # a power of two (the BPF program masks with RING - 1)
MAX_THREADS = 4096
HEALTH = ("samples", "threads_full")  # the order of `enum regsample_health`
CALLERS = 4  # frames kept of what called a lock function (the analysis skips wrappers among them)
_BATCH = 1024  # more new slots than this: one batch read of the whole ring
# The lock functions, by their names without leading underscores and glibc's `GI_`
# alias prefix: every one takes its lock as its first argument.
LOCK_PREFIXES = (
    "pthread_mutex_", "pthread_rwlock_", "pthread_spin_", "lll_lock", "lll_unlock", "lll_trylock",
)  # fmt: skip


def plain_name(frame: str) -> str:
    """A frame's function without leading underscores, glibc's `GI_` prefix, a symbol
    version or an inline mark: `__GI___lll_lock_wait` -> `lll_lock_wait`."""
    name = frame.split(" ", 1)[0].split("@", 1)[0].lstrip("_")
    return name.removeprefix("GI_").lstrip("_")


def is_lock_function(frame: str) -> bool:
    """pthread_mutex_lock and the rest of the lock machinery (not pthread_mutexattr_*)."""
    return plain_name(frame).startswith(LOCK_PREFIXES)


@dataclass
class _Raw:
    tid: int
    cpu: int
    ip: int
    regs: tuple[int, ...]
    ustack: int  # the user stack's key in `ustacks`, 0: none
    kernel: bool


@dataclass
class _State:
    """Everything decoded so far (cumulative, survives the program's maps)."""

    rows: dict[tuple[int, int, int, int], int] = field(default_factory=lambda: defaultdict(int))
    meta: dict[tuple[int, int], tuple[str, str, str, int]] = field(default_factory=dict)
    # (tid, lock, function, leaf, callers, kernel) -> samples; and the locks' data symbols
    locks: dict[tuple[int, int, str, str, tuple[str, ...], bool], int] = field(
        default_factory=lambda: defaultdict(int)
    )
    lock_symbols: dict[int, str] = field(default_factory=dict)
    lock_unattributed: int = 0
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
        self._frames: Symbolizer | None = None  # names the stacks of lock samples
        self._ustacks: dict[int, tuple[list[int], str]] = {}
        self._callers: dict[int, tuple[str, tuple[str, ...]]] = {}  # stack key -> (lock function, callers)
        self._lock_leaf: dict[int, str | None] = {}  # IP -> its lock function, None: not in one

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
                regs = tuple(int(r) for r in s.regs)
                out.append(_Raw(int(s.tid), int(s.cpu), int(s.ip), regs, int(s.ustack), bool(s.kernel)))
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
            if r.ip not in self._lock_leaf:
                func = proc.function(r.ip)
                self._lock_leaf[r.ip] = func[0] if func is not None and is_lock_function(func[0]) else None
            leaf = self._lock_leaf[r.ip]
            if leaf is not None:
                self._lock_sample(r, leaf)
            if r.kernel:
                continue  # its user registers are a syscall's or an interrupt's: no atomic stalled
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

    def _lock_sample(self, r: _Raw, leaf: str) -> None:
        """Count a sample in a lock function for its lock, from the register that holds
        the function's first argument at its IP, and for its caller."""
        assert self._process is not None
        st = self._state
        reg = self._process.lock_register(r.ip)
        if reg is None:
            st.lock_unattributed += 1
            return
        addr = r.regs[reg]
        if addr not in st.lock_symbols:
            symbol = self._symbols.get(addr)
            if symbol is None:
                symbol = self._symbols[addr] = self._process.data_symbol(addr)
            st.lock_symbols[addr] = symbol
        function, callers = self._callers_of(r.ustack, leaf)
        st.locks[(r.tid, addr, function, leaf, callers, r.kernel)] += 1

    def _callers_of(self, key: int, leaf: str) -> tuple[str, tuple[str, ...]]:
        """(the outermost lock function, the first CALLERS frames that led to it, innermost
        first) of user stack `key`; (`leaf`, ()) without a stack. Only the frames up to
        those are named (each address with what was inlined there)."""
        got = self._callers.get(key)
        if got is not None:
            return got
        ips = self._stack(key)
        if not ips or self._frames is None:
            return leaf, ()
        function = leaf
        outside: list[str] = []
        for i, ip in enumerate(ips):  # leaf first; every one past the leaf a return address
            at = self._frames.frames_at(ip, caller=i > 0)  # its function, then what was inlined there
            if not outside and is_lock_function(at[0]):
                function = at[0]
                continue
            outside += [f.removesuffix(INLINED) for f in reversed(at)]
            if len(outside) >= CALLERS:
                break
        got = self._callers[key] = (function, tuple(outside[:CALLERS]))
        return got

    def _stack(self, key: int) -> list[int]:
        """The addresses, leaf first, of user stack `key` that oncpu.bpf.c stored; [] when none."""
        module = self.module
        if not key or module is None or "unwinder" not in module.shared:
            return []
        try:
            table = module.table("ustacks")
        except KeyError:
            return []
        stack = unwind.read_stack(table, key, self._ustacks)
        if not stack:
            return []
        if self._frames is None:
            self._frames = Symbolizer(self.pid, module.shared["unwinder"], self.opts.inline)
        return stack[0]

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
            locks=[
                LockCpuSample(tid, addr, st.lock_symbols[addr], fn, leaf, list(callers), kernel, n)
                for (tid, addr, fn, leaf, callers, kernel), n in sorted(
                    st.locks.items(), key=lambda kv: (-kv[1], kv[0])
                )
            ],
            lock_unattributed=st.lock_unattributed,
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
