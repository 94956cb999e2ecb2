#!/usr/bin/env python3
"""What `kvprof record` and `kvprof top` cost the server they profile.

**The user's view (`--mode single`, the default).** One kvcached (baseline,
2 workers) under one load that runs the whole time: the demo's (`--load
demo`, `kvprof demo`'s kvload: 4 connections x 32 in flight, 5 % sets) or
the lighter one below (`--load light`). Windows of `--seconds` alternate
A B B A ... with each tool detached (A) and attached (B), and the ratio is
read from the server's own counters (`stats`: cmd_get + cmd_set), as a
user checks it. The tools: `record` and `top` with their defaults,
`record --collectors oncpu,offcpu`, and the peers BCC `profile-bpfcc -F 99`
and `perf record -F 99 --call-graph dwarf`, and `none` (nothing attached: the
method's control). A tool is attached anew for every B window (its compile
is not in the window: the window starts once it said it is attached, plus a
second), and every A window follows an attach and detach of the same tool,
so that both windows of a pair come after the same burst of compiling: on
this VM the host more often moves the vCPUs to the slower placement right
after one, which alone cost a window after an attach 10-15 % against one
without (measured with BCC's `profile`, whose own cost is 1 %). Each `record` window's profile gives
kvprof's own-cost figure (kvprof.analysis.own_cost), printed beside the loss
measured in that pair, and where the cost went: events per second and ns per
event of each collector's programs, uprobe traps counted at
kvprof.collect.UPROBE_HIT_NS (bench/probe_cost.py measures it) and samples
on the target at kvprof.collect.SAMPLE_INTERRUPT_NS (this bench measures it:
`record:oncpu@--hz@999` beside `record:oncpu`, docs/record.md).

**The tool resident, toggled (`--mode toggle`)**: the same server and load,
each tool attached once, then windows of 1 s (`--seconds`) alternating A B /
B A with its cost turned off (A) and on (B), `--settle` seconds before each
window (Toggle says how, per tool; record and top pause their programs on
SIGUSR1 and resume them on SIGUSR2, with no compile between). The windows of
a pair are seconds apart, with no compile between them, so the host's moves
of the vCPUs land on both sides alike; `--pairs 60` or more resolves a few
percent (`none` is the method's control again). After a record tool's pairs,
the same tool records for FIGURE_S seconds without a pause, and that
profile's own-cost figure is the one printed beside the loss.

**Two servers side by side (`--mode pair`)**, the first design, below: it
compares two servers that both pay what the tool costs the machine (the
TUI's CPU, the programs on `sched_switch`), so it measures what the tool
costs the profiled server beyond the machine-wide costs, not what a user
sees.

kvcached (`--preset baseline`, or `fixed`; 2 workers) under kvload (one
thread, 8 connections, batches of 8, 20 % sets, zipf keys; `--load-threads
2` fills both cores), with and without `kvprof record` attached (default
settings: every collector, 99 Hz, kvcached's default probe sampling),
measured side by side in one run.

Single runs on a VM differ by far more than record costs, for two reasons,
and the benchmark is built around both:

- **The host moves the VM's CPUs** between cores that share a cache and
  cores that do not (kvprof.bench.placement: the cache-line round trip
  between the two vCPUs flips between ~100 and ~450 ns every 10-40 s, often
  within a run), and the baseline server's shared mutex and atomics run
  about 25 % faster on the near placement. A "with" run that starts after
  `record` spent seconds compiling its BPF programs may start on another
  placement than the "without" run before the compile. So, by default, two
  identical servers run side by side: `record` attaches to the first once,
  and short kvload runs alternate between the two (A B, then B A, ...)
  with nothing between them but a 30 ms round-trip probe: the two runs of
  a pair are seconds apart, and the probes say whether they shared a
  placement (`near`: both probes of a run below the geometric middle of
  the lowest and highest round trips seen, `far`: both above, else
  `moved`). The "without" server pays what record costs everything else on
  the machine (its sched_switch program runs on every context switch, and
  the 99 Hz sampling fires on every CPU); that part is measured separately
  and printed. `--reattach` instead uses one server and attaches record
  anew for every "with" run (the first design; its pairs are a compile
  apart).
- **Throughput depends on everything else the machine does.** The BPF
  programs' own CPU time does not: BPF run-time statistics are on while
  the runs go (BPF_ENABLE_STATS: off again when the bench ends, however it
  ends), and the run time of each of record's programs is read from
  /proc/PID/fdinfo around every run, so the exact CPU the probes took is
  printed per second and per operation, for the "with" and the "without"
  runs. (USDT traps add ~0.5 µs per probe hit in the kernel, outside that
  count.)

`--watch top` attaches `kvprof top -p PID` instead (in a pseudo-terminal,
its default 1 s refresh: it reads every map each second) and prints the
TUI process's own CPU too.

    sudo .venv/bin/python bench/overhead.py [--pairs 8] [--seconds 5] [--load demo|light]
                                            [--tools record,top,...]
    sudo .venv/bin/python bench/overhead.py --mode toggle [--pairs 60] [--seconds 1] [--settle 1]
                                            [--toggle both|programs|process] [--tools ...]
                                            [--probe-rate R] [--probe-sample N]  (kvcached's)
    sudo .venv/bin/python bench/overhead.py --mode pair [--pairs 60] [--seconds 2] [--load-threads 1]
                                            [--preset baseline|fixed] [--watch top]
    sudo .venv/bin/python bench/overhead.py --mode reattach ...
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvprof.analysis.own_cost import own_cost  # noqa: E402
from kvprof.bench import published  # noqa: E402
from kvprof.bench.machine import process_cpu_s  # noqa: E402
from kvprof.bench.placement import Placement, alike  # noqa: E402
from kvprof.collect.overhead import enable_stats  # noqa: E402
from kvprof.model.profile import Profile  # noqa: E402
from kvprof.system import demo  # noqa: E402
from kvprof.system.servers import Server, kvload_binary, start_kvcached  # noqa: E402

LOAD = ["--connections=8", "--batch-size=8", "--set-pct=20", "--key-dist=zipf:0.99"]  # + --num-threads
PROG_TYPES = {
    "1": "socket",
    "2": "kprobe/uprobe",
    "5": "tracepoint",
    "7": "perf_event",
    "17": "raw_tracepoint",
}
Programs = dict[str, tuple[str, int, int]]  # fd -> (program type, run_time_ns, run_cnt)


@dataclass
class Run:
    ops_per_sec: float
    cpu_us_per_op: float  # the server's CPU time per operation
    ops: int
    seconds: float
    rt_before: float  # cache-line round trip before and after the run (placement)
    rt_after: float
    bpf: dict[str, tuple[int, int]]  # record's BPF programs during the run: type -> (ns, runs)
    watcher_cpu_s: float  # CPU seconds the attached kvprof process (record or top) used during the run


def bpf_programs(pid: int | None) -> Programs:
    """Every BPF program `pid` holds, with the kernel's run-time statistics."""
    out: Programs = {}
    if pid is None:
        return out
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            text = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        kind = re.search(r"prog_type:\s*(\d+)", text)
        run_time = re.search(r"run_time_ns:\s*(\d+)", text)
        run_cnt = re.search(r"run_cnt:\s*(\d+)", text)
        if kind and run_time and run_cnt:
            out[fd] = (kind.group(1), int(run_time.group(1)), int(run_cnt.group(1)))
    return out


