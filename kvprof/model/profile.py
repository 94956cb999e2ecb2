"""The profile: what a recording holds, and its file format (docs/design.md).

One JSON document, gzip'd when the file name ends in `.gz`:
`{"format": "kvprof-profile", "version": 1, "kvprof_version": "0.1.0" (the
kvprof that wrote it), "target": ..., "host": ..., "window": ..., "hz": ...,
"collectors": [...], "threads": ..., "oncpu": ..., "offcpu": ..., "locks": [...],
"cachelines": [...], "requests": ..., "server_stats": ..., "findings": [...],
"status": ...}`.

Frames are symbol names, root first; a frame without a symbol is
`module+0xSTART`, the start of the function the module's unwind table (FDE)
covers, or `module+0xoffset` of code no FDE covers (`missing_symbols` says which
modules and why); kernel frames end in `_[k]` (the folded-stack convention);
a function inlined at the address of the frame before it (DWARF's inline
chain, outermost first) ends in ` [inlined]`.
Fields may be added; none may change meaning. A file of another format or
version is refused with a ProfileError whose message is one readable line.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvprof import __version__

# on-CPU (and register) samples per second per CPU when none is asked for, off a
# multiple of common timer rates; the collectors' default (kvprof.collect.HZ). Every
# sample interrupts a CPU, the largest part of what kvprof costs a saturated server
# that has been measured (docs/record.md, "Overhead"): --hz 99 doubles the stacks and
# that part of the cost.
HZ = 49
# status.counters of a recording: the whole machine's CPU ns, busy and idle, over all its CPUs
MACHINE_BUSY = "machine.busy_ns"
MACHINE_IDLE = "machine.idle_ns"

# the suffix of a frame that was inlined into the frame before it (rootward)
INLINED = " [inlined]"

FORMAT = "kvprof-profile"
VERSION = 1


class ProfileError(Exception):
    """A profile file that cannot be used; the message is one line for the user."""


@dataclass
class Target:
    pid: int
    comm: str = ""
    exe: str = ""
    cmdline: list[str] = field(default_factory=list)
    kvs_probes: bool = False
    ns_pid: int | None = None  # its PID in its own PID namespace (a container's), when not the host's

    def to_dict(self) -> dict[str, Any]:
        """Its fields; `ns_pid` only for a target in another PID namespace."""
        d = asdict(self)
        if self.ns_pid is None:
            del d["ns_pid"]
        return d

    @property
    def pids(self) -> str:
        """`PID 1234`, or `PID 1234 (1 in its namespace)`."""
        return f"PID {self.pid}" + (f" ({self.ns_pid} in its namespace)" if self.ns_pid is not None else "")


@dataclass
class Host:
    kernel: str = ""
    cpus: int = 0
    topology: dict[str, dict[str, int]] = field(default_factory=dict)  # Topology.to_dict()


@dataclass
class Window:
    start: float = 0.0  # Unix time the recording started
    duration_s: float = 0.0


@dataclass
class ThreadInfo:
    name: str = ""
    cpu_samples: int = 0
    sockets: dict[str, int] = field(default_factory=dict)  # socket -> samples
    stack_quality: float | None = None  # share of stacks that look truncated (0 = all good)
    stack_stops: dict[str, int] = field(default_factory=dict)  # why on-CPU stacks stopped early -> samples
    offcpu_ns: int = 0
    lock_wait_ns: int = 0
    runnable_ns: int = 0  # of offcpu_ns, waiting for a CPU while runnable (the kernel's run delay)


@dataclass
class CpuStack:
    tid: int
    frames: list[str]
    count: int


@dataclass
class OffCpuStack:
    tid: int
    frames: list[str]
    ns: int

    def placeless(self) -> bool:
        """Time with no place to wait at: `[runnable]` or `[asleep, not sampled]`."""
        return len(self.frames) == 1 and self.frames[0] in (RUNNABLE_FRAME, UNSAMPLED_FRAME)


# The one frame of a sampled thread's wait for a CPU (kvprof.collect.offsample): runnable, not asleep.
RUNNABLE_FRAME = "[runnable]"
# ... and of the sleep of a sampled thread that no look found asleep: time known, place not.
UNSAMPLED_FRAME = "[asleep, not sampled]"


@dataclass
class FutexWait:
    tid: int
    uaddr: int
    frames: list[str]
    waits: int
    ns: int
    name: str = (
        ""  # the data symbol that holds the futex word (`stats_lock+0x8`), or `heap 0x...`/`stack 0x...`
    )
    # the looks that saw these waits when sampled (`ns` is then an estimate from that many
    # samples); 0: every wait timed (--offcpu-hz 0)
    samples: int = 0
    # the standard deviation of `ns` from that sampling, when the collector knows it
    # (kvprof.collect.offsample); 0: ns / sqrt(samples), the looks as a Poisson count
    sd_ns: int = 0
    # ns timed on sched_switch in stretches meant to cover this share of the time
    # (OFFCPU_TIMED_S / OFFCPU_TIMED_EVERY_S), scaled up from them (kvprof.collect.offsample's
    # switch timer; `sd_ns` is then the stretches' spread and `samples` the looks that
    # split ns over stacks); 0: not timed in stretches
    timed_share: float = 0.0


@dataclass
class OffCpu:
    stacks: list[OffCpuStack] = field(default_factory=list)
    futex: list[FutexWait] = field(default_factory=list)


@dataclass
class ThreadWaits:
    waits: int = 0
    wait_ns: int = 0


@dataclass
class LockStack:
    frames: list[str]
    waits: int
    wait_ns: int


@dataclass
class LockStat:
    name: str
    address: int
    waits: int = 0
    wait_ns: int = 0
    max_ns: int = 0
    hist_log2_ns: list[int] = field(default_factory=list)
    by_thread: dict[str, ThreadWaits] = field(default_factory=dict)
    stacks: list[LockStack] = field(default_factory=list)


@dataclass
class ThreadHolds:
    acquisitions: int = 0
    hold_ns: int = 0


@dataclass
class LockHold:
    """How long one lock was held, contended or not (kvcached's sampled
    lock__hold, or `record --hold`'s uprobes): the acquisitions and hold ns the
    samples stand for, over `window_s` seconds."""

    name: str
    address: int = 0
    acquisitions: int = 0
    hold_ns: int = 0
    samples: int = 0  # lock__hold firings behind the estimates
    min_ns: int = 0  # the shortest sampled hold: the critical section's own work, nothing moved
    by_thread: dict[str, ThreadHolds] = field(default_factory=dict)
    window_s: float = 0.0  # the seconds it was measured over; 0: the whole window (rates divide by it)
    # of acquisitions, those of holds over kvprof.collect.INTERRUPTED x their thread's shortest
    # (taken for interrupted: preempted, a page fault), and their hold ns
    interrupted: int = 0
    interrupted_ns: int = 0


@dataclass
class LineThread:
    samples: int = 0
    transfers: int = 0
    cycles_mean: float = 0.0


@dataclass
class CacheLineStat:
    site: str
    line: int  # address of the 64-byte line
    samples: int = 0
    transfers: int = 0
    cross_socket_transfers: int = 0
    cycles_mean: float = 0.0
    cycles_max: int = 0
    hist_log2_cycles: list[int] = field(default_factory=list)
    socket_matrix: list[list[int]] = field(default_factory=list)  # [from socket][to socket]
    by_thread: dict[str, LineThread] = field(default_factory=dict)


@dataclass
class AddressSample:
    """On-CPU samples that landed on one atomic instruction writing one data
    address, from one thread on one CPU (the `regsample` collector)."""

    tid: int
    cpu: int
    address: int  # the data address the instruction wrote
    ip: int  # the instruction's address
    function: str
    instruction: str  # "lock add qword ptr [rip + 0x2dfd], 1"
    symbol: str  # data symbol: "shared_items", "stats+0x8", "heap 0x55d0c0a0"
    width: int  # bytes written
    count: int


@dataclass
class LockCpuSample:
    """On-CPU samples in the lock machinery (pthread_mutex_lock, the unlock, the
    futex calls under them) acting on one lock, from one thread and one caller
    (the `regsample` collector)."""

    tid: int
    address: int  # the lock (a mutex's address is its lock word's)
    symbol: str  # data symbol: "big_lock", "stats+0x8", "heap 0x55d0c0a0"
    function: str  # the lock function called: the outermost lock frame ("pthread_mutex_lock")
    leaf: str  # where the sample was: the innermost one ("__lll_lock_wait")
    callers: list[str]  # the frames that called it, innermost first (a few); [] when no stack said
    kernel: bool  # in the kernel, under the lock function (the futex syscall)
    count: int


@dataclass
class SampledAddresses:
    """What the `regsample` collector saw: kvprof.analysis.lines folds it into cache lines."""

    samples: list[AddressSample] = field(default_factory=list)
    thread_samples: dict[str, int] = field(default_factory=dict)  # tid -> all its on-CPU samples
    user_samples: int = 0  # samples taken in user mode
    kernel_samples: int = 0  # samples taken in kernel mode
    unattributed: dict[str, int] = field(default_factory=dict)  # reason -> samples
    lost: int = 0  # overwritten in the ring before they were read
    locks: list[LockCpuSample] = field(default_factory=list)  # samples in lock functions, by lock
    lock_unattributed: int = 0  # samples in lock functions whose lock the registers did not give


@dataclass
class RequestStat:
    count: int = 0
    hist_log2_ns: list[int] = field(default_factory=list)
    p50_ns: int = 0
    p99_ns: int = 0


@dataclass
class Finding:
    id: str
    title: str
    category: str  # cpu | lock | cacheline | offcpu
    severity: str  # critical | warning | info
    where: str  # function, lock or site
    cost: dict[str, float] = field(default_factory=dict)
    per_thread: dict[str, dict[str, float]] = field(default_factory=dict)
    per_socket: dict[str, dict[str, float]] = field(default_factory=dict)
    explanation: str = ""
    advice: str = ""
    hotspot: str = ""  # id of the matching kvprof.analysis.hotspots entry, "" for a generic finding
    sites: list[str] = field(default_factory=list)  # call sites (functions), most costly first
    thread_names: dict[str, str] = field(default_factory=dict)  # tid -> name, for per_thread's keys
    lock: str = ""  # a futex finding's lock: its data symbol (`stats_lock`) or `heap 0x...`


@dataclass
class Status:
    """How the recording went: what each collector did, what was lost."""

    partial: bool = False  # e.g. the target died mid-run
    reason: str = ""
    collectors: dict[str, str] = field(default_factory=dict)  # name -> "ok" or why not
    counters: dict[str, int] = field(default_factory=dict)  # lost samples, stack errors, map full...
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the target was and did: Go, forks, execs, threads
    sample_rates: dict[str, int] = field(default_factory=dict)  # probe -> 1 in N (server's --probe-sample)


@dataclass
class MissingSymbols:
    """A module of the target that had no symbol for code its frames are in."""

    module: str  # as frames name it: `memcached`, `libc.so.6`
    path: str  # as the target maps it
    build_id: str = ""
    names: str = ""  # where its names came from: `none` (stripped), `dynsym` (exported functions only)
    functions: int = 0  # frames named `module+0xSTART`: the start of the function an FDE covers
    outside_unwind: list[str] = field(default_factory=list)  # frames `module+0xOFF` of code no FDE covers
    fix: str = ""  # what would give it names: its debug package, a debuginfod server


@dataclass
class ProgramCost:
    """One of kvprof's BPF programs during the window: how often it ran, how long."""

    collector: str
    name: str
    kind: str  # uprobe | tracepoint | perf_event (what fires it)
    runs: int = 0
    ns: int = 0


@dataclass
class Overhead:
    """What kvprof itself cost during the window (kvprof.collect.overhead):
    kvprof.analysis.own_cost turns it into a share of the target."""

    measured: bool = False  # the kernel's BPF run-time statistics were on
    window_s: float = 0.0
    cpus: int = 0
    target_cpu_s: float = 0.0  # the target's utime + stime
    kvprof_cpu_s: float = 0.0  # the kvprof process's (record or top), map reads included
    uprobe_hit_ns: float = 0.0  # what the kernel adds per uprobe hit beyond the program
    sample_interrupt_ns: float = 0.0  # what a cpu-clock sample on the target costs beyond the program
    programs: list[ProgramCost] = field(default_factory=list)


def _overhead(d: dict[str, Any]) -> Overhead:
    return Overhead(**{**d, "programs": [ProgramCost(**x) for x in d.get("programs", [])]})


def _addresses(d: dict[str, Any]) -> SampledAddresses:
    return SampledAddresses(
        **{
            **d,
            "samples": [AddressSample(**s) for s in d.get("samples", [])],
            "locks": [LockCpuSample(**s) for s in d.get("locks", [])],
        }
    )


@dataclass
class Profile:
    target: Target
    host: Host = field(default_factory=Host)
    window: Window = field(default_factory=Window)
    hz: int = 0
    collectors: list[str] = field(default_factory=list)
    threads: dict[str, ThreadInfo] = field(default_factory=dict)
    oncpu: list[CpuStack] = field(default_factory=list)
    offcpu: OffCpu = field(default_factory=OffCpu)
    locks: list[LockStat] = field(default_factory=list)
    holds: list[LockHold] = field(default_factory=list)
    cachelines: list[CacheLineStat] = field(default_factory=list)
    requests: dict[str, RequestStat] = field(default_factory=dict)
    # "before"/"after" (and "hold.before"/"hold.after": record --hold's seconds) -> stats
    server_stats: dict[str, dict[str, str]] = field(default_factory=dict)
    addresses: SampledAddresses = field(default_factory=SampledAddresses)
    findings: list[Finding] = field(default_factory=list)
    status: Status = field(default_factory=Status)
    overhead: Overhead = field(default_factory=Overhead)
    missing_symbols: list[MissingSymbols] = field(default_factory=list)
    kvprof_version: str = __version__  # of the kvprof that recorded it; "" in older profiles

    # ---- file format ----------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["target"] = self.target.to_dict()
        return {
            "format": FORMAT,
            "version": VERSION,
            "kvprof_version": self.kvprof_version,
            **{k: body[k] for k in body if k not in ("oncpu", "kvprof_version")},
            "oncpu": {"stacks": body["oncpu"]},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ProfileError('not a kvprof profile (no "format": "kvprof-profile")')
        if d.get("version") != VERSION:
            raise ProfileError(
                f"profile version {d.get('version')!r} is not supported (this kvprof reads version {VERSION})"
            )
        try:
            offcpu = d.get("offcpu") or {}
            return cls(
                target=Target(**d["target"]),
                host=Host(**d.get("host", {})),
                window=Window(**d.get("window", {})),
                hz=int(d.get("hz", 0)),
                collectors=list(d.get("collectors", [])),
                threads={k: ThreadInfo(**v) for k, v in d.get("threads", {}).items()},
                oncpu=[CpuStack(**s) for s in (d.get("oncpu") or {}).get("stacks", [])],
                offcpu=OffCpu(
                    stacks=[OffCpuStack(**s) for s in offcpu.get("stacks", [])],
                    futex=[FutexWait(**f) for f in offcpu.get("futex", [])],
                ),
                locks=[
                    LockStat(
                        **{
                            **lk,
                            "by_thread": {t: ThreadWaits(**w) for t, w in lk.get("by_thread", {}).items()},
                            "stacks": [LockStack(**s) for s in lk.get("stacks", [])],
                        }
                    )
                    for lk in d.get("locks", [])
                ],
                holds=[
                    LockHold(
                        **{**h, "by_thread": {t: ThreadHolds(**v) for t, v in h.get("by_thread", {}).items()}}
                    )
                    for h in d.get("holds", [])
                ],
                cachelines=[
                    CacheLineStat(
                        **{**c, "by_thread": {t: LineThread(**v) for t, v in c.get("by_thread", {}).items()}}
                    )
                    for c in d.get("cachelines", [])
                ],
                requests={k: RequestStat(**v) for k, v in d.get("requests", {}).items()},
                server_stats=dict(d.get("server_stats", {})),
                addresses=_addresses(d.get("addresses") or {}),
                findings=[Finding(**f) for f in d.get("findings", [])],
                status=Status(**d.get("status", {})),
                overhead=_overhead(d.get("overhead") or {}),
                missing_symbols=[MissingSymbols(**m) for m in d.get("missing_symbols", [])],
                kvprof_version=str(d.get("kvprof_version", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ProfileError(f"malformed kvprof profile: {e}") from None

    def save(self, path: str | Path) -> None:
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        p = Path(path)
        if p.suffix == ".gz":
            with gzip.open(p, "wt", encoding="utf-8") as f:
                f.write(text)
        else:
            p.write_text(text, encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        p = Path(path)
        try:
            if p.suffix == ".gz":
                with gzip.open(p, "rt", encoding="utf-8") as f:
                    text = f.read()
            else:
                text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ProfileError(f"{p}: no such file") from None
        except IsADirectoryError:
            raise ProfileError(f"{p}: is a directory, not a profile") from None
        except PermissionError:
            raise ProfileError(f"{p}: permission denied") from None
        except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
            raise ProfileError(f"{p}: cannot read it ({e})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ProfileError(f"{p}: not JSON, truncated or corrupt ({e.msg}, line {e.lineno})") from None
        try:
            return cls.from_dict(data)
        except ProfileError as e:
            raise ProfileError(f"{p}: {e}") from None
