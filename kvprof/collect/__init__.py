"""eBPF collectors: the only package that imports bcc.

One module per BPF program in probes/<name>.bpf.c; each module owns its
program and maps and hands out plain dataclasses from kvprof.model (no bcc
type leaves this package). The contract every collector follows:

    class XCollector:
        name = "x"                                   # as in Profile.collectors
        def __init__(self, pid: int, opts: CollectOptions) -> None
        def applies(self) -> str | None              # None, or why it does not apply to this target
        def start(self) -> None                      # compile, load, attach; raises CollectError
        def contribute(self, profile: Profile) -> None
            # fill this collector's sections of `profile` with what it has
            # counted since start (cumulative), and its health counters in
            # profile.status.counters ("<name>.lost", "<name>.stack_errors", ...)
        def close(self) -> None                      # detach everything; idempotent
        reads_once = True  # optional: counts come once, at the end (py-spy and perf record):
                           # started when the window starts, left out of its base

The on-CPU stacks may come from kvprof.collect.pyspy or kvprof.collect.perf
(programs run beside the target, no BPF) under the same contract and name.

The session (session.py) drives a set of collectors against one PID.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvprof import REPO
from kvprof.model.topology import Topology

PROBES_DIR = REPO / "probes"


class CollectError(Exception):
    """A collector could not attach; the message is one line that says what to do."""


def missing_bcc() -> str | None:
    """Why BCC cannot be imported here (one line with the fix), or None. For callers
    outside this package that must check before taking the screen."""
    try:
        import bcc  # noqa: F401  (python3-bpfcc, seen through --system-site-packages)
    except ImportError as e:
        return f"BCC is not importable ({e}): run scripts/provision.sh"
    return None


@dataclass
class CollectOptions:
    hz: int = 99
    topology: Topology = field(default_factory=Topology.read)
    stack_storage: int = 16384  # stack ids per stack map (raise if stack_errors show up)
    max_entries: int = 10240  # entries per aggregation map (raise if map_full shows up)
    offcpu_sample: int = 64  # off-CPU stacks for 1 in N switch-outs (totals stay exact)
    progress: Callable[[str], None] | None = None  # one line of what takes long (building unwind tables)
    # who takes the on-CPU stacks (the session picks the collector, see session.modules):
    backend: str = "bpf"  # "perf": `perf record` instead of BPF, and nothing else
    python: bool | None = None  # py-spy's Python stacks: None = when the target is CPython
    native: bool = False  # py-spy --native: C frames of extensions merged into the Python stacks
    live: bool = False  # read while attaching (top): the window starts at the first attach; py-spy dumps