def bpf_delta(a: Programs, b: Programs) -> dict[str, tuple[int, int]]:
    """program type -> (ns, runs) between two readings."""
    out: dict[str, tuple[int, int]] = {}
    for fd, (kind, ns, cnt) in b.items():
        if fd in a:
            name = PROG_TYPES.get(kind, f"type {kind}")
            prev = out.get(name, (0, 0))
            out[name] = (prev[0] + ns - a[fd][1], prev[1] + cnt - a[fd][2])
    return out


def kvload(server: Server, seconds: float, placement: Placement, record_pid: int | None) -> Run:
    rt0 = placement.probe()
    progs = bpf_programs(record_pid)
    cpu = process_cpu_s(server.pid)
    watcher = process_cpu_s(record_pid) if record_pid else 0.0
    out = subprocess.run(
        [str(kvload_binary()), f"--server={server.address}", f"--duration={seconds}", "--no-population",
         "--json", "--quiet", *LOAD],
        capture_output=True, text=True, timeout=seconds + 60,
    )  # fmt: skip
    used = process_cpu_s(server.pid) - cpu
    watcher = process_cpu_s(record_pid) - watcher if record_pid else 0.0
    bpf = bpf_delta(progs, bpf_programs(record_pid))
    rt1 = placement.probe()
    if out.returncode != 0:
        raise SystemExit(f"overhead: kvload failed (exit {out.returncode}): {out.stderr.strip()[-500:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    ops = int(result["ops"])
    return Run(
        result["ops_per_sec"], used * 1e6 / max(1, ops), ops, result["duration_s"], rt0, rt1, bpf, watcher
    )


@contextmanager
def recording(pid: int, tmp: str, collectors: str) -> Iterator[int]:
    """`kvprof record -p PID` attached (it has said "collecting") until the block ends; its PID."""
    rec = subprocess.Popen(
        [sys.executable, "-m", "kvprof.cli", "record", "-p", str(pid), "-d", "100000", "-o",
         str(Path(tmp) / "overhead.json.gz"), *(["--collectors", collectors] if collectors else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        # before "collecting" it is compiling BPF programs, which would load the machine
        _ready_line(rec, "collecting", 180, "kvprof record", stderr=True)
        time.sleep(0.5)
        yield rec.pid
    finally:
        rec.send_signal(signal.SIGINT)
        rec.communicate(timeout=60)


@contextmanager
def watching(pid: int, tmp: str, collectors: str) -> Iterator[int]:
    """`kvprof top -p PID` (default 1 s refresh) in a 132x40 pseudo-terminal, as a user
    runs it, once every collector is attached (its status line says so); its PID."""
    from top_cpu import Screen  # bench/top_cpu.py, next to this file

    argv = [sys.executable, "-m", "kvprof.cli", "top", "-p", str(pid)]
    if collectors:
        argv += ["--collectors", collectors]
    screen = Screen(argv)
    try:
        if not screen.seen_attached.wait(180):
            raise SystemExit("overhead: kvprof top did not attach every collector within 180 s")
        time.sleep(2.0)  # its first full refreshes after the last attach
        yield screen.proc.pid
    finally:
        screen.stop()


def placement_class(run: Run, threshold: float) -> str:
    """near / far / moved: both probes of the run below the threshold, both above, or not."""
    if math.isnan(run.rt_before) or math.isnan(run.rt_after):
        return "?"
    near = [x < threshold for x in (run.rt_before, run.rt_after)]
    return "near" if all(near) else "far" if not any(near) else "moved"


def print_pair(i: int, a: Run, b: Run) -> None:
    rts = f"{a.rt_before:.0f}/{a.rt_after:.0f} {b.rt_before:.0f}/{b.rt_after:.0f}"
    cpu = f"{a.cpu_us_per_op:.2f} -> {b.cpu_us_per_op:.2f}"
    ratio = b.ops_per_sec / a.ops_per_sec
    print(
        f"{i:>4} {a.ops_per_sec:>14,.0f} {b.ops_per_sec:>14,.0f} {ratio:>7.3f} {cpu:>18} {rts:>22}",
        flush=True,
    )


def summary(label: str, pairs: list[tuple[Run, Run]]) -> None:
    """Median throughput ratio with/without and server CPU per op with/without, over `pairs`."""
    if not pairs:
        print(f"{label}: none")
        return
    ratios = [b.ops_per_sec / a.ops_per_sec for a, b in pairs]
    cpu = [b.cpu_us_per_op / a.cpu_us_per_op for a, b in pairs]
    print(
        f"{label} ({len(pairs)}): median ratio {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max "
        f"{max(ratios):.3f}); server CPU per op with/without {statistics.median(cpu):.3f}"
    )


def bpf_line(label: str, runs: list[Run]) -> str:
    """The BPF programs' CPU over `runs`: share of one core, ns per operation, by program type."""
    ns: dict[str, int] = {}
    count: dict[str, int] = {}
    for r in runs:
        for name, (n, c) in r.bpf.items():
            ns[name] = ns.get(name, 0) + n
            count[name] = count.get(name, 0) + c
    seconds = sum(r.seconds for r in runs)
    ops = sum(r.ops for r in runs)
    if not ns or seconds <= 0:
        return f"{label}: no BPF statistics"
    total = sum(ns.values())
    parts = ", ".join(
        f"{name} {count[name] / seconds:,.0f}/s x {ns[name] / max(1, count[name]) / 1e3:.2f} µs"
        for name in sorted(ns, key=lambda n: -ns[n])
    )
    return (
        f"{label}: {total / seconds / 1e7:.2f} % of one core, {total / max(1, ops):,.0f} ns per op ({parts})"
    )


def report(pairs: list[tuple[Run, Run]], watch: str = "record") -> None:
    readings = [x for a, b in pairs for r in (a, b) for x in (r.rt_before, r.rt_after) if x == x]
    low, high = min(readings, default=1.0), max(readings, default=1.0)
    # one placement when every reading is alike; else near/far split at the geometric middle
    threshold = math.inf if alike(low, high) else math.sqrt(low * high)
    classes = [(placement_class(a, threshold), placement_class(b, threshold)) for a, b in pairs]
    print(
        f"placement (round trips {low:.0f}-{high:.0f} ns; near: both probes of a run below "
        f"{threshold:.0f} ns, far: both above, else moved):"
    )
    counts: dict[str, int] = {}
    for ca, cb in classes:
        key = f"{ca}/{cb}"
        counts[key] = counts.get(key, 0) + 1
    print("  " + ", ".join(f"{n} {key}" for key, n in sorted(counts.items(), key=lambda kv: -kv[1])))
    summary("all pairs", pairs)
    same = [p for p, (ca, cb) in zip(pairs, classes, strict=True) if ca == cb and ca in ("near", "far")]
    summary("same-placement pairs", same)
    for where in ("near", "far"):
        both = [p for p, c in zip(pairs, classes, strict=True) if c == (where, where)]
        summary(f"  of which {where}", both)
    print(bpf_line(f"{watch}'s BPF programs during the 'with' runs", [b for _, b in pairs]))
    print(
        bpf_line("and during the 'without' runs (its cost to the rest of the machine)", [a for a, _ in pairs])
    )
    runs = [r for p in pairs for r in p]
    seconds = sum(r.seconds for r in runs)
    if seconds > 0:
        share = sum(r.watcher_cpu_s for r in runs) / seconds
        print(f"kvprof {watch} process itself (utime+stime, BPF map reads included): {share:.1%} of one core")


def side_by_side(args: argparse.Namespace, placement: Placement, tmp: str, sample: list[str]) -> None:
    """Two identical servers; record attached to the first once; runs alternate A B, B A, ..."""
    profiled = start_kvcached(["-t", "2", "--preset", args.preset, *sample])
    control = start_kvcached(["-t", "2", "--preset", args.preset, *sample])
    try:
        for server in (profiled, control):
            populate = [
                str(kvload_binary()),
                f"--server={server.address}",
                "--populate-only",
                "--quiet",
                *LOAD,
            ]
            subprocess.run(populate, check=True, stdout=subprocess.DEVNULL)
        print(
            f"kvcached PID {profiled.pid} with {args.watch} attached, PID {control.pid} without "
            f"({args.preset}, "
            f"2 workers each); kvload {' '.join(LOAD)}"
        )
        print(
            f"{args.pairs} pairs of {args.seconds:g} s runs alternating A B, B A, ...; collectors: "
            f"{args.collectors or 'all'}; probe: cache-line round trip between {placement.where}"
        )
        header(args.watch)
        pairs = []
        attached = watching if args.watch == "top" else recording
        with attached(profiled.pid, tmp, args.collectors) as rec:
            for i in range(args.pairs):
                if i % 2 == 0:
                    a = kvload(control, args.seconds, placement, rec)
                    b = kvload(profiled, args.seconds, placement, rec)
                else:
                    b = kvload(profiled, args.seconds, placement, rec)
                    a = kvload(control, args.seconds, placement, rec)
                pairs.append((a, b))
                print_pair(i + 1, a, b)
        report(pairs, args.watch)
    finally:
        for server in (profiled, control):
            server.stop()
            server.log_path.unlink(missing_ok=True)


def reattach(args: argparse.Namespace, placement: Placement, tmp: str, sample: list[str]) -> None:
    """One server; each pair: A, then record attached, B, record detached."""
    server = start_kvcached(["-t", "2", "--preset", args.preset, *sample])
    try:
        populate = [str(kvload_binary()), f"--server={server.address}", "--populate-only", "--quiet", *LOAD]
        subprocess.run(populate, check=True, stdout=subprocess.DEVNULL)
        print(f"kvcached PID {server.pid} ({args.preset}, 2 workers); kvload {' '.join(LOAD)}")
        print(
            f"{args.pairs} pairs of {args.seconds:g} s runs, record attached anew for each 'with' run; "
            f"collectors: {args.collectors or 'all'}; probe: cache-line round trip between {placement.where}"
        )
        header()
        pairs = []
        for i in range(args.pairs):
            a = kvload(server, args.seconds, placement, None)
            with recording(server.pid, tmp, args.collectors) as rec:
                b = kvload(server, args.seconds, placement, rec)
            pairs.append((a, b))
            print_pair(i + 1, a, b)
        report(pairs)
    finally:
        server.stop()
        server.log_path.unlink(missing_ok=True)


# ---- the user's view: one server, tools attached and detached ----------------

TOOLS = ("record", "top", "record-oncpu-offcpu", "bcc-profile", "perf-dwarf", "none")


@dataclass
class Window:
    ops_per_sec: float
    server_cpu: float  # the server's CPU time per second
    rt: tuple[float, float] = (math.nan, math.nan)  # cache-line round trips before and after (placement)
    own_cost: float | None = None  # the record profile's own-cost figure (kvprof.analysis.own_cost)
    profile: Profile | None = None


def server_ops(server: Server) -> int:
    stats = server.stats()
    return int(stats["cmd_get"]) + int(stats["cmd_set"])


PLACEMENT = Placement()


def measure_window(server: Server, seconds: float) -> Window:
    rt0 = PLACEMENT.probe()
    ops0, cpu0, t0 = server_ops(server), process_cpu_s(server.pid), time.monotonic()
    time.sleep(seconds)
    ops1, cpu1, t1 = server_ops(server), process_cpu_s(server.pid), time.monotonic()
    return Window((ops1 - ops0) / (t1 - t0), (cpu1 - cpu0) / (t1 - t0), (rt0, PLACEMENT.probe()))


def window_class(w: Window, threshold: float) -> str:
    """near / far / moved, as placement_class for a Run."""
    if any(math.isnan(x) for x in w.rt):
        return "?"
    near = [x < threshold for x in w.rt]
    return "near" if all(near) else "far" if not any(near) else "moved"


def _ready_line(
    proc: subprocess.Popen[str], word: str, timeout: float, what: str, stderr: bool = False
) -> None:
    """Read what `proc` says (stdout, or stderr) until a line holds `word`."""
    stream = proc.stderr if stderr else proc.stdout
    assert stream is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if word in line:
            return
        if not line:
            raise SystemExit(f"overhead: {what} exited before it was ready (exit {proc.wait()})")
    raise SystemExit(f"overhead: {what} was not ready within {timeout:g} s")


def _wait_bpf_loaded(proc: subprocess.Popen[str], timeout: float, what: str) -> None:
    """Until `proc` holds a loaded BPF program of the perf-event type (its sampler)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(kind == "7" for kind, _, _ in bpf_programs(proc.pid).values()):
            return
        if proc.poll() is not None:
            raise SystemExit(f"overhead: {what} exited before it was ready (exit {proc.returncode})")
        time.sleep(0.05)
    raise SystemExit(f"overhead: {what} loaded no program within {timeout:g} s")


def _sigint_default() -> None:
    """In the tool's process: SIGINT stops it, also when this benchmark was started in the
    background (a shell starts background jobs with SIGINT ignored, and children inherit it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Attached:
    """A tool attached by tool_attached(): its process (None for `none`), and for record
    the path of the profile it writes when it is stopped (read it after the block)."""

    tool: str
    proc: subprocess.Popen[str] | subprocess.Popen[bytes] | None
    profile: Path | None
    control: Path | None = None  # perf record's --control FIFOs: commands, then acks


@contextmanager
def tool_attached(tool: str, pid: int, tmp: str) -> Iterator[Attached]:
    """`tool` attached to `pid` until the block ends."""
    out = Path(tmp) / "window.json.gz"
    if tool == "none":  # the method's control: the same windows with nothing attached
        time.sleep(1.0)
        yield Attached(tool, None, None)
        time.sleep(1.0)
        return
    if tool == "top":
        from top_cpu import Screen  # bench/top_cpu.py, next to this file

        screen = Screen([sys.executable, "-m", "kvprof.cli", "top", "-p", str(pid)])
        try:
            if not screen.seen_attached.wait(180):
                raise SystemExit("overhead: kvprof top did not attach every collector within 180 s")
            time.sleep(1.0)
            yield Attached(tool, screen.proc, None)
        finally:
            try:
                screen.stop(30)
            except subprocess.TimeoutExpired:  # seen once after 60 toggles; the kernel detaches on kill
                print("overhead: kvprof top did not quit within 60 s of q and SIGTERM: killed", flush=True)
                screen.proc.kill()
                screen.proc.wait()
        return
    if tool.startswith("record"):
        argv = [sys.executable, "-m", "kvprof.cli", "record", "-p", str(pid), "-d", "100000", "-o", str(out)]
        if tool == "record-oncpu-offcpu":
            argv += ["--collectors", "oncpu,offcpu"]
        elif ":" in tool:  # record:locks+cachelines: those collectors only
            argv += ["--collectors", tool.split(":", 1)[1].split("@")[0].replace("+", ",")]
        argv += tool.split("@")[1:]  # record:offcpu@--offcpu-sample@64: more of record's options
        word, what = "collecting", "kvprof record"
    elif tool.startswith("bcc-profile"):  # bcc-profile@-p@1: a later option overrides an earlier
        argv = [shutil.which("profile-bpfcc") or "/usr/sbin/profile-bpfcc", "-F", "99", "-p", str(pid),
                *tool.split("@")[1:], "100000"]  # fmt: skip
        word, what = "Sampling", "profile-bpfcc"
    else:  # --control: toggle_windows() disables and enables its events
        control = Path(tmp) / "perf-control"
        for fifo in (control, control.with_suffix(".ack")):
            fifo.unlink(missing_ok=True)
            os.mkfifo(fifo)
        argv = ["perf", "record", "-F", "99", "--call-graph", "dwarf", "-p", str(pid), "-o",
                str(Path(tmp) / "perf.data"), "-q",
                f"--control=fifo:{control},{control.with_suffix('.ack')}"]  # fmt: skip
        word, what = "", "perf record"
    # what it says goes to one pipe (BCC's tools say "Sampling" on stdout, record "collecting"
    # on stderr), read until it is ready, then drained so that it never blocks on a full pipe
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            preexec_fn=_sigint_default)  # fmt: skip
    try:
        if word:
            _ready_line(proc, word, 180, what)
        if tool.startswith("bcc-profile"):  # it says "Sampling" before it compiles: wait for its program
            _wait_bpf_loaded(proc, 180, what)
        assert proc.stdout is not None
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        time.sleep(1.0 if word else 2.0)
        perf = Path(tmp) / "perf-control" if tool == "perf-dwarf" else None
        yield Attached(tool, proc, out if tool.startswith("record") else None, perf)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    time.sleep(1.0)  # the detach's own work (map reads, writing the profile) settles


def detached_window(tool: str, server: Server, seconds: float, tmp: str) -> Window:
    """A window without the tool, measured right after it was attached and detached again:
    both windows of a pair then follow the same compile. (This VM's host moves its vCPUs to
    the slower placement more often right after a burst of CPU, such as a compile: a window
    measured after an attach and one that is not differ by up to 15 % with nothing attached.)"""
    with tool_attached(tool, server.pid, tmp):
        pass
    (Path(tmp) / "window.json.gz").unlink(missing_ok=True)
    return measure_window(server, seconds)


def attached_window(tool: str, server: Server, seconds: float, tmp: str) -> Window:
    with tool_attached(tool, server.pid, tmp) as attached:
        w = measure_window(server, seconds)
    out = attached.profile
    if out is not None and out.exists():
        w.profile = Profile.load(out)
        cost = own_cost(w.profile)
        w.own_cost = cost.share if cost is not None else None
        out.unlink()
    return w


def start_single_load(server: Server, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    if args.load == "demo":
        return demo.start_load(server.address, None).proc
    subprocess.run([str(kvload_binary()), f"--server={server.address}", "--populate-only", "--quiet", *LOAD],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    argv = [str(kvload_binary()), f"--server={server.address}", "--duration=86400", "--no-population",
            "--quiet", *LOAD]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def tools_of(args: argparse.Namespace) -> list[str]:
    """--tools, checked: the TOOLS, or record:<collector>+<collector>..., each record
    or bcc-profile optionally followed by @<option>@<value>... (more of its command line)"""
    tools = [t for t in args.tools.split(",") if t]
    unknown = [t for t in tools if t.split("@")[0] not in TOOLS and not t.startswith("record:")]
    if unknown:
        raise SystemExit(f"overhead: unknown tool {unknown[0]!r}: choose from {', '.join(TOOLS)}")
    return tools


def single(args: argparse.Namespace, tmp: str, sample: list[str]) -> None:
    """One server under one continuous load; per tool, windows A B, B A, ... (A: detached)."""
    tools = tools_of(args)
    server = start_kvcached(["-t", "2", "--preset", args.preset, *sample])
    load = start_single_load(server, args)
    try:
        time.sleep(3.0)  # the demo load populates first
        load_desc = (
            "kvprof demo's (4 connections x 32 in flight, 5 % sets)"
            if args.load == "demo"
            else " ".join(LOAD)
        )
        print(f"kvcached PID {server.pid} ({args.preset}, 2 workers), one server; load: {load_desc}")
        print(f"{args.pairs} pairs of {args.seconds:g} s windows per tool, A B / B A alternating, "
              "tools in turn; ratio = with / without, from the server's `stats`")  # fmt: skip
        print(f"{'pair':>4} {'tool':<20} {'without ops/s':>14} {'with':>12} {'ratio':>7} {'CPU/op':>7} "
              f"{'own-cost':>9}")  # fmt: skip
        pairs: dict[str, list[tuple[Window, Window]]] = {t: [] for t in tools}
        ratios: dict[str, list[float]] = {t: [] for t in tools}
        cpu: dict[str, list[float]] = {t: [] for t in tools}
        costs: dict[str, list[float]] = {t: [] for t in tools}
        profiles: list[Profile] = []
        for i in range(args.pairs):
            for tool in tools[i % len(tools) :] + tools[: i % len(tools)]:
                if i % 2 == 0:
                    a = detached_window(tool, server, args.seconds, tmp)
                    b = attached_window(tool, server, args.seconds, tmp)
                else:
                    b = attached_window(tool, server, args.seconds, tmp)
                    a = detached_window(tool, server, args.seconds, tmp)
                pairs[tool].append((a, b))
                r = b.ops_per_sec / a.ops_per_sec
                c = (b.server_cpu / b.ops_per_sec) / (a.server_cpu / a.ops_per_sec)
                ratios[tool].append(r)
                cpu[tool].append(c)
                if b.own_cost is not None:
                    costs[tool].append(b.own_cost)
                if b.profile is not None and tool == "record":
                    profiles.append(b.profile)
                own = f"{b.own_cost:.1%}" if b.own_cost is not None else "-"
                print(f"{i + 1:>4} {tool:<20} {a.ops_per_sec:>14,.0f} {b.ops_per_sec:>12,.0f} {r:>7.3f} "
                      f"{c:>7.3f} {own:>9}", flush=True)  # fmt: skip
        readings = [x for ps in pairs.values() for w in ps for x in (*w[0].rt, *w[1].rt) if x == x]
        low, high = min(readings, default=1.0), max(readings, default=1.0)
        threshold = math.inf if alike(low, high) else math.sqrt(low * high)
        print(f"\nplacement: round trips {low:.0f}-{high:.0f} ns; a pair is same-placement when both its "
              f"windows' probes are below {threshold:.0f} ns (near) or above (far)")  # fmt: skip
        print(f"{'tool':<20} {'ratio median':>12} {'IQR':>13} {'min-max':>13} {'loss':>6} {'own-cost':>9}"
              f"  {'same-placement median (n)':>26}")  # fmt: skip
        for tool in tools:
            rs = sorted(ratios[tool])
            q = statistics.quantiles(rs, n=4) if len(rs) >= 2 else [rs[0]] * 3
            med = statistics.median(rs)
            own = f"{statistics.median(costs[tool]):.1%}" if costs[tool] else "-"
            same = [b.ops_per_sec / a.ops_per_sec for a, b in pairs[tool]
                    if window_class(a, threshold) == window_class(b, threshold) in ("near", "far")
                    ]  # fmt: skip
            sm = f"{statistics.median(same):.3f} ({len(same)})" if same else "- (0)"
            print(f"{tool:<20} {med:>12.3f} {q[0]:>6.3f}-{q[2]:<6.3f} {rs[0]:>6.3f}-{rs[-1]:<6.3f} "
                  f"{1 - med:>6.1%} {own:>9}  {sm:>26}")  # fmt: skip
        if profiles:
            where_it_goes(profiles)
        write_results(
            args, {t: (ratios[t], statistics.median(costs[t]) if costs[t] else None) for t in tools}
        )
    finally:
        load.send_signal(signal.SIGTERM)
        load.wait(timeout=10)
        server.stop()
        server.log_path.unlink(missing_ok=True)


def where_it_goes(profiles: list[Profile]) -> None:
    """Per collector over the record windows: events/s, BPF ns per event, BPF and kernel
    (uprobe traps, sampling interrupts) ms/s, share."""
    rows: dict[str, list[tuple[float, float, float, float, float]]] = {}
    for p in profiles:
        cost = own_cost(p)
        if cost is None:
            continue
        s = max(p.overhead.window_s, 1e-9)
        for r in cost.rows:
            rows.setdefault(r.collector, []).append(
                (r.events_per_s, r.ns_per_event, r.bpf_ns / s / 1e6, (r.trap_ns + r.interrupt_ns) / s / 1e6,
                 r.share)
            )  # fmt: skip
    if not rows:  # offcpu's looks alone: no program of the target's, only the process (its own-cost column)
        return
    o = profiles[0].overhead
    print(f"\nwhere record's cost goes (medians over its windows; uprobe traps at {o.uprobe_hit_ns:.0f} ns "
          f"per hit, samples on the target at {o.sample_interrupt_ns:,.0f} ns):")  # fmt: skip
    print(f"{'collector':<12} {'events/s':>10} {'BPF ns/event':>12} {'BPF ms/s':>9} {'kernel ms/s':>11} "
          f"{'share':>7}")  # fmt: skip
    for name, vals in sorted(rows.items(), key=lambda kv: -statistics.median(v[4] for v in kv[1])):
        m = [statistics.median(v[k] for v in vals) for k in range(5)]
        print(f"{name:<12} {m[0]:>10,.0f} {m[1]:>12,.0f} {m[2]:>9.2f} {m[3]:>11.2f} {m[4]:>7.2%}")
    parts = [c for c in (own_cost(p) for p in profiles) if c is not None]
    med = {k: statistics.median(getattr(c, k) for c in parts)
           for k in ("bpf_share", "trap_share", "interrupt_share", "process_share", "share")}  # fmt: skip
    print(f"the figure {med['share']:.2%}: BPF run time {med['bpf_share']:.2%}, uprobe traps "
          f"{med['trap_share']:.2%}, samples' interrupts {med['interrupt_share']:.2%}, kvprof's process "
          f"{med['process_share']:.2%} (its CPU over all {o.cpus} CPUs)")  # fmt: skip


# ---- the tool resident, toggled: windows a second apart ---------------------------

PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_DISABLE = 0x2400, 0x2401
SYS_PIDFD_GETFD = 438  # the same number on x86_64 and on the generic table (arm64)
PAUSE_STABLE_S = 1.0  # a first pause is whole once its attachment count held this long
ATTACHMENTS = ("anon_inode:[perf_event]", "anon_inode:bpf_link", "anon_inode:bpf-raw-tracepoint")
FIGURE_S = 5.0  # after a record tool's pairs, a recording this long without a pause gives its own-cost figure
SETTLE_S = 1.0  # default --settle: after a toggle, before the window (the tool's catch-up, the last hits)


def perf_event_fds(pid: int) -> list[int]:
    """`pid`'s perf event fds, duplicated into this process (pidfd_getfd: root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    fds = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:[perf_event]":
                    continue
            except OSError:
                continue
            got = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(fd), 0)
            if got >= 0:
                fds.append(got)
    finally:
        os.close(pidfd)
    return fds


class Toggle:
    """An attached tool's cost turned off and on again, with nothing compiled in between:

    - record: SIGUSR1 detaches its programs from their events (kvprof's
      pause_on_signals), then SIGSTOP stops the process; on: SIGCONT, SIGUSR2;
    - top: SIGUSR1 detaches its programs and freezes its screen (no map reads, no
      drawing; its timer keeps the refresh pace), SIGUSR2 resumes both. It is not
      stopped: a TUI stopped and continued refreshes at once on every SIGCONT, 2-2.5
      times its CPU per second running at 0.5 s windows (docs/top.md, "Overhead");
    - BCC's profile: its cpu-clock events disabled (PERF_EVENT_IOC_DISABLE on its
      fds, taken with pidfd_getfd), and the process stopped;
    - perf record: `disable` and `enable` on its --control FIFO;
    - none: nothing (the method's control)."""

    def __init__(self, attached: Attached, what: str = "both") -> None:
        """`what` (record and top): both, or only their `programs` or their `process`."""
        self.attached = attached
        self.what = what
        self.tool = attached.tool
        self.pid = attached.proc.pid if attached.proc is not None else None
        self.fds = perf_event_fds(self.pid) if self.tool.startswith("bcc-profile") and self.pid else []
        self.attached_count = self._attachments() if self.pid else 0
        self.paused_count: int | None = None  # what a whole pause leaves: learnt at the first
        self.on = True

    def set(self, on: bool) -> None:
        if on != self.on:
            self._switch(on)
            self.on = on

    def _switch(self, on: bool) -> None:
        """Off: the programs first, then the process; on: the other way round."""
        if self.pid is None:
            return
        if self.tool == "perf-dwarf":
            self._perf_control("enable" if on else "disable")
            return
        steps = [self._programs_switch, self._process_switch]
        for step in steps[::-1] if on else steps:
            step(on)

    def _programs_switch(self, on: bool) -> None:
        assert self.pid is not None
        if self.tool.startswith("bcc-profile"):
            for fd in self.fds:
                fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE if on else PERF_EVENT_IOC_DISABLE, 0)
        elif self.what != "process":
            os.kill(self.pid, signal.SIGUSR2 if on else signal.SIGUSR1)
            self._wait_programs(running=on)

    def _process_switch(self, on: bool) -> None:
        assert self.pid is not None
        if self.what == "programs" or (self.tool == "top" and self.what == "both"):
            return  # top: SIGUSR1 froze its screen with its programs
        os.kill(self.pid, signal.SIGCONT if on else signal.SIGSTOP)

    def _attachments(self) -> int:
        """How many attachments the tool holds: perf events (uprobes, cpu-clock, tracepoints)
        and BPF links (raw tracepoints); fewer once paused, as many again once resumed."""
        n = 0
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            try:
                n += os.readlink(f"/proc/{self.pid}/fd/{fd}") in ATTACHMENTS
            except OSError:  # closed meanwhile
                pass
        return n

    def _wait_programs(self, running: bool, timeout: float = 10.0) -> None:
        """Until the tool holds all its attachments again, or, paused, as few as a whole
        pause leaves: a count, not the programs' runs, which a quiet target may not fire
        for a while. The first pause learns that count (the count stops falling). A
        pause detaches one collector after another, each uprobe waiting for an RCU grace
        period: a window begun after the first one went would still have the rest
        attached, and the tool stopped then would keep them (until run 15 it did)."""
        deadline = time.monotonic() + timeout
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            n = self._attachments()
            if running and n == self.attached_count:
                return
            if not running and self.paused_count is not None and n == self.paused_count:
                return
            if not running and self.paused_count is None:
                if n != last:
                    last, since = n, time.monotonic()
                elif n < self.attached_count and time.monotonic() - since >= PAUSE_STABLE_S:
                    self.paused_count = n
                    return
            time.sleep(0.02)
        verb = "resume" if running else "pause"
        raise SystemExit(f"overhead: {self.tool} did not {verb} within {timeout:g} s")

    def _perf_control(self, command: str) -> None:
        control = self.attached.control
        assert control is not None
        with open(control, "w") as f:
            f.write(command + "\n")
        with open(control.with_suffix(".ack")) as f:
            f.readline()

    def close(self) -> None:
        self.set(True)  # record writes a whole profile; every tool exits as it would
        for fd in self.fds:
            os.close(fd)


def toggle_windows(args: argparse.Namespace, tmp: str, sample: list[str]) -> None:
    """One server under one continuous load; each tool attached once, then windows of
    `--seconds` alternating A B, B A, ... with its cost toggled off (A) and on (B)."""
    tools = tools_of(args)
    server = start_kvcached(["-t", "2", "--preset", args.preset, *sample])
    load = start_single_load(server, args)
    results: dict[str, tuple[list[float], float | None]] = {}
    try:
        time.sleep(3.0)  # the demo load populates first
        print(f"kvcached PID {server.pid} ({args.preset}, 2 workers), one server; load: {args.load}")
        print(f"each tool attached once; {args.pairs} pairs of {args.seconds:g} s windows, A B / B A, with "
              f"its cost toggled off (A) and on (B) {args.settle:g} s before each; ratio = B / A from the "
              "server's `stats`", flush=True)  # fmt: skip
        for tool in tools:
            ratios: list[float] = []
            with tool_attached(tool, server.pid, tmp) as attached:
                toggle = Toggle(attached, args.toggle)
                try:
                    for i in range(args.pairs):
                        got = {}
                        for on in (False, True) if i % 2 == 0 else (True, False):
                            toggle.set(on)
                            time.sleep(args.settle)
                            got[on] = measure_ops(server, args.seconds)
                        ratios.append(got[True] / got[False])
                        if (i + 1) % 10 == 0 or i + 1 == args.pairs:
                            print(f"  {tool}: {i + 1} pairs, median so far {statistics.median(ratios):.3f}",
                                  flush=True)  # fmt: skip
                finally:
                    toggle.close()
            if attached.profile is not None:
                attached.profile.unlink(missing_ok=True)  # toggled: its figure is not the user's
            share = None
            if tool.startswith("record"):
                profile = continuous_profile(tool, server.pid, tmp)
                cost = own_cost(profile) if profile is not None else None
                share = cost.share if cost is not None else None
                if profile is not None:
                    where_it_goes([profile])
            results[tool] = (ratios, share)
        print(f"\n{'tool':<20} {'ratio median':>12} {'IQR':>13} {'min-max':>13} {'loss':>6} {'own-cost':>9}")
        for tool, (rs, share) in results.items():
            rs = sorted(rs)
            q = statistics.quantiles(rs, n=4) if len(rs) >= 2 else [rs[0]] * 3
            med = statistics.median(rs)
            own = f"{share:.1%}" if share is not None else "-"
            print(f"{tool:<20} {med:>12.3f} {q[0]:>6.3f}-{q[2]:<6.3f} {rs[0]:>6.3f}-{rs[-1]:<6.3f} "
                  f"{1 - med:>6.1%} {own:>9}")  # fmt: skip
        write_results(args, results)
    finally:
        load.send_signal(signal.SIGTERM)
        load.wait(timeout=10)
        server.stop()
        server.log_path.unlink(missing_ok=True)


def write_results(args: argparse.Namespace, results: dict[str, tuple[list[float], float | None]]) -> None:
    """bench/results/overhead-*.json: each tool's median ratio (with / without) and its IQR,
    and the own-cost figure of its profile where it has one."""
    figures = []
    for tool, (ratios, share) in results.items():
        rs = sorted(ratios)
        if not rs:
            continue
        q = statistics.quantiles(rs, n=4) if len(rs) >= 2 else [rs[0]] * 3
        figures.append(
            published.Figure(
                f"{tool}: throughput with / without",
                round(statistics.median(rs), 4),
                "x",
                round(q[0], 4),
                round(q[2], 4),
                f"IQR of {len(rs)} pairs",
                len(rs),
            )
        )
        if share is not None:
            figures.append(published.Figure(f"{tool}: own-cost figure", round(100 * share, 2), "%"))
    settings = {
        "mode": args.mode,
        "load": args.load,
        "preset": args.preset,
        "pairs": args.pairs,
        "seconds": args.seconds,
        "tools": args.tools,
    }
    if args.mode == "toggle":
        settings |= {"settle": args.settle, "toggle": args.toggle}
    title = "What kvprof costs the server it watches" + (" (toggled)" if args.mode == "toggle" else "")
    path = published.write(
        published.document(f"overhead-{args.mode}-{args.load}", title, figures, settings),
        REPO / "bench" / "results",
    )
    print(f"wrote {path}", flush=True)


def continuous_profile(tool: str, pid: int, tmp: str, seconds: float = FIGURE_S) -> Profile | None:
    """A record tool attached for `seconds` without a pause: the profile whose own-cost figure
    a user reads. A toggled recording's is not it: its programs attach one by one at every
    resume and detach one by one at every pause, so no one span says how long each ran."""
    with tool_attached(tool, pid, tmp) as attached:
        time.sleep(seconds)
    if attached.profile is None or not attached.profile.exists():
        return None
    try:
        return Profile.load(attached.profile)
    finally:
        attached.profile.unlink()


def measure_ops(server: Server, seconds: float) -> float:
    """The server's operations per second over the next `seconds`, from its `stats`."""
    ops0, t0 = server_ops(server), time.monotonic()
    time.sleep(seconds)
    return (server_ops(server) - ops0) / (time.monotonic() - t0)


def header(watch: str = "record") -> None:
    print(f"{'pair':>4} {'without ops/s':>14} {'with ' + watch:>14} {'ratio':>7} {'server CPU µs/op':>18}"
          f" {'round trips ns':>22}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--mode",
        default="single",
        choices=("single", "toggle", "pair", "reattach"),
        help="single: one server, tools attached and detached (default); toggle: attached once, "
        "their cost toggled off and on; pair: two servers",
    )
    ap.add_argument("--pairs", type=int, default=0, help="pairs per tool (default 8; 60 with --mode pair)")
    ap.add_argument("--seconds", type=float, default=0.0, help="seconds per window (default 5; 2 for pair)")
    ap.add_argument(
        "--load", default="demo", choices=("demo", "light"), help="single: the load (default demo)"
    )
    ap.add_argument(
        "--tools",
        default=",".join(TOOLS),
        help=f"what to attach (default {','.join(TOOLS)}); also record:<collector>+<collector>, and "
        "any record or bcc-profile followed by @<option>@<value>... (record:offcpu@--offcpu-sample@64; "
        "bcc-profile@-p@1 samples at 99 Hz for a process that never runs: the sampling interrupts alone)",
    )
    ap.add_argument(
        "--toggle",
        default="both",
        choices=("both", "programs", "process"),
        help="toggle: what of record and top is turned off: both (default; top's process is not stopped, "
        "its screen freezes with its programs), their BPF programs only, or their process only (SIGSTOP)",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=SETTLE_S,
        help=f"toggle: seconds between a toggle and its window (default {SETTLE_S:g})",
    )
    ap.add_argument("--collectors", default="", help="record's --collectors (default: all)")
    ap.add_argument(
        "--probe-sample", type=int, default=0, help="kvcached's --probe-sample (default: its own)"
    )
    ap.add_argument("--probe-rate", type=int, default=0, help="kvcached's --probe-rate (default: its own)")
    ap.add_argument("--preset", default="baseline", choices=("baseline", "fixed"), help="kvcached's preset")
    ap.add_argument("--reattach", action="store_true", help="one server, record attached anew for each pair")
    ap.add_argument(
        "--watch",
        default="record",
        choices=("record", "top"),
        help="what is attached: kvprof record (default), or kvprof top in a pseudo-terminal",
    )
    ap.add_argument(
        "--load-threads",
        type=int,
        default=1,
        help="kvload threads (default 1: kvload near one core, the server below it; 2 fill both cores)",
    )
    args = ap.parse_args()
    args.reattach = args.reattach or args.mode == "reattach"
    args.pairs = args.pairs or {"single": 8, "toggle": 60}.get(args.mode, 60)
    args.seconds = args.seconds or {"single": 5.0, "toggle": 1.0}.get(args.mode, 2.0)
    LOAD.insert(0, f"--num-threads={args.load_threads}")
    if args.watch == "top" and args.reattach:
        print("overhead: --reattach measures record only", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("overhead: needs root (kvprof record loads BPF programs)", file=sys.stderr)
        return 2
    sample = ["--probe-sample", str(args.probe_sample)] if args.probe_sample else []
    sample += ["--probe-rate", str(args.probe_rate)] if args.probe_rate else []
    placement = Placement()
    # a descriptor, not the sysctl: a bench killed midway then leaves the statistics as they were
    stats = enable_stats()
    tmp = tempfile.mkdtemp(prefix="kvprof-overhead-")
    try:
        if args.mode == "single":
            single(args, tmp, sample)
        elif args.mode == "toggle":
            toggle_windows(args, tmp, sample)
        else:
            (reattach if args.reattach else side_by_side)(args, placement, tmp, sample)
    finally:
        if stats is not None:
            os.close(stats)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
