"""`kvprof bench --instructions`: instructions and simulated cache misses per
operation, counted by valgrind's cachegrind, which a noisy machine cannot move.

Each variant's server runs under cachegrind twice per round: populated, then
a fixed number of kvload batches (`--num-cycles`), then stopped; the second
run does `requests` more operations than the first. Everything the two runs
share -- start-up, population, the first cold requests, shutdown -- cancels
in the difference, so (long - short) / (ops_long - ops_short) is the cost of
one measured request. Debian 12's valgrind (3.19) cannot switch cachegrind's
counting on and off inside a run (`--instr-at-start` and cachegrind's client
requests came in 3.22), and callgrind's switch (`callgrind_control -i`) goes
through vgdb into a live process; two plain runs are simpler and exact.
"""

from __future__ import annotations

import datetime
import math
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import pyperf  # type: ignore[import-untyped]  # pyperf ships no type information

from kvprof import __version__
from kvprof.bench import BenchError
from kvprof.bench.loadgen import kvload_argv, kvload_binary, kvload_counts, kvload_populate_argv, tail
from kvprof.bench.machine import host_metadata
from kvprof.bench.variants import KVCACHED, KVLOAD, Plan, Variant
from kvprof.system.servers import TargetError, start_kvcached

DEFAULT_REQUESTS = 100_000  # measured requests per round: the long run's extra operations
SHORT_SHARE = 4  # the short run does requests / SHORT_SHARE operations after population
START_TIMEOUT_S = 60.0  # valgrind takes a few seconds to start a server
RUN_TIMEOUT_S = 600.0
TOP_FUNCTIONS = 8  # functions listed under the table per compared pair
UNIT = "integer"


@dataclass
class Profile:
    """One cachegrind output file: totals and per-function counts by event."""

    events: tuple[str, ...]
    totals: dict[str, int]
    functions: dict[str, dict[str, int]] = field(default_factory=dict)
    caches: str = ""  # cachegrind's `desc:` lines: the simulated I1, D1 and LL


def parse_cachegrind(text: str) -> Profile:
    """cachegrind.out: `events:` names the columns, `fn=` starts a function, lines of
    `LINE COUNT...` follow (missing trailing counts are 0), `summary:` has the totals."""
    events: tuple[str, ...] = ()
    functions: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    summary: dict[str, int] = {}
    desc = []
    for line in text.splitlines():
        if line.startswith("events:"):
            events = tuple(line.split()[1:])
        elif line.startswith("desc:"):
            desc.append(" ".join(line.split()[1:]))
        elif line.startswith("fn="):
            current = functions.setdefault(line[3:], dict.fromkeys(events, 0))
        elif line.startswith("summary:"):
            summary = dict(zip(events, map(int, line.split()[1:]), strict=False))
        elif line[:1].isdigit() and current is not None:
            for name, count in zip(events, line.split()[1:], strict=False):
                current[name] += int(count)
    if not events or not summary:
        raise BenchError("cachegrind wrote no `events:` or `summary:` line")
    return Profile(events, {e: summary.get(e, 0) for e in events}, functions, "; ".join(desc))


def d1_misses(counts: dict[str, int] | dict[str, float]) -> float:
    return float(counts.get("D1mr", 0) + counts.get("D1mw", 0))


def ll_misses(counts: dict[str, int] | dict[str, float]) -> float:
    """Last-level misses, instruction and data, as cg_annotate's LLm."""
    return float(counts.get("ILmr", 0) + counts.get("DLmr", 0) + counts.get("DLmw", 0))


@dataclass(frozen=True)
class Round:
    """One round of one variant: the difference of a short and a long run, per operation."""

    ops: int  # ops_long - ops_short
    per_op: dict[str, float]  # event -> count per operation
    functions: dict[str, float]  # function -> instructions per operation
    caches: str
    date: str
    argv: tuple[str, ...]  # the long run's kvload

    @property
    def instructions(self) -> float:
        return self.per_op.get("Ir", math.nan)

    @property
    def d1(self) -> float:
        return d1_misses(self.per_op)

    @property
    def ll(self) -> float:
        return ll_misses(self.per_op)


@dataclass
class VariantRounds:
    variant: Variant
    server_argv: list[str]
    rounds: list[Round] = field(default_factory=list)


def valgrind() -> str:
    exe = shutil.which("valgrind")
    if exe is None:
        raise BenchError("valgrind not found: apt-get install valgrind")
    return exe


