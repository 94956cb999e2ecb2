"""Findings: the hotspot catalog joined with a profile's measurements.

`find(profile)` returns the findings ranked by one rule (`common.rank`): a
finding is worth the larger of what fixing it gives back now
(`cost["gain_if_fixed"]`, kvprof.analysis.whatif) and a fixed weight times
the share of its resource's ceiling today's throughput already uses
(kvprof.analysis.ceilings); its severity and its place both follow from
that worth, ties broken by the estimated cost `cost["est_s_per_s"]`. The
thresholds in `Thresholds` say what each module reports at all and with
which measurements; docs/report.md has the rule.

One module per category, each a function from the window's `Context` to
its findings: `locks` (kvs lock probes), `lock_cpu` (the CPU of the lock
machinery, by lock and caller, from sampled registers), `sites` (cache lines of the kvs
atomic probe), `cpu` (catalog functions and hot leaves), `offcpu` (futexes
and blocking waits); the cache lines from sampled registers are
kvprof.analysis.lines'. `common` has the thresholds and what every rule
shares, `summary` the one or two sentences of "how much".

Sampled probes count as the events they stand for: kvcached's probes carry
their weights and the programs count each event that many times (a profile
recorded before the weights has `profile.status.sample_rates["atomic__sample"]`,
and its samples and transfers are multiplied by it: kvprof.analysis.tables). A finding whose collector
cost the target more than a tenth of what it reports is flagged
(`probe_effect`). Each finding's `cost["gain_if_fixed"]` is the throughput
fixing it would give back (kvprof.analysis.whatif); a lock's or shared
line's also carries the ceiling its resource puts on throughput and the
thread count at which it binds (kvprof.analysis.ceilings).
"""

from __future__ import annotations

from kvprof.analysis import ceilings
from kvprof.analysis.findings.common import THRESHOLDS, Context, Thresholds, rank_key
from kvprof.analysis.findings.cpu import cpu_findings, fold_cpu
from kvprof.analysis.findings.lock_cpu import lock_cpu_findings
from kvprof.analysis.findings.locks import lock_findings
from kvprof.analysis.findings.offcpu import offcpu_findings
from kvprof.analysis.findings.probe_effect import flag_probe_effect
from kvprof.analysis.findings.sites import site_findings
from kvprof.analysis.findings.summary import summary
from kvprof.analysis.lines import line_findings
from kvprof.analysis.whatif import annotate
from kvprof.model.profile import Finding, Profile

__all__ = ["THRESHOLDS", "Thresholds", "find", "rank_key", "summary"]


def find(profile: Profile, thresholds: Thresholds = THRESHOLDS) -> list[Finding]:
    """Every finding for `profile`, most costly first."""
    c = Context(profile, thresholds)
    findings = [
        *lock_findings(c),
        *lock_cpu_findings(c),
        *site_findings(c),
        *line_findings(profile, skip_functions={cl.site for cl in profile.cachelines}),
        *cpu_findings(c),
        *offcpu_findings(c),
    ]
    return ceilings.ranked(profile, annotate(profile, flag_probe_effect(profile, fold_cpu(c, findings))))
