#!/usr/bin/env python3
"""kvprof's lock-wait figure (LOCKS) checked against an exact tracer, bpftrace.

For each target, --runs times:

1. start the target (Debian's `sysbench mutex --threads=4` with 1 or 2 mutexes,
   or the project's own tests/programs/glibc_lock.c and contend.c);
2. start `bpftrace bench/lockwait.bt PID` and wait for its first line: it
   times every switch-out of a thread asleep in glibc's lock wait
   (FUTEX_WAIT with the value 2, __lll_lock_wait's call) until the thread is
   back on a CPU, and prints the cumulative sum with the kernel's monotonic
   clock every 100 ms;
3. `kvprof record -p PID -d D` (with `--offcpu-hz 0`: every switch timed; or the
   default, sampled), then stop bpftrace;
4. cut bpftrace's cumulative sum at the recording's window (its start and
   length, moved from the wall clock to the monotonic one), interpolated
   between the 100 ms lines, and divide kvprof's LOCKS total (its futex rows)
   by it.

The windows agree to within the reads at their edges: kvprof counts a wait when
the thread next leaves the CPU, bpftrace when it is back on one, so a wait in
flight at either edge may fall on the other side in one of them (a few ms
against seconds of waiting). The JSON written (--out, by default
bench/results/lockwait-accuracy-*.json) has the machine, kvprof's version, the
settings and every run's figures and ratio; --json prints it instead.

    sudo .venv/bin/python bench/lockwait_accuracy.py [--runs 5] \
        [--target sysbench1 --target sysbench2 --target glibc_lock --target contend] \
        [--mode exact --mode sampled]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvprof.analysis.tables import locks  # noqa: E402
from kvprof.bench import published  # noqa: E402
from kvprof.collect import OFFCPU_HZ, OFFCPU_LOCK_HZ  # noqa: E402
from kvprof.model.profile import Profile  # noqa: E402

SCRIPT = ROOT / "bench" / "lockwait.bt"
KVPROF = ROOT / ".venv" / "bin" / "kvprof"
PROGRAMS = ROOT / "tests" / "programs"
TARGETS = ("sysbench1", "sysbench2", "glibc_lock", "contend")
MODES = {"exact": ["--offcpu-hz", "0"], "sampled": []}
# 10 s each: a wait in flight at an edge can be a tenth of a second on a busy machine,
# against one to two seconds of waiting in 5 s of sysbench
DURATION = {"exact": 10.0, "sampled": 10.0}
ATTACH_TIMEOUT_S = 60.0


def _sysbench(mutexes: int) -> list[str]:
    # one event per thread of many locks: it runs until stopped
    return [
        "sysbench",
        "mutex",
        "--threads=4",
        f"--mutex-num={mutexes}",
        "--mutex-locks=1000000000",
        "--mutex-loops=200",
        "run",
    ]


def target_command(name: str, build_dir: Path) -> list[str]:
    """The command that runs target `name` (a test program is built into build_dir)."""
    if name.startswith("sysbench"):
        return _sysbench(int(name.removeprefix("sysbench")))
    binary = build_dir / name
    if not binary.exists():
        flags = ["-fno-omit-frame-pointer"] if name == "contend" else []
        subprocess.run(
            ["cc", "-O1", "-g", *flags, "-pthread", "-o", str(binary), str(PROGRAMS / f"{name}.c")],
            check=True,
        )
    return [str(binary), "600"]


def cumulative(lines: list[str]) -> tuple[list[int], list[int]]:
    """bpftrace's "T ktime_ns wait_ns waits" lines as (times, cumulative wait ns)."""
    rows = [line.split() for line in lines if line.startswith("T ")]
    return [int(r[1]) for r in rows], [int(r[2]) for r in rows]


def at(times: list[int], values: list[int], t: float) -> float:
    """The cumulative value at monotonic ns `t`, interpolated between the lines."""
    i = bisect.bisect_left(times, t)
    if i == 0:
        return float(values[0])
    if i >= len(times):
        return float(values[-1])
    f = (t - times[i - 1]) / (times[i] - times[i - 1])
    return values[i - 1] + f * (values[i] - values[i - 1])


def kvprof_locks(profile: Profile) -> tuple[int, int | None]:
    """LOCKS' futex rows: (total wait ns, its 90 % half-width or None when timed)."""
    rows = [lk for lk in locks(profile) if lk.futex]
    errs = [lk.err90_ns for lk in rows if lk.err90_ns is not None]
    return sum(lk.wait_ns for lk in rows), (round(sum(e * e for e in errs) ** 0.5) if errs else None)


