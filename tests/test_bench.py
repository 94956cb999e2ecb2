"""`kvprof bench`: the statistics and verdicts on exact numbers, the pyperf JSON
round trip, `--compare`, the topology-driven CPU choice of the atomics
scenario, and short real runs end to end (shape only: never a timed verdict)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyperf
import pytest
from support import KVPROF, REPO

from kvprof.bench import atomics, history, instructions, placement, results, scenarios, stats, table
from kvprof.bench.loadgen import parse_memcaslap
from kvprof.bench.runner import RunResult, VariantRuns
from kvprof.bench.variants import ClientConfig, Variant, parse_server
from kvprof.model.topology import Topology


def _fits(lines: list[str]) -> bool:
    """Every line but those that name a file fits in 80 columns."""
    return all(len(line) <= 80 for line in lines if not line.startswith(("wrote ", "old: ", "new: ")))


# ---------------------------------------------------------------- statistics


def test_median_and_cv_exact() -> None:
    """Median is the middle value; CV is the sample stdev over the mean, 0 for one sample."""
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([1.0, 2.0, 3.0, 10.0]) == 2.5
    assert stats.cv([90.0, 100.0, 110.0]) == pytest.approx(0.1)
    assert stats.cv([5.0]) == 0.0
    with pytest.raises(ValueError):
        stats.median([])


def test_t_critical_follows_pyperfs_table() -> None:
    """The 95 % critical values are pyperf's table, stepping down to 1.96 for large df."""
    assert stats.t_critical_95(1) == 12.706
    assert stats.t_critical_95(4) == 2.776
    assert stats.t_critical_95(8) == 2.306
    assert stats.t_critical_95(30) == 2.042
    assert stats.t_critical_95(35) == 2.042
    assert stats.t_critical_95(45) == 2.021
    assert stats.t_critical_95(500) == 1.960


