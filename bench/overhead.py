#!/usr/bin/env python3
"""What `kvprof record` costs the server it profiles.

kvcached (--preset baseline, 2 workers) under kvload, measured side by side in
one run: A = kvload alone, B = kvload while `kvprof record` (default
settings: every collector, 99 Hz, kvs probes at the server's default 1 in
64) is attached. Pairs are interleaved A B A B ..., so machine drift hits
both alike; B is measured only after every collector has attached. Prints
each pair, the median ratio B/A and its spread, and the server's CPU time
per operation in each run (utime + stime of kvcached over ops): the probes'
cost lands in the target's own CPU time, so that ratio is less sensitive to
other load on the machine than throughput is.

    sudo .venv/bin/python bench/overhead.py [--pairs 5] [--seconds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvprof.target import kvload_binary, start_kvcached  # noqa: E402

LOAD = ["--num-threads=1", "--connections=8", "--batch-size=8", "--set-pct=20", "--key-dist=zipf:0.99"]


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kvload(address: str, seconds: float, pid: int) -> tuple[float, float]:
    """ops/s, and the server's CPU µs per op over the run."""
    cpu = cpu_seconds(pid)
    out = subprocess.run(
        [str(kvload_binary()), f"--server={address}", f"--duration={seconds}", "--no-population", "--json",
         "--quiet", *LOAD],
        capture_output=True, text=True, timeout=seconds + 60,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"overhead: kvload failed (exit {out.returncode}): {out.stderr.strip()[-500:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result["ops_per_sec"], (cpu_seconds(pid) - cpu) * 1e6 / max(1.0, result["ops"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--collectors", default="", help="record's --collectors (default: all)")
    ap.add_argument("--probe-sample", type=int, default=0, help="kvcached's --probe-sample (default: 256)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("overhead: needs root (kvprof record loads BPF programs)", file=sys.stderr)
        return 2
    sample = ["--probe-sample", str(args.probe_sample)] if args.probe_sample else []
    server = start_kvcached(["-t", "2", "--preset", "baseline", *sample])
    tmp = tempfile.mkdtemp(prefix="kvprof-overhead-")
    try:
        populate = [str(kvload_binary()), f"--server={server.address}", "--populate-only", "--quiet", *LOAD]
        subprocess.run(populate, check=True, stdout=subprocess.DEVNULL)
        print(f"kvcached PID {server.pid} (baseline, 2 workers); kvload {' '.join(LOAD)}")
        which = args.collectors or "all"
        print(f"{args.pairs} interleaved pairs of {args.seconds:g} s runs; collectors: {which}")
        print(f"{'pair':>4} {'without ops/s':>14} {'with record':>14} {'ratio':>7} {'server CPU µs/op':>22}")
        ratios, without, with_, cpu_ratios = [], [], [], []
        for i in range(args.pairs):
            a, cpu_a = kvload(server.address, args.seconds, server.pid)
            rec = subprocess.Popen(
                [sys.executable, "-m", "kvprof.cli", "record", "-p", str(server.pid), "-d", "600", "-o",
                 str(Path(tmp) / "overhead.json.gz"),
                 *(["--collectors", args.collectors] if args.collectors else [])],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
            )  # fmt: skip
            # B starts once every collector is attached (record says "collecting";
            # before that it is compiling BPF programs, which would load the machine)
            _wait_for_line(rec, "collecting", timeout=180)
            time.sleep(1.0)
            b, cpu_b = kvload(server.address, args.seconds, server.pid)
            rec.send_signal(signal.SIGINT)
            rec.communicate(timeout=60)
            ratios.append(b / a)
            without.append(a)
            with_.append(b)
            cpu_ratios.append(cpu_b / cpu_a)
            cpu = f"{cpu_a:.2f} -> {cpu_b:.2f}"
            print(f"{i + 1:>4} {a:>14,.0f} {b:>14,.0f} {b / a:>7.3f} {cpu:>22}", flush=True)
        med = statistics.median(ratios)
        print(
            f"median ratio {med:.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
            f"median ops/s {statistics.median(without):,.0f} without, {statistics.median(with_):,.0f} with"
        )
        print(
            f"server CPU per op with/without: median {statistics.median(cpu_ratios):.3f} "
            f"(min {min(cpu_ratios):.3f}, max {max(cpu_ratios):.3f}); less sensitive to a busy machine"
        )
    finally:
        server.stop()
        server.log_path.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _wait_for_line(proc: subprocess.Popen[str], word: str, timeout: float) -> None:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if word in line:
            return
        if not line:
            raise SystemExit(f"overhead: kvprof record exited before attaching (exit {proc.wait()})")
    raise SystemExit(f"overhead: kvprof record did not attach within {timeout:g} s")


if __name__ == "__main__":
    raise SystemExit(main())
