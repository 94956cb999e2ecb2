"""A finding's measurements in one or two plain sentences: the "how much" of the report."""

from __future__ import annotations

from kvprof.analysis.findings.common import GAIN_KEY
from kvprof.analysis.findings.lock_cpu import ID_PREFIX as LOCK_CPU
from kvprof.analysis.whatif import modelled
from kvprof.model.profile import Finding

# a ceiling below today's throughput: kvprof.analysis.critical's two-thread convoy
SATURATED_NOTE = ": busier threads saturate it, and a saturated sleeping mutex pays a hand-off"


def _n(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}".rstrip("0").rstrip(".") if x else "0"


def _cpu_note(f: Finding) -> str:
    if "cpu_share" not in f.cost:
        return ""
    where = f.sites[0] if f.sites else f.where
    return f" {where} was on the stack in {f.cost['cpu_share']:.1%} of the CPU samples."


def summary(f: Finding) -> str:
    """The finding's measurements in one or two plain sentences ("how much"), then what
    fixing it would give back."""
    s = _measured(f)
    if modelled(f) and GAIN_KEY in f.cost:
        s += f" Fixing it would give back about {f.cost[GAIN_KEY]:+.1%} throughput."
    if "ceiling_ops_per_s" in f.cost:
        share = f.cost.get("ceiling_share", 0)
        s += (
            f" Alone it caps the server at {_n(f.cost['ceiling_ops_per_s'])} ops/s, whatever its cores"
            f" (about {_n(f.cost.get('binds_at_threads', 0))} busy threads at today's pace; today's"
            f" throughput is {share:.1%} of it" + (SATURATED_NOTE if share > 1 else "") + ")."
        )
    return s


def _measured(f: Finding) -> str:
    k = f.cost
    if f.id.startswith(LOCK_CPU):
        threads = int(k.get("threads", 0))
        return (
            f"{threads} thread{'' if threads == 1 else 's'} spent {k.get('share', 0):.1%} of the CPU samples "
            f"in the lock and unlock calls of the {f.lock}, called from {f.where}"
            + (f" ({_n(k['cpu_s_per_s'] * 1e3)} ms of CPU per second)" if "cpu_s_per_s" in k else "")
            + f", {k.get('kernel_share', 0):.0%} of it in the kernel's futex calls (from sampled registers)."
        )
    if f.category == "lock":
        threads = int(k.get("threads", 0))
        s = (
            f"The {f.where} lock was found held {_n(k.get('waits_per_s', 0))} times a second"
            + (f", mostly in {f.sites[0]}" if f.sites else "")
            + f"; waiting for it cost {_n(k.get('wait_ms_per_s', 0))} ms per second"
            + f" ({k.get('wait_share', 0):.1%} of the time of the {threads} waiting "
            + ("thread" if threads == 1 else "threads")
            + f"), the longest wait {_n(k.get('max_ms', 0))} ms."
        )
        return s + _cpu_note(f)
    if f.id.startswith("sampled-line:"):
        what = "distinct addresses in one line" if k.get("false_sharing") else "one line"
        return (
            f"{int(k.get('samples', 0))} on-CPU samples stalled on atomic writes to {what}, "
            f"written by {int(k.get('writers', 0))} threads: ~{k.get('share', 0):.1%} of those threads' CPU "
            "(from sampled registers, no probes)."
        )
    if f.category == "cacheline":
        s = (
            f"{f.where} updated its counter {_n(k.get('updates_per_s', 0))} times a second; "
            f"{_n(k.get('transfers_per_s', 0))} a second ({k.get('transfer_share', 0):.0%}) "
            f"found the cache line on another CPU"
        )
        if k.get("cross_socket_per_s", 0):
            s += f", {k.get('cross_socket_share', 0):.0%} of them on another socket"
        s += f"; an update took {_n(k.get('cycles_mean', 0))} cycles on average"
        writers = int(k.get("writers", 0))
        s += f" ({writers} writing thread{'' if writers == 1 else 's'} per line)."
        return s + _cpu_note(f)
    if f.category == "cpu":
        s = (
            f"{f.where} was on the stack in {k.get('share', 0):.1%} of the CPU samples "
            f"and running itself in {k.get('self_share', 0):.1%}"
        )
        if "cpu_s_per_s" in k:
            s += f" ({_n(k['cpu_s_per_s'] * 1e3)} ms of CPU per second)"
        return s + "."
    if f.id.startswith("futex:"):
        on = f"{f.lock} in {f.where}" if f.lock and f.lock != f.where else f.where
        return (
            f"Threads waited on {on} {_n(k.get('waits_per_s', 0))} times a second, "
            f"{_n(k.get('wait_ms_per_s', 0))} ms per second "
            f"({k.get('wait_share', 0):.1%} of the waiting threads' time)."
        )
    return (
        f"{int(k.get('threads', 0))} threads were blocked in {f.where} for "
        f"{_n(k.get('offcpu_ms_per_s', 0))} ms per second in all, one of them "
        f"{k.get('max_wall_share', 0):.0%} of the time."
    )
