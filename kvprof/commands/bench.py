"""`kvprof bench`: kvcached presets under kvload, interleaved, with statistics."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvprof.commands import add_seconds, command, fail, number
from kvprof.commands import options as options_of

# kvprof.bench.scenarios.SCENARIOS (tests check they agree): kept literal so
# that building the parser imports nothing but the standard library.
SCENARIOS = ("study", "loadgen", "atomics", "keycmp", "whatif", "ceiling")
LOADS = ("demo", "study", "demo2")  # kvprof.bench.whatif.CHOICES, literal for the same reason

HELP = "benchmark kvcached presets with statistics (pyperf JSON, ratios, verdicts)"

EXAMPLES = """\
examples:
  kvprof bench                        # the study's 3 steps at 1, 2, ... workers
  kvprof bench --against memcached    # kvcached fixed vs memcached, 2 workers
  kvprof bench --scenario loadgen     # kvload vs memcaslap, same kvcached
  kvprof bench --scenario atomics     # shared vs padded vs local counters
  kvprof bench -t 2 --variants baseline,baseline+topkeys,fixed+item-counter,fixed
  kvprof bench -t 2 --variants fixed --connections 2,4,8  # client settings
  kvprof bench --scenario keycmp      # key comparison inlined vs through a pointer
  kvprof bench --scenario whatif      # each fix's predicted gain vs the fix itself (root)
  kvprof bench --scenario whatif --load study   # ... under the study's load only
  kvprof bench --scenario ceiling     # ceilings predicted at 1 worker vs 2 workers (root)
  kvprof bench --scenario keycmp --instructions   # instructions/op under cachegrind
  kvprof bench --rev HEAD~1 --rev HEAD --history bench-history.jsonl
  kvprof bench --runs 10 --duration 5 -o before.json
  kvprof bench --compare before.json after.json
  python -m pyperf compare_to before.json after.json   # same files