def test_t_test_exact_and_equal_to_pyperf() -> None:
    """t = (m1 - m2) / sqrt(pooled variance * (1/n1 + 1/n2)), the same answer as pyperf's."""
    from pyperf._utils import is_significant  # private, but the reference we promise to match

    t = stats.t_test([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert t is not None
    assert t.df == 4
    assert t.t == pytest.approx(-3 / math.sqrt(2 / 3))
    assert t.significant
    near = stats.t_test([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
    assert near is not None and not near.significant
    for a, b in (
        ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]),
        ([1.0, 2.0, 3.0], [1.5, 2.5, 3.5]),
        ([10, 11], [12, 14]),
    ):
        ours = stats.t_test(a, b)
        assert ours is not None
        assert (ours.significant, ours.t) == pytest.approx(is_significant(a, b))


def test_t_test_edge_cases() -> None:
    """Fewer than 2 samples cannot be tested; samples without spread differ iff their means do."""
    assert stats.t_test([1.0], [2.0, 3.0]) is None
    same = stats.t_test([2.0, 2.0], [2.0, 2.0])
    assert same is not None and not same.significant
    apart = stats.t_test([2.0, 2.0], [3.0, 3.0])
    assert apart is not None and apart.significant and apart.t == -math.inf


def test_verdict_rules() -> None:
    """UNSTABLE above a 10 % spread; IMPROVEMENT/REGRESSION strictly beyond max(3 %, spread) and
    only when the test is significant; else no change."""
    assert stats.verdict(0.50, 0.11, True) == stats.UNSTABLE
    assert stats.verdict(0.05, 0.01, True) == stats.IMPROVEMENT
    assert stats.verdict(-0.05, 0.01, True) == stats.REGRESSION
    assert stats.verdict(0.05, 0.01, False) == stats.NO_CHANGE  # beyond the line but not significant
    assert stats.verdict(0.05, 0.01, None) == stats.NO_CHANGE  # too few rounds to test
    assert stats.verdict(0.02, 0.01, True) == stats.NO_CHANGE
    assert stats.verdict(0.03, 0.0, True) == stats.NO_CHANGE  # at the waterline is not beyond it
    assert stats.verdict(0.06, 0.07, True) == stats.NO_CHANGE  # the spread raises the waterline
    assert stats.verdict(0.08, 0.07, True) == stats.IMPROVEMENT
    assert stats.verdict(-0.12, 0.10, True) == stats.REGRESSION  # a spread of exactly 10 % is still judged
    assert stats.waterline(0.02) == 0.03
    assert stats.waterline(0.05) == 0.05


def test_paired_ratios() -> None:
    """Run i of a variant is paired with run i of the reference: drift between rounds cancels."""
    assert stats.paired_ratios([100.0, 200.0, 50.0], [110.0, 220.0, 55.0]) == pytest.approx([1.1, 1.1, 1.1])
    assert stats.paired_ratios([100.0, 200.0], [110.0]) == []


def test_paired_t_test_exact() -> None:
    """The paired test is a one-sample t-test of log(ratio) against 0, with n - 1 degrees of freedom."""
    ratios = [1.1, 1.15, 1.2]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    t = stats.paired_t_test(ratios)
    assert t is not None and t.df == 2 and t.critical == 4.303
    assert t.t == pytest.approx(mean / (sd / math.sqrt(3)))
    assert t.significant
    assert stats.paired_t_test([1.0]) is None
    flat = stats.paired_t_test([1.0, 1.0])
    assert flat is not None and not flat.significant
    steady = stats.paired_t_test([0.9, 0.9, 0.9])
    assert steady is not None and steady.significant and steady.t == -math.inf
    # 2x and 0.5x are equally far from no change
    assert stats.paired_t_test([2.0, 0.5]).t == pytest.approx(0.0)  # type: ignore[union-attr]


def test_verdict_steady_ratios_under_noisy_variants() -> None:
    """Each variant's CV of ops/s is far above 10 % (the host moved the CPUs between rounds), but
    every round the new variant is 1.45x the reference: the paired verdict is IMPROVEMENT."""
    base = [1.00e6, 1.40e6, 0.80e6, 1.30e6, 0.70e6, 1.20e6]
    factors = [1.44, 1.47, 1.43, 1.46, 1.45, 1.44]
    new = [b * f for b, f in zip(base, factors, strict=True)]
    assert stats.cv(base) > 0.2 and stats.cv(new) > 0.2
    c = stats.compare(base, new)
    assert c.paired and c.significant is True
    assert c.ratio == pytest.approx(1.445)
    assert c.spread < 0.02
    assert c.verdict == stats.IMPROVEMENT
    assert c.base_cv == pytest.approx(stats.cv(base))  # still there for the table
    # the same samples as two unrelated result files cannot be judged
    assert stats.compare_unpaired(base, new).verdict == stats.UNSTABLE
    # and a steady 0.8x is a REGRESSION
    assert stats.compare(base, [b * 0.8 for b in base]).verdict == stats.REGRESSION


def test_verdict_noisy_ratios() -> None:
    """Ratios that swing from 0.8x to 1.5x round to round are UNSTABLE however quiet each variant
    looks; ratios that are a little noisy (CV 5 %) around 1.02x are no change, not significant."""
    base = [1.00e6, 1.01e6, 0.99e6, 1.00e6, 1.02e6, 0.98e6]
    swinging = [b * f for b, f in zip(base, [0.8, 1.5, 0.9, 1.4, 1.0, 1.3], strict=True)]
    c = stats.compare(base, swinging)
    assert stats.cv(base) < 0.02
    assert c.spread > 0.10 and c.verdict == stats.UNSTABLE
    wobbly = [b * f for b, f in zip(base, [1.08, 0.97, 1.04, 0.96, 1.07, 1.00], strict=True)]
    w = stats.compare(base, wobbly)
    assert 0.03 < w.spread < 0.10
    assert w.significant is False and w.verdict == stats.NO_CHANGE


def test_compare_on_ops_samples() -> None:
    """compare() takes ops/s samples: median per-round ratio, CVs, significance, verdict; with
    different run counts it falls back to the unpaired comparison."""
    c = stats.compare([100.0, 101.0, 99.0], [120.0, 121.0, 119.0])
    assert c.ratio == pytest.approx(1.2, rel=1e-3)
    assert c.base_cv == pytest.approx(0.01)
    assert c.significant is True
    assert c.verdict == stats.IMPROVEMENT
    worse = stats.compare([100.0, 101.0, 99.0], [90.0, 91.0, 89.0])
    assert worse.verdict == stats.REGRESSION and worse.ratio == pytest.approx(0.9, rel=1e-3)
    same = stats.compare([100.0, 101.0, 99.0], [100.5, 100.5, 100.5])
    assert same.verdict == stats.NO_CHANGE
    uneven = stats.compare([100.0, 101.0, 99.0], [120.0, 121.0])
    assert not uneven.paired and uneven.ratio == pytest.approx(120.5 / 100.0)
    noisy = stats.compare_unpaired([100.0, 130.0, 80.0], [120.0, 121.0, 119.0])
    assert noisy.verdict == stats.UNSTABLE


# ---------------------------------------------------------------- variants and scenarios


def test_server_specs() -> None:
    """Specs name a preset plus flipped sites, or memcached; bad ones say what is wrong."""
    assert parse_server("baseline", 2).args() == ["--preset", "baseline", "-t", "2"]
    mid = parse_server("baseline+topkeys", 1)
    assert mid.args() == ["--preset", "baseline", "--topkeys", "per-thread", "-t", "1"]
    assert mid.site_modes()["topkeys"] == "per-thread" and mid.site_modes()["timings"] == "shared"
    assert parse_server("fixed+item-counter", 4).args() == [
        "--preset",
        "fixed",
        "--item-counter",
        "shared",
        "-t",
        "4",
    ]
    assert parse_server("memcached", 2).args() == ["-t", "2"]
    for bad in ("nope", "baseline+locks", "baseline+topkeys+topkeys", "memcached+topkeys"):
        with pytest.raises(ValueError):
            parse_server(bad, 2)


def test_study_plan() -> None:
    """The study: 3 steps per worker count, 2 connections per worker, baseline first in each group."""
    assert scenarios.study_workers(1) == [1, 2]
    assert scenarios.study_workers(2) == [1, 2]
    assert scenarios.study_workers(6) == [1, 2, 4, 6]
    assert scenarios.study_workers(8) == [1, 2, 4, 8]
    assert scenarios.study_client(1, ncpu=2).label == "1x2 b100"
    assert scenarios.study_client(2, ncpu=2).label == "2x2 b100"
    assert scenarios.study_client(2, ncpu=1).label == "1x4 b100"
    assert scenarios.study_client(8, ncpu=2).label == "2x8 b100"
    plan = scenarios.build("study", None, scenarios.Overrides(workers=(1, 2)))
    labels = [scenarios.study_client(w).label for w in (1, 2)]
    assert [g.title for g in plan.groups] == [
        f"1 worker, kvload {labels[0]}",
        f"2 workers, kvload {labels[1]}",
    ]
    assert [v.name for v in plan.groups[1].variants] == ["baseline t=2", "baseline+topkeys t=2", "fixed t=2"]
    client = plan.groups[1].variants[0].client
    assert (client.set_pct, client.batch, client.value_size) == (0, 100, 32)
    assert client.total_connections >= 2
    assert len(plan.servers()) == 6


def test_other_plans() -> None:
    """--against memcached puts memcached first; loadgen pairs memcaslap and kvload on one server."""
    mc = scenarios.build("study", "memcached", scenarios.Overrides())
    assert mc.scenario == "memcached" and mc.target == 1.0
    assert [v.name for v in mc.variants] == ["memcached t=2", "fixed t=2"]
    lg = scenarios.build("loadgen", None, scenarios.Overrides())
    assert [[v.client.tool for v in g.variants] for g in lg.groups] == [["memcaslap", "kvload"]] * 2
    assert len(lg.servers()) == 1
    o = scenarios.Overrides(servers=("fixed",), workers=(2,), client_threads=(1,), connections=(2, 4))
    matrix = scenarios.build("study", None, o)
    assert [v.name for v in matrix.variants] == ["fixed t=2 1x2 b100", "fixed t=2 1x4 b100"]
    assert [g.title for g in matrix.groups] == ["fixed, 2 workers"]
    with pytest.raises(ValueError):
        scenarios.build("loadgen", None, scenarios.Overrides(batch=(10,)))
    with pytest.raises(ValueError):
        scenarios.build("loadgen", "memcached", scenarios.Overrides())


def test_cli_scenarios_match() -> None:
    """The CLI's literal scenario and what-if load lists are the bench package's."""
    from kvprof.bench import whatif
    from kvprof.commands import bench

    assert bench.SCENARIOS == scenarios.SCENARIOS
    assert bench.LOADS == whatif.CHOICES


def test_parse_memcaslap() -> None:
    """memcaslap's TPS and counts come from its final summary."""
    out = (
        "cmd_get: 139449\ncmd_set: 15508\nget_misses: 0\nwritten_bytes: 7593030\n\n"
        "Run time: 3.0s Ops: 154957 TPS: 51616 Net_rate: 9.2M/s\n"
    )
    parsed = parse_memcaslap(out)
    assert parsed == {
        "duration_s": 3.0,
        "ops": 154957.0,
        "tps": 51616.0,
        "cmd_get": 139449.0,
        "cmd_set": 15508.0,
        "get_misses": 0.0,
    }


# ---------------------------------------------------------------- atomics topology


def _fake_sysfs(root: Path, sockets: int, cores: int, smt: int) -> None:
    """A sysfs tree: CPU numbers go socket by socket, SMT siblings last (as Linux numbers them)."""
    n = 0
    for _ in range(smt):
        for socket in range(sockets):
            for core in range(cores):
                topo = root / "devices" / "system" / "cpu" / f"cpu{n}" / "topology"
                topo.mkdir(parents=True)
                (topo / "core_id").write_text(f"{core}\n")
                (topo / "physical_package_id").write_text(f"{socket}\n")
                n += 1


def test_atomics_placement_two_sockets(tmp_path: Path) -> None:
    """Same-socket fills distinct cores of socket 0 first; cross-socket alternates sockets."""
    _fake_sysfs(tmp_path, sockets=2, cores=2, smt=2)  # cpu0-1 s0, cpu2-3 s1, cpu4-5 s0 SMT, cpu6-7 s1 SMT
    cpus = placement.usable_cpus(Topology.read(tmp_path))
    assert atomics.placement(cpus, 2, atomics.SAME) == [0, 1]
    assert atomics.placement(cpus, 3, atomics.SAME) == [0, 1, 4]
    assert atomics.placement(cpus, 2, atomics.CROSS) == [0, 2]
    configs = atomics.plan(cpus, [1, 2])
    names = [c.name for c in configs]
    assert names[:4] == ["local t=1", "padded t=1", "false-shared t=1", "shared t=1"]
    assert "shared t=2 cross-socket" in names and "shared t=1 cross-socket" not in names
    cross = next(c for c in configs if c.name == "shared t=2 cross-socket")
    assert cross.cpus == (0, 2) and cross.nsockets == 2
    assert placement.usable_cpus(Topology.read(tmp_path), allowed={0, 1})[-1].cpu == 1


def test_atomics_one_socket_has_no_cross_variant(tmp_path: Path) -> None:
    """On one socket every configuration stays there; thread counts are 1..ncpu (then doublings)."""
    _fake_sysfs(tmp_path, sockets=1, cores=2, smt=1)
    cpus = placement.usable_cpus(Topology.read(tmp_path))
    assert all(c.where == atomics.SAME for c in atomics.plan(cpus, atomics.thread_counts(len(cpus))))
    assert atomics.thread_counts(2) == [1, 2]
    assert atomics.thread_counts(12) == [1, 2, 3, 4, 5, 6, 7, 8, 12]
    assert atomics.thread_counts(16) == [1, 2, 3, 4, 5, 6, 7, 8, 16]


def test_atomics_table_two_sockets(tmp_path: Path) -> None:
    """The atomics table: ratios to local and padded per placement, a cross-socket line, 80 columns."""
    _fake_sysfs(tmp_path, sockets=2, cores=2, smt=1)
    configs = atomics.plan(placement.usable_cpus(Topology.read(tmp_path)), [1, 2])
    speed = {"local": 1000e6, "padded": 400e6, "false-shared": 100e6, "shared": 80e6}
    done = [
        atomics.ConfigRuns(c, [speed[c.mode] / (2 if c.where == atomics.CROSS else 1)] * 2, [{}, {}])
        for c in configs
    ]
    lines = table.render_atomics(done, multi_socket=True)
    row = next(line.split() for line in lines if line.split()[:2] == ["2", "shared"] and "0,1" in line)
    assert row == ["2", "shared", "0,1", "1", "80.0", "25.00", "0.0", "0.080", "0.200"]
    cross = next(line.split() for line in lines if line.split()[:3] == ["2", "shared", "0,2"])
    assert cross[3] == "2" and cross[-2:] == ["0.080", "0.200"]
    assert "shared vs padded: 1 thread 0.20x, 2 threads 0.20x" in lines
    assert any(line.startswith("cross-socket vs same-socket: local t=2 0.50x") for line in lines)
    assert _fits(lines)


# ---------------------------------------------------------------- pyperf JSON and --compare


def _fake_results(ops: dict[str, list[float]], group: str = "2 workers") -> list[VariantRuns]:
    """VariantRuns with the given ops/s per run, as the runner would return them."""
    out = []
    for name, samples in ops.items():
        spec = name.split()[0]
        v = Variant(name, group, parse_server(spec, 2), ClientConfig(connections=4))
        runs = [
            RunResult(
                ops_per_sec=x,
                duration_s=1.0,
                ops=int(x),
                gets=int(x),
                sets=0,
                hits=int(x),
                misses=0,
                latency_us={"p50": 100.0, "p99": 250.0, "p999": 400.0, "max": 900.0},
                client_cpu_s=0.4,
                server_cpu_s=1.5,
                other_cpu_s=0.1,
                steal_s=0.0,
                load_avg_1min=0.5,
                date="2025-01-01 00:00:00",
                argv=("kvload", "--server", "127.0.0.1:1"),
                rt_before_ns=100.0,
                rt_after_ns=450.0,
            )
            for x in samples
        ]
        out.append(VariantRuns(v, ["kvcached", *v.server.args()], "1.6.0 kvcached-0.1.0", runs))
    return out


def _write(path: Path, ops: dict[str, list[float]]) -> Path:
    results.write(results.to_suite("study", _fake_results(ops)), path)
    return path


def test_pyperf_round_trip(tmp_path: Path) -> None:
    """Each variant is a Benchmark, each run a Run valued 1/ops in seconds, ops/s in the metadata."""
    path = _write(tmp_path / "a.json", {"baseline t=2": [1000.0, 1010.0], "fixed t=2": [1500.0, 1490.0]})
    suite = pyperf.BenchmarkSuite.load(str(path))
    assert suite.get_benchmark_names() == ["baseline t=2", "fixed t=2"]
    bench = suite.get_benchmark("fixed t=2")
    assert bench.get_unit() == "second"
    assert bench.get_values() == pytest.approx((1 / 1500.0, 1 / 1490.0))
    meta = bench.get_runs()[0].get_metadata()
    assert meta["ops_per_sec"] == 1500.0
    assert meta["preset"] == "fixed" and meta["server_workers"] == 2
    assert meta["latency_p99_us"] == 250.0 and meta["kvprof_group"] == "2 workers"
    back = results.measured(suite)
    assert back[0].ops == pytest.approx((1000.0, 1010.0))
    assert back[1].p99_us == (250.0, 250.0) and back[1].client_cores == (0.4, 0.4)
    assert back[1].server_ns_per_op == pytest.approx((1.5 / 1500 * 1e9, 1.5 / 1490 * 1e9))
    assert meta["cacheline_rt_ns_before"] == 100.0 and meta["cacheline_rt_ns_after"] == 450.0
    assert back[1].rt_ns == (100.0, 100.0, 450.0, 450.0)


def test_pyperf_compare_to_reads_our_files(tmp_path: Path) -> None:
    """`python -m pyperf compare_to` runs on two result files and calls more ops/s "faster"."""
    old = _write(tmp_path / "old.json", {"fixed t=2": [1000.0, 1010.0, 990.0]})
    new = _write(tmp_path / "new.json", {"fixed t=2": [1500.0, 1490.0, 1510.0]})
    proc = subprocess.run(
        [sys.executable, "-m", "pyperf", "compare_to", str(old), str(new)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "faster" in proc.stdout and "1.50x" in proc.stdout


def test_compare_command(tmp_path: Path) -> None:
    """--compare matches variants by name and gives ratio, significance and verdict per variant."""
    old = _write(
        tmp_path / "old.json", {"baseline t=2": [1000.0, 1010.0, 990.0], "fixed+topkeys t=2": [5.0, 5.0]}
    )
    new = _write(
        tmp_path / "new.json", {"baseline t=2": [1200.0, 1210.0, 1190.0], "fixed t=2": [2000.0, 2000.0]}
    )
    proc = subprocess.run([*KVPROF, "bench", "--compare", str(old), str(new)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    row = next(line for line in lines if "baseline t=2" in line)
    assert row.split() == ["baseline", "t=2", "1,000", "1,200", "1.0/0.8", "1.200", "yes", "IMPROVEMENT"]
    assert any(line.startswith("only in") and "fixed+topkeys t=2" in line for line in lines)
    assert any(line.startswith("only in") and "fixed t=2" in line for line in lines)
    assert _fits(lines)


def test_table_fits_80_columns() -> None:
    """The bench table: a heading per group, the reference first, every line within 80 columns."""
    measured = [
        results.Measured(
            "baseline+topkeys+timings t=16 16x32 b1000",
            "16 workers",
            (1e7, 1.1e7),
            server_ns_per_op=(700, 710),
        ),
        results.Measured("fixed t=16", "16 workers", (2e7, 2.05e7), server_ns_per_op=(400, 420)),
    ]
    lines = table.render_bench(measured)
    head = ["variant", "ops/s", "CV", "%", "ratio", "rCV", "%", "cpu", "ns/op", "sig", "verdict"]
    assert lines[0].split() == head
    assert lines[1] == "16 workers"
    assert lines[2].endswith("1.000             705       reference")
    assert lines[2].startswith("  baseline+topkeys+tim…")
    # the ratio is the median of the per-round ratios (2.00 and 1.86), not of the medians (1.929)
    row = ["fixed", "t=16", "20,250,000", "1.7", "1.932", "5.0", "410", "yes", "IMPROVEMENT"]
    assert lines[3].split() == row
    # per-round ratios 2.00 and 1.86: their spread with the drift between rounds divided out
    assert lines[4] == "ratio within each round (min / median / max, CV of the ratios):"
    assert lines[5] == "  fixed t=16: 1.86 / 1.93 / 2.00, CV 5.0 %"
    assert _fits(lines)


def test_placement_line_says_when_the_host_moved_the_cpus() -> None:
    """Round trips within 2x of each other are one placement; 100 vs 450 ns is the host moving the CPUs."""
    assert placement.alike(100.0, 190.0) and placement.alike(450.0, 600.0)
    assert not placement.alike(100.0, 450.0)
    assert placement.alike(math.nan, 450.0)  # a missing reading says nothing
    steady = results.Measured("fixed t=2", "2 workers", (1e6, 1e6), rt_ns=(440.0, 470.0, 455.0, 600.0))
    lines = table.render_bench([steady], legend=False)
    assert "cache-line round trip between two CPUs, before and after each run: 440-600 ns." in lines
    moved = results.Measured("fixed t=2", "2 workers", (1e6, 1e6), rt_ns=(95.0, 470.0, 455.0, 600.0))
    text = " ".join(table.render_bench([moved], legend=False))
    assert "95-600 ns: the host moved the CPUs between cores that share a cache" in text
    assert _fits(table.render_bench([moved]))
    starved = results.Measured(
        "fixed t=2", "2 workers", (1e6, 1e6), other_cores=(1.6, 1.7), rt_ns=(1900.0, 12691.0)
    )
    text = " ".join(table.render_bench([starved], legend=False))
    assert "other processes took up to 1.70 cores, so the probe's threads waited for a CPU" in text
    assert "the host moved" not in text
    assert not any(
        "round trip" in line for line in table.render_bench([results.Measured("a", "", (1.0, 1.0))])
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the round-trip probe needs two CPUs")
def test_pingpong_round_trip_is_measured() -> None:
    """atomics --mode pingpong hands a line between two pinned threads: a round trip of tens to
    thousands of ns (never 0 or the time slice of one shared CPU); it needs exactly two threads."""
    bad = subprocess.run(
        [str(placement.atomics_binary()), "--mode", "pingpong", "--threads", "3"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 64 and "pingpong: 2" in bad.stderr
    cpus = placement.probe_cpus() or (0, 1)
    # on a loaded machine a probe thread can get no CPU in the window (NaN): a few longer tries
    values = [placement.round_trip_ns(cpus, ms=200) for _ in range(5)]
    readings = [v for v in values if not math.isnan(v)]
    if not readings:
        pytest.skip(
            f"machine too loaded (load {os.getloadavg()[0]:.1f}): no 200 ms probe had both threads on a CPU"
        )
    assert all(10 < v < 100_000 for v in readings), values


def test_handoff_measures_a_mutex_handed_to_a_sleeper() -> None:
    """atomics --mode handoff: every acquisition is a hand-off to a thread asleep in the futex
    wait, so the hand-off is positive and longer than the unlocker's time in the waking unlock
    (the wake is part of it); it needs exactly two threads."""
    bad = subprocess.run(
        [str(placement.atomics_binary()), "--mode", "handoff", "--threads", "3"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 64 and "handoff: 2" in bad.stderr
    handoff, wake = placement.handoff_ns(10_000, ms=200)
    if math.isnan(handoff):
        pytest.skip(f"machine too loaded (load {os.getloadavg()[0]:.1f}): no hand-off in 200 ms")
    assert 0 < wake < handoff, (handoff, wake)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the round-trip probe needs two CPUs")
@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs root")
def test_pingpong_realtime_measures_on_a_busy_machine() -> None:
    """--realtime runs the probe's threads at SCHED_FIFO and its timer above them: with
    both CPUs kept busy by other threads it still measures a round trip, and ends
    within its window (the timer preempts its own spinning threads)."""
    cpus = placement.probe_cpus() or (0, 1)
    busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(4)]
    try:
        argv = [str(placement.atomics_binary()), "--mode", "pingpong", "--threads", "2", "--cpus",
                f"{cpus[0]},{cpus[1]}", "--duration-ms", "20", "--realtime", "--json"]  # fmt: skip
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert out.returncode == 0, out.stderr
    assert 10 < json.loads(out.stdout)["ns_per_op"] < 20_000, out.stdout


# ---------------------------------------------------------------- real runs, end to end


def _started_pids(stderr: str) -> list[int]:
    started = re.findall(r"^started (?:kv|mem)cached .*: PID (\d+) on", stderr, re.MULTILINE)
    return [int(pid) for pid in started]


def _gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_bench_end_to_end(tmp_path: Path) -> None:
    """A real 2-variant run: progress per run, the table, pyperf JSON; every server stopped."""
    out = tmp_path / "e2e.json"
    argv = ["bench", "-t", "1", "--variants", "baseline,fixed", "--runs", "2", "-d", "0.5", "--warmup", "0"]
    proc = subprocess.run([*KVPROF, *argv, "-o", str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^\[run 2/2\] fixed t=1: [\d,]+ ops/s$", proc.stderr, re.MULTILINE), proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "kvprof bench study: 2 runs x 0.5 s per variant, interleaved"
    assert "1 worker, kvload 1x2 b100" in lines
    base = next(line for line in lines if line.startswith("  baseline t=1"))
    fixed = next(line for line in lines if line.startswith("  fixed t=1"))
    assert base.endswith("reference")
    assert fixed.split()[-1] in ("IMPROVEMENT", "REGRESSION", "UNSTABLE", "change")
    assert _fits(lines)
    suite = pyperf.BenchmarkSuite.load(str(out))
    assert suite.get_benchmark_names() == ["baseline t=1", "fixed t=1"]
    for bench in suite.get_benchmarks():
        assert bench.get_nrun() == 2
        meta = bench.get_runs()[0].get_metadata()
        assert meta["ops_per_sec"] > 0 and meta["misses"] == 0 and meta["server"] == "kvcached"
        assert bench.get_values()[0] == pytest.approx(1 / meta["ops_per_sec"])
    # the placement probe brackets every run; on a loaded machine a probe whose threads got
    # too little CPU reads nothing (NaN, left out), so only the readings taken are checked
    keys = ("cacheline_rt_ns_before", "cacheline_rt_ns_after")
    readings = [r.get_metadata().get(k) for b in suite.get_benchmarks() for r in b.get_runs() for k in keys]
    taken = [x for x in readings if x is not None]
    assert all(x > 0 for x in taken)
    if taken:
        assert any(line.startswith("cache-line round trip between two CPUs") for line in lines)
    pids = _started_pids(proc.stderr)
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)


def test_bench_ctrl_c_stops_servers_and_keeps_complete_runs(tmp_path: Path) -> None:
    """SIGINT mid-run: every server stopped by PID, exit 130, the complete runs written."""
    out = tmp_path / "partial.json"
    argv = ["bench", "-t", "1", "--variants", "baseline,fixed", "--runs", "50", "-d", "0.3", "--warmup", "0"]
    proc = subprocess.Popen(
        [*KVPROF, *argv, "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("[run 2/50] fixed"):
            break
    proc.send_signal(signal.SIGINT)
    stdout, rest = proc.communicate(timeout=30)
    stderr = "".join(seen) + rest
    assert proc.returncode == 130, stderr
    pids = _started_pids(stderr)
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)
    suite = pyperf.BenchmarkSuite.load(str(out))
    assert [b.get_nrun() for b in suite.get_benchmarks()] in ([2, 2], [3, 3])
    assert "fixed t=1" in stdout


def test_atomics_end_to_end(tmp_path: Path) -> None:
    """The counter experiment runs every mode pinned and reports ratios; JSON is pyperf's."""
    out = tmp_path / "atomics.json"
    # 0.3 s: a pinned thread that gets no CPU for a whole run stops the bench, likelier at 0.1 s when loaded
    argv = ["bench", "--scenario", "atomics", "-t", "1,2", "--runs", "2", "-d", "0.3", "-o", str(out)]
    proc = subprocess.run([*KVPROF, *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    rows = [
        line.split() for line in lines if re.match(r"\s+[12]\s+(local|padded|false-shared|shared)\s", line)
    ]
    assert [(r[0], r[1]) for r in rows] == [
        (t, m) for t in ("1", "2") for m in ("local", "padded", "false-shared", "shared")
    ]
    assert all(r[-2] == "1.000" for r in rows if r[1] == "local")
    assert any(line.startswith("shared vs padded: 1 thread") for line in lines)
    assert _fits(lines)
    suite = pyperf.BenchmarkSuite.load(str(out))
    assert len(suite.get_benchmarks()) == 8
    meta = suite.get_benchmark("shared t=2").get_runs()[0].get_metadata()
    assert meta["mode"] == "shared" and meta["threads"] == 2 and json.dumps(meta)


# ---------------------------------------------------------------- keycmp, --instructions, --rev, --history


def _get(server: object, command: bytes) -> bytes:
    import socket

    host, port = server.host, server.port  # type: ignore[attr-defined]
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(command)
        data = b""
        while not data.endswith((b"END\r\n", b"STORED\r\n")):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def test_kvcached_key_compare_modes() -> None:
    """--key-compare indirect finds, misses and replaces keys as inline (the default) does, and
    `stats settings` says which one runs; a bad value is one usage line, status 64."""
    from kvprof.system.servers import kvcached_binary, start_kvcached

    for args, mode in (((), "inline"), (("--key-compare", "indirect"), "indirect")):
        server = start_kvcached(["-t", "1", *args])
        try:
            assert server.stats("settings")["key_compare"] == mode
            for key, value in ((b"kvload:1", b"aa"), (b"kvload:10", b"bbb"), (b"kvload:1", b"c")):
                assert _get(server, b"set %s 0 0 %d\r\n%s\r\n" % (key, len(value), value)) == b"STORED\r\n"
            got = _get(server, b"get kvload:1 kvload:10 kvload:100 kvload:\r\n")
            assert got == b"VALUE kvload:1 0 1\r\nc\r\nVALUE kvload:10 0 3\r\nbbb\r\nEND\r\n"
        finally:
            server.stop()
            server.log_path.unlink(missing_ok=True)
    bad = subprocess.run([str(kvcached_binary()), "--key-compare", "fast"], capture_output=True, text=True)
    assert bad.returncode == 64
    assert bad.stderr.strip().splitlines() == [
        "kvcached: --key-compare must be 'inline' or 'indirect', not 'fast' (see kvcached --help)"
    ]


def test_keycmp_plan() -> None:
    """keycmp: fixed preset, inline first (the reference) then indirect, 2 workers by default."""
    plan = scenarios.build("keycmp", None, scenarios.Overrides())
    assert [v.name for v in plan.variants] == ["inline t=2", "indirect t=2"]
    assert plan.variants[1].server.args() == ["--preset", "fixed", "--key-compare", "indirect", "-t", "2"]
    with pytest.raises(ValueError):
        scenarios.build("keycmp", None, scenarios.Overrides(servers=("baseline",)))


CACHEGRIND_OUT = """\
desc: I1 cache:         32768 B, 64 B, 8-way associative
desc: D1 cache:         32768 B, 64 B, 8-way associative
cmd: kvcached
events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw
fl=items.c
fn=lookup_locked
10 100 1 1 40 2 1 20 1 1
11 50
fn=key_order
20 30 0 0 10 1
fl=???
fn=memcmp
0 5
summary: 185 1 1 50 3 1 20 1 1
"""


def test_parse_cachegrind() -> None:
    """cachegrind's file: counts per function summed over its lines (short lines pad with 0),
    totals from `summary:`, D1 misses = D1mr + D1mw, LL misses = ILmr + DLmr + DLmw."""
    p = instructions.parse_cachegrind(CACHEGRIND_OUT)
    assert p.totals["Ir"] == 185 and p.totals["DLmw"] == 1
    assert p.functions["lookup_locked"]["Ir"] == 150 and p.functions["lookup_locked"]["D1mr"] == 2
    assert p.functions["key_order"] == {
        "Ir": 30, "I1mr": 0, "ILmr": 0, "Dr": 10, "D1mr": 1, "DLmr": 0, "Dw": 0, "D1mw": 0, "DLmw": 0
    }  # fmt: skip
    assert p.functions["memcmp"]["Ir"] == 5
    assert instructions.d1_misses(p.totals) == 4 and instructions.ll_misses(p.totals) == 3
    assert "D1 cache" in p.caches
    with pytest.raises(Exception, match="summary"):
        instructions.parse_cachegrind("events: Ir\nfn=x\n1 2\n")


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_instructions_end_to_end(tmp_path: Path) -> None:
    """keycmp --instructions on a short run: instructions and D1/LL misses per op per variant in
    the table and in every run's metadata, the per-function difference names key_order, and the
    indirect comparison costs more instructions per op than the inline one (a count, not a time)."""
    out = tmp_path / "instr.json"
    argv = [
        "bench",
        "--scenario",
        "keycmp",
        "--instructions",
        "--runs",
        "2",
        "--requests",
        "2000",
        "-o",
        str(out),
    ]
    proc = subprocess.run([*KVPROF, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == f"wrote {out} (pyperf JSON)"
    head = next(line for line in lines if line.startswith("variant"))
    assert head.split() == ["variant", "instr/op", "CV", "%", "ratio", "D1", "miss/op", "LL", "miss/op"]
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("  inline", "  indirect"))}
    assert rows["inline"][4] == "1.000"
    assert any(line.endswith("  key_order") and line.split()[0].startswith("+") for line in lines)
    assert _fits(lines)
    suite = pyperf.BenchmarkSuite.load(str(out))
    assert suite.get_benchmark_names() == ["inline t=2", "indirect t=2"]
    per_op = {}
    for bench in suite.get_benchmarks():
        assert bench.get_nrun() == 2
        for run in bench.get_runs():
            meta = run.get_metadata()
            assert meta["kvprof_measure"] == "instructions" and meta["ops"] == 2000
            assert meta["instructions_per_op"] > 100 and meta["d1_misses_per_op"] >= 0
            assert "ll_misses_per_op" in meta
            assert run.values == (meta["instructions_per_op"],)
        per_op[bench.get_name()] = bench.median()
    assert per_op["indirect t=2"] > per_op["inline t=2"]


def _git(cwd: Path, *args: str) -> str:
    ident = [
        "-c",
        "user.name=kvprof test",
        "-c",
        "user.email=test@kvprof.invalid",
        "-c",
        "commit.gpgsign=false",
    ]
    proc = subprocess.run(["git", *ident, *args], cwd=cwd, capture_output=True, text=True, check=True)
    return proc.stdout


@pytest.fixture
def small_repo(tmp_path: Path) -> Path:
    """A new git repository holding this tree's server/ and kvprof/probes/ in two commits (the
    second changes a comment), /build/ ignored as in ours."""
    repo = tmp_path / "repo"
    repo.mkdir()
    skip = shutil.ignore_patterns("build", "build-*", "*.o")
    shutil.copytree(REPO / "server", repo / "server", ignore=skip)
    shutil.copytree(REPO / "kvprof" / "probes", repo / "kvprof" / "probes", ignore=skip)
    (repo / ".gitignore").write_text("/build/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "one")
    with (repo / "server" / "main.c").open("a") as f:
        f.write("/* the second revision */\n")
    _git(repo, "commit", "-qam", "two")
    return repo


# kvprof run in the small repository: -P keeps its kvprof/ (probes only) off sys.path, where
# `python -m` would import it as a namespace package instead of kvprof
IN_SMALL_REPO = [sys.executable, "-P", "-m", "kvprof"]


def test_rev_end_to_end(small_repo: Path, tmp_path: Path) -> None:
    """--rev HEAD~1 --rev HEAD builds both in worktrees under build/, runs them interleaved,
    leaves `git status` clean and no worktree registered, and --history gets one line per run;
    the second run reuses the builds and is judged against the first."""
    hist = tmp_path / "history.jsonl"
    out = tmp_path / "rev.json"
    argv = [
        "bench",
        "--rev",
        "HEAD~1",
        "--rev",
        "HEAD",
        "-t",
        "1",
        "--runs",
        "2",
        "-d",
        "0.3",
        "--warmup",
        "0",
    ]
    argv += ["--history", str(hist), "-o", str(out)]
    first = subprocess.run(
        [*IN_SMALL_REPO, *argv], cwd=small_repo, capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("building kvcached at ") == 2
    lines = first.stdout.splitlines()
    assert any(line.startswith("  HEAD~1 t=1") and line.endswith("reference") for line in lines)
    assert any(line.startswith("  HEAD t=1") for line in lines)
    assert "the first run of this workload" in " ".join(first.stdout.split())
    assert _git(small_repo, "status", "--porcelain") == ""
    assert len(_git(small_repo, "worktree", "list").splitlines()) == 1
    head = _git(small_repo, "rev-parse", "HEAD").strip()
    suite = pyperf.BenchmarkSuite.load(str(out))
    meta = suite.get_benchmark("HEAD t=1").get_runs()[0].get_metadata()
    assert meta["revision"] == "HEAD" and meta["commit"] == head
    second = subprocess.run(
        [*IN_SMALL_REPO, *argv], cwd=small_repo, capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stderr
    assert "building" not in second.stderr and second.stderr.count("(built before)") == 2
    text = " ".join(second.stdout.split())
    assert "ops/s vs the median of the last 1 runs" in text
    records = [json.loads(line) for line in hist.read_text().splitlines()]
    assert len(records) == 2
    assert records[0]["new"]["commit"] == head and records[0]["new"]["revision"] == "HEAD"
    assert [v["revision"] for v in records[1]["variants"]] == ["HEAD~1", "HEAD"]
    assert records[1]["new"]["figures"]["ops_per_sec"] > 0


def test_rev_bad_input(small_repo: Path) -> None:
    """An unknown revision, a revision that does not build, a directory outside git: one line
    each and status 1, the checkout untouched."""
    with (small_repo / "server" / "main.c").open("a") as f:
        f.write("#error broken on purpose\n")
    _git(small_repo, "commit", "-qam", "broken")
    cases = (
        (small_repo, ["--rev", "HEAD~1", "--rev", "no-such-rev"], "unknown revision 'no-such-rev'"),
        (small_repo, ["--rev", "HEAD~1", "--rev", "HEAD"], "kvcached does not build at HEAD ("),
        (small_repo.parent, ["--rev", "HEAD"], "is not in a git repository"),
    )
    for cwd, revs, says in cases:
        argv = [*IN_SMALL_REPO, "bench", *revs]
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("kvprof bench")]
        assert len(errors) == 1 and says in errors[0], proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stdout == ""
    assert _git(small_repo, "status", "--porcelain") == ""
    assert len(_git(small_repo, "worktree", "list").splitlines()) == 1


def test_history_waterline(tmp_path: Path) -> None:
    """The waterline: the last 5 runs' median moved by max(3 %, their CV); beyond it is flagged,
    lower instructions/op is better, a history with a CV above 10 % cannot judge."""
    assert history.judge(100.0, [100.0, 101.0, 99.0], True)[0] == stats.NO_CHANGE
    assert history.judge(90.0, [100.0, 101.0, 99.0], True)[0] == stats.REGRESSION
    assert history.judge(110.0, [100.0, 101.0, 99.0], True)[0] == stats.IMPROVEMENT
    assert history.judge(110.0, [100.0, 101.0, 99.0], False)[0] == stats.REGRESSION
    assert history.judge(90.0, [100.0, 150.0, 60.0], True)[0] == stats.UNSTABLE
    path = tmp_path / "h.jsonl"
    new = history.Entry("HEAD t=2", "fixed, 2 workers", "HEAD", "abc", {"instructions_per_op": 1000.0})
    for value in (1000.0, 1001.0, 999.0, 1000.0, 1000.0, 1000.0, 5000.0):  # the oldest falls out
        old = history.Entry("HEAD t=2", "fixed, 2 workers", "HEAD", "abc", {"instructions_per_op": value})
        history.append(path, "rev", [old], old)
    worse = history.Entry("HEAD t=2", "fixed, 2 workers", "HEAD", "abc", {"instructions_per_op": 1100.0})
    (line,) = history.append(path, "rev", [worse], worse)
    assert "last 5 runs" in line and line.endswith("UNSTABLE")  # 5000 is in the window
    for _ in range(5):
        history.append(path, "rev", [new], new)
    (line,) = history.append(path, "rev", [worse], worse)
    assert line.endswith("REGRESSION") and "vs the median of the last 5 runs 1,000.0" in line
    other = history.Entry("HEAD t=1", "fixed, 1 worker", "HEAD", "abc", {"instructions_per_op": 1.0})
    assert history.append(path, "rev", [other], other)[0].endswith("the first run of this workload")
    path.write_text("not json\n")
    with pytest.raises(Exception, match="line 1 is not JSON"):
        history.read(path)


def test_slices_merge_into_one_run() -> None:
    """A run made of slices: counts and CPU summed, ops/s over the summed time, the first
    slice's probe before and the last one's after, latency percentiles the slices' median."""
    from kvprof.bench.runner import merge

    a, b, c = (
        r.runs[0]
        for r in _fake_results({f"fixed t={n}": [x] for n, x in ((1, 1000.0), (2, 3000.0), (3, 2000.0))})
    )
    b = dataclasses.replace(
        b, rt_before_ns=7.0, rt_after_ns=9.0, latency_us={"p99": 10.0, "max": 50.0}, redone=1
    )
    c = dataclasses.replace(c, latency_us={"p99": 30.0, "max": 20.0})
    m = merge([a, b, c])
    assert (m.ops, m.duration_s, m.ops_per_sec, m.slices, m.redone) == (6000, 3.0, 2000.0, 3, 1)
    assert m.server_cpu_s == pytest.approx(4.5) and m.gets == 6000
    assert (m.rt_before_ns, m.rt_after_ns) == (100.0, 450.0)
    assert m.latency_us["p99"] == 30.0 and m.latency_us["max"] == 900.0  # median of 10, 30, 250
    assert merge([b, c]).latency_us == {"p99": 30.0, "max": 50.0}
