#!/usr/bin/env python3
"""How long `kvprof record` takes to attach its collectors, and what each costs.

Starts kvcached (baseline preset, 2 workers) under kvprof's demo load, then:

1. `kvprof record -p PID -d 2`, --runs times: the seconds from starting the
   command to its "attached N collectors" line, and to its exit;
2. `kvprof record -p PID -d 0.1`, --runs times: the seconds to "attached",
   and the CPU seconds of the whole command (user + system, its children
   included): almost all of it is attaching, and machine load moves it far
   less than the wall-clock times;
3. each default collector alone (`record --collectors NAME -d 0.1`): the
   seconds to its "attached" line and the command's CPU seconds (the Python
   start-up and the kvs probe lookup are in every row);
4. `kvprof top -p PID` in a 132x40 pseudo-terminal, --runs times: the
   seconds to the first finding on screen (`topkeys`, the demo server's
   hottest lock) and to "N collectors ✓" (every collector attached).

`--no-load` leaves the server idle (no kvload): the machine runs nothing but
the command timed, the condition the 2 s attach target is stated for
(docs/record.md, "Attach time"); by default the
demo load keeps both CPUs busy, and the compile shares them with it.

`--tree DIR` runs the kvprof of another checkout (its .venv), e.g. the main
branch for the "before" row of docs/record.md. Run it under the benchmark
lock so no other measurement overlaps:

    flock /tmp/kvprof-bench.lock sudo .venv/bin/python bench/attach_time.py \
        [--runs 3] [--no-load] [--tree /work/main]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvprof.bench import published  # noqa: E402
from kvprof.collect.session import ALL_COLLECTORS  # noqa: E402
from kvprof.system import demo  # noqa: E402
from kvprof.system.servers import start_kvcached  # noqa: E402


def kvprof(tree: Path) -> list[str]:
    """The command that runs the kvprof of checkout `tree`."""
    python = tree / ".venv" / "bin" / "python"
    return [str(python if python.exists() else sys.executable), "-m", "kvprof.cli"]


def timed_record(pid: int, out: Path, extra: list[str], tree: Path) -> tuple[dict[str, float], str]:
    """Seconds from start to record's "attached" line and to its exit, and the
    command's CPU seconds ("cpu"); that line."""
    argv = [*kvprof(tree), "record", "-p", str(pid), "-o", str(out), *extra]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tree)
    assert proc.stderr is not None
    marks: dict[str, float] = {}
    lines = []
    for line in proc.stderr:
        lines.append(line.rstrip())
        now = time.monotonic() - t0
        if "attached" in line and "attached" not in marks:
            marks["attached"] = now
    _, status, usage = os.wait4(proc.pid, 0)
    marks["exit"] = time.monotonic() - t0
    marks["cpu"] = usage.ru_utime + usage.ru_stime  # with its children's (readelf), once waited for
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 or "attached" not in marks:
        print(f"attach_time: {' '.join(argv)} failed: {' | '.join(lines[-3:])}", file=sys.stderr)
        marks.setdefault("attached", float("nan"))
    return marks, next((x.strip() for x in lines if "attached" in x), "")


Rest = Callable[[dict[str, float], str], str]  # a run's marks and "attached" line -> the end of its line


def record_runs(
    runs: int, label: str, pid: int, out: Path, extra: list[str], tree: Path, rest: Rest
) -> list[dict[str, float]]:
    """`record EXTRA`, `runs` times, each printed as it ends: "LABEL, run N: attached
    after S s, " and `rest` of its marks and its "attached" line."""
    found = []
    for i in range(runs):
        m, text = timed_record(pid, out, extra, tree)
        found.append(m)
        print(f"  {label}, run {i + 1}: attached after {m['attached']:5.2f} s, {rest(m, text)}", flush=True)
    return found


def spread(runs: list[dict[str, float]], mark: str, unit: str = " s") -> str:
    """'M UNIT (min A, max B)': the median and the range of one mark over the runs."""
    values = [m[mark] for m in runs]
    return f"{statistics.median(values):.2f}{unit} (min {min(values):.2f}, max {max(values):.2f})"


def timed_top(pid: int, tree: Path) -> tuple[float, float]:
    """Seconds from starting `kvprof top -p PID` to its first finding and to all attached."""
    from top_cpu import Screen  # bench/top_cpu.py, next to this file

    t0 = time.monotonic()
    os.chdir(tree)
    screen = Screen([*kvprof(tree), "top", "-p", str(pid)])
    try:
        first = math.nan
        while time.monotonic() - t0 < 120 and not screen.seen_attached.is_set():
            if math.isnan(first) and b"topkeys" in screen.tail:
                first = time.monotonic() - t0
            time.sleep(0.05)
        attached = time.monotonic() - t0 if screen.seen_attached.is_set() else math.nan
        if math.isnan(first) and b"topkeys" in screen.tail:
            first = attached
        return first, attached
    finally:
        screen.stop()


