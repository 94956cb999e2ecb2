"""What kvprof itself cost the target over a window, from Profile.overhead.

The share is the part of the target's throughput kvprof is expected to take
when the target is CPU-bound:

    (BPF run time + uprobe hits x the kernel's cost per hit
     + cpu-clock samples that landed on the target x the cost of one) / the target's CPU time
    + the kvprof process's CPU time / (window x CPUs)

Every program counted here runs in the thread whose event fired it (a uprobe
in the target's thread, sched_switch in the thread switching out, a cpu-clock
sample on the CPU it interrupts), so its time is time the target's threads did
not spend serving; sched_switch and the cpu-clock programs also run, briefly,
for other processes, which the share counts as the target's (an
overestimate). A per-CPU cpu-clock timer fires whatever runs, so the samples
that landed on the target are its runs x the share of the CPUs' time the
target ran; what one costs (Overhead.sample_interrupt_ns) is measured as a
loss of throughput on a contended server, not as CPU time. The kvprof process
competes with everything on the machine, so it counts as its share of all
CPUs. What an event leaves in the caches (the server's own lines evicted)
and what the process displaces beyond its share of the CPUs are not in it:
a busy server can lose more than the share says.
docs/record.md ("Overhead") compares the share with the throughput loss
measured on one server, and says how the cost of a sample was measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvprof.model.profile import Profile


@dataclass
class CollectorCost:
    collector: str
    fired_by: str
    events_per_s: float
    ns_per_event: float  # the program's run time per event
    bpf_ns: int
    trap_ns: int  # the kernel's per-hit cost of the uprobes that fired it
    interrupt_ns: int  # the cost of the cpu-clock samples that fired it on the target
    share: float  # of the target's CPU time


@dataclass
class OwnCost:
    measured: bool
    share: float  # the whole figure (the formula above)
    bpf_share: float
    trap_share: float
    interrupt_share: float
    process_share: float  # the kvprof process, of all CPUs
    rows: list[CollectorCost] = field(default_factory=list)  # most costly first


def own_cost(p: Profile) -> OwnCost | None:
    """kvprof's cost over the window, or None when the profile has no figure for it."""
    o = p.overhead
    if o.window_s <= 0 or o.target_cpu_s <= 0:
        return None
    target_ns = o.target_cpu_s * 1e9
    by: dict[str, CollectorCost] = {}
    for prog in o.programs:
        row = by.setdefault(prog.collector, CollectorCost(prog.collector, prog.kind, 0.0, 0.0, 0, 0, 0, 0.0))
        row.events_per_s += prog.runs / o.window_s
        row.bpf_ns += prog.ns
        if prog.kind == "uprobe":
            row.trap_ns += round(prog.runs * o.uprobe_hit_ns)
        elif prog.kind == "perf_event":
            on_target = prog.runs * o.target_cpu_s / (o.window_s * max(1, o.cpus))
            row.interrupt_ns += round(on_target * o.sample_interrupt_ns)
    for row in by.values():
        runs = row.events_per_s * o.window_s
        row.ns_per_event = row.bpf_ns / runs if runs else 0.0
        row.share = (row.bpf_ns + row.trap_ns + row.interrupt_ns) / target_ns
    bpf = sum(r.bpf_ns for r in by.values()) / target_ns
    trap = sum(r.trap_ns for r in by.values()) / target_ns
    interrupt = sum(r.interrupt_ns for r in by.values()) / target_ns
    process = o.kvprof_cpu_s / (o.window_s * max(1, o.cpus))
    return OwnCost(
        measured=o.measured,
        share=bpf + trap + interrupt + process,
        bpf_share=bpf,
        trap_share=trap,
        interrupt_share=interrupt,
        process_share=process,
        rows=sorted(by.values(), key=lambda r: -r.share),
    )


def own_cost_line(p: Profile) -> str:
    """ "kvprof: 1.2 % of the target" for a status line; "" when there is no figure."""
    cost = own_cost(p)
    if cost is None or not cost.measured:
        return ""
    return f"kvprof: {cost.share:.1%} of the target"