"""

DESCRIPTION = """\
Start every variant's server (kvcached presets and per-site switches, or
memcached) on free loopback ports, populate each once, then run kvload against
them interleaved (A B C, A B C, ...) so machine drift hits all alike. Prints
median ops/s and CV, the median per-round ratio to each group's first variant
and that ratio's CV, a paired t-test and a verdict judged on the per-round
ratios (UNSTABLE / IMPROVEMENT / REGRESSION / no change), and writes pyperf
JSON (values are seconds per operation, so pyperf's "faster" is more ops/s).
--instructions counts instructions and simulated cache misses per operation
under valgrind's cachegrind instead; --rev builds kvcached at git revisions
of the repository you are in and runs them as the variants.

A variant spec is `baseline` or `fixed`, optionally with `+SITE` for each site
flipped away from the preset (sites: topkeys, timings, item-counter,
memory-counter), or `memcached`."""


_count = number(int, lo=1)


def _counts(text: str) -> tuple[int, ...]:
    values = tuple(int(_count(part)) for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected N or N,M,...: {text!r}")
    return values


def _specs(text: str) -> tuple[str, ...]:
    values = tuple(part.strip() for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected SPEC or SPEC,SPEC,...: {text!r}")
    return values


def add_parser(commands: Any) -> None:
    p = command(commands, "bench", HELP, DESCRIPTION, EXAMPLES)
    p.add_argument("--scenario", choices=SCENARIOS, default="study", help="what to run (default: study)")
    p.add_argument(
        "--against", choices=("memcached",), help="kvcached fixed vs memcached on the study's workload"
    )
    p.add_argument(
        "--compare", nargs=2, type=Path, metavar=("OLD", "NEW"), help="compare two result files, then exit"
    )
    p.add_argument("--runs", type=number(int, lo=2), default=5, metavar="N",
                   help="interleaved runs (default: %(default)s, min 2)")  # fmt: skip
    add_seconds(
        p, "-d", "--duration", type=number(float, lo=0.1), help="seconds per run (default: 5; atomics: 1)"
    )
    add_seconds(p, "--warmup", type=number(float, lo=0), default=1.0,
                help="one unrecorded run per variant first (0: none)")  # fmt: skip
    p.add_argument(
        "--wait-idle",
        action="store_true",
        help="for shared machines: start each run when the machine is 90 %% idle, and "
        "run it again (up to 3 times) when other processes used over 0.15 cores meanwhile",
    )
    p.add_argument(
        "--load",
        choices=LOADS,
        help="whatif: run under this load only (default: the demo's, then the study's; demo2: the "
        "demo's requests from two kvload threads)",
    )
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="default: bench-<scenario>.json")
    p.add_argument("--results", type=Path, metavar="DIR", help="also write a result file in DIR")
    p.add_argument(
        "--instructions",
        action="store_true",
        help="run each server under cachegrind for a fixed request count: instructions and "
        "simulated D1/LL misses per operation (--runs rounds)",
    )
    p.add_argument(
        "--requests",
        type=_count,
        metavar="N",
        help="--instructions: measured requests per round (default: 100000)",
    )
    p.add_argument(
        "--rev",
        action="append",
        metavar="REV",
        help="build kvcached at this git revision of the current repository and run it as a "
        "variant (give it twice or more: --rev HEAD~1 --rev HEAD)",
    )
    p.add_argument(
        "--history",
        type=Path,
        metavar="FILE",
        help="append this run to FILE (JSON lines) and judge the last variant against the last 5 runs there",
    )
    p.add_argument(
        "-t",
        "--threads",
        dest="workers",
        type=_counts,
        metavar="N,M",
        help="server worker threads (default: 1,2 and more up to the CPU count; "
        "--against memcached and loadgen: 2); atomics: thread counts",
    )
    p.add_argument(
        "--variants", dest="servers", type=_specs, metavar="SPEC,...", help="server variants (see above)"
    )
    _client_options(p)
    p.set_defaults(run=_run)


def _client_options(p: argparse.ArgumentParser) -> None:
    client = p.add_argument_group("kvload settings (comma lists make a matrix)")
    client.add_argument("--client-threads", type=_counts, metavar="N,M", help="kvload threads")
    client.add_argument(
        "--connections",
        type=_counts,
        metavar="N,M",
        help="connections per kvload thread (default: 2 per worker)",
    )
    client.add_argument(
        "--batch-size", dest="batch", type=_counts, metavar="N,M", help="requests per batch (default: 100)"
    )
    client.add_argument("--num-items", type=_count, metavar="N", help="distinct keys (default: 10000)")
    client.add_argument("--value-size", type=_count, metavar="BYTES", help="value size (default: 32)")
    client.add_argument(
        "--set-pct", type=number(int, 0, 100), metavar="P", help="percentage of sets (default: 0)"
    )
    client.add_argument("--key-dist", metavar="D", help="uniform (default) or zipf:S")


def _run(args: argparse.Namespace) -> int:
    from kvprof.bench import BadOptions, BenchError

    try:
        return _bench(args)
    except BadOptions as e:
        return fail("bench", str(e))
    except BenchError as e:
        return fail("bench", f"error: {e}", 1)


def _bench(args: argparse.Namespace) -> int:
    from kvprof.bench import command, instructions, scenarios

    if args.compare:
        others = [
            args.against,
            args.servers,
            args.workers,
            args.output,
            args.rev,
            args.history,
            args.requests,
            args.results,
        ]
        if args.scenario != "study" or any(x is not None for x in others):
            return fail("bench", "--compare takes only the two files")
        old, new = args.compare
        return command.compare(old, new)
    opts = replace(
        options_of(command.Options, args),
        overrides=options_of(scenarios.Overrides, args),
        requests=args.requests or instructions.DEFAULT_REQUESTS,
        revs=tuple(args.rev or ()),
    )
    if args.requests and not args.instructions:
        return fail("bench", "--requests goes with --instructions")
    if args.scenario == "ceiling":
        from kvprof.analysis.ceilings import ladder
        from kvprof.analysis.findings import THRESHOLDS, find
        from kvprof.bench import ceiling
        from kvprof.model.profile import Profile

        def first_rung(p: Profile) -> tuple[str, float] | None:
            rungs = ladder(p, find(p))
            return (rungs[0].resource, rungs[0].ceiling_ops_per_s) if rungs else None

        model = (THRESHOLDS.handoff_ns, THRESHOLDS.wake_ns)
        return ceiling.run(first_rung, model, args.runs, args.results)
    if args.scenario == "whatif":
        from kvprof.analysis.findings import find
        from kvprof.analysis.whatif import predict

        return command.run(opts, lambda p, fixes: predict(p, find(p), fixes))
    return command.run(opts)
