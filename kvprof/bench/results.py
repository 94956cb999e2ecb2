"""Benchmark results as pyperf JSON, and back.

One pyperf Benchmark per variant, one pyperf Run per measured run. pyperf
treats every value as a duration (lower is better), so each run's value is
seconds per operation (1 / ops/s, unit "second"): `python -m pyperf
compare_to old.json new.json` then calls an improvement "faster". The ops/s,
latency percentiles, CPU times and the exact server and client settings sit
in each run's metadata. The variant's group (what its ratio is taken
against) is the metadata `kvprof_group`; the first benchmark of a group in
the file is the group's reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyperf  # type: ignore[import-untyped]  # pyperf ships no type information

from kvprof import __version__
from kvprof.bench.machine import host_metadata
from kvprof.bench.runner import RunResult, VariantRuns
from kvprof.bench.variants import KVCACHED

UNIT = "second"
Metadata = dict[str, str | int | float]


def _clean(meta: Mapping[str, object]) -> Metadata:
    """pyperf takes str (non-empty, one line), int and float values only."""
    out: Metadata = {}
    for key, value in meta.items():
        if isinstance(value, bool):
            out[key] = int(value)
        elif isinstance(value, int | float):
            if value == value:  # not NaN
                out[key] = value
        elif isinstance(value, str):
            text = " ".join(value.split())
            if text:
                out[key] = text
    return out


def run_metadata(scenario: str, vr: VariantRuns, run: RunResult, host: Metadata) -> Metadata:
    """Everything a reader needs to know about one run, flat."""
    v = vr.variant
    meta: dict[str, object] = {
        **host,
        "name": v.name,
        "unit": UNIT,
        "date": run.date,
        "duration": run.duration_s,
        # pyperf's model of a run: `loops` iterations of which each value is
        # one's time, so value x loops is the run's wall time (its "raw value")
        "loops": max(1, run.ops),
        "load_avg_1min": run.load_avg_1min,
        "kvprof_version": __version__,
        "kvprof_scenario": scenario,
        "kvprof_group": v.group,
        "server": v.server.kind,
        "server_version": vr.server_version,
        "server_args": " ".join(vr.server_argv[1:]),
        "server_workers": v.server.workers,
        "client": v.client.tool,
        "client_threads": v.client.threads,
        "client_connections": v.client.connections,
        "client_batch": v.client.batch,
        "client_num_items": v.client.num_items,
        "client_value_size": v.client.value_size,
        "client_set_pct": v.client.set_pct,
        "client_key_dist": v.client.key_dist,
        "client_args": " ".join(run.argv[1:]),
        "ops_per_sec": run.ops_per_sec,
        "ops": run.ops,
        "gets": run.gets,
        "sets": run.sets,
        "hits": run.hits,
        "misses": run.misses,
        "client_cpu_s": run.client_cpu_s,
        "server_cpu_s": run.server_cpu_s,
        "other_cpu_s": run.other_cpu_s,
        "steal_s": run.steal_s,
        "redone": run.redone,
        "slices": run.slices,
        "cacheline_rt_ns_before": run.rt_before_ns,
        "cacheline_rt_ns_after": run.rt_after_ns,
    }
    if v.server.kind == KVCACHED:
        meta["preset"] = "+".join((v.server.preset, *v.server.flipped))
        meta["key_compare"] = v.server.key_compare or "default"
        meta["revision"] = v.server.revision
        meta["commit"] = v.server.commit
        for site, mode in v.server.site_modes().items():
            meta[f"site_{site.replace('-', '_')}"] = mode
    for name, value in run.latency_us.items():
        meta[f"latency_{name}_us"] = value
    return _clean(meta)


def to_suite(scenario: str, results: Sequence[VariantRuns]) -> pyperf.BenchmarkSuite:
    """One Benchmark per variant with at least one run, in plan order."""
    host = host_metadata()
    benchmarks = []
    for vr in results:
        runs = []
        for i, run in enumerate(vr.runs):
            warmups = (
                [(1, 1 / vr.warmup.ops_per_sec)] if i == 0 and vr.warmup and vr.warmup.ops_per_sec else None
            )
            runs.append(
                pyperf.Run(
                    [1 / run.ops_per_sec],
                    warmups=warmups,
                    metadata=run_metadata(scenario, vr, run, host),
                    collect_metadata=False,
                )
            )
        if runs:
            benchmarks.append(pyperf.Benchmark(runs))
    if not benchmarks:
        raise ValueError("no complete runs to write")
    return pyperf.BenchmarkSuite(benchmarks)


def write(suite: pyperf.BenchmarkSuite, path: Path) -> None:
    """Write (replacing) a pyperf JSON file."""
    suite.dump(str(path), replace=True)


@dataclass(frozen=True)
class Measured:
    """One variant's samples, as the table needs them."""

    name: str
    group: str
    ops: tuple[float, ...]  # ops/s of each run
    p99_us: tuple[float, ...] = ()  # the load generator's p99 latency of each run, when it has one
    client_cores: tuple[float, ...] = ()  # load-generator CPU / wall time of each run
    server_cores: tuple[float, ...] = ()
    server_ns_per_op: tuple[float, ...] = ()  # server CPU time per operation of each run
    other_cores: tuple[float, ...] = ()  # CPU used by everything else during each run
    steal_cores: tuple[float, ...] = ()  # CPU the hypervisor gave other guests during each run
    rt_ns: tuple[float, ...] = ()  # the cache-line round trips before and after each run (placement)