def cycles_for(requests: int, v: Variant) -> int:
    """kvload batches per connection that make about `requests` operations."""
    per_cycle = v.client.total_connections * v.client.batch
    return max(1, -(-requests // per_cycle))


class Counter:
    """Runs servers under cachegrind; files go to a temporary folder removed at the end."""

    def __init__(self, progress: TextIO) -> None:
        self.progress = progress
        self.valgrind = valgrind()
        self.kvload = kvload_binary()
        self.workdir = Path(tempfile.mkdtemp(prefix="kvprof-cachegrind-"))
        self.runs = 0

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    def one_run(self, v: Variant, cycles: int) -> tuple[Profile, int, list[str], list[str]]:
        """Start the server under cachegrind, populate, `cycles` batches, stop: its profile and ops."""
        if v.server.kind != KVCACHED or v.client.tool != KVLOAD:
            raise BenchError(f"--instructions measures kvcached under kvload, not {v.name}")
        self.runs += 1
        out = self.workdir / f"cachegrind.{self.runs}.out"
        wrapper = [
            self.valgrind,
            "--tool=cachegrind",
            "--cache-sim=yes",
            f"--cachegrind-out-file={out}",
            "-q",
        ]
        binary = Path(v.server.binary) if v.server.binary else None
        try:
            server = start_kvcached(v.server.args(), binary=binary, wrapper=wrapper, timeout=START_TIMEOUT_S)
        except TargetError as e:
            raise BenchError(f"cannot start kvcached under cachegrind for {v.name}: {e}") from None
        try:
            populate = kvload_populate_argv(self.kvload, server.address, v.client)
            proc = subprocess.run(populate, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
            if proc.returncode != 0:
                raise BenchError(f"populating {v.name} under cachegrind failed:\n{tail(proc.stderr)}")
            argv = kvload_argv(self.kvload, server.address, v.client, cycles=cycles)
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
            ops = kvload_counts(v, proc).ops
        finally:
            status = server.stop(timeout=RUN_TIMEOUT_S)
            log = server.log()
            server.log_path.unlink(missing_ok=True)
        if status != 0 or not out.exists():
            raise BenchError(
                f"kvcached under cachegrind for {v.name} exited with status {status}:\n{tail(log)}"
            )
        profile = parse_cachegrind(out.read_text(errors="replace"))
        out.unlink()
        return profile, ops, server.argv, argv

    def round(self, v: Variant, requests: int) -> tuple[Round, list[str]]:
        """A short and a long run; their difference per operation."""
        date = datetime.datetime.now().isoformat(" ", "seconds")
        long_cycles = cycles_for(requests, v)
        short_cycles = max(1, long_cycles // SHORT_SHARE)
        short, short_ops, _, _ = self.one_run(v, short_cycles)
        long, long_ops, server_argv, argv = self.one_run(v, short_cycles + long_cycles)
        ops = long_ops - short_ops
        if ops <= 0:
            raise BenchError(f"the long cachegrind run of {v.name} did no more operations than the short one")
        per_op = {e: (long.totals[e] - short.totals.get(e, 0)) / ops for e in long.events}
        names = set(long.functions) | set(short.functions)
        functions = {
            fn: (long.functions.get(fn, {}).get("Ir", 0) - short.functions.get(fn, {}).get("Ir", 0)) / ops
            for fn in names
        }
        return Round(ops, per_op, functions, long.caches, date, tuple(argv)), server_argv


def run(plan: Plan, rounds: int, requests: int, progress: TextIO) -> list[VariantRounds]:
    """`rounds` interleaved rounds over the plan's variants (A B, A B, ...)."""
    counter = Counter(progress)
    out = [VariantRounds(v, []) for v in plan.variants]
    try:
        for n in range(1, rounds + 1):
            for vr in out:
                r, vr.server_argv = counter.round(vr.variant, requests)
                vr.rounds.append(r)
                print(
                    f"[round {n}/{rounds}] {vr.variant.name}: {r.instructions:,.1f} instructions/op, "
                    f"D1 misses {max(r.d1, 0.0):.2f}/op, LL misses {max(r.ll, 0.0):.3f}/op ({r.ops:,} ops)",
                    file=progress,
                    flush=True,
                )
    except KeyboardInterrupt:
        complete = min(len(vr.rounds) for vr in out)
        for vr in out:
            del vr.rounds[complete:]
    finally:
        counter.close()
    return out


# ---------------------------------------------------------------- results


def to_suite(scenario: str, done: Sequence[VariantRounds]) -> pyperf.BenchmarkSuite:
    """One Benchmark per variant, one Run per round valued in instructions per operation."""
    host = host_metadata()
    benchmarks = []
    for vr in done:
        runs = []
        for r in vr.rounds:
            meta: dict[str, str | int | float] = {
                **host,
                "name": vr.variant.name,
                "unit": UNIT,
                "date": r.date,
                "loops": max(1, r.ops),
                "kvprof_version": __version__,
                "kvprof_scenario": scenario,
                "kvprof_group": vr.variant.group,
                "kvprof_measure": "instructions",
                "server_args": " ".join(vr.server_argv[1:]),
                "server_workers": vr.variant.server.workers,
                "client_args": " ".join(r.argv[1:]),
                "ops": r.ops,
                "instructions_per_op": r.instructions,
                "d1_misses_per_op": r.d1,
                "ll_misses_per_op": r.ll,
                "cachegrind_caches": r.caches,
            }
            if vr.variant.server.key_compare:
                meta["key_compare"] = vr.variant.server.key_compare
            if vr.variant.server.revision:
                meta["revision"] = vr.variant.server.revision
                meta["commit"] = vr.variant.server.commit
            for event, value in r.per_op.items():
                meta[f"cachegrind_{event}_per_op"] = value
            runs.append(pyperf.Run([r.instructions], metadata=meta, collect_metadata=False))
        if runs:
            benchmarks.append(pyperf.Benchmark(runs))
    if not benchmarks:
        raise ValueError("no complete rounds to write")
    return pyperf.BenchmarkSuite(benchmarks)
