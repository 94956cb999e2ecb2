"""What `kvprof bench` does: run a scenario or compare two result files.

Progress goes to stderr, one line per run; the table goes to stdout; the
results go to a pyperf JSON file.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from kvprof.bench import BenchError, atomics, results, scenarios, stats, table
from kvprof.bench.machine import host_metadata
from kvprof.bench.runner import Interrupted, VariantRuns, run_plan
from kvprof.bench.variants import KVLOAD, Plan
from kvprof.model.topology import Topology

EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Options:
    """`kvprof bench`'s arguments, parsed."""

    scenario: str = scenarios.STUDY
    against: str | None = None
    runs: int = 5
    duration: float | None = None  # None: the scenario's default
    warmup: float = 1.0
    wait_idle: bool = False
    output: Path | None = None
    overrides: scenarios.Overrides = field(default_factory=scenarios.Overrides)


DEFAULT_DURATION = 5.0
ATOMICS_DURATION = 1.0


def host_line() -> str:
    """`host: 2 CPUs, AMD EPYC, kernel 6.1.0-18-amd64, load 0.52`."""
    model = host_metadata().get("cpu_model_name", platform.machine())
    load = os.getloadavg()[0]
    return f"host: {os.cpu_count()} CPUs, {model}, kernel {platform.release()}, load {load:.2f} at start"


def _client_line(plan: Plan) -> str:
    c = plan.variants[0].client
    if plan.scenario == scenarios.LOADGEN:
        return (
            f"both clients: {c.set_pct} % sets, {c.value_size}-byte values; TxC bN = "
            "client threads x connections each, N requests per batch (kvload) or keys per multi-get"
        )
    return (
        f"kvload: batch {c.batch} ({'multi-gets' if c.set_pct == 0 else 'pipelined'}), "
        f"{c.set_pct} % sets, {c.value_size}-byte values, {c.num_items:,} keys, {c.key_dist}; "
        "TxC = client threads x connections each"
    )


def _targets(plan: Plan, measured: Sequence[results.Measured]) -> list[str]:
    if plan.target is None:
        return []
    lines = []
    for _, members in table.groups(measured):
        if len(members) < 2:
            continue
        first, last = members[0], members[-1]
        ratio = stats.median(last.ops) / stats.median(first.ops)
        paired = stats.paired_ratios(first.ops, last.ops)
        within = f", {stats.median(paired):.2f}x within rounds" if paired else ""
        met = "met" if ratio >= plan.target else "NOT met"
        lines += table.wrap(
            f"{last.name} / {first.name} = {ratio:.2f}x{within}: target >= {plan.target:g} "
            f"{met} ({plan.target_means})"
        )
    return lines


def _write(suite_results: list[VariantRuns], plan: Plan, output: Path) -> list[results.Measured]:
    suite = results.to_suite(plan.scenario, suite_results)
    results.write(suite, output)
    return results.measured(suite)


def run_scenario(o: Options, out: TextIO = sys.stdout, progress: TextIO = sys.stderr) -> int:
    """Run a server scenario (study, memcached, loadgen); returns the exit status."""
    try:
        plan = scenarios.build(o.scenario, o.against, o.overrides)
    except ValueError as e:
        print(f"kvprof bench: {e}", file=sys.stderr)
        return 2
    duration = o.duration or DEFAULT_DURATION
    output = o.output or Path(f"bench-{plan.scenario}.json")
    n = len(plan.variants)
    total = n * (o.runs * duration + o.warmup)
    print(
        f"kvprof bench {plan.scenario}: {n} variants x {o.runs} runs of {duration:g} s, interleaved, "
        f"~{total / 60:.1f} min\nCtrl-C stops early and keeps the complete rounds",
        file=progress,
        flush=True,
    )
    host = host_line()
    interrupted = False
    try:
        done = run_plan(plan, o.runs, duration, o.warmup, progress, o.wait_idle)
    except Interrupted as e:
        done = [r for r in e.results if r.runs]
        interrupted = True
        print(f"\ninterrupted: {len(done[0].runs) if done else 0} complete runs kept", file=progress)
    except BenchError as e:
        print(f"kvprof bench: error: {e}", file=sys.stderr)
        return 1
    if not done:
        return EXIT_INTERRUPTED
    measured = _write(done, plan, output)
    runs = len(done[0].runs)
    title = [
        f"kvprof bench {plan.scenario}: {runs} runs x {duration:g} s per variant, interleaved",
        host,
        _client_line(plan) if any(v.client.tool == KVLOAD for v in plan.variants) else "",
    ]
    lines = table.render_bench(measured, title=[w for t in title for w in table.wrap(t)])
    lines += _targets(plan, measured)
    lines.append(f"wrote {output} (pyperf JSON)")
    print("\n".join(lines), file=out, flush=True)
    return EXIT_INTERRUPTED if interrupted else 0


def run_atomics(o: Options, out: TextIO = sys.stdout, progress: TextIO = sys.stderr) -> int:
    """The counter experiment; returns the exit status."""
    cpus = atomics.usable_cpus(Topology.read(), allowed=os.sched_getaffinity(0))
    counts = list(o.overrides.workers or atomics.thread_counts(len(cpus)))
    configs = atomics.plan(cpus, counts)
    duration = o.duration or ATOMICS_DURATION
    output = o.output or Path("bench-atomics.json")
    multi = len({c.socket for c in cpus}) > 1
    host = f"host: {atomics.describe_host(cpus)}, load {os.getloadavg()[0]:.2f} at start"
    print(
        f"kvprof bench atomics: {len(configs)} configurations x {o.runs} runs of {duration:g} s, "
        "interleaved\nCtrl-C stops early and keeps the complete rounds",
        file=progress,
        flush=True,
    )
    status = 0
    try:
        done = atomics.run(configs, o.runs, duration, progress, o.wait_idle)
    except BenchError as e:
        print(f"kvprof bench: error: {e}", file=sys.stderr)
        return 1
    except atomics.AtomicsInterrupted as e:
        done = e.results
        status = EXIT_INTERRUPTED
        print(f"\ninterrupted: {len(done[0].ops)} complete runs kept", file=progress)
        if not done[0].ops:
            return status
    results.write(atomics.to_suite(done), output)
    lines = [
        f"kvprof bench atomics: {len(done[0].ops)} runs x {duration:g} s each, interleaved, threads pinned",
        host,
        *table.render_atomics(done, multi),
        f"wrote {output} (pyperf JSON)",
    ]
    print("\n".join(lines), file=out, flush=True)
    return status


def compare(old: Path, new: Path, out: TextIO = sys.stdout) -> int:
    """`--compare OLD NEW`: the two files side by side, variant by variant."""
    try:
        _, before = results.load(old)
        _, after = results.load(new)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"kvprof bench: cannot read {old} / {new}: {e}", file=sys.stderr)
        return 1
    lines = ["kvprof bench --compare", f"old: {old}", f"new: {new}"]
    lines += table.render_compare(before, after)
    print("\n".join(lines), file=out, flush=True)
    return 0


def run(o: Options) -> int:
    if o.scenario == scenarios.ATOMICS:
        if o.against or o.overrides.servers or o.overrides.client_changes():
            print("kvprof bench: --scenario atomics takes only -t, --runs, --duration, -o", file=sys.stderr)
            return 2
        return run_atomics(o)
    return run_scenario(o)
