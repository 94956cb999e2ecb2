"""Benchmark tables, 80 columns wide.

Pure functions from measurements to lines of text: the live run, `--compare`
and the atomics scenario all render here.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from kvprof.bench import atomics, instructions, placement, stats
from kvprof.bench.results import Measured

WIDTH = 80
INDENT = "  "
BUSY_CORES = 0.5  # other processes' share above which the placement probe measures waiting

CV_LEGEND = "CV: stdev / mean of ops/s over the runs, for information. "
CPU_LEGEND = (
    "cpu ns/op: the server's CPU time per operation (median), less sensitive than ops/s to what "
    "else runs on the machine. "
)
PAIRED_LEGEND = (
    "ratio: the median over the rounds of this variant's ops/s / the group's first variant's in "
    "the same round; rCV: the CV of those per-round ratios. sig: paired t-test at 95 % on the "
    "logs of the per-round ratios. verdict: UNSTABLE when rCV > 10 %, IMPROVEMENT or REGRESSION "
    "when the ratio moves by more than max(3 %, rCV) and sig says yes, else no change."
)
UNPAIRED_LEGEND = (
    "sig: two-sample t-test at 95 % (pyperf's, on seconds per op). verdict: UNSTABLE when either "
    "CV > 10 %, IMPROVEMENT or REGRESSION when the change exceeds max(3 %, the larger CV) and sig "
    "says yes, else no change."
)
LEGEND = CV_LEGEND + CPU_LEGEND + PAIRED_LEGEND
COMPARE_LEGEND = "ratio: new median ops/s / old. " + CV_LEGEND + UNPAIRED_LEGEND


def wrap(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH)


def _sig(significant: bool | None) -> str:
    return "-" if significant is None else ("yes" if significant else "no")


def _fit(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def groups(measured: Sequence[Measured]) -> list[tuple[str, list[Measured]]]:
    """Measurements grouped by `group`, in first-seen order (the first of each is its reference)."""
    out: dict[str, list[Measured]] = {}
    for m in measured:
        out.setdefault(m.group, []).append(m)
    return list(out.items())


@dataclass(frozen=True)
class Row:
    """One line of the bench table, before formatting."""

    name: str
    median: float
    cv: float
    ratio: float | None  # None for a group's reference
    spread: float | None  # the CV of the per-round ratios
    cpu_ns: float | None  # median server CPU time per operation
    significant: bool | None
    verdict: str


def rows(group: Sequence[Measured]) -> list[Row]:
    """Each variant against the group's first."""
    ref = group[0]
    out = []
    for i, m in enumerate(group):
        cpu = stats.median(m.server_ns_per_op) if m.server_ns_per_op else None
        if i == 0:
            out.append(Row(m.name, stats.median(m.ops), stats.cv(m.ops), None, None, cpu, None, "reference"))
            continue
        c = stats.compare(ref.ops, m.ops)
        out.append(Row(m.name, c.new_median, c.new_cv, c.ratio, c.spread, cpu, c.significant, c.verdict))
    return out


