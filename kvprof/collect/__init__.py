"""Collectors: what kvprof counts in a target, one module per collector.

Every collector follows this contract (the session, session.py, drives a
set of them against one PID):

    class XCollector:
        name = "x"                                   # as in Profile.collectors
        def __init__(self, pid: int, opts: CollectOptions) -> None
        def applies(self) -> str | None              # None, or why it does not apply to this target
        def start(self) -> None                      # set up and attach; raises CollectError
        def contribute(self, profile: Profile) -> None
            # fill this collector's sections of `profile` with what it has
            # counted since start (cumulative), and its health counters in
            # profile.status.counters ("<name>.lost", "<name>.stack_errors", ...)
        def close(self) -> None                      # detach everything; idempotent
        reads_once = True  # optional: counts come once, at the end (py-spy and perf record):
                           # started when the window starts, left out of its base

The on-CPU stacks may come from kvprof.collect.pyspy or kvprof.collect.perf
(programs run beside the target, no BPF) under the same contract and name.

A BPF collector (probes/<name>.bpf.c, the only modules that import bcc,
through kvprof.collect.bpf) also has the two halves of start(), so that the
session compiles the programs of all its BPF collectors as ONE BCC module
(one clang run instead of one per collector, see docs/record.md):

        def program(self) -> bpf.Program            # its C text and -D flags; raises CollectError
        def attach(self, module: bpf.Module) -> None  # load, attach, push tables; raises CollectError

start() is then attach(a module compiled for this collector alone). A
program names its maps, types and functions `<name>_...` so that programs
can share a module; probes/common.h holds what they share. attach() must
own what it attaches (perf-event or uprobe fds it closes in close()), since
the module outlives any one collector; the module's owner cleans it up.

Every default lives here, once: CollectOptions' fields and the constants
below; the BPF programs get them as -D flags from CollectOptions.cflags().
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from kvprof.model.profile import HZ as HZ  # defined with the profile, which analysis reads too
from kvprof.model.topology import Topology

# The BPF programs and headers, package data of kvprof (kvprof/probes/, in the wheel
# too): BCC compiles them from files on disk, so the package is never a zip.
PROBES_DIR = Path(str(resources.files("kvprof") / "probes"))
# Every file of PROBES_DIR that kvprof reads at run time (`kvprof doctor` checks them;
# kvs.d, the kvs provider, is the server build's): the programs, the headers they
# include, and kvcached's opcode numbers (kvprof.collect.requests).
PROBE_FILES = (
    "cachelines.bpf.c",
    "clock.bpf.c",
    "hold.bpf.c",
    "locks.bpf.c",
    "offcpu.bpf.c",
    "offsample.bpf.c",
    "oncpu.bpf.c",
    "regsample.bpf.c",
    "requests.bpf.c",
    "usdt_rate.bpf.c",
    "common.h",
    "follow.h",
    "futex.h",
    "unwind.h",
    "opcodes.h",
)
# What installs BCC on Debian and Ubuntu (named by every message that needs it)
INSTALL_BCC = "apt-get install python3-bpfcc"


class CollectError(Exception):
    """A collector could not attach; the message is one line that says what to do."""


def missing_bcc() -> str | None:
    """Why BCC cannot be imported here (one line with the fix), or None. For callers
    outside this package that must check before taking the screen."""
    try:
        import bcc  # noqa: F401  (python3-bpfcc, seen through --system-site-packages)
    except ImportError as e:
        return f"BCC is not importable ({e}): {INSTALL_BCC}, in a venv made with --system-site-packages"
    return None


# The registry: each module under kvprof/collect/ that collects, and its collector class.
# A collector name (Profile.collectors) is taken by one of these modules (session.modules
# picks which: the on-CPU stacks come from oncpu, pyspy or perf). Imported only when
# a session makes the collector, since the BPF ones import bcc.
COLLECTORS: dict[str, str] = {
    "oncpu": "OnCpuCollector",
    "offcpu": "OffCpuCollector",
    "offsample": "OffSampleCollector",
    "locks": "LocksCollector",
    "cachelines": "CachelinesCollector",
    "requests": "RequestsCollector",
    "regsample": "RegsampleCollector",
    "pyspy": "PySpyCollector",
    "perf": "PerfCollector",
    "hold": "HoldCollector",
}


def collector_class(module_name: str) -> type:
    """The collector class of kvprof.collect.<module_name> (a key of COLLECTORS)."""
    import importlib

    if module_name not in COLLECTORS:
        raise CollectError(f"no collector module {module_name!r}: choose from {', '.join(COLLECTORS)}")
    try:
        module = importlib.import_module(f"kvprof.collect.{module_name}")
    except ImportError as e:  # a Python package it needs from Debian is missing
        raise CollectError(f"{module_name} cannot load ({e}): `kvprof doctor` says what to install") from None
    cls: type = getattr(module, COLLECTORS[module_name])
    return cls


STACK_STORAGE = 16384  # stack ids per stack map (raise if stack_errors show up)
MAX_ENTRIES = 10240  # entries per aggregation map (raise if map_full shows up)
# a sampled or timed hold over this many times its thread's shortest (or than
# INTERRUPTED_MIN_NS, when the shortest is shorter) is taken for interrupted: its holder
# preempted, a page fault. It stays in the hold time and is left out of what moved into the
# critical section (probes/common.h, kvprof.analysis.critical). The floor keeps a shortest
# hold of a few ns (record --hold's, less the probes' own time) from making every hold one.
INTERRUPTED = 16
INTERRUPTED_MIN_NS = 100
# Looks a second at each thread of the target for off-CPU samples (kvprof.collect.offsample);
# 0: time every switch instead (kvprof.collect.offcpu: exact, at a cost at every switch)
OFFCPU_HZ = 5
# ... and this many a second at a thread seen in a futex wait within the last OFFCPU_HOT_S:
# a lock wait is often a few per cent of a thread's time, and a sampled figure's error
# shrinks as the square root of the looks that found it (docs/record.md, "Lock waits")
OFFCPU_LOCK_HZ = 100
OFFCPU_HOT_S = 1.0
# ... and at most this many threads a second in all: a target with more threads than
# OFFCPU_LOOKS / OFFCPU_HZ has each of them looked at less often, in turn
OFFCPU_LOOKS = 1000
# While a thread of the target was seen in a lock wait within OFFCPU_HOT_S, its futex waits
# are timed on sched_switch for OFFCPU_TIMED_S of every OFFCPU_TIMED_EVERY_S and scaled up:
# being on sched_switch costs every switch of the machine, and the share of the looks that
# find a thread woken and waiting for a CPU is no measure of that wait (docs/record.md)
OFFCPU_TIMED_S = 0.05
OFFCPU_TIMED_EVERY_S = 0.2
# With OFFCPU_HZ 0: off-CPU stacks for 1 in N switch-outs (totals stay exact); 0: N follows the rate
OFFCPU_SAMPLE = 0
OFFCPU_WALKS = 16  # ... so that each CPU walks about this many stacks a second (docs/record.md: why)
INLINE_FRAMES = True  # expand each address to the functions inlined there (docs/record.md: its cost)
HIST_SLOTS = 64  # buckets of a log2 histogram (ns or cycles)
ATTACH_NICE = -10  # the attaching thread's nice while it compiles (root only; then back)
WATCH_NICE = 19  # every thread of kvprof's process once attached (system.attach.yield_cpu), SCHED_IDLE too
# ... but the thread that looks at the target's sleeping threads (kvprof.collect.offsample)
# keeps SCHED_OTHER at this nice: a look that runs only when a CPU is free comes when the
# target's threads wait, and finds them waiting far more often than they do
LOOK_NICE = 0
# ... and back to SCHED_OTHER at that nice once its threads waited for a CPU longer than
# STARVED_S in all over one STARVE_CHECK_S: a machine with no idle CPU for kvprof's work
STARVE_CHECK_S = 1.0
STARVED_S = 0.5
# A recording's wait between snapshots wakes at the target's exit (a pidfd) and, to see
# whether it exec'd, once every EXEC_CHECK_S: each wakeup is CPU taken from the target.
EXEC_CHECK_S = 0.5
# `kvprof top`'s seconds between refreshes: each reads every map and redraws the screen,
# CPU taken from a busy target (docs/top.md, "Overhead"); -i 1 for a livelier view.
TOP_INTERVAL_S = 2.0
# What the kernel adds to one uprobe hit beyond the BPF program (the trap and
# its return), for kvprof's own-cost figure: bench/probe_cost.py measures it
# on a machine, docs/record.md has the figures.
UPROBE_HIT_NS = 600
# `record --hold LOCK`: seconds the uprobes on every pthread mutex call stay attached
# (each call traps: docs/record.md, "Hold time of one lock"), and the most it allows
HOLD_SECONDS = 5.0
HOLD_SECONDS_MAX = 60.0
# What one cpu-clock sample that interrupts the target costs its throughput beyond the
# program it runs (the interrupt, on this VM's hypervisor, and the stall of a contended
# pipeline), for the same figure: bench/overhead.py measures it from the loss at a high
# --hz against the default, docs/record.md ("Overhead") has the figures.
SAMPLE_INTERRUPT_NS = 100_000


@dataclass
class CollectOptions:
    hz: int = HZ
    topology: Topology = field(default_factory=Topology.read)
    stack_storage: int = STACK_STORAGE
    max_entries: int = MAX_ENTRIES
    offcpu_sample: int = OFFCPU_SAMPLE
    offcpu_hz: int = OFFCPU_HZ
    inline: bool = INLINE_FRAMES  # `name [inlined]` frames from the target's DWARF
    progress: Callable[[str], None] | None = None  # one line of what takes long (building unwind tables)
    # who takes the on-CPU stacks (the session picks the collector, see session.modules):
    backend: str = "bpf"  # "perf": `perf record` instead of BPF, and nothing else
    python: bool | None = None  # py-spy's Python stacks: None = when the target is CPython
    native: bool = False  # py-spy --native: C frames of extensions merged into the Python stacks
    follow_forks: bool = False  # also the processes the target forks (kvprof.collect.follow)
    live: bool = False  # read while attaching (top): the window starts at the first attach; py-spy dumps
    hold: str = ""  # the `hold` collector's lock: a data symbol of the target or an address 0x...
    hold_seconds: float = HOLD_SECONDS

    def cflags(self, pid: int) -> list[str]:
        """The -D flags of probes/common.h for a program watching `pid`."""
        return [
            f"-I{PROBES_DIR}",
            f"-DTARGET_TGID={pid}",
            f"-DSTACK_STORAGE={self.stack_storage}",
            f"-DMAX_ENTRIES={self.max_entries}",
            f"-DHIST_SLOTS={HIST_SLOTS}",
            f"-DINTERRUPTED={INTERRUPTED}",
            f"-DINTERRUPTED_MIN_NS={INTERRUPTED_MIN_NS}",
        ]
