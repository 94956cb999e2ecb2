#!/usr/bin/env python3
"""What `kvprof record` costs the server it profiles.

kvcached (--preset baseline, 2 workers) under kvload, measured side by side in
one run: A = kvload alone, B = kvload while `kvprof record` (default
settings: every collector, 99 Hz, kvs probes at the server's default 1 in
64) is attached. Pairs are interleaved A B A B ..., so machine drift hits
both alike; B is measured only after every collector has attached. Prints
each pair, the median ratio B/A and its spread.

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


def kvload(address: str, seconds: float) -> float:
    out = subprocess.run(
        [str(kvload_binary()), f"--server={address}", f"--duration={seconds}", "--no-population", "--json",
         "--quiet", *LOAD],
        capture_output=True, text=True, timeout=seconds + 60, check=True,
    )  # fmt: skip
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result["ops_per_sec"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--collectors", default="", help="record's --collectors (default: all)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("overhead: needs root (kvprof record loads BPF programs)", file=sys.stderr)
        return 2
    server = start_kvcached(["-t", "2", "--preset", "baseline"])
    tmp = tempfile.mkdtemp(prefix="kvprof-overhead-")
    try:
        populate = [str(kvload_binary()), f"--server={server.address}", "--populate-only", "--quiet", *LOAD]
        subprocess.run(populate, check=True, stdout=subprocess.DEVNULL)
        print(f"kvcached PID {server.pid} (baseline, 2 workers); kvload {' '.join(LOAD)}")
        which = args.collectors or "all"
        print(f"{args.pairs} interleaved pairs of {args.seconds:g} s runs; collectors: {which}")
        print(f"{'pair':>4} {'without ops/s':>14} {'with record':>14} {'ratio':>7}")
        ratios, without, with_ = [], [], []
        for i in range(args.pairs):
            a = kvload(server.address, args.seconds)
            rec = subprocess.Popen(
                [sys.executable, "-m", "kvprof.cli", "record", "-p", str(server.pid), "-d", "600", "-o",
                 str(Path(tmp) / "overhead.json.gz"), "-q",
                 *(["--collectors", args.collectors] if args.collectors else [])],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
            )  # fmt: skip
            # attached once the oncpu program's perf events exist: wait for the
            # kvs semaphores (raised by the last collectors) to go up, then settle
            kvs = not args.collectors or any(
                c in args.collectors for c in ("locks", "cachelines", "requests")
            )  # noqa: E501
            deadline = time.monotonic() + (120 if kvs else 10)  # without kvs collectors: no semaphore to see
            while time.monotonic() < deadline and not (kvs and _semaphores_up(server.pid)):
                time.sleep(0.2)
            time.sleep(1.0)
            b = kvload(server.address, args.seconds)
            rec.send_signal(signal.SIGINT)
            rec.communicate(timeout=60)
            ratios.append(b / a)
            without.append(a)
            with_.append(b)
            print(f"{i + 1:>4} {a:>14,.0f} {b:>14,.0f} {b / a:>7.3f}", flush=True)
        med = statistics.median(ratios)
        print(
            f"median ratio {med:.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
            f"median ops/s {statistics.median(without):,.0f} without, {statistics.median(with_):,.0f} with"
        )
    finally:
        server.stop()
        server.log_path.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _semaphores_up(pid: int) -> bool:
    from kvprof.probes import ElfFile, load_bias, open_process, read_probes, read_semaphores

    process = open_process(pid)
    elf = ElfFile(f"/proc/{pid}/exe")
    probes = read_probes(elf)
    return any(read_semaphores(process, probes, load_bias(process, elf)).values())


if __name__ == "__main__":
    raise SystemExit(main())