def _span(values: Sequence[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def _cpu_line(measured: Sequence[Measured]) -> list[str]:
    client = [x for m in measured for x in m.client_cores]
    server = [x for m in measured for x in m.server_cores]
    other = [x for m in measured for x in m.other_cores]
    steal = [x for m in measured for x in m.steal_cores]
    if not client:
        return []
    line = f"cores busy per run: load generator {_span(client)}"
    if server:
        line += f", server {_span(server)}"
    if other:
        line += f", other processes {_span(other)}"
    if steal:
        line += f", stolen by the hypervisor {_span(steal)}"
    return wrap(line + ".")


def _placement_line(measured: Sequence[Measured]) -> list[str]:
    """The cache-line round trips taken around the runs, and whether the host moved the CPUs."""
    rts = [x for m in measured for x in m.rt_ns if x > 0]
    if not rts:
        return []
    low, high = min(rts), max(rts)
    line = f"cache-line round trip between two CPUs, before and after each run: {low:,.0f}-{high:,.0f} ns"
    if placement.alike(low, high):
        return wrap(line + ".")
    other = [x for m in measured for x in m.other_cores]
    if other and max(other) > BUSY_CORES:
        # a probe thread that waits for a CPU reads microseconds: the machine, not the host
        return wrap(
            line + f": other processes took up to {max(other):.2f} cores, so the probe's threads "
            "waited for a CPU and these readings say little about where the host put the CPUs."
        )
    return wrap(
        line + ": the host moved the CPUs between cores that share a cache and cores that do not "
        "during the bench, which changes what shared locks and counters cost (the JSON has the "
        "readings of every run)."
    )


def _paired_lines(measured: Sequence[Measured]) -> list[str]:
    """Per-round ratios of each variant to its group's reference (the runs are interleaved)."""
    lines = []
    for _, members in groups(measured):
        for m in members[1:]:
            ratios = stats.paired_ratios(members[0].ops, m.ops)
            if len(ratios) >= 2:
                spread = f"{min(ratios):.2f} / {stats.median(ratios):.2f} / {max(ratios):.2f}"
                lines.append(f"  {m.name}: {spread}, CV {100 * stats.cv(ratios):.1f} %")
    if not lines:
        return []
    return ["ratio within each round (min / median / max, CV of the ratios):", *lines]


def render_bench(measured: Sequence[Measured], title: Sequence[str] = (), legend: bool = True) -> list[str]:
    """The main table: per group, median ops/s, CV, per-round ratio and its CV,
    server CPU per op, paired t-test, verdict."""
    with_cpu = any(m.server_ns_per_op for m in measured)
    rest = 11 + 6 + 6 + 6 + (10 if with_cpu else 0) + 5 + 13
    name_w = min(max((len(INDENT) + len(m.name) for m in measured), default=10), WIDTH - rest)
    name_w = max(name_w, len("variant"))
    head = f"{'variant':<{name_w}}{'ops/s':>11}{'CV %':>6}{'ratio':>6}{'rCV %':>6}"
    head += f"{'cpu ns/op':>10}" if with_cpu else ""
    head += f"{'sig':>5}  {'verdict'}"
    lines = [*title, head]
    for group, members in groups(measured):
        if group:
            lines.append(_fit(group, WIDTH))
        for r in rows(members):
            line = f"{_fit(INDENT + r.name, name_w):<{name_w}}{r.median:>11,.0f}{100 * r.cv:>6.1f}"
            line += f"{'1.000' if r.ratio is None else f'{r.ratio:.3f}':>6}"
            line += f"{'' if r.spread is None else f'{100 * r.spread:.1f}':>6}"
            if with_cpu:
                line += f"{'-' if r.cpu_ns is None else f'{r.cpu_ns:,.0f}':>10}"
            line += f"{'' if r.ratio is None else _sig(r.significant):>5}  {r.verdict}"
            lines.append(line.rstrip())
    lines += _paired_lines(measured)
    lines += _cpu_line(measured)
    lines += _placement_line(measured)
    if legend:
        lines += wrap(LEGEND)
    return lines


def render_compare(
    old: Sequence[Measured], new: Sequence[Measured], old_label: str = "old", new_label: str = "new"
) -> list[str]:
    """OLD vs NEW file, variant by variant (matched by name), grouped as in NEW."""
    by_name = {m.name: m for m in old}
    matched = [m for m in new if m.name in by_name]
    rest = 11 + 11 + 10 + 7 + 5 + 13
    name_w = min(max((len(INDENT) + len(m.name) for m in matched), default=10), WIDTH - rest)
    name_w = max(name_w, len("variant"))
    head = f"{'variant':<{name_w}}{'old ops/s':>11}{'new ops/s':>11}{'CV % o/n':>10}{'ratio':>7}{'sig':>5}"
    lines = [head + "  verdict"]
    for group, members in groups(matched):
        if group:
            lines.append(_fit(group, WIDTH))
        for m in members:
            c = stats.compare_unpaired(by_name[m.name].ops, m.ops)
            cvs = f"{100 * c.base_cv:.1f}/{100 * c.new_cv:.1f}"
            lines.append(
                f"{_fit(INDENT + m.name, name_w):<{name_w}}{c.base_median:>11,.0f}{c.new_median:>11,.0f}"
                f"{cvs:>10}{c.ratio:>7.3f}{_sig(c.significant):>5}  {c.verdict}"
            )
    only_old = [m.name for m in old if m.name not in {n.name for n in new}]
    only_new = [m.name for m in new if m.name not in by_name]
    if only_old:
        lines += wrap(f"only in {old_label}: {', '.join(only_old)}")
    if only_new:
        lines += wrap(f"only in {new_label}: {', '.join(only_new)}")
    if not matched:
        lines.append("no variant is in both files")
    lines += wrap(COMPARE_LEGEND)
    return lines


def render_atomics(results: Sequence[atomics.ConfigRuns], multi_socket: bool) -> list[str]:
    """Mops/s, ns per increment per thread, CV, and ratios vs local and vs padded."""
    med = {(r.config.threads, r.config.where, r.config.mode): stats.median(r.ops) for r in results if r.ops}
    # with a sockets column, narrower columns keep the line within 80
    sep, cpus_w, ns_w, cv_w, local_w = (" ", 10, 7, 6, 9) if multi_socket else ("  ", 12, 8, 7, 10)
    head = f"{'threads':>7}{sep}{'mode':<13}{'cpus':<{cpus_w}}"
    head += f"{'sockets':>8}" if multi_socket else ""
    head += f"{'Mops/s':>9}{'ns/op':>{ns_w}}{'CV %':>{cv_w}}{'vs local':>{local_w}}{'vs padded':>10}"
    lines = [head]
    for r in results:
        if not r.ops:
            continue
        c = r.config
        m = med[(c.threads, c.where, c.mode)]
        local = med.get((c.threads, c.where, "local"))
        padded = med.get((c.threads, c.where, "padded"))
        cpus = ",".join(map(str, c.cpus))
        line = f"{c.threads:>7}{sep}{c.mode:<13}{_fit(cpus, cpus_w - 1):<{cpus_w}}"
        line += f"{c.nsockets:>8}" if multi_socket else ""
        line += f"{m / 1e6:>9,.1f}{c.threads / m * 1e9:>{ns_w}.2f}{100 * stats.cv(r.ops):>{cv_w}.1f}"
        line += f"{m / local:>{local_w}.3f}" if local else f"{'-':>{local_w}}"
        line += f"{m / padded:>10.3f}" if padded else f"{'-':>10}"
        lines.append(line)
    pairs = []
    for (n, where, mode), m in med.items():
        if mode == "shared" and where == atomics.SAME and (n, where, "padded") in med:
            pairs.append(f"{n} thread{'s' if n != 1 else ''} {m / med[(n, where, 'padded')]:.2f}x")
    if pairs:
        lines += wrap("shared vs padded: " + ", ".join(pairs))
    cross = []
    for (n, where, mode), m in med.items():
        if where == atomics.CROSS and (n, atomics.SAME, mode) in med:
            cross.append(f"{mode} t={n} {m / med[(n, atomics.SAME, mode)]:.2f}x")
    if cross:
        lines += wrap("cross-socket vs same-socket: " + ", ".join(cross))
    lines.append("ns/op: nanoseconds per increment per thread (threads / ops/s).")
    return lines


INSTRUCTIONS_LEGEND = (
    "instr/op: instructions per operation counted by cachegrind (median over the rounds), CV "
    "its spread; ratio: to the group's first variant. D1 / LL miss/op: simulated first-level "
    "data and last-level cache misses per operation (a difference of two counts, shown as 0 "
    "below 0). Per operation means the difference of two runs of the same server, one with "
    "more requests, divided by the extra operations: start-up and population cancel out."
)


def render_instructions(done: Sequence[instructions.VariantRounds]) -> list[str]:
    """Instructions and cache misses per operation per variant, then the functions whose
    instructions per operation changed most against each group's first variant."""
    measured = [vr for vr in done if vr.rounds]
    rest = 11 + 6 + 7 + 11 + 11
    name_w = min(max((len(INDENT) + len(vr.variant.name) for vr in measured), default=10), WIDTH - rest)
    name_w = max(name_w, len("variant"))
    lines = [
        f"{'variant':<{name_w}}{'instr/op':>11}{'CV %':>6}{'ratio':>7}{'D1 miss/op':>11}{'LL miss/op':>11}"
    ]
    by_group: dict[str, list[instructions.VariantRounds]] = {}
    for vr in measured:
        by_group.setdefault(vr.variant.group, []).append(vr)
    diffs: list[str] = []
    for group, members in by_group.items():
        lines.append(_fit(group, WIDTH))
        ref = stats.median([r.instructions for r in members[0].rounds])
        for vr in members:
            ir = [r.instructions for r in vr.rounds]
            med = stats.median(ir)
            d1 = stats.median([r.d1 for r in vr.rounds])
            ll = stats.median([r.ll for r in vr.rounds])
            lines.append(
                f"{_fit(INDENT + vr.variant.name, name_w):<{name_w}}{med:>11,.1f}{100 * stats.cv(ir):>6.2f}"
                f"{med / ref:>7.3f}{max(d1, 0.0):>11.2f}{max(ll, 0.0):>11.3f}"
            )
        for vr in members[1:]:
            diffs += function_diff(members[0], vr)
    return lines + diffs + wrap(INSTRUCTIONS_LEGEND)


def function_diff(base: instructions.VariantRounds, new: instructions.VariantRounds) -> list[str]:
    """The functions whose median instructions per operation changed most, new - base (like
    `cg_diff` then `cg_annotate`)."""

    def per_fn(vr: instructions.VariantRounds) -> dict[str, float]:
        names = {fn for r in vr.rounds for fn in r.functions}
        return {fn: stats.median([r.functions.get(fn, 0.0) for r in vr.rounds]) for fn in names}

    a, b = per_fn(base), per_fn(new)
    delta = {fn: b.get(fn, 0.0) - a.get(fn, 0.0) for fn in set(a) | set(b)}
    top = sorted(delta.items(), key=lambda kv: -abs(kv[1]))[: instructions.TOP_FUNCTIONS]
    top = [(fn, d) for fn, d in top if abs(d) >= 0.05]
    if not top:
        return []
    total = sum(delta.values())
    lines = [
        _fit(
            f"instructions/op by function, {new.variant.name} - {base.variant.name} ({total:+,.1f} in all):",
            WIDTH,
        )
    ]
    for fn, d in top:
        lines.append(_fit(f"  {d:>+9.1f}  {fn}", WIDTH))
    return lines