def figure(name: str, runs: list[dict[str, float]], mark: str, unit: str = "s") -> published.Figure:
    """The median of one mark over the runs, with their min-max (a run that never reached it left out)."""
    return published.Figure.median_of(name, [m[mark] for m in runs if m[mark] == m[mark]], unit, "runs", 2)


def write_results(
    a: argparse.Namespace,
    full: list[dict[str, float]],
    short: list[dict[str, float]],
    tops: list[dict[str, float]],
    loaded: bool,
) -> None:
    """bench/results/attach-time-*.json: the medians above, with their ranges."""
    figures = [
        figure("record: attached", full, "attached"),
        figure("record -d 0.1: CPU of the command", short, "cpu", "CPU s"),
    ]
    if tops and loaded:
        figures.append(figure("top -p: first finding on screen", tops, "first"))
    if tops:
        figures.append(figure("top -p: every collector attached", tops, "attached"))
    settings = {
        "runs": a.runs,
        "load": "demo" if loaded else "none",
        "server": "kvcached --preset baseline -t 2",
    }
    doc = published.document("attach-time" + ("" if loaded else "-idle"), "Time to attach", figures, settings)
    where = published.write(doc, REPO / "bench" / "results")
    print(f"wrote {where}")


def git_head(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="full `record -d 2` runs (default 3)")
    ap.add_argument("--no-each", action="store_true", help="skip the per-collector rows")
    ap.add_argument("--no-top", action="store_true", help="skip the `kvprof top` rows")
    ap.add_argument("--no-load", action="store_true", help="no kvload: the server idles, nothing else runs")
    ap.add_argument("--tree", type=Path, default=REPO, help="the kvprof checkout to time (default: this one)")
    a = ap.parse_args()
    tree = a.tree.resolve()
    if os.geteuid() != 0:
        print("attach_time: needs root (kvprof record loads BPF programs)", file=sys.stderr)
        return 2
    server = start_kvcached(["--preset", "baseline", "-t", "2"])
    load = None if a.no_load else demo.start_load(server.address, None)
    tmp = Path(tempfile.mkdtemp(prefix="kvprof-attach-"))
    try:
        time.sleep(2.0)  # kvload populates its keys first
        how = "idle" if load is None else "under the demo load"
        print(f"kvprof of {tree} ({git_head(tree)}); kvcached PID {server.pid} (baseline, 2 workers) "
              f"{how}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        full = record_runs(a.runs, "record -d 2", server.pid, tmp / "full.json.gz", ["-d", "2"], tree,
                           lambda m, text: f"exit after {m['exit']:5.2f} s  ({text})")  # fmt: skip
        print(f"record -d 2: attached after median {spread(full, 'attached')}; "
              f"exit after median {statistics.median(m['exit'] for m in full):.2f} s")  # fmt: skip
        short = record_runs(a.runs, "record -d 0.1", server.pid, tmp / "short.json.gz", ["-d", "0.1"], tree,
                            lambda m, _: f"{m['cpu']:5.2f} CPU s")  # fmt: skip
        attached = statistics.median(m["attached"] for m in short)
        print(f"record -d 0.1: attached after median {attached:.2f} s, "
              f"median {spread(short, 'cpu', ' CPU s')}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        if not a.no_each:
            print("each collector alone (record --collectors NAME -d 0.1), seconds to 'attached', CPU s:")
            for name in ALL_COLLECTORS:
                extra = ["--collectors", name, "-d", "0.1"]
                m, _ = timed_record(server.pid, tmp / f"{name}.json.gz", extra, tree)
                print(f"  {name:<11} {m['attached']:5.2f} s  {m['cpu']:5.2f} CPU s", flush=True)
        if not a.no_top:
            tops = []
            for i in range(a.runs):
                first, attached = timed_top(server.pid, tree)
                tops.append({"first": first, "attached": attached})
                found = f"first finding (topkeys) after {first:5.2f} s"
                if load is None:
                    found = "no finding (no load)"
                print(f"  top -p, run {i + 1}: {found}, every collector attached after {attached:5.2f} s",
                      flush=True)  # fmt: skip
            first = "" if load is None else f"first finding after median {spread(tops, 'first')}; "
            print(f"top -p: {first}every collector attached after median {spread(tops, 'attached')}")
        write_results(a, full, short, tops if not a.no_top else [], load is not None)
        return 0
    finally:
        if load is not None:
            load.stop()
            load.cleanup()
        server.stop()
        server.log_path.unlink(missing_ok=True)
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()


if __name__ == "__main__":
    raise SystemExit(main())
