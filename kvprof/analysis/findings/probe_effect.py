"""Findings whose own measurement cost too much to be taken at face value.

A collector's programs run in the threads whose events they count: the lock
probe in the thread that waited, the atomic sample in the thread that
updated the counter, sched_switch in the thread that blocks. What kvprof
spent there (kvprof.analysis.own_cost: BPF run time plus the kernel's cost per
uprobe hit) is set beside what the finding reports the spot costs
(`est_s_per_s`, thread-seconds per second). When it is more than
`PROBE_EFFECT_FLAG` of it, the finding says so (`cost["probe_share"]`): part
of what it reports may be kvprof's own doing. docs/report.md ("The probe
effect") says why it is flagged rather than subtracted.
"""

from __future__ import annotations

from kvprof.analysis.findings.lock_cpu import ID_PREFIX as LOCK_CPU
from kvprof.analysis.own_cost import own_cost
from kvprof.model.profile import Finding, Profile

PROBE_EFFECT_FLAG = 0.10  # kvprof's cost on a spot, as a share of the spot's reported cost


def measured_by(f: Finding) -> str:
    """The collector whose events a finding comes from."""
    if f.category == "cacheline":
        return "regsample" if f.id.startswith("sampled-line:") else "cachelines"
    if f.id.startswith(LOCK_CPU):
        return "regsample"
    return {"lock": "locks", "offcpu": "offcpu", "cpu": "oncpu"}.get(f.category, "")


def flag_probe_effect(profile: Profile, findings: list[Finding]) -> list[Finding]:
    """`findings`, those whose collector cost more than PROBE_EFFECT_FLAG of what they report flagged."""
    cost = own_cost(profile)
    if cost is None or profile.overhead.window_s <= 0:
        return findings
    spent = {  # a program that serves several collectors ("oncpu+regsample") counts for each
        name: (r.bpf_ns + r.trap_ns) / 1e9 / profile.overhead.window_s
        for r in cost.rows
        for name in r.collector.split("+")
    }
    for f in findings:
        reported = f.cost.get("est_s_per_s", 0.0)
        ours = spent.get(measured_by(f), 0.0)
        if reported <= 0 or ours <= PROBE_EFFECT_FLAG * reported:
            continue
        f.cost["probe_share"] = ours / reported
        f.explanation += (
            f" kvprof's own {measured_by(f)} probes cost {ours / reported:.0%} of what this finding reports "
            "in the same threads: part of it may be kvprof's own doing."
        )
    return findings
