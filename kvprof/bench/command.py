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

from kvprof.bench import (
    BadOptions,
    BenchError,
    atomics,
    history,
    instructions,
    placement,
    published,
    results,
    revisions,
    scenarios,
    stats,
    table,
    whatif,
)
from kvprof.bench.instructions import DEFAULT_REQUESTS
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
    instructions: bool = False  # cachegrind instead of timed runs
    requests: int = DEFAULT_REQUESTS  # --instructions: measured operations per round
    revs: tuple[str, ...] = ()  # kvcached built at these git revisions, as the variants
    history: Path | None = None  # JSON lines, one per run, judged against the last runs
    results: Path | None = None  # also write the figures as a result file here (kvprof.bench.published)
    load: str | None = None  # whatif: the one load to run (whatif.LOADS); None: every one


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


def _plan(o: Options, progress: TextIO) -> Plan:
    """The scenario's plan, or with --rev kvcached built at each revision (ValueError / BenchError)."""
    if o.scenario == scenarios.WHATIF:
        if o.against or o.revs or o.overrides.servers or o.overrides.client_changes():
            raise ValueError(
                "--scenario whatif chooses its own variants and loads: give only -t, --runs, -d, --load"
            )
        return whatif.plan(o.overrides.workers, (o.load,) if o.load else whatif.LOADS)
    if o.load:
        raise ValueError("--load goes with --scenario whatif")
    if not o.revs:
        return scenarios.build(o.scenario, o.against, o.overrides)
    if o.scenario != scenarios.STUDY or o.against:
        raise ValueError("--rev runs the study's workload on each revision: drop --scenario / --against")
    specs = o.overrides.servers or (revisions.DEFAULT_SPEC,)
    if len(specs) != 1:
        raise ValueError("--rev takes one --variants spec, run at every revision")
    workers = o.overrides.workers or scenarios.REV_WORKERS
    for w in workers:
        scenarios.single_client(w, o.overrides)  # a matrix is a ValueError before anything is built
    return revisions.plan(
        o.revs, specs[0], workers, lambda w: scenarios.single_client(w, o.overrides), progress
    )


def _history(o: Options, plan: Plan, figures: dict[str, dict[str, float]]) -> list[str]:
    """Append this run to --history and judge its new variant (the first group's last) there;
    the lines wrapped to the table's width (BenchError when the file cannot be used)."""
    if o.history is None:
        return []
    entries = [
        history.Entry(v.name, v.group, v.server.revision, v.server.commit, figures[v.name])
        for v in plan.variants
        if v.name in figures
    ]
    first = [e for e in entries if e.workload == plan.groups[0].title]
    if not first:
        return []
    try:
        said = history.append(o.history, plan.scenario, entries, first[-1])
    except OSError as e:
        raise BenchError(str(e)) from None
    return [w for line in said for w in table.wrap(line)]


def _publish(
    o: Options, bench: str, title: str, figures: list[published.Figure], **settings: object
) -> list[str]:
    """With --results DIR: the figures as a result file there; the line that says so."""
    if o.results is None:
        return []
    settings = {"runs": o.runs, **settings}
    return [
        f"wrote {published.write(published.document(bench, title, figures, settings), o.results)} (results)"
    ]


def _published_figures(measured: Sequence[results.Measured]) -> list[published.Figure]:
    """Each variant's median ops/s (min-max of its runs), and its median per-round ratio to its
    group's first variant with that ratio's CV."""
    out = []
    for _, members in table.groups(measured):
        for m in members:
            out.append(published.Figure.median_of(f"{m.name}: ops/s", m.ops, "ops/s", "runs", 0))
            if m is not members[0]:
                c = stats.compare(members[0].ops, m.ops)
                out.append(
                    published.Figure(
                        f"{m.name} / {members[0].name}",
                        round(c.ratio, 4),
                        "x",
                        spread=f"CV {c.spread:.1%} of the per-round ratios; {c.verdict}",
                        n=len(m.ops),
                    )
                )
    return out


def _timed_figures(measured: Sequence[results.Measured]) -> dict[str, dict[str, float]]:
    out = {}
    for _, members in table.groups(measured):
        for m in members:
            figures = {"ops_per_sec": stats.median(m.ops), "cv": stats.cv(m.ops)}
            if m is not members[0]:
                c = stats.compare(members[0].ops, m.ops)
                figures |= {"ratio": c.ratio, "ratio_cv": c.spread}
            out[m.name] = figures
    return out