def one_run(target: str, mode: str, duration: float, work: Path, extra: list[str]) -> dict[str, object]:
    """One paired measurement: bpftrace and kvprof record on one target over one window."""
    proc = subprocess.Popen(target_command(target, work), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    bt = None
    try:
        time.sleep(1.0)  # the threads started and contend
        out = work / f"{target}-{mode}.bt"
        with open(out, "w") as f:
            bt = subprocess.Popen(
                ["bpftrace", str(SCRIPT), str(proc.pid)], stdout=f, stderr=subprocess.DEVNULL, text=True
            )
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        while "T " not in out.read_text():
            if bt.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bpftrace did not start on {target}")
            time.sleep(0.1)
        offset = time.time() - time.monotonic()
        prof = work / f"{target}-{mode}.json"
        record = [str(KVPROF), "record", "-p", str(proc.pid), "-d", str(duration), *MODES[mode], *extra]
        subprocess.run(
            [*record, "-o", str(prof)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        bt.send_signal(2)
        bt.wait(timeout=30)
        profile = Profile.from_dict(json.loads(prof.read_text()))
        times, values = cumulative(out.read_text().splitlines())
        t0 = (profile.window.start - offset) * 1e9
        t1 = t0 + profile.window.duration_s * 1e9
        exact = at(times, values, t1) - at(times, values, t0)
        ns, err = kvprof_locks(profile)
        return {
            "target": target,
            "mode": mode,
            "window_s": profile.window.duration_s,
            "bpftrace_s": round(exact / 1e9, 4),
            "kvprof_s": round(ns / 1e9, 4),
            "kvprof_err90_s": None if err is None else round(err / 1e9, 4),
            "ratio": round(ns / exact, 4) if exact else None,
            "profile": str(prof),
        }
    finally:
        if bt is not None and bt.poll() is None:
            bt.kill()
            bt.wait()
        proc.kill()
        proc.wait()


def figures(runs: list[dict[str, Any]]) -> list[published.Figure]:
    """Per target and mode, kvprof's figure over bpftrace's across the runs; sampled, also the
    interval kvprof stated, relative."""
    out = []
    for target in dict.fromkeys(r["target"] for r in runs):
        for mode in dict.fromkeys(r["mode"] for r in runs):
            mine = [r for r in runs if r["target"] == target and r["mode"] == mode]
            if not mine:
                continue
            out.append(published.Figure.median_of(f"{target}, {mode}: kvprof / bpftrace",
                                                  [r["ratio"] for r in mine], "x", "runs"))  # fmt: skip
            stated = [
                r["kvprof_err90_s"] / r["kvprof_s"] for r in mine if r["kvprof_err90_s"] and r["kvprof_s"]
            ]
            if stated:
                out.append(published.Figure.median_of(f"{target}, {mode}: stated ±90 %", stated, "x", "runs"))
                covered = [abs(r["kvprof_s"] - r["bpftrace_s"]) <= r["kvprof_err90_s"] for r in mine]
                out.append(
                    published.Figure(
                        f"{target}, {mode}: bpftrace's figure within the stated ±90 %",
                        round(100 * sum(covered) / len(covered)),
                        "% of runs",
                        n=len(covered),
                    )
                )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--target", action="append", choices=TARGETS)
    ap.add_argument("--mode", action="append", choices=tuple(MODES))
    ap.add_argument("--duration", type=float, help="seconds per recording (default: 5 exact, 10 sampled)")
    ap.add_argument("--offcpu-hz", type=int, help="sampled mode: record's --offcpu-hz (default: its own)")
    ap.add_argument(
        "--results", type=Path, default=ROOT / "bench" / "results", help="where the result file goes"
    )
    ap.add_argument("--json", action="store_true", help="print the JSON instead of writing a file")
    ap.add_argument("--keep", type=Path, help="keep the profiles and bpftrace's output in this folder")
    ap.add_argument(
        "--more",
        type=Path,
        help="a result file of this benchmark whose runs the new ones join (a series split into "
        "several calls); the file written then has them all, and replaces it",
    )
    args = ap.parse_args()
    missing = [t for t in ("bpftrace", "sysbench", "cc") if shutil.which(t) is None]
    if missing:
        print(
            f"lockwait_accuracy: {', '.join(missing)} not installed (scripts/provision.sh)", file=sys.stderr
        )
        return 2
    if os.geteuid() != 0:
        print("lockwait_accuracy: needs root (BPF)", file=sys.stderr)
        return 2
    runs: list[dict[str, Any]] = []
    if args.more is not None:
        try:
            runs = json.loads(args.more.read_text())["runs"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(
                f"lockwait_accuracy: {args.more}: not a result file of this benchmark ({e})", file=sys.stderr
            )
            return 2
    modes = args.mode or list(MODES)
    first = max((r["run"] for r in runs if r["mode"] in modes), default=0)
    with tempfile.TemporaryDirectory() as d:
        work = args.keep or Path(d)
        for i in range(args.runs):
            for target in args.target or list(TARGETS):
                for mode in modes:
                    hz = args.offcpu_hz if mode == "sampled" else None
                    extra = ["--offcpu-hz", str(hz)] if hz else []
                    run_dir = work / f"run{i + 1}"
                    run_dir.mkdir(parents=True, exist_ok=True)
                    r = one_run(target, mode, args.duration or DURATION[mode], run_dir, extra)
                    r["run"] = first + i + 1
                    if args.keep is None:
                        del r["profile"]
                    runs.append(r)
                    print(json.dumps(r), file=sys.stderr)
    doc = published.document(
        "lockwait-accuracy",
        "Lock waits: kvprof's LOCKS over bpftrace's exact figure",
        figures(runs),
        {
            "runs": max((r["run"] for r in runs), default=0),
            "duration_s": args.duration or DURATION,
            "modes": MODES,
            "sampled_offcpu_hz": args.offcpu_hz or OFFCPU_HZ,
            "sampled_lock_hz": OFFCPU_LOCK_HZ,
            "reference": "bpftrace bench/lockwait.bt: switch-out asleep in FUTEX_WAIT val 2 to back on a CPU",
        },
    )
    doc["runs"] = runs
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"wrote {published.write(doc, args.results)}", file=sys.stderr)
        if args.more is not None and args.more.resolve().parent == args.results.resolve():
            args.more.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