def _floats(runs: Sequence[pyperf.Run], key: str, per_second: bool = False) -> tuple[float, ...]:
    out = []
    for run in runs:
        meta = run.get_metadata()
        value = meta.get(key)
        if not isinstance(value, int | float):
            return ()
        if per_second:
            duration = meta.get("duration")
            if not isinstance(duration, int | float) or duration <= 0:
                return ()
            value = value / duration
        out.append(float(value))
    return tuple(out)


def _readings(runs: Sequence[pyperf.Run], *keys: str) -> tuple[float, ...]:
    """Every number under `keys` in the runs' metadata, skipping runs that lack one (a
    placement probe that could not run reads nothing)."""
    out = []
    for key in keys:
        for run in runs:
            value = run.get_metadata().get(key)
            if isinstance(value, int | float):
                out.append(float(value))
    return tuple(out)


def _cpu_per_op(runs: Sequence[pyperf.Run]) -> tuple[float, ...]:
    out = []
    for run in runs:
        meta = run.get_metadata()
        cpu, ops = meta.get("server_cpu_s"), meta.get("ops")
        if not isinstance(cpu, int | float) or not isinstance(ops, int | float) or ops <= 0:
            return ()
        out.append(cpu / ops * 1e9)
    return tuple(out)


def measured(suite: pyperf.BenchmarkSuite) -> list[Measured]:
    """The suite's benchmarks in file order; ops/s = 1 / value, so any pyperf file works."""
    out = []
    for bench in suite.get_benchmarks():
        runs = [run for run in bench.get_runs() if run.values]
        if not runs:
            continue
        ops = tuple(1 / value for run in runs for value in run.values)
        group = runs[0].get_metadata().get("kvprof_group", "")
        out.append(
            Measured(
                name=bench.get_name(),
                group=str(group),
                ops=ops,
                p99_us=_floats(runs, "latency_p99_us"),
                client_cores=_floats(runs, "client_cpu_s", per_second=True),
                server_cores=_floats(runs, "server_cpu_s", per_second=True),
                server_ns_per_op=_cpu_per_op(runs),
                other_cores=_floats(runs, "other_cpu_s", per_second=True),
                steal_cores=_floats(runs, "steal_s", per_second=True),
                rt_ns=_readings(runs, "cacheline_rt_ns_before", "cacheline_rt_ns_after"),
            )
        )
    return out


def load(path: Path) -> tuple[pyperf.BenchmarkSuite, list[Measured]]:
    """Read a pyperf JSON file (ValueError / OSError with the reason on a bad one)."""
    suite = pyperf.BenchmarkSuite.load(str(path))
    return suite, measured(suite)


def scenario_of(suite: pyperf.BenchmarkSuite) -> str:
    """The scenario a file was written by ('' for a foreign pyperf file)."""
    for bench in suite.get_benchmarks():
        value = bench.get_metadata().get("kvprof_scenario")
        if isinstance(value, str):
            return value
    return ""