def run_scenario(
    o: Options,
    out: TextIO = sys.stdout,
    progress: TextIO = sys.stderr,
    predict: whatif.Predict | None = None,
) -> int:
    """Run a server scenario (study, memcached, loadgen, keycmp, whatif with `predict`,
    --rev); returns the exit status (0, or EXIT_INTERRUPTED); BadOptions and BenchError
    say what stopped it."""
    try:
        plan = _plan(o, progress)
    except ValueError as e:  # the scenarios' and revisions' checks of the options
        raise BadOptions(str(e)) from None
    if o.instructions:
        return run_instructions(o, plan, out, progress)
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
    recorder = None
    if plan.scenario == scenarios.WHATIF:
        if predict is None:
            raise BadOptions("--scenario whatif needs kvprof's model: run it as `kvprof bench`")
        recorder = whatif.Recorder(predict, keep=output)
    try:
        done = run_plan(plan, o.runs, duration, o.warmup, progress, o.wait_idle, recorder)
    except Interrupted as e:
        done = [r for r in e.results if r.runs]
        interrupted = True
        print(f"\ninterrupted: {len(done[0].runs) if done else 0} complete runs kept", file=progress)
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
    if recorder is not None:
        ops = {m.name: m.ops for m in measured}
        cpu = {m.name: m.server_ns_per_op for m in measured}
        for g in plan.groups:
            lines += ["", *whatif.render(g.variants, ops, recorder, cpu)]
    lines += _history(o, plan, _timed_figures(measured))
    lines.append(f"wrote {output} (pyperf JSON)")
    figures = _published_figures(measured)
    if recorder is not None:
        ops = {m.name: m.ops for m in measured}
        cpu = {m.name: m.server_ns_per_op for m in measured}
        figures += [f for g in plan.groups for f in whatif.figures(g.variants, ops, recorder, cpu)]
    lines += _publish(
        o,
        f"bench-{plan.scenario}",
        f"kvprof bench --scenario {plan.scenario}",
        figures,
        duration_s=duration,
        variants=[v.name for v in plan.variants],
        workers=list(o.overrides.workers or ()),
    )
    print("\n".join(lines), file=out, flush=True)
    return EXIT_INTERRUPTED if interrupted else 0


def run_instructions(o: Options, plan: Plan, out: TextIO = sys.stdout, progress: TextIO = sys.stderr) -> int:
    """--instructions: every variant under cachegrind, `runs` interleaved rounds."""
    output = o.output or Path(f"bench-{plan.scenario}-instructions.json")
    print(
        f"kvprof bench {plan.scenario} --instructions: {len(plan.variants)} variants x {o.runs} rounds "
        f"under cachegrind, {o.requests:,} measured requests each\nCtrl-C stops early and keeps the "
        "complete rounds",
        file=progress,
        flush=True,
    )
    done = instructions.run(plan, o.runs, o.requests, progress)
    rounds = min(len(vr.rounds) for vr in done)
    if rounds == 0:
        return EXIT_INTERRUPTED
    results.write(instructions.to_suite(plan.scenario, done), output)
    title = [
        f"kvprof bench {plan.scenario} --instructions: {rounds} rounds per variant under cachegrind, "
        f"interleaved, {o.requests:,} measured requests each",
        host_line(),
        _client_line(plan),
    ]
    lines = [w for t in title for w in table.wrap(t)] + table.render_instructions(done)
    figures = {
        vr.variant.name: {
            "instructions_per_op": stats.median([r.instructions for r in vr.rounds]),
            "d1_misses_per_op": stats.median([r.d1 for r in vr.rounds]),
            "ll_misses_per_op": stats.median([r.ll for r in vr.rounds]),
        }
        for vr in done
    }
    lines += _history(o, plan, figures)
    lines.append(f"wrote {output} (pyperf JSON)")
    lines += _publish(
        o,
        f"bench-{plan.scenario}-instructions",
        f"kvprof bench --scenario {plan.scenario} --instructions",
        [
            published.Figure(f"{name}: {what}", round(value, 3), "per op", n=rounds)
            for name, fs in figures.items()
            for what, value in fs.items()
        ],
        requests=o.requests,
    )
    print("\n".join(lines), file=out, flush=True)
    return EXIT_INTERRUPTED if rounds < o.runs else 0


def run_atomics(o: Options, out: TextIO = sys.stdout, progress: TextIO = sys.stderr) -> int:
    """The counter experiment; returns the exit status."""
    cpus = placement.usable_cpus(Topology.read(), allowed=os.sched_getaffinity(0))
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
    lines += _publish(
        o,
        "bench-atomics",
        "kvprof bench --scenario atomics",
        [published.Figure.median_of(f"{r.config.name}: ops/s", r.ops, "ops/s", "runs", 0) for r in done],
        duration_s=duration,
    )
    print("\n".join(lines), file=out, flush=True)
    return status


def compare(old: Path, new: Path, out: TextIO = sys.stdout) -> int:
    """`--compare OLD NEW`: the two files side by side, variant by variant."""
    try:
        _, before = results.load(old)
        _, after = results.load(new)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadOptions(f"cannot read {old} / {new}: {e}") from None
    lines = ["kvprof bench --compare", f"old: {old}", f"new: {new}"]
    lines += table.render_compare(before, after)
    print("\n".join(lines), file=out, flush=True)
    return 0


def run(o: Options, predict: whatif.Predict | None = None) -> int:
    if o.scenario == scenarios.ATOMICS:
        if o.against or o.overrides.servers or o.overrides.client_changes() or o.revs or o.instructions:
            raise BadOptions("--scenario atomics takes only -t, --runs, --duration, -o, --results")
        return run_atomics(o)
    return run_scenario(o, predict=predict)
